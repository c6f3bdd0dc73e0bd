"""What bench stores of the offline prediction beside its measurements, and what show and the report say of the two."""

from __future__ import annotations

import json

import pytest

from diffmeter import units
from diffmeter.predict.operators import operator_work
from diffmeter.runs.lifecycle import bench
from diffmeter.runs.spec import BenchSpec


@pytest.fixture(scope="module")
def predicted_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("predicted")
    spec = BenchSpec(model="tiny-sd", iterations=2, save_images=False, optimizations=[{"name": "vae-tiling"}])
    return bench(spec, out=out)


def test_bench_stores_the_prediction_beside_the_measurements(predicted_run):
    result, folder = predicted_run
    prediction = result.prediction
    assert prediction.memory_techniques == ["vae-tiling"]
    assert prediction.peak_memory_bytes > 0
    time = prediction.time
    assert time.device.startswith("CPU") and time.dtype == "float32"
    # a lower bound: never above the fastest measured call, stage by stage
    for stage in time.stages:
        assert stage.lower_s <= result.summary.stages_s[stage.stage].min
    assert time.lower_s <= result.summary.latency_s.min
    assert prediction.time_left_out == []  # the decode is counted as the tiled decode runs it
    stored = json.loads((folder / "results.json").read_text())
    assert stored["prediction"]["time"]["lower_s"] == pytest.approx(time.lower_s)


def test_show_prints_predicted_against_measured(predicted_run, cli):
    _, folder = predicted_run
    code, out, _ = cli("show", folder)
    assert code == 0
    assert "predicted peak memory with vae-tiling" in out
    assert "predicted time per call on CPU" in out and "without vae-tiling" not in out


def test_no_predict_leaves_it_out(tmp_path, cli):
    code, _, err = cli(
        "bench", "tiny-sd", "--iterations", "1", "--no-save-images", "--no-predict", "--out", tmp_path, "-q"
    )
    assert code == 0, err
    (results,) = tmp_path.glob("*/results.json")
    assert json.loads(results.read_text())["prediction"] is None


def test_a_traced_run_calibrates_fractions_below_one(tmp_path):
    from diffmeter.measure.calibrate import calibrate, stage_measurements
    from diffmeter.predict.roofline import FlopRates, lower_bounds

    spec = BenchSpec(model="tiny-sd", iterations=2, save_images=False, trace=True)
    result, _ = bench(spec, out=tmp_path)
    measured = stage_measurements(result)
    assert set(measured) == {"text_encoding", "denoising", "vae_decode"}
    for stage, found in measured.items():  # the traced call's operators and the rest, scaled to the median
        assert sum(found.kinds_s.values()) + found.outside_s == pytest.approx(found.median_s, rel=0.02), stage
    time = result.prediction.time
    lower = lower_bounds(
        operator_work(result.spec.profile_spec()), FlopRates(time.peak_tflops * 1e12), time.bandwidth_bytes_per_s
    )
    calibration = calibrate([(measured, lower)], "test")
    # a lower bound is never beaten: no kind reaches more than its whole roofline
    assert all(0 < low <= high <= 1 for low, high in calibration.fractions.values()), calibration.fractions
    assert calibration.overhead_s[0] > 0
    # the run's own eager bound per operator: a prediction of smaller operators is outside what it was fitted on
    kinds = [figures for stage in lower.values() for figures in stage.values()]
    per_operator = sum(seconds for seconds, _ in kinds) / sum(count for _, count in kinds)
    assert calibration.least_bound_per_operator_s == pytest.approx(per_operator)


def test_a_prediction_that_cannot_be_made_is_a_note_and_the_run_is_kept(tmp_path, monkeypatch):
    # Lumina-Image-2.0 reads its caption mask as Python numbers: with no room for the mask's values in the fake
    # run (predict/fake_run.py), the prediction fails for real, as any data-dependent path it cannot follow would
    monkeypatch.setattr("diffmeter.predict.fake_run.HOST_VALUES_LIMIT", 0)
    monkeypatch.setenv("DIFFMETER_CACHE_DIR", "off")
    result, folder = bench(BenchSpec(model="tiny-lumina2", iterations=1, save_images=False), out=tmp_path)
    assert result.status == "complete" and result.prediction is None
    assert any(note.startswith("no prediction: ") and "lumina2" in note for note in result.notes), result.notes
    assert json.loads((folder / "results.json").read_text())["summary"]["iterations"] == 1


def test_show_says_where_the_measured_median_lies_against_the_expected_range(predicted_run):
    """Inside or outside by the median against the range (it said "inside" for a median above the range whose
    interval overlapped it), and the interval's verdict said apart: held against ranges placed around this
    run's own measured median and interval, the percentages worked by hand from them."""
    from diffmeter.report.prediction_lines import against_expected, prediction_lines

    result, _ = predicted_run
    latency = result.summary.latency_s
    bounds = f"({units.seconds_range(latency.ci_low, latency.ci_high)})"
    inside = against_expected(result, (latency.median / 2, latency.median * 2))
    assert (
        inside == f", inside the expected range; its {100 * latency.ci_level:.0f}% interval {bounds} overlaps the range"
    )
    assert latency.ci_low < latency.median
    top = (latency.ci_low + latency.median) / 2  # under the median, above the interval's low end
    above = against_expected(result, (top / 2, top))
    assert above.startswith(f", outside the expected range (above it by {100 * (latency.median / top - 1):.0f}%); ")
    assert above.endswith(f"{bounds} overlaps the range")
    wholly_above = against_expected(result, (latency.ci_low / 8, latency.ci_low / 4))
    assert wholly_above.startswith(", outside the expected range (above it by ")
    assert wholly_above.endswith("lies wholly above the range")
    bottom = (latency.median + latency.ci_high) / 2  # above the median, under the interval's high end
    below = against_expected(result, (bottom, bottom * 2))
    under = f"{100 * (1 - latency.median / bottom):.0f}%"
    assert below.startswith(f", outside the expected range (below it by {under}); ") and "wholly" not in below
    assert against_expected(result, (latency.ci_high * 2, latency.ci_high * 3)).endswith("lies wholly below the range")
    assert against_expected(result, None) == ""
    verdict = against_expected(result, result.prediction.time.expected_s)
    assert any(verdict in line for line in prediction_lines(result))


def test_a_stage_measured_under_its_lower_bound_is_flagged_in_show_and_the_report(predicted_run, cli, tmp_path):
    """A stage faster than its roofline lower bound (a CPU VAE decode 19.3 s against a 20.9 s bound, from peaks
    measured while the CPU was busy) was shown without a word: the bound placed 25% above the measured median
    (median / 0.8) reads "20% under" in show and in the report's caption; the bounds as predicted flag nothing."""
    import shutil

    result, folder = predicted_run
    copy = tmp_path / "study" / folder.name
    shutil.copytree(folder, copy)
    stored = json.loads((copy / "results.json").read_text())
    median = result.summary.stages_s["vae_decode"].median
    (decode,) = [stage for stage in stored["prediction"]["time"]["stages"] if stage["stage"] == "vae_decode"]
    decode["lower_s"] = median / 0.8
    (copy / "results.json").write_text(json.dumps(stored))
    flag = f"vae decode {units.seconds(median)} against {units.seconds(median / 0.8)} (20% under)"
    code, out, err = cli("show", folder)
    assert code == 0, err
    assert "under the roofline lower bound" not in out
    code, out, err = cli("show", copy)
    assert code == 0, err
    assert "measured under the roofline lower bound: " + flag in " ".join(out.split())
    report = tmp_path / "report.html"
    code, _, err = cli("report", tmp_path / "study", "--out", report)
    assert code == 0, err
    assert "Measured under the roofline lower bound" in report.read_text() and flag in report.read_text()


def test_a_quantized_runs_prediction_names_the_format_as_its_optimizations_line_does(tmp_path, cli):
    """The prediction line said "with quantize-torchao-int8wo" (the memory model's own name) under "optimizations:
    torchao-int8wo"; show reads the stored run without torch, so the names are mapped without it."""
    code, out, err = cli(
        "bench", "tiny-sd", "--steps", "1", "--iterations", "1", "--quantize", "torchao:int8wo", "--no-save-images",
        "--out", tmp_path,
    )  # fmt: skip
    assert code == 0, err
    said = " ".join(out.split())
    assert "optimizations: torchao-int8wo (lossy)" in said
    assert "predicted peak memory with torchao-int8wo:" in said and "quantize-torchao" not in said
    (folder,) = tmp_path.iterdir()
    stored = json.loads((folder / "results.json").read_text())
    assert stored["prediction"]["memory_techniques"] == ["quantize-torchao-int8wo"]  # the JSON keeps the model's


def test_bench_measures_the_weights_as_stored_and_holds_the_prediction_to_them(tmp_path, cli):
    """The profile's ``param_bytes`` are the unquantized weights at the run's dtype; what a quantized run's weights
    occupy after loading is measured from their storages, and the prediction of them is held to it exactly."""
    code, out, err = cli(
        "bench", "tiny-flux", "--steps", "1", "--iterations", "1", "--quantize", "quanto:int8",
        "--opt", "fp8-text-encoder", "--no-save-images", "--out", tmp_path,
    )  # fmt: skip
    assert code == 0, err
    (folder,) = tmp_path.iterdir()
    stored = json.loads((folder / "results.json").read_text())
    measured = stored["summary"]["peak_memory"]["weights_bytes"]
    assert measured == stored["prediction"]["weights_bytes"]
    unquantized = {c["name"]: c["param_bytes"] for c in stored["profile"]["components"]}
    assert measured["transformer"] < unquantized["transformer"] and measured["vae"] == unquantized["vae"]
    said = " ".join(out.split())
    assert f"weights after loading: {units.gib(sum(measured.values()))} as stored" in said
    assert "measured after loading (exact)" in said
