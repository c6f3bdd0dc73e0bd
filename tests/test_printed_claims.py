"""The held-out figures `profile --gpu` prints beside a quantized or compiled time are the ones the committed
held-out tests found (benchmarks/results/calibration_quantized.md, calibration_techniques.md): a refit that
changes them without the claim fails here."""

from __future__ import annotations

import json
import re
from pathlib import Path

from diffmeter.predict.quantized_modelled import HELD_OUT as QUANTIZED
from diffmeter.predict.quantized_modelled import held_out_claim
from diffmeter.predict.timed_techniques import HELD_OUT as TECHNIQUES

RESULTS = Path(__file__).parents[1] / "benchmarks" / "results"


def held_out(page: str, section: str) -> tuple[str, str, str]:
    """(inside, runs, median error) of ``section``'s held-out line on the committed ``page``."""
    text = (RESULTS / page).read_text()
    part = text[text.index(f"## {section}") :]
    found = re.search(r"coverage \*\*(\d+%)\*\* \((\d+ of \d+)\), midpoint median error \*\*([\d.]+%)\*\*", part)
    return found.groups()


def test_the_printed_claim_is_the_committed_held_out_figure():
    inside, runs, error = held_out("calibration_techniques.md", "all")
    assert f"{runs} published" in TECHNIQUES and f"({inside})" in TECHNIQUES
    assert f"median error {error}" in TECHNIQUES and "calibration_techniques.md" in TECHNIQUES


def test_each_quantized_format_claims_its_own_committed_held_out_figure():
    """The shipped per-format figures are the committed page's sections, every one of them."""
    stored = json.loads(QUANTIZED.read_text())
    sections = [("all quantized runs", stored["all"])] + list(stored["formats"].items())
    text = (RESULTS / "calibration_quantized.md").read_text()
    assert set(stored["formats"]) == set(re.findall(r"^## ([a-z]+:[\w-]+): ", text, re.M))
    for section, figures in sections:
        inside, runs, error = held_out("calibration_quantized.md", section)
        assert (
            runs == f"{figures['inside']} of {figures['runs']}"
            and inside == f"{figures['inside'] / figures['runs']:.0%}"
        )
        assert error == f"{figures['median_error']:.1%}"


def test_a_quantized_time_says_its_own_formats_held_out_figure(cli):
    """A format with published runs quotes its own; one without says so before quoting all quantized runs'."""
    stored = json.loads(QUANTIZED.read_text())
    mine = stored["formats"]["quanto:int8"]
    code, out, _ = cli("profile", "tiny-flux", "--gpu", "h100", "--quantize", "quanto:int8")
    said = " ".join(out.split())
    assert (
        code == 0 and f"quanto:int8: its published runs held out by source, {mine['inside']} of {mine['runs']}" in said
    )
    assert f"all {stored['all']['runs']} published eager quantized runs" not in said
    assert "float8dq-row" not in stored["formats"]
    code, out, _ = cli("profile", "tiny-flux", "--gpu", "h100", "--quantize", "torchao:float8dq-row")
    said = " ".join(out.split())
    # its published runs (benchmarks/published_quantized.yaml) are compiled, which the held-out test leaves out
    assert code == 0 and "torchao:float8dq-row: no published eager run of this format (the test takes eager" in said
    assert "no published run of" not in said
    every = stored["all"]
    assert f"all {every['runs']} published eager quantized runs: held out by source, {every['inside']} of" in said
    assert held_out_claim(["torchao:float8dq-row"]) in said
    code, out, _ = cli("profile", "tiny-flux", "--gpu", "h100", "--quantize", "torchao:float8dq-row", "--json")
    assert code == 0 and json.loads(out)["quantized_time_held_out"] == held_out_claim(["torchao:float8dq-row"])


def test_formats_without_published_runs_share_one_clause():
    """Several formats with no published run are named together before all quantized runs' figure, said once."""
    stored = json.loads(QUANTIZED.read_text())
    asked = ("torchao:float8dq-row", "gguf:Q4_K_S", "gguf:Q6_K")
    unpublished = [name for name in asked if name not in stored["formats"]]
    assert len(unpublished) >= 2
    said = held_out_claim([*unpublished, "quanto:int8"])
    assert said.count(f"all {stored['all']['runs']} published eager quantized runs") == 1
    assert f"{', '.join(unpublished)}: no published eager run of these formats (" in said
    assert said.startswith("quanto:int8: its published runs held out by source")


def test_a_borrowed_calibration_claims_the_widened_held_out_figure_not_its_lenders(cli):
    """A V100 (Volta: no fit of its own; a T4 was so before Turing's shipped) is timed with Ampere's calibration
    widened: it printed Ampere's own held-out figure. It claims the committed held-out test of a borrowed, widened
    range instead, in `profile --gpu`, `fit` and (through the same calibration) a bench run's stored prediction."""
    from diffmeter.predict.calibration import calibration_for, calibrations
    from diffmeter.predict.devices import named_gpu

    ampere = calibrations()["cuda:ampere"]
    claim, lenders = ampere.borrowed_held_out, ampere.held_out
    assert ampere.source.endswith(f"; {lenders}") and claim and lenders not in claim
    inside, runs, error = held_out("calibration_published.md", "Each architecture predicted by its neighbour's calibr")
    assert f": {runs} runs ({inside}) inside their range, midpoint median error {error}," in claim
    own = ampere.borrowed_held_out_by["volta"]  # Volta's own runs in that test, as the page's row has them
    row = re.search(
        r"^\| volta \| (\d+) \| (\d+%) \| ([\d.]+%) \|", (RESULTS / "calibration_published.md").read_text(), re.M
    )
    assert (
        own.startswith(f"volta's own {row[1]} runs in that test: ")
        and f"({row[2]}), midpoint median error {row[3]}" in own
    )
    t4 = calibration_for(named_gpu("V100 SXM2"))
    assert t4.held_out == f"{claim}; {own}" and t4.source.endswith(t4.held_out) and lenders not in t4.source
    assert "borrowed for volta (V100 SXM2) from ampere" in t4.source
    code, out, _ = cli("profile", "tiny-sd", "--gpu", "v100 sxm2", "--json")
    said = json.loads(out)["time"]["calibration"]
    assert code == 0 and claim in said and lenders not in said
    code, out, _ = cli("fit", "tiny-sd", "--gpu", "v100 sxm2", "--memory", "32GB", "--json", "--steps", "2")
    eager = json.loads(out)["held_out"][0]
    assert code == 0 and claim in eager and lenders not in eager
    assert eager.startswith("the eager range (ampere GPUs' fit, borrowed for volta (V100 SXM2) from ampere): ")
    code, out, _ = cli("profile", "tiny-sd", "--gpu", "a100")  # Ampere's own card keeps Ampere's own figure
    assert code == 0 and lenders in " ".join(out.split()) and claim not in " ".join(out.split())


def test_a_card_with_published_runs_says_what_its_own_runs_showed_held_out(cli):
    """The A10's four published runs (a 150 W card, off its architecture's fit before the power limit) in the
    held-out test: a prediction on the A10 says how they fared beside the ampere figure, with the counts and signed
    error of the committed page's rows."""
    import statistics

    import yaml

    from diffmeter.predict.gpu_spec import chosen_gpu

    figures = yaml.safe_load((RESULTS.parent / "published_figures.yaml").read_text())["figures"]
    cards = {figure["id"]: chosen_gpu(figure["gpu"], None).name for figure in figures if figure.get("gpu")}
    text = (RESULTS / "calibration_published.md").read_text()
    part = text[text.index("## All architectures") :].split("\n\n")[1]
    rows = [row.split(" | ") for row in part.splitlines()[2:]]
    mine = [row for row in rows if cards.get(row[0].removeprefix("| ")) == "A10"]
    errors = [float(row[5].rstrip("%")) / 100 for row in mine]
    inside = sum(row[6].startswith("yes") for row in mine)
    code, out, err = cli("profile", "sd15", "--gpu", "a10")
    said = " ".join(out.split())
    assert code == 0, err
    assert f"the A10's own {len(mine)} published runs in that test: {inside} inside their range" in said
    code, out, _ = cli("profile", "sd15", "--gpu", "l4")  # no published run of its own: its architecture's range
    assert code == 0 and "no published run on the L4 itself in that test" in " ".join(out.split())
    median = statistics.median(errors)
    lean = "faster" if median < 0 else "slower"
    assert f"midpoint median error {median:+.0%} (predicted {lean} than measured" in said
