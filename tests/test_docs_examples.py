"""Every `$ diffmeter` example of README.md and docs/*.md that runs offline here is run, and the figures it prints
(with their units: GiB, MACs, FLOPs, params, ms, %...) must be the page's; measured timings are not compared.
A page out of date: `python -m tests.docs_examples --update` rewrites its blocks (tests/docs_examples.py)."""

import docs_examples as docs
import pytest

PAGES = [page for page in docs.pages() if any(isinstance(step, docs.Example) for step in docs.steps(page))]


def _pages_with(slow: bool) -> list:
    return [
        pytest.param(page, id=str(page.relative_to(docs.ROOT)))
        for page in PAGES
        if any(isinstance(s, docs.Example) and s.runnable and s.slow == slow for s in docs.steps(page))
    ]


@pytest.mark.parametrize("page", _pages_with(slow=False))
def test_the_pages_examples_print_the_figures_they_show(page, tmp_path):
    found = docs.check_page(page, tmp_path, slow=False)
    assert not found, "\n" + "\n".join(found)


@pytest.mark.slow
@pytest.mark.parametrize("page", _pages_with(slow=True))
def test_the_pages_slow_examples_print_the_figures_they_show(page, tmp_path):
    found = docs.check_page(page, tmp_path, slow=True)
    assert not found, "\n" + "\n".join(found)


def test_the_readme_has_examples_and_each_page_marks_what_it_cannot_run_here():
    readme = [s for s in docs.steps(docs.ROOT / "README.md") if isinstance(s, docs.Example)]
    assert len(readme) >= 5 and all(s.runnable or s.needs <= {"weights", "gpu"} for s in readme)
    for page in PAGES:
        for step in docs.steps(page):
            if isinstance(step, docs.Example):
                assert step.needs <= {"weights", "gpu"}, f"{step.where}: unknown need {step.needs}"


def test_a_changed_figure_is_reported_with_page_example_and_both_values(tmp_path):
    """The comparison itself: a page claiming another FLOP count for tiny-sd fails, naming what differs."""
    page = tmp_path / "page.md"
    page.write_text("```console\n$ diffmeter profile tiny-sd --steps 2\ntotal 9.99 GFLOPs\n...\n```\n")
    docs_root, docs.ROOT = docs.ROOT, tmp_path
    try:
        (example,) = docs.steps(page)
        found = docs.differences(example, *docs.run(example.command, tmp_path))
    finally:
        docs.ROOT = docs_root
    assert len(found) == 1 and "page.md:2 `diffmeter profile tiny-sd --steps 2`" in found[0]
    assert "expected 9.99 GFLOPs" in found[0] and "got 1.06 GFLOPs" in found[0]


def test_measured_timings_are_not_compared_but_compute_is():
    timing = docs.compared("diffmeter bench tiny-sd --iterations 6")
    assert not timing("ms") and not timing("GiB") and not timing("%") and timing("GFLOPs")
    assert docs.compared("diffmeter profile flux-dev")("%") and not docs.compared("diffmeter fit x --gpu cpu")("ms")
    assert docs.figures("│ total │ 1.87 PMACs (3.73 PFLOPs) │ 50 steps 1024x1024 │ 16.87B params │") == [
        "1.87 PMACs",
        "3.73 PFLOPs",
        "16.87 B params",
    ]


def test_update_rewrites_a_block_from_the_current_output_keeping_its_cut(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("intro\n```console\n$ diffmeter profile tiny-sd --steps 2\nold line\n...\n```\nafter\n")
    docs_root, docs.ROOT = docs.ROOT, tmp_path
    try:
        assert docs.update_page(page, tmp_path) == 1
        (example,) = docs.steps(page)
        assert not docs.differences(example, *docs.run(example.command, tmp_path))
    finally:
        docs.ROOT = docs_root
    lines = page.read_text().splitlines()
    assert lines[:3] == ["intro", "```console", "$ diffmeter profile tiny-sd --steps 2"]
    assert lines[3].startswith("tiny-sd") and lines[4:] == ["...", "```", "after"]
