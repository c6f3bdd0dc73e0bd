"""A threshold cache's skipped share outside the thresholds of the published runs it is predicted from is said to be
extrapolated (``predict.cache_published.extrapolated``): in ``profile``'s, ``fit``'s and a bench run's prediction, as
text and as the JSON field ``extrapolated``; the range is read from the published runs the prediction uses."""

from __future__ import annotations

import json

from diffusers.hooks import FirstBlockCacheConfig

from diffmeter.predict.cache_published import drift_rows, extrapolated, published
from diffmeter.predict.cache_time import cache_skip
from diffmeter.predict.operators import predict_memory_and_work
from diffmeter.report.prediction_lines import prediction_lines
from diffmeter.runs.storage import read_result
from diffmeter.spec import ProfileSpec

DEFAULT = FirstBlockCacheConfig().threshold  # what diffusers runs when none is given


def runs(*thresholds: float, model="flux-dev", steps=28, size=1024) -> list[dict]:
    """Published First-Block-Cache runs (FLUX.1-dev at 1024x1024, 28 steps unless given) at ``thresholds``."""
    return [
        {"technique": "first-block-cache", "params": {"threshold": t}, "threshold": t, "skipped_share": 0.5,
         "source": "a", "model": model, "steps": steps, "height": size, "width": size}
        for t in thresholds
    ]  # fmt: skip


def tiny(steps: int) -> str:
    """What is extrapolated in tiny-flux's settings, unlike every published run's (FLUX.1-dev, 28 steps, 1024x1024)."""
    settings = f"{steps} steps, the published 28; 32x32 px, the published 1024x1024"
    return f"model tiny-flux, the published runs' flux-dev; {settings}"


TINY = tiny(8)


def shipped_range() -> tuple[float, float]:
    """The thresholds of the shipped published runs First-Block-Cache is predicted from."""
    thresholds = [r["threshold"] for r in drift_rows("first-block-cache", {"threshold": DEFAULT}, published())[0]]
    return min(thresholds), max(thresholds)


def test_a_threshold_outside_the_published_runs_is_extrapolated_and_one_inside_is_not():
    given = runs(0.1, 0.2, 0.15)
    assert extrapolated("first-block-cache", {"threshold": 0.1}, given) is None  # the ends are published
    assert extrapolated("first-block-cache", {"threshold": 0.17}, given) is None
    below = extrapolated("first-block-cache", {"threshold": 0.05}, given)
    assert below == "skipped share extrapolated: threshold 0.05 below the published 0.1-0.2"
    above = extrapolated("first-block-cache", {"threshold": 0.6}, given)
    assert above == "skipped share extrapolated: threshold 0.6 above the published 0.1-0.2"
    # cache-dit with other blocks has no runs of its own: the range is that of the runs it borrows
    lent = extrapolated("cache-dit", {"threshold": 0.25, "fn": 8, "bn": 8}, given)
    assert lent == "skipped share extrapolated: threshold 0.25 above the published 0.1-0.2"


def test_sizes_are_said_width_x_height():
    """A 1280x720 video read '720x1280 px' (height first), against every other size the tool prints."""
    given = [{**row, "height": 720, "width": 1280} for row in runs(0.1, 0.2)]
    spec = ProfileSpec(model="flux-dev", steps=28, height=480, width=832)
    said = extrapolated("first-block-cache", {"threshold": 0.1}, given, spec)
    assert said == "skipped share extrapolated: 832x480 px, the published 1280x720"


def test_the_cached_work_carries_it_from_the_rows_it_was_predicted_with():
    spec = ProfileSpec(model="tiny-flux", steps=8)
    memory, work = predict_memory_and_work(spec, True, ())
    denoisers = tuple(memory.denoisers)
    alike = {"model": "tiny-flux", "steps": 8, "size": 32}  # published runs of the asked model, steps and size
    inside = cache_skip(work, "first-block-cache", {"threshold": 0.15}, denoisers, spec, runs(0.1, 0.2, **alike))
    outside = cache_skip(work, "first-block-cache", {"threshold": 0.15}, denoisers, spec, runs(0.2, 0.4, **alike))
    assert inside.extrapolated is None
    assert outside.extrapolated == "skipped share extrapolated: threshold 0.15 below the published 0.2-0.4"
    flux = cache_skip(work, "first-block-cache", {"threshold": 0.15}, denoisers, spec, runs(0.1, 0.2))
    assert flux.extrapolated == f"skipped share extrapolated: {TINY}"  # inside the thresholds, not the settings
    low, high = shipped_range()
    assert DEFAULT < low  # diffusers' default is under every published run's threshold
    default = cache_skip(work, "first-block-cache", {}, denoisers, spec)  # the shipped runs, diffusers' default
    assert (
        default.extrapolated
        == f"skipped share extrapolated: threshold {DEFAULT:g} below the published {low:g}-{high:g}; {TINY}"
    )


def test_profile_says_it_in_the_text_and_the_json_only_outside(cli):
    low, high = shipped_range()
    asked = ("profile", "tiny-flux", "--gpu", "h100", "--steps", "8")
    for threshold, side in ((low / 2, "below"), ((low + high) / 2, None), (high * 2, "above")):
        code, out, err = cli(*asked, "--opt", f"first-block-cache:threshold={threshold}", "--json")
        assert code == 0, err
        said = json.loads(out)["time"]["cache"]["extrapolated"]
        code, out, _ = cli(*asked, "--opt", f"first-block-cache:threshold={threshold}")
        text = " ".join(out.split())
        outside = [f"threshold {threshold:g} {side} the published {low:g}-{high:g}"] if side else []
        expected = f"skipped share extrapolated: {'; '.join([*outside, TINY])}"  # tiny-flux is never published
        assert said == expected and f"denoiser calls skipped ({expected}; threshold" in text
        # a threshold outside the published runs' is said apart, as a note (a new user's threshold=2 was buried)
        assert ("note: first-block-cache threshold" in text and "held-out test below did not cover" in text) == bool(
            side
        )


def test_fit_says_it_for_its_cached_settings(cli):
    low, high = shipped_range()
    code, out, err = cli("fit", "tiny-flux", "--gpu", "h100", "--json", "--steps", "2")
    assert code == 0, err
    found = {tuple(row["techniques"]): row for row in json.loads(out)["fits"]}
    expected = f"skipped share extrapolated: threshold {DEFAULT:g} below the published {low:g}-{high:g}; {tiny(2)}"
    for chosen, row in found.items():
        cached = "first-block-cache" in chosen
        assert row["cache_extrapolated"] == (expected if cached else None)
        assert (row["cache_skipped_share"] is not None) == cached
    code, out, _ = cli("fit", "tiny-flux", "--gpu", "h100", "--steps", "2")
    assert code == 0 and f"Cache: first-block-cache threshold={DEFAULT} skips " in " ".join(out.split())
    assert f"denoiser calls ({expected})" in " ".join(out.split())


def test_a_bench_run_stores_it_and_show_prints_it(cli, tmp_path):
    low, high = shipped_range()
    threshold = DEFAULT
    args = ("bench", "tiny-flux", "--steps", "2", "--iterations", "1", "--out", tmp_path, "-q")
    code, _, err = cli(*args, "--opt", f"first-block-cache:threshold={threshold}")
    assert code == 0, err
    (folder,) = tmp_path.iterdir()
    result = read_result(folder)
    expected = f"skipped share extrapolated: threshold {threshold:g} below the published {low:g}-{high:g}; {tiny(2)}"
    assert result.prediction.time.cache.extrapolated == expected
    code, out, _ = cli("show", folder)
    assert code == 0 and f"denoiser calls ({expected})" in " ".join(out.split())
    inside = result.prediction.time.cache.model_copy(update={"extrapolated": None})
    time = result.prediction.time.model_copy(update={"cache": inside})
    quiet = result.model_copy(update={"prediction": result.prediction.model_copy(update={"time": time})})
    lines = prediction_lines(quiet)
    assert any(line.startswith("prediction: first-block-cache threshold=") for line in lines)
    assert not any("extrapolated" in line for line in lines)


def test_the_leaderboard_page_says_its_cache_threshold_is_extrapolated():
    from diffmeter.report.leaderboard import leaderboard_html

    low, high = shipped_range()
    said = f"skipped share extrapolated: threshold {DEFAULT:g} below the published {low:g}-{high:g}"
    runs = "the published runs are flux-dev at 28 steps, 1024x1024 px: other models, steps and sizes extrapolated"
    assert (
        f"a first-block cache where bench accepts them (at threshold {DEFAULT:g}, diffusers' default: {said}; {runs})"
        in leaderboard_html([], [])
    )
