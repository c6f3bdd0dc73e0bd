"""The CPU calibration's bfloat16 and compiled fits (``Calibration.variants``, written by
benchmarks/roofline_cpu_variants.py): each call priced by the fit of its dtype and compilation at the peaks of its
dtype, no range where a call's variant has no fit, one fit for every call where a calibration has no variants (CUDA's),
and compile timed on a CPU from the CPU's compiled fit, mode=default alone. Nothing here is measured: the device and
the fits are made up, the work counted on a tiny SD pipeline."""

from __future__ import annotations

import pytest

from diffmeter.measure.calibrate import POOL, StageMeasurement, calibrate, pooled
from diffmeter.predict.calibration import Calibration, calibrations, variant_name
from diffmeter.predict.compiled_time import FUSED_KINDS, compiled_work
from diffmeter.predict.devices import Device
from diffmeter.predict.operators import operator_work
from diffmeter.predict.roofline import predict_time
from diffmeter.predict.timed_techniques import why_untimed
from diffmeter.spec import ProfileSpec

#: a CPU whose bfloat16 peaks are 4x its float32 ones, and whose copies cost nothing (the bounds are the FLOPs')
CPU = Device(
    name="cpu",
    kind="cpu",
    memory_bytes=None,
    bandwidth_bytes_per_s=1e30,
    tflops={"fp32": 0.2, "conv-fp32": 0.3, "bf16": 0.8, "conv-bf16": 1.2},
    source="",
)
#: FLOP/s per (dtype, kind) of ``CPU``
RATE = {("float32", "convolution"): 0.3e12, ("bfloat16", "convolution"): 1.2e12, "float32": 0.2e12, "bfloat16": 0.8e12}


def fit(fraction: float) -> Calibration:
    return Calibration(
        source=f"fit at {fraction}",
        fractions={"other": (fraction, fraction)},
        overhead_s=(0.0, 0.0),
        fitted_tflops=dict(CPU.tflops),
    )


def cpu_fit(**variants: Calibration) -> Calibration:
    return fit(1.0).model_copy(update={"variants": {name.replace("_", " "): f for name, f in variants.items()}})


def bound_s(work, stage: str) -> float:
    """The stage's FLOPs at the peak of each call's dtype and each operator's kind (copies are free on ``CPU``)."""
    return sum(
        g.flops * g.calls * c.count / RATE.get((c.dtype or work.dtype, g.kind), RATE[c.dtype or work.dtype])
        for c in work.calls
        if c.stage == stage
        for g in c.operators
    )


@pytest.fixture(scope="module")
def bf16_compiled():
    """tiny-sd in bfloat16 with its UNet compiled, as the CPU ladder's half rung runs SD 1.5."""
    return compiled_work(operator_work(ProfileSpec(model="tiny-sd", steps=2, dtype="bfloat16")), ("unet",))


def test_a_call_is_named_by_its_dtype_and_whether_it_is_compiled():
    assert variant_name("float32", False) == ""
    assert variant_name("bfloat16", False) == "bfloat16"
    assert variant_name("float32", True) == "compiled"
    assert variant_name("bfloat16", True) == "compiled bfloat16"


def test_each_call_is_priced_by_its_variants_fit_at_its_dtypes_peaks(bf16_compiled):
    assert {c.compiled for c in bf16_compiled.calls if c.component == "unet"} == {True}
    assert not any(c.compiled for c in bf16_compiled.calls if c.component != "unet")
    calibration = cpu_fit(bfloat16=fit(0.5), compiled_bfloat16=fit(0.25), compiled=fit(0.125))
    time = predict_time(bf16_compiled, CPU, calibration=calibration)
    stages = {stage.stage: stage for stage in time.stages}
    for stage, fraction in (("text_encoding", 0.5), ("denoising", 0.25), ("vae_decode", 0.5)):
        bound = bound_s(bf16_compiled, stage)
        assert bound > 0 and stages[stage].lower_s == pytest.approx(bound), stage
        assert stages[stage].expected_s == pytest.approx((bound / fraction, bound / fraction)), stage
    assert "fit at 0.5" in time.calibration and "fit at 0.25" in time.calibration
    assert "fit at 1.0" not in time.calibration and "fit at 0.125" not in time.calibration  # not used
    # the same work in float32: the float32 eager fit, at float32's peaks, and the compiled fit for the UNet
    fp32 = compiled_work(operator_work(ProfileSpec(model="tiny-sd", steps=2, dtype="float32")), ("unet",))
    stages = {stage.stage: stage for stage in predict_time(fp32, CPU, calibration=calibration).stages}
    assert stages["text_encoding"].expected_s == pytest.approx((bound_s(fp32, "text_encoding"),) * 2)
    assert stages["denoising"].expected_s == pytest.approx((bound_s(fp32, "denoising") / 0.125,) * 2)
    assert bound_s(fp32, "denoising") == pytest.approx(4 * bound_s(bf16_compiled, "denoising"), rel=0.2)


def test_a_call_whose_variant_has_no_fit_gets_no_range_and_says_which(bf16_compiled):
    time = predict_time(bf16_compiled, CPU, calibration=cpu_fit(bfloat16=fit(0.5)))
    assert time.expected_s is None and all(stage.expected_s is None for stage in time.stages)
    assert "no fit for compiled bfloat16 calls" in time.calibration
    assert time.lower_s == pytest.approx(sum(bound_s(bf16_compiled, s.stage) for s in time.stages))
    fp16 = operator_work(ProfileSpec(model="tiny-sd", steps=2, dtype="float16"))
    cpu = CPU.model_copy(update={"tflops": {**CPU.tflops, "fp16": 0.4, "conv-fp16": 0.4}})
    assert "no fit for float16 calls" in predict_time(fp16, cpu, calibration=cpu_fit(bfloat16=fit(0.5))).calibration


def test_a_calibration_without_variants_prices_every_call_alike(bf16_compiled):
    """CUDA's calibrations are fitted on eager runs at any dtype, compile modelled as a change of the work."""
    time = predict_time(bf16_compiled, CPU, calibration=fit(0.5))
    for stage in time.stages:
        assert stage.expected_s == pytest.approx((stage.lower_s / 0.5,) * 2), stage.stage


def test_a_compiled_calls_generated_loops_are_fitted_as_one_kind():
    """A compiled call's fused operators run inside one traced CompiledFxGraph call: the fit pools their kinds."""
    measured = {
        "denoising": StageMeasurement(
            median_s=10.0, min_s=9.0, kinds_s={"matmul": 4.0, "other": 5.0, "elementwise": 0.5}, outside_s=0.5
        )
    }
    lower = {"denoising": {"matmul": [2.0, 10], "elementwise": [0.5, 20], "normalization": [0.5, 5]}}
    merged_measured, merged_lower = pooled(measured, lower, FUSED_KINDS)
    assert merged_lower == {"denoising": {"matmul": [2.0, 10], POOL: [1.0, 25]}}
    assert merged_measured["denoising"].kinds_s == {"matmul": 4.0, POOL: 5.5}
    fitted = calibrate([(merged_measured, merged_lower)], "t")
    assert fitted.fractions["matmul"] == (0.5, 0.5) and fitted.fractions[POOL] == pytest.approx((1 / 5.5,) * 2)
    assert fitted.overhead_s == pytest.approx((0.5 / 35,) * 2)


def test_compile_is_timed_on_a_cpu_from_the_shipped_compiled_fit_in_its_fitted_mode_alone():
    shipped = calibrations()["cpu"]
    assert {"bfloat16", "compiled", "compiled bfloat16"} <= set(shipped.variants)
    for name, variant in shipped.variants.items():
        assert "benchmarks/roofline_cpu_variants.py" in variant.source, name
        assert "SD 1.5 at 256 px is in no run of this fit" in variant.source, name
        assert {"bf16", "conv-bf16", "fp32", "conv-fp32"} <= set(variant.fitted_tflops), name
        assert all(0 < low <= high for low, high in variant.fractions.values()), name
    assert why_untimed("compile", {"mode": "default"}, on_cpu=True) is None
    assert "only mode=default" in why_untimed("compile", {"mode": "max-autotune-no-cudagraphs"}, on_cpu=True)
    assert why_untimed("compile", {"mode": "default", "backend": "eager"}, on_cpu=True).startswith("the eager")
