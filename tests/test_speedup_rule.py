"""One rule for a speed-up: `table`, `report`, `compare`, `show` and a ladder give the same estimate, interval and
verdict from the same calls, and a figure from a noisy run carries that run's noise notes everywhere."""

import json
import re

import pytest
from speedup_key import hodges_lehmann, per_image_times, rank_symmetric

from diffmeter.measure.conditions import Conditions, Range
from diffmeter.measure.speedup import Speedup, estimate, factor_text, verdict, within_noise_rule
from diffmeter.optimize.options import parse_opt
from diffmeter.runs import collect, speedups, storage
from diffmeter.runs.iteration import Iteration
from diffmeter.runs.lifecycle import bench
from diffmeter.runs.results import AppliedOptimization
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
    # VAE slicing: a technique that may change any stage, so the rule reads every call as it is (a denoiser-only one
    # would have its untouched stages checked for the machine's drift: test_a_cache_whose_untouched_stages_...)
    _, candidate = bench(BenchSpec(**FAST, optimizations=[parse_opt("vae-slicing")], compare_baseline=True), out=out)
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
    # the answer key: the stored calls' per-image times, baseline over candidate, worked out apart from diffmeter
    times = per_image_times(baseline), per_image_times(candidate)
    assert expected.estimate == pytest.approx(hodges_lehmann(*times), rel=1e-9)
    assert rank_symmetric(expected.low, expected.high, *times)
    shown = expected.text()
    ends = (1 / expected.high, 1 / expected.low) if expected.verdict == "slower" else (expected.low, expected.high)
    assert "(noisy)" in shown and f"({factor_text(ends[0])}-{factor_text(ends[1])}x)" in shown  # 84.6x past 10

    code, text, err = cli("table", out, "--json")
    assert code == 0, err
    (row,) = [row for row in json.loads(text) if row["optimizations"] == "vae-slicing"]
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
    # the stages as show names them, and why their medians do not add up to the call's (a new user's trial)
    assert "text encoding" in text and "whole call" in text and "text_encoding" not in text
    assert "need not add up to the whole call's" in _plain(text)
    assert _plain(text).count("Hodges-Lehmann") == 1  # the method is said once

    code, text, _ = cli("show", candidate)
    assert code == 0 and expected.sentence() in _plain(text)

    report = tmp_path / "report.html"
    code, _, err = cli("report", out, "--out", report)
    assert code == 0, err
    page = report.read_text()
    assert shown in page and notes[0].split(";")[0] in page  # html escapes nothing in these


def test_every_plot_of_a_noisy_run_names_it_in_its_caption(noisy_pair):
    """The summary table marked the run "(noisy)"; the plots drew it unmarked. Each plot's caption names it."""
    from diffmeter.report.html import figures as plots
    from diffmeter.report.html.study import read_study

    out, _, candidate, _ = noisy_pair
    study = read_study(out)
    (noisy,) = [run for run in study.runs if run.folder.name == candidate.name]
    drawn = [figure for _, _, section in plots.SECTIONS for figure in section(study)]
    measured = [figure for figure in drawn if "Measured on" in figure.caption]
    assert measured and all("Noisy timings" in f.caption and noisy.label in f.caption for f in measured)


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
    times = per_image_times(base.folder), per_image_times(half.folder)  # the key, apart from diffmeter's code
    assert expected.estimate == pytest.approx(hodges_lehmann(*times), rel=1e-9)
    assert rank_symmetric(expected.low, expected.high, *times)
    study = read_study(tmp_path)
    (run,) = [run for run in study.runs if run.row["dtype"] == "bfloat16"]
    assert run.row["speedup"] == expected.estimate and run.row["speedup_verdict"] == expected.verdict
    table = {row["dtype"]: row for row in collect.rows(tmp_path)}  # `diffmeter table` reads the ladder too
    assert table["bfloat16"]["speedup"] == expected.estimate and table["float32"]["speedup_verdict"] == "baseline"
    from diffmeter.report.html.ladder_plots import ladders

    (figure,) = ladders(study)
    assert f"Measured on {ladder.device};" in figure.caption and "{" not in figure.caption
    from diffmeter.report.html.tradeoff_plots import tradeoffs

    # the rung's images against the baseline's are the ladder's (its own result has none): it is in the speed
    # against quality plot, at its speed-up (the plot was missing from a ladder's report)
    plotted = tradeoffs(study)[0].figure
    assert plotted.layout.title.text.startswith("Speed-up against image quality")
    assert expected.estimate in [x for trace in plotted.data for x in (trace.x or ())]


def test_a_candidate_eleven_times_slower_reads_so_everywhere(noisy_pair, cli, tmp_path):
    """Hand-worked: every call of the candidate takes 11 times its baseline counterpart's time, so the estimate is
    1/11 exactly (the pairs' ratios are 1/11 times a set symmetric about 1) and every command says "11.0x slower",
    its interval inverted too (it said "0.09x slower (0.01-0.51x)")."""
    import shutil

    out, baseline, candidate, _ = noisy_pair
    study = tmp_path / "study"
    shutil.copytree(out, study)
    slowed = study / candidate.name
    result = storage.read_result(slowed)
    result.iterations = [_slowed(it, 11.0) for it in storage.read_result(baseline).iterations]
    summary = result.summary
    result.summary = summarize_run(
        result.spec,
        result.iterations,
        summary.peak_memory,
        summary.energy,
        result.profile,
        result.first_call_s,
        summary.compilation,
        None,
    )
    storage.write_json(slowed / storage.RESULTS, result.to_json_dict())
    key = per_image_times(baseline), per_image_times(slowed)
    assert [b / a for a, b in zip(*key, strict=True)] == pytest.approx([11.0] * len(key[0]), rel=1e-9)

    code, text, err = cli("compare", baseline, slowed, "--json")
    assert code == 0, err
    (call,) = [stage for stage in json.loads(text)["pairs"][0]["stages"] if stage["stage"] == "call"]
    assert call["speedup"] == pytest.approx(1 / 11, rel=1e-9) and call["verdict"] == "slower"
    assert rank_symmetric(call["ci_low"], call["ci_high"], *key) and call["ci_high"] < 1
    figure = f"11.0x slower ({_factor(1 / call['ci_high'])}-{_factor(1 / call['ci_low'])}x)"
    assert 1 / call["ci_high"] <= 11 <= 1 / call["ci_low"]
    code, text, _ = cli("compare", baseline, slowed)
    assert code == 0 and figure in _plain(text) and "0.09x" not in text

    code, text, err = cli("table", study, "--json")
    assert code == 0, err
    (row,) = [row for row in json.loads(text) if row["optimizations"] == "vae-slicing"]
    assert row["speedup"] == pytest.approx(1 / 11, rel=1e-9) and row["speedup_verdict"] == "slower"
    code, text, _ = cli("table", study)
    assert code == 0 and figure in _plain(text)
    code, text, _ = cli("show", slowed)
    assert code == 0 and f"speed vs unoptimized (same seeds, per image): {figure}" in _plain(text)
    report = tmp_path / "report.html"
    code, _, err = cli("report", study, "--out", report)
    assert code == 0, err
    assert figure in report.read_text() and "0.09x" not in report.read_text()


def _factor(value: float) -> str:
    """As a person reads a factor: two decimals below 10, one below 100, none above."""
    return f"{value:.2f}" if value < 9.995 else f"{value:.1f}" if value < 99.95 else f"{value:.0f}"


def test_a_slower_factor_and_its_interval_read_as_times_slower():
    """The issue's figures: 0.09x (0.01-0.51x) is 11.1 times slower, between 1.96 and 100 times."""
    found = Speedup(estimate=0.09, low=0.01, high=0.51, coverage=0.95, verdict="slower")
    assert found.text() == "11.1x slower (1.96-100x)"
    assert (
        Speedup(estimate=0.5, low=0.4, high=0.8, coverage=0.95, verdict="slower").text() == "2.00x slower (1.25-2.50x)"
    )
    assert (
        Speedup(estimate=2.1, low=1.8, high=2.4, coverage=0.95, verdict="faster").text() == "2.10x faster (1.80-2.40x)"
    )


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


def test_one_call_has_no_interval_so_it_is_noisy_and_supports_no_factor(tmp_path):
    """One measured call: its median's "interval" is the call itself (0% coverage), which read as known to +-0% (no
    noise note) and, set against another one-call run, as "2.00x faster (2.00-2.00x)"; and a claim on where that
    interval lies against a predicted range."""
    from diffmeter.report.prediction_lines import against_expected

    result, folder = bench(BenchSpec(**{**FAST, "iterations": 1}), out=tmp_path)
    latency = result.summary.latency_s
    assert latency.n == 1 and latency.ci_level == 0 and latency.ci_low == latency.ci_high
    (note,) = [note for note in result.notes if note.startswith("noisy:")]
    assert "one measured call" in note and note in speedups.noise_notes(storage.read_result(folder))
    claim = against_expected(result, (latency.median / 8, latency.median / 4))
    assert claim.endswith("; one measured call: no interval") and "wholly" not in claim
    found = estimate([1.0], [0.5])  # one call each: a twice as fast candidate, by its one pair
    assert found.coverage == 0 and found.estimate == 2.0
    assert found.verdict == "within noise" and found.text() == "within noise (one call each: no interval)"
    # two calls each: an interval at 67% coverage, which supports no factor at the 95% asked; four: 97.1%
    short = estimate([1.0, 1.01], [0.5, 0.505])
    assert short.coverage == pytest.approx(2 / 3) and short.verdict == "within noise"
    assert short.text() == "within noise: too few calls (1.98-2.02x at 67% coverage; 95% asked needs 4 calls a run)"
    assert estimate([1.0, 1.01, 1.02, 1.0], [0.5, 0.505, 0.51, 0.5]).verdict == "faster"
    # three calls each, a candidate 4x slower with one call far out: the interval's far end 1 / 215, which two
    # decimals printed "0.00-0.39x" (a new user's compare); and the captions' rule names the too-few case
    slow = estimate([1.0, 1.06, 0.05], [4.0, 4.1, 4.4])
    assert slow.short and slow.interval_text(compact=True).startswith(f"{slow.low:.2g}-") and slow.low < 0.05
    assert "the calls are too few for the coverage asked" in within_noise_rule()


def test_a_cache_whose_untouched_stages_slowed_says_the_machine_changed(tmp_path):
    """A cache changes the denoising loop alone: where text encoding and decode took 5x as long in its run, the
    machine slowed between the runs and the speed-up holds that ("23.3x slower" for SeaCache, a new user's trial):
    its interval is widened by that factor and supports no verdict. Fused QKV acts on the denoiser alone too ("22.2x
    faster" while text encoding took a third); a run at another dtype changes every stage, so says nothing."""
    flux = {**FAST, "model": "tiny-flux", "iterations": 4}
    baseline, _ = bench(BenchSpec(**flux), out=tmp_path)
    cached, _ = bench(BenchSpec(**flux, optimizations=[parse_opt("first-block-cache")]), out=tmp_path)
    as_cached = {"optimizations": cached.optimizations}
    slowed = baseline.model_copy(update={**as_cached, "iterations": [_slowed(it, 5.0) for it in baseline.iterations]})
    drift = speedups.machine_drift(baseline, slowed)
    assert "that first-block-cache leaves alone" in drift.note and "text encoding 5.00x" in drift.note
    assert (drift.low, drift.high) == (1.0, pytest.approx(5.0))
    found = speedups.between(baseline, slowed)
    plain = estimate(speedups.per_image(baseline), speedups.per_image(slowed))
    assert drift.note in found.notes and plain.verdict == "slower" and found.verdict == "within noise"
    assert (found.low, found.high) == (pytest.approx(plain.low), pytest.approx(plain.high * 5.0))
    from diffmeter.runs.compare import compare_runs

    compared = compare_runs(baseline, slowed, "A", "B", images=False)  # compare says why its intervals are wide
    assert compared.noise[-1] == drift.note and {stage.verdict for stage in compared.stages} == {"within noise"}
    loop_only = [
        it.model_copy(update={"stages": it.stages.model_copy(update={"denoising_s": it.stages.denoising_s * 5})})
        for it in baseline.iterations
    ]
    assert speedups.machine_drift(baseline, baseline.model_copy(update={**as_cached, "iterations": loop_only})) is None
    fused, _ = bench(BenchSpec(**flux, optimizations=[parse_opt("fuse-qkv")]), out=tmp_path)
    assert (
        "that fuse-qkv leaves alone"
        in speedups.machine_drift(baseline, slowed.model_copy(update={"optimizations": fused.optimizations})).note
    )
    other_dtype = slowed.model_copy(update={"spec": slowed.spec.model_copy(update={"dtype": "bfloat16"})})
    assert speedups.machine_drift(baseline, other_dtype) is None
    # a quantization of the denoisers leaves the other stages alone too ("other 1.85x faster" under quanto:int8, a
    # new user's trial); one that names a text encoder changes text encoding, so says nothing; the record as bench
    # stores it (--quantize quanto:int8: no components named)
    for components, drifts in (([], True), (["denoiser"], True), (["text_encoder_2"], False)):
        quanto = AppliedOptimization(
            name="quanto", label="quanto-int8", kind="quantization", lossless=False,
            params={"type": "int8", "components": components},
        )  # fmt: skip
        quantized = slowed.model_copy(update={"optimizations": [quanto]})
        assert (speedups.machine_drift(baseline, quantized) is not None) is drifts


def test_a_ladders_baseline_measured_again_widens_every_interval_by_its_change():
    """A new user's ladder: the baseline took 268.56 ms at the start and 30.23 ms at the end, and compile still read
    "11.0x faster (2.84-17.4x)". The rungs ran while the baseline's speed was anywhere between, so each interval is
    widened by that change and the verdict read from the widened one; a change of 2% leaves a clear one standing."""
    from diffmeter.measure.speedup import Drift

    baseline, compiled = [0.2686, 0.2701, 0.2650, 0.2712], [0.0943, 0.0251, 0.0239, 0.0246]
    plain = estimate(baseline, compiled)
    assert plain.verdict == "faster" and plain.low > 2.5
    change = Drift.of([0.03023 / 0.26856], "the machine's speed changed during the ladder")
    found = estimate(baseline, compiled, drift=change)
    assert found.low == pytest.approx(plain.low * 0.03023 / 0.26856) and found.high == plain.high
    assert found.verdict == "within noise" and found.notes == ["the machine's speed changed during the ladder"]
    assert estimate(baseline, compiled, drift=Drift.of([1.02], "2% slower at the end")).verdict == "faster"
    both = Drift.joined([Drift.of([0.5], "a"), None, Drift.of([1.5], "b")])
    assert (both.low, both.high, both.note) == (0.5, 1.5, "a; b")


def test_too_few_calls_read_so_in_every_command(tmp_path, cli):
    """Two calls against six give an interval short of the 95% asked: the rule said "too few calls" while `compare`
    and `table`, which rebuilt the figure from its stored columns without the coverage asked, said only "within
    noise" (a new user's trial)."""
    _, baseline = bench(BenchSpec(**{**FAST, "iterations": 2}), out=tmp_path)
    _, candidate = bench(BenchSpec(**FAST, optimizations=[parse_opt("vae-slicing")]), out=tmp_path)
    expected = speedups.between(storage.read_result(baseline), storage.read_result(candidate))
    assert expected.short and expected.coverage == pytest.approx(1 - 2 / 28) and "too few calls" in expected.text()
    said = f"within noise: too few calls ({expected.interval_text()})"
    code, text, err = cli("compare", baseline, candidate)
    assert code == 0 and said in _plain(text), err
    code, _, err = cli("report", tmp_path, "--out", tmp_path / "report.html")  # the table's rows, as report shows them
    cell = f"within noise: too few calls ({expected.interval_text(compact=True)})"  # a cell: without the calls needed
    assert code == 0 and cell in (tmp_path / "report.html").read_text(), err
