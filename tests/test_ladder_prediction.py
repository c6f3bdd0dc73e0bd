"""A ladder's rungs predicted before they run (runs/ladder_prediction.py): a range per rung from the spec alone, and
no range where the time leaves out a technique the rung runs. Nothing here is measured."""

from diffmeter.runs.ladder import plan
from diffmeter.runs.ladder_prediction import RungPrediction, predict_rungs
from diffmeter.runs.spec import BenchSpec

CPU_LADDER = ("scheduler", "compile", "half", "attention", "cache")


def test_every_timed_rung_gets_a_range_before_it_runs():
    rungs = plan(BenchSpec(model="tiny-sd", steps=4, device="cpu"), CPU_LADDER, 2, "default")
    found = {p.rung: p for p in predict_rungs(rungs)}
    assert set(found) == {rung.name for rung in rungs if rung.spec is not None}  # attention: skipped on CPU
    for name in ("baseline", "scheduler"):  # the sampler's time is its steps: timed
        low, high = found[name].expected_s
        assert 0 < found[name].lower_s <= low < high, name
        assert found[name].calibration and found[name].untimed is None
    assert found["scheduler"].expected_s[1] < found["baseline"].expected_s[1]  # 2 steps against 4
    for name in ("compile", "half", "cache"):  # compile on a CPU, and every rung that keeps it: no range
        assert found[name].expected_s is None and found[name].verdict(1.0) == "not timed", name
        assert "compile mode=default: on a CPU inductor runs the fused operators" in found[name].untimed, name
        assert any(item.startswith("compile mode=default: on a CPU") for item in found[name].left_out), name
    assert not any(item.startswith("deep-cache") for item in found["cache"].left_out)  # its shallow calls are timed


def test_a_rung_whose_technique_is_not_timed_has_no_range():
    rungs = plan(BenchSpec(model="tiny-sd", steps=2, device="cpu"), ("runtime",), None, "default")
    baseline, runtime = predict_rungs(rungs)
    assert baseline.expected_s is not None
    assert runtime.expected_s is None and "onnxruntime" in runtime.untimed
    assert runtime.verdict(1.0) == "not timed"


def test_the_verdict_places_the_measured_median():
    rung = RungPrediction("compile", expected_s=(2.0, 4.0), lower_s=1.0)
    assert rung.verdict(3.0) == "inside"
    assert rung.verdict(5.0) == "outside: 25% above the range"
    assert rung.verdict(1.5) == "outside: 25% below the range"
    assert rung.verdict(None) == "not measured"


def test_compile_is_timed_on_a_gpu_and_not_on_a_cpu():
    from diffmeter.predict.timed_techniques import CPU_COMPILE, why_untimed

    assert why_untimed("compile", {"mode": "default"}) is None
    assert why_untimed("compile", {"mode": "default"}, on_cpu=True) == CPU_COMPILE
