"""A ladder's rungs predicted before they run (runs/ladder_prediction.py): a range per rung from the spec alone, and
no range where the time leaves out a technique the rung runs. Nothing here is measured."""

from diffmeter.runs.ladder import plan
from diffmeter.runs.ladder_prediction import RungPrediction, predict_rungs
from diffmeter.runs.spec import BenchSpec

CPU_LADDER = ("scheduler", "compile", "half", "attention", "cache")
#: a compile mode a CPU runs that its compiled fit was not made with
AUTOTUNED = "max-autotune-no-cudagraphs"


def test_every_timed_rung_gets_a_range_before_it_runs():
    rungs = plan(BenchSpec(model="tiny-sd", steps=4, device="cpu"), CPU_LADDER, 2, "default")
    found = {p.rung: p for p in predict_rungs(rungs)}
    assert set(found) == {rung.name for rung in rungs if rung.spec is not None}  # attention: skipped on CPU
    for name in ("baseline", "scheduler"):  # the sampler's time is its steps: timed
        low, high = found[name].expected_s
        assert 0 < found[name].lower_s <= low < high, name
        assert found[name].calibration and found[name].untimed is None
    assert found["scheduler"].expected_s[1] < found["baseline"].expected_s[1]  # 2 steps against 4
    for name in ("compile", "half", "cache"):  # compile on a CPU: timed from the CPU's compiled fit
        low, high = found[name].expected_s
        assert 0 < found[name].lower_s <= low < high, name
        assert found[name].untimed is None and not found[name].left_out, name
        assert "benchmarks/roofline_cpu_variants.py" in found[name].calibration, name
    assert "(2 threads, compiled," in found["compile"].calibration  # its UNet by the float32 compiled fit
    assert "(2 threads, float32)" in found["compile"].calibration  # its text encoder and VAE by the float32 eager fit
    for name in ("half", "cache"):  # every call in bfloat16: the bfloat16 fits alone
        assert "compiled bfloat16" in found[name].calibration and "(2 threads, float32)" not in found[name].calibration
    assert found["cache"].expected_s[1] < found["half"].expected_s[1]  # DeepCache's shallow calls are timed
    autotuned = plan(BenchSpec(model="tiny-sd", steps=4, device="cpu"), ("compile",), None, AUTOTUNED)
    compiled = predict_rungs(autotuned)[1]
    assert compiled.expected_s is None and "only mode=default" in compiled.untimed


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


def test_compile_is_timed_on_a_gpu_and_on_a_cpu_in_the_mode_fitted_there():
    from diffmeter.predict.timed_techniques import why_untimed

    assert why_untimed("compile", {"mode": "default"}) is None
    assert why_untimed("compile", {"mode": "default"}, on_cpu=True) is None
    assert why_untimed("compile", {"mode": "reduce-overhead"}) is None
    assert "only mode=default" in why_untimed("compile", {"mode": "reduce-overhead"}, on_cpu=True)
