"""`diffmeter table` and `diffmeter.load_results`: one tidy row per stored run, any depth, with the
speed-up against the unoptimized run of the same settings; CSV and Parquet round trips."""

import json
import math

import pandas
import pytest
import torch
from speedup_key import hodges_lehmann, per_image_times, rank_symmetric

import diffmeter
from diffmeter import units
from diffmeter.errors import DiffmeterError
from diffmeter.measure.speedup import Drift
from diffmeter.optimize.options import parse_opt
from diffmeter.runs import speedups
from diffmeter.runs.collect import COLUMNS
from diffmeter.runs.lifecycle import bench
from diffmeter.runs.spec import BenchSpec
from diffmeter.runs.storage import read_result

FAST = {"model": "tiny-sd", "steps": 1, "iterations": 2, "device": "cpu"}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A baseline, an optimized run compared with it, the same optimized run stored elsewhere
    without comparing, another batch size, and a failed run."""
    out = tmp_path_factory.mktemp("runs")
    bench(BenchSpec(**FAST), out=out / "study")
    fused = [parse_opt("fuse-qkv")]
    bench(BenchSpec(**FAST, optimizations=fused, compare_baseline=True), out=out / "study")
    bench(BenchSpec(**FAST, optimizations=fused), out=out / "elsewhere" / "deeper")
    bench(BenchSpec(**FAST, batch_size=2), out=out / "study")

    def exhaust(what, done, total):  # a CUDA OOM cannot happen on this CPU machine: raise the real type
        if what == "measuring":
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")

    with pytest.raises(DiffmeterError):
        bench(BenchSpec(**FAST, batch_size=4), out=out / "study", progress=exhaust)
    return out


def test_one_row_per_run_at_any_depth_with_units_and_speedups(runs):
    frame = diffmeter.load_results(runs)
    assert list(frame.columns) == list(COLUMNS) and len(frame) == 5
    complete = frame[frame.status == "complete"]
    assert (complete.weights == "tiny-random").all() and (complete.s_per_image > 0).all()
    shares = complete[["text_share", "denoise_share", "decode_share", "other_share"]].sum(axis=1)
    assert all(math.isclose(total, 1.0, rel_tol=1e-9) for total in shares)
    baseline = complete[(complete.optimizations == "") & (complete.batch == 1)].iloc[0]
    compared = complete[complete.folder.str.startswith("study") & (complete.optimizations == "fuse-qkv")].iloc[0]
    elsewhere = complete[complete.folder.str.startswith("elsewhere")].iloc[0]
    stored = read_result(runs / compared.folder)
    named = read_result(stored.speedup.baseline)  # the run's own --compare-baseline run
    assert named.folder == (runs / baseline.folder).resolve()
    # the answer key: the stored calls' per-image times, baseline over candidate, worked out apart from diffmeter
    base, fused = per_image_times(named.folder), per_image_times(runs / compared.folder)
    assert compared.speedup == pytest.approx(hodges_lehmann(base, fused), rel=1e-9)
    # fuse-qkv acts on the denoiser alone: where this busy machine moved the other stages, the interval is widened
    drift = speedups.machine_drift(named, stored) or Drift(low=1.0, high=1.0, note="")
    assert rank_symmetric(compared.speedup_ci_low / drift.low, compared.speedup_ci_high / drift.high, base, fused)
    assert compared.speedup_ci_low <= compared.speedup <= compared.speedup_ci_high
    assert compared.speedup_verdict == speedups.between(named, stored).verdict
    # matched in the table: the only unoptimized run of the same settings, by the same rule, said to be apart
    apart = per_image_times(runs / elsewhere.folder)
    assert elsewhere.speedup == pytest.approx(hodges_lehmann(base, apart), rel=1e-9)
    assert elsewhere.speedup_noise.endswith(f"baseline: stored apart, in {named.folder}")
    assert compared.identical_images == 2 or compared.psnr_db > 30  # fuse-qkv is lossless up to rounding
    batch2 = complete[complete.batch == 2].iloc[0]
    assert batch2.speedup == 1.0 and batch2.speedup_verdict == "baseline"  # an unoptimized run is its own baseline
    # 1x by definition, not a measured interval (a new user read "1.0-1.0, coverage 1.0" as one)
    assert pandas.isna(batch2.speedup_ci_low) and pandas.isna(batch2.speedup_coverage)
    (failed,) = frame[frame.status == "failed"].itertuples()
    assert "out of memory" in failed.error and math.isnan(failed.s_per_image) and failed.batch == 4
    assert math.isnan(failed.speedup)
    assert batch2.tflops_per_image == pytest.approx(baseline.tflops_per_image)


def test_a_160_column_table_keeps_the_quality_of_an_optimization_and_drops_empty_columns_first(runs):
    """PSNR/SSIM gave way before p90 and an all-dash energy column on a 160-column terminal."""
    from diffmeter.report.results_table import results_table

    frame = diffmeter.load_results(runs / "study")
    shown = [column.header for column in results_table(frame, "study").fitted(160).columns]
    assert "PSNR" in shown and "speed-up" in shown
    assert "J / image" not in shown and "MFU" not in shown  # a CPU study: no energy, no peak for MFU


@pytest.mark.parametrize(("seconds", "said"), [(0.4, True), (0.5, False), (0.502, False)])
def test_a_scaling_efficiency_over_100_percent_is_said_to_be_usually_noise_or_cache_effects(seconds, said):
    """2.5x on 2 processes read "125% of 2 processes" with no word on it; 1.99x (100% to the percent) needs none."""
    from diffmeter.distributed.scaling import line
    from diffmeter.runs.parallel_records import SUPERLINEAR, Scaling, StageScaling

    speedup = 1.0 / seconds
    stage = StageScaling(
        one_device_s_per_image=1.0, parallel_s_per_image=seconds, speedup=speedup, efficiency=speedup / 2
    )
    text = line(Scaling(processes=2, one_device_run="single", call=stage, denoising=stage))
    assert f"{speedup:.2f}x = {speedup / 2:.0%} of 2 processes" in text and (SUPERLINEAR in text) == said


def test_the_table_marks_a_superlinear_scaling_and_says_why_below(runs):
    from rich.console import Console

    from diffmeter.report.results_table import results_table
    from diffmeter.runs.parallel_records import SUPERLINEAR

    frame = diffmeter.load_results(runs / "study")
    frame = frame[frame.status == "complete"].reset_index(drop=True)
    parallel = {"processes": 2, "scaling_speedup": 2.5, "scaling_efficiency": 1.25, "scaling_verdict": "faster"}
    for column, value in parallel.items():
        frame.loc[0, column] = value
    console = Console(width=400, record=True)
    console.print(results_table(frame, "study"))
    text = " ".join(console.export_text().split())
    assert "2.50x = 125% of 2 (superlinear)" in text and SUPERLINEAR in text
    frame.loc[0, "scaling_efficiency"] = 0.9
    console.print(results_table(frame, "study"))
    assert console.export_text().count("superlinear") == 0


def test_a_baseline_is_never_compared_and_never_chosen_among_several_apart(runs, tmp_path):
    """A second unoptimized run of the same settings in another folder (another session) is its own baseline,
    not "faster" than the first; with two candidates apart, a run stored in a third folder gets no speed-up
    rather than an arbitrary one; a run beside one of them is compared with that one."""
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(runs, copy)
    bench(BenchSpec(**FAST), out=copy / "other")
    frame = diffmeter.load_results(copy)
    unoptimized = frame[(frame.optimizations == "") & (frame.batch == 1)]
    assert len(unoptimized) == 2 and (unoptimized.speedup_verdict == "baseline").all()
    (elsewhere,) = frame[frame.folder.str.startswith("elsewhere")].itertuples()
    assert math.isnan(elsewhere.speedup)
    bench(BenchSpec(**FAST, optimizations=[parse_opt("fuse-qkv")]), out=copy / "other")
    frame = diffmeter.load_results(copy)
    (beside,) = frame[frame.folder.str.startswith("other") & (frame.optimizations == "fuse-qkv")].itertuples()
    other = copy / frame[frame.folder.str.startswith("other") & (frame.optimizations == "")].folder.iloc[0]
    key = hodges_lehmann(per_image_times(other), per_image_times(copy / beside.folder))
    assert beside.speedup == pytest.approx(key, rel=1e-9)
    assert "stored apart" not in (beside.speedup_noise or "")


def test_csv_and_parquet_round_trip(runs, cli, tmp_path):
    frame = diffmeter.load_results(runs)
    code, out, _ = cli("table", runs, "--csv", tmp_path / "t.csv", "--parquet", tmp_path / "t.parquet")
    assert code == 0 and "5 rows written" in out
    from_csv = pandas.read_csv(tmp_path / "t.csv", keep_default_na=True)
    from_parquet = pandas.read_parquet(tmp_path / "t.parquet")
    pandas.testing.assert_frame_equal(from_parquet, frame)
    numeric = ["s_per_image", "speedup", "peak_rss_bytes", "batch", "tflops_per_image"]
    pandas.testing.assert_frame_equal(from_csv[numeric], frame[numeric], check_dtype=False)
    assert list(from_csv.folder) == list(frame.folder)


def test_where_and_sort_filter_the_table(runs, cli):
    code, out, _ = cli(
        "table", runs, "--json", "--where", "status == 'complete' and batch == 1", "--sort", "-s_per_image"
    )
    rows = json.loads(out)
    assert code == 0 and len(rows) == 3
    assert [row["s_per_image"] for row in rows] == sorted((row["s_per_image"] for row in rows), reverse=True)
    code, out, _ = cli("table", runs)
    assert code == 0 and "tiny-sd" in out and "(tiny)" in out and "failed" in out
    # the intervals' coverage, which their calls decide, beside them (it was only in --json)
    coverages = {row["speedup_coverage"] for row in json.loads(cli("table", runs, "--json")[1])}
    shown = sorted(found for found in coverages if found is not None)
    assert shown and f"coverage (how often such an interval holds the true factor): {shown[0]:.1%}" in " ".join(
        out.split()
    )


@pytest.mark.parametrize(
    "args, message",
    [
        (["--sort", "latency"], "--sort latency: no column 'latency'"),
        (["--where", "batch >>> 2"], "--where 'batch >>> 2'"),
        (["--where", "batch > 64"], "matches --where 'batch > 64'; loosen it"),
    ],
)
def test_bad_table_options_are_one_line(runs, cli, args, message):
    code, _, err = cli("table", runs, *args)
    assert code == 2 and message in " ".join(err.split()) and len(err.strip().splitlines()) == 1


def test_a_csv_path_that_cannot_be_a_file_is_one_line(runs, cli, tmp_path):
    """A folder, or a path under a file: one line each (both were tracebacks for a new user)."""
    (tmp_path / "afile").write_text("")
    for path, said in ((tmp_path, "is a folder: name a file in it"), (tmp_path / "afile" / "x.csv", "afile is not")):
        code, _, err = cli("table", runs, "--csv", path)
        assert code == 2 and said in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert (tmp_path / "afile").read_text() == "" and sorted(p.name for p in tmp_path.iterdir()) == ["afile"]


def test_a_folder_without_runs_says_so(cli, tmp_path):
    code, _, err = cli("table", tmp_path)
    assert code == 2 and "no stored runs" in err and "--where" not in err  # none was given
    code, out, err = cli("table", tmp_path, "--json")  # alike: it printed [] and exited 0 (a new user's trial)
    assert code == 2 and "no stored runs" in err and out == ""
    code, _, err = cli("table", tmp_path / "missing")
    assert code == 2 and "is not a folder" in err


def test_every_column_is_documented():
    from pathlib import Path

    documented = (Path(__file__).parents[1] / "docs" / "table.md").read_text()
    assert all(f"| `{name}` | {text} |" in documented for name, text in COLUMNS.items())


def test_a_copied_study_compares_with_its_own_baseline_not_the_original_it_names(runs, tmp_path):
    """A --compare-baseline run stores its baseline's path as it was given; in a copy of the study whose baseline
    was measured again, its speed-up is against the copy's baseline beside it (it read the original's)."""
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(runs / "study", copy)
    _, measured_again = bench(BenchSpec(**FAST), out=copy, force=True)
    frame = diffmeter.load_results(copy)
    (compared,) = frame[frame.optimizations == "fuse-qkv"].itertuples()
    assert read_result(copy / compared.folder).speedup.baseline.startswith(str(runs / "study"))
    fused = per_image_times(copy / compared.folder)
    key = hodges_lehmann(per_image_times(measured_again), fused)
    original = hodges_lehmann(per_image_times(runs / "study" / measured_again.name), fused)
    assert compared.speedup == pytest.approx(key, rel=1e-9) and compared.speedup != pytest.approx(original, rel=1e-9)
    assert compared.speedup_baseline == measured_again.name


def test_an_unreadable_result_is_skipped_and_named_and_files_are_ordinary(runs, cli, tmp_path):
    """One truncated results.json does not refuse the whole study (table and report name it and go on);
    the files table writes have the permissions of ordinary files (they were 0600 under umask 022)."""
    import os
    import shutil

    from diffmeter.report.html.study import read_study

    study = tmp_path / "study"
    shutil.copytree(runs / "study", study)
    (study / "broken").mkdir()
    (study / "broken" / "results.json").write_text('{"status": "comp')
    previous = os.umask(0o022)
    try:
        code, out, err = cli("table", study, "--csv", tmp_path / "t.csv")
    finally:
        os.umask(previous)
    assert code == 0 and "4 rows written" in out
    assert "skipped: " in out + err and "broken/results.json is not a readable diffmeter result" in out + err
    assert (tmp_path / "t.csv").stat().st_mode & 0o777 == 0o644
    read = read_study(study)
    assert len(read.runs) == 4 and len(read.skipped) == 1 and "broken" in read.skipped[0]
    with pytest.raises(DiffmeterError, match="broken/results.json is not a readable"):
        diffmeter.load_results(study)  # the Python API still refuses unless asked to skip
    assert len(diffmeter.load_results(study, skipped=[])) == 4
    code, out, err = cli("table", study, "--json")  # the skipped line beside the JSON, which stays parseable
    assert code == 0 and len(json.loads(out)) == 4 and "broken/results.json is not a readable" in err


def test_a_table_of_images_and_videos_shows_whole_frames_and_names_what_each_rate_counts(cli, tmp_path):
    """pandas turns a whole-number column with gaps into floats (a video's 9 frames read "9.0" beside an image
    run's none), and a video is not an image: a mixed table and report count outputs, each rate naming its kind."""
    from rich.console import Console

    from diffmeter.report.html.page import render
    from diffmeter.report.html.study import read_study
    from diffmeter.report.results_table import results_table

    bench(BenchSpec(**FAST), out=tmp_path)
    bench(BenchSpec(**{**FAST, "model": "tiny-cogvideox"}), out=tmp_path)
    frame = diffmeter.load_results(tmp_path)
    video = frame[frame.model == "tiny-cogvideox"].iloc[0]
    assert video.frames == 9 and frame.frames.isna().sum() == 1  # the image run has none
    code, out, _ = cli("table", tmp_path, "--json")
    assert code == 0 and sorted(row["frames"] for row in json.loads(out) if row["frames"]) == [9]
    assert '"frames": 9,' in out  # not 9.0
    console = Console(width=260, record=True)
    console.print(results_table(frame, "mixed"))
    text = console.export_text()
    assert "32x32x9f" in text and "9.0f" not in text
    assert "outputs / s (mean)" in text and "images / s" not in text and "s / output (median)" in text
    rates = {model: units.figure(rate) for model, rate in zip(frame.model, frame.images_per_s, strict=True)}
    assert f"{rates['tiny-cogvideox']} videos" in text and f"{rates['tiny-sd']} images" in text
    console = Console(width=260, record=True)
    console.print(results_table(frame[frame.model == "tiny-sd"], "images only"))
    assert "images / s (mean)" in console.export_text() and "outputs" not in console.export_text()
    page = render(read_study(tmp_path), "mixed")
    assert "<th>outputs / s (mean)</th>" in page and "images / s" not in page
    assert f">{rates['tiny-cogvideox']} videos</td>" in page and f">{rates['tiny-sd']} images</td>" in page


def test_a_ladder_rung_is_against_its_ladders_baseline_with_the_ladders_psnr(cli, tmp_path):
    """A rung's own results.json holds no quality (the ladder compares its images) and its baseline runs more steps:
    the table shows the ladder's PSNR/SSIM and says the speed-up is against the ladder's baseline, named."""
    from rich.console import Console

    from diffmeter.report.results_table import results_table
    from diffmeter.runs.ladder import climb, plan

    ladder = climb(plan(BenchSpec(**{**FAST, "steps": 2}), ("scheduler",), 1, "default"), tmp_path, recheck=False)
    baseline, rung = ladder.rows
    assert rung.quality is not None and read_result(rung.folder).quality is None
    frame = diffmeter.load_results(tmp_path)
    row = frame[frame.optimizations != ""].iloc[0]
    base = frame[frame.optimizations == ""].iloc[0]
    assert row.psnr_db == pytest.approx(rung.quality.mean_psnr_db) and row.ssim == pytest.approx(rung.quality.mean_ssim)
    assert row.speedup == pytest.approx(rung.speedup) and row.speedup_against == "ladder baseline"
    assert row.speedup_baseline == base.folder and base.steps == 2 and row.steps == 1
    assert base.speedup_verdict == "baseline" and pandas.isna(base.speedup_against)
    console = Console(width=400, record=True)
    console.print(results_table(frame, "ladder"))
    text = console.export_text()
    assert f"{rung.quality.mean_psnr_db:.2f} dB" in text and "(ladder)" in text
    assert f"(ladder): against the ladder's baseline, 2 steps, float32, no techniques: {base.folder}" in text


def test_a_rate_column_reads_alike_and_a_noise_note_says_its_latency_is_per_call(runs):
    """40.0 images/s was written "40" beside "37.9"; a batch-2 run's note quoted "median latency 33.93 ms" beside the
    per-image column (16.96 ms); "1 threads", "1 CPU cores"."""
    from diffmeter.measure.conditions import Conditions, Range
    from diffmeter.report import outputs
    from diffmeter.runs.summary import measurement_notes

    assert [outputs.rate(value, False, False) for value in (40.0, 37.9, 0.4651)] == ["40.00", "37.90", "0.465"]
    (folder,) = [path for path in (runs / "study").iterdir() if "+batch-2+" in path.name]
    summary = read_result(folder).summary
    median = summary.latency_s.median
    wide = summary.latency_s.model_copy(update={"ci_low": median * 0.8, "ci_high": median * 1.2})  # +-20%: noisy
    notes = measurement_notes(summary.model_copy(update={"latency_s": wide, "conditions": None}), 0)
    (note,) = [note for note in notes if note.startswith("noisy:")]
    per_image = units.seconds(median / 2)
    assert f"median call latency {units.seconds(median)} (2 images per call: {per_image} per image)" in note
    assert note.endswith("measure longer with --target-precision 0.02 on a quieter machine")
    # a target asked and not reached: the note advised the very option that had just failed
    asked = summary.model_copy(update={"latency_s": wide, "conditions": None, "target_precision": 0.05})
    notes = measurement_notes(asked, 0)
    assert any(note.startswith("--target-precision 0.05 not reached") for note in notes)
    (note,) = [note for note in notes if note.startswith("noisy:")]
    assert note.endswith("measure longer with more calls (--max-iterations) on a quieter machine")
    assert units.counted(1, "thread") == "1 thread" and units.counted(3, "profile") == "3 profiles"
    busy = Conditions(samples=3, cpu_count=1, other_processes_cores=Range(mean=0.9, min=0.8, max=1.0))
    assert "used 0.9 of 1 CPU core on average" in busy.disturbed()


def test_the_report_counts_a_failed_run_in_words_and_scales_compute_to_a_unit(runs, tmp_path):
    """The report of a study with one failed run: "1 failed run" (was "1 failed runs"); each run's compute per image
    in a unit (was a bare 0.0003726 under "TFLOPs"), sorted by its TFLOPs."""
    import re

    from diffmeter.report.html import write_report

    page = write_report(runs, tmp_path / "r.html", "t", images_per_run=0).read_text()
    assert "1 failed run listed in the summary" in page and "1 failed runs" not in page
    baseline = diffmeter.load_results(runs).query("status == 'complete'").tflops_per_image.iloc[0]
    cell = re.search(rf'data-value="{re.escape(str(baseline))}">([^<]+)</td>', page)
    assert cell is not None and cell[1] == units.flops(baseline * 1e12) and cell[1].endswith("FLOPs")


def test_the_reports_pareto_frontier_joins_runs_of_one_output_size_only(runs, tmp_path):
    """A smaller image is another product, not a faster setting: with two sizes of one model, each size has its own
    frontier, named by its size (one line joined the 32, 48 and 64 px runs, a new user's finding)."""
    import shutil

    from diffmeter.report.html.study import read_study
    from diffmeter.report.html.tradeoff_plots import tradeoffs

    study = tmp_path / "study"
    shutil.copytree(runs / "study", study)
    _, small = bench(BenchSpec(**FAST, height=16, width=16), out=study)
    memory = next(f for f in tradeoffs(read_study(study)) if f.figure.layout.title.text.startswith("Peak memory"))
    lines = {trace.name: trace for trace in memory.figure.data if trace.name.endswith("Pareto frontier")}
    frame = diffmeter.load_results(study, skipped=[]).query("status == 'complete'")
    sizes = {f"{row.width}x{row.height}" for row in frame.itertuples()}
    assert len(sizes) == 2 and set(lines) == {f"tiny-sd at {size}: Pareto frontier" for size in sizes}
    (only,) = lines["tiny-sd at 16x16: Pareto frontier"].x  # its one run: not joined to the larger ones
    assert only == frame[frame.folder == small.name].s_per_image.item()


def test_a_run_of_other_settings_is_not_sped_up_against_a_baseline_and_says_its_settings(cli, tmp_path):
    """True CFG (two denoiser calls a step) and a shorter text are other generations: a fused run of either is not
    compared with the plain baseline, whose settings the table's columns showed alike (a new user read "33.3x
    faster"); the same fused run at the baseline's settings is, and the table names what tells them apart."""
    flux = {"model": "tiny-flux", "steps": 1, "iterations": 2, "device": "cpu"}
    fused = [parse_opt("fuse-qkv")]
    bench(BenchSpec(**flux), out=tmp_path)
    bench(BenchSpec(**flux, optimizations=fused, true_cfg_scale=4.0), out=tmp_path)
    bench(BenchSpec(**flux, optimizations=fused, max_sequence_length=16), out=tmp_path)
    bench(BenchSpec(**flux, optimizations=fused), out=tmp_path)
    frame = diffmeter.load_results(tmp_path).set_index("settings")
    assert pandas.isna(frame.loc["true-cfg-4"].speedup_against) and math.isnan(frame.loc["true-cfg-4"].speedup)
    assert math.isnan(frame.loc["max-sequence-length-16"].speedup)
    plain = frame.loc[""]
    compared = plain[plain.optimizations == "fuse-qkv"].iloc[0]
    assert compared.speedup_against == "same settings" and compared.speedup > 0
    code, out, _ = cli("table", tmp_path)
    assert code == 0 and "other settings" in out and "true-cfg-4" in out and "max-sequence-length-16" in out
