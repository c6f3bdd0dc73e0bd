"""One rule for a speed-up: `table`, `report`, `compare`, `show` and a ladder give the same estimate, interval and
verdict from the same calls, and a figure from a noisy run carries that run's noise notes everywhere."""

import json
import re

import pytest

from diffmeter.measure.conditions import Conditions, Range
from diffmeter.measure.speedup import Speedup, estimate, verdict
from diffmeter.optimize.options import parse_opt
from diffmeter.runs import collect, speedups, storage
from diffmeter.runs.iteration import Iteration
from diffmeter.runs.lifecycle import bench
from diffmeter.runs.spec import BenchSpec
from diffmeter.runs.summary import measurement_notes, summarize_run

FAST = {"model": "tiny-sd", "steps": 1, "iterations": 6, "device": "cpu", "predict": False}
#: how each of the six calls of the optimized run is slowed: one call three times, as a busy machine does
SLOWED = (1.0, 1.0, 3.0, 1.0, 1.0, 1.0)


def _slowed(iteration: Iteration, factor: float) -> Iteration:
    stages = iteration.stages
    scaled = stages.model_copy(
        update={
            "text_encoding_s": stages.text_encoding_s * factor,
            "denoising_s": stages.denoising_s * factor,
            "steps_s": [step * factor for step in stages.steps_s],
            "vae_decode_s": stages.vae_decode_s * factor,
            "other_s": stages.other_s * factor,
        }
    )
    return iteration.model_copy(
        update={"total_s": iteration.total_s * factor, "wall_s": iteration.wall_s * factor, "stages": scaled}
    )


def _make_noisy(folder) -> list[str]:
    """Store the run again as a noisy one: one call slowed, the machine busy, summarized and noted by the
    runner's own functions. Returns its noise notes."""
    result = storage.read_result(folder)
    iterations = [_slowed(it, factor) for it, factor in zip(result.iterations, SLOWED, strict=True)]
    busy = Conditions(samples=8, cpu_count=2, other_processes_cores=Range(mean=1.3, min=1.1, max=1.5))
    summary = result.summary
    result.iterations = iterations
    result.summary = summarize_run(
        result.spec,
        iterations,
        summary.peak_memory,
        summary.energy,
        result.profile,
        result.first_call_s,
        summary.compilation,
        busy,
    )
    result.notes = [note for note in result.notes if not note.startswith(speedups.NOISE_PREFIXES)]
    result.notes += measurement_notes(result.summary, 0)
    storage.write_json(folder / storage.RESULTS, result.to_json_dict())
    return speedups.noise_notes(storage.read_result(folder))


@pytest.fixture(scope="module")
def noisy_pair(tmp_path_factory):
    out = tmp_path_factory.mktemp("noisy")
    _, baseline = bench(BenchSpec(**FAST), out=out)
    _, candidate = bench(BenchSpec(**FAST, optimizations=[parse_opt("fuse-qkv")], compare_baseline=True), out=out)
    notes = _make_noisy(candidate)
    return out, baseline, candidate, notes


def _plain(text: str) -> str:
    return " ".join(text.split())


def test_every_command_gives_one_speedup_and_carries_the_noise_note(noisy_pair, cli, tmp_path):
    out, baseline, candidate, notes = noisy_pair
    assert any(note.startswith("noisy:") for note in notes)
    assert "other processes used 1.3 of 2 CPU cores" in " ".join(notes)
    expected = speedups.between(storage.read_result(baseline), storage.read_result(candidate))
    baseline_notes = speedups.noise_notes(storage.read_result(baseline))  # this shared machine is often busy
    assert expected.notes == [f"baseline: {note}" for note in baseline_notes] + [f"this run: {n}" for n in notes]
    shown = expected.text()
    assert "(noisy)" in shown and f"({expected.low:.2f}-{expected.high:.2f}x)" in shown

    code, text, err = cli("table", out, "--json")
    assert code == 0, err
    (row,) = [row for row in json.loads(text) if row["optimizations"] == "fuse-qkv"]
    figures = (expected.estimate, expected.low, expected.high, expected.coverage)
    columns = ("speedup", "speedup_ci_low", "speedup_ci_high", "speedup_coverage")
    assert [row[column] for column in columns] == pytest.approx(figures, rel=1e-9)  # --json keeps 10 digits
    assert row["speedup_verdict"] == expected.verdict
    assert notes[0] in row["noise"] and notes[0] in row["speedup_noise"]
    code, text, _ = cli("table", out)
    assert code == 0 and shown in _plain(text) and _plain(notes[0]) in _plain(text)

    code, text, err = cli("compare", baseline, candidate, "--json")
    assert code == 0, err
    (call,) = [stage for stage in json.loads(text)["pairs"][0]["stages"] if stage["stage"] == "call"]
    assert (call["speedup"], call["ci_low"], call["ci_high"], call["verdict"]) == (
        expected.estimate,
        expected.low,
        expected.high,
        expected.verdict,
    )
    assert json.loads(text)["pairs"][0]["noise"] == [f"A: {n}" for n in baseline_notes] + [f"B: {n}" for n in notes]
    code, text, _ = cli("compare", baseline, candidate)
    assert code == 0 and shown in _plain(text) and _plain(notes[0]) in _plain(text)
    assert _plain(text).count("Hodges-Lehmann") == 1  # the method is said once

    code, text, _ = cli("show", candidate)
    assert code == 0 and expected.sentence() in _plain(text)

    report = tmp_path / "report.html"
    code, _, err = cli("report", out, "--out", report)
    assert code == 0, err
    page = report.read_text()
    assert shown in page and notes[0].split(";")[0] in page  # html escapes nothing in these


def test_a_ladder_rung_in_another_dtype_has_the_ladders_speedup_in_the_report(tmp_path):
    """The half-precision rung has no unoptimized run of its own dtype: its speed-up is against the ladder's
    baseline, by the same rule, in the ladder and in the report (it showed "-")."""
    from diffmeter.report.html.study import read_study
    from diffmeter.runs.ladder import climb, plan

    ladder = climb(plan(BenchSpec(**{**FAST, "iterations": 3}), ("half",), None, "default"), tmp_path, recheck=False)
    base, half = ladder.rows
    assert half.dtype == "bfloat16" and half.speedup_detail is not None
    expected = speedups.between(storage.read_result(base.folder), storage.read_result(half.folder))
    assert half.speedup_detail == expected and half.speedup == expected.estimate
    study = read_study(tmp_path)
    (run,) = [run for run in study.runs if run.row["dtype"] == "bfloat16"]
    assert run.row["speedup"] == expected.estimate and run.row["speedup_verdict"] == expected.verdict
    table = {row["dtype"]: row for row in collect.rows(tmp_path)}  # `diffmeter table` reads the ladder too
    assert table["bfloat16"]["speedup"] == expected.estimate and table["float32"]["speedup_verdict"] == "baseline"
    from diffmeter.report.html.ladder_plots import ladders

    (figure,) = ladders(study)
    assert f"Measured on {ladder.device};" in figure.caption and "{" not in figure.caption


@pytest.mark.parametrize(
    "times, factor, expected",
    [
        ([1.0] * 8, 2.0, "faster"),
        ([1.0] * 8, 0.5, "slower"),
        ([1.0] * 8, 1.02, "within noise"),  # the interval excludes 1x, the effect is under 5%
    ],
)
def test_the_verdict_needs_the_interval_and_the_effect(times, factor, expected):
    jitter = [t * (1 + 0.001 * i) for i, t in enumerate(times)]
    found = estimate(jitter, [t / factor for t in jitter])
    assert found.verdict == expected and found.low <= found.estimate <= found.high
    assert found.estimate == pytest.approx(factor, rel=1e-3)
    if expected == "within noise":
        assert found.low > 1 and not re.search(r"\d\.\d\dx within", found.text())  # no bare factor shown


def test_within_noise_shows_no_factor():
    found = Speedup(estimate=1.3, low=0.9, high=1.8, coverage=0.95, verdict=verdict(1.3, 0.9, 1.8))
    assert found.verdict == "within noise" and found.text() == "within noise (0.90-1.80x)"
