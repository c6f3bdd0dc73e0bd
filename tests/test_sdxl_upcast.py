"""SDXL's pipelines decode a float16 VAE in float32 (``force_upcast``): the plan, the memory prediction and the
operator count follow the real pipeline. On an H200, SDXL at 1024 px in float16 peaked 23% above the prediction
before this rule (benchmarks/results/gpu_validation_nvidia-h200.md, fourth session)."""

from __future__ import annotations

import json

import pytest
import torch
from tiny_runs import tiny_call

from diffmeter.catalog import resolve
from diffmeter.families import VAE_DECODER
from diffmeter.loading import load_pipeline
from diffmeter.predict.devices import Device
from diffmeter.predict.memory import predict_memory, settled_plan
from diffmeter.predict.operators import operator_work
from diffmeter.predict.roofline import predict_time
from diffmeter.predict.schema import VAE_DECODE
from diffmeter.predict.techniques import peak_under, stage_peaks_under
from diffmeter.spec import ProfileSpec
from diffmeter.weights import locate_weights


def decode_dtype(spec: ProfileSpec) -> str | None:
    _, _, plan = settled_plan(spec)
    (decode,) = [call for call in plan if call.role == VAE_DECODER]
    return decode.dtype


def test_the_real_float16_sdxl_pipeline_decodes_in_float32_as_the_plan_says():
    """The tiny SDXL pipeline at float16, run for real on the CPU: the VAE's weights and the latents it decodes are
    float32 inside ``decode``, and the VAE is float16 again after the call."""
    entry = resolve("tiny-sdxl")
    pipe = load_pipeline(entry, locate_weights(entry, False), torch.device("cpu"), "float16")
    pipe, call, settings = tiny_call(entry, pipe=pipe, steps=1)
    seen = []
    decode = pipe.vae.decode

    def watched(z, *args, **kwargs):
        seen.append((z.dtype, pipe.vae.decoder.conv_in.weight.dtype))
        return decode(z, *args, **kwargs)

    pipe.vae.decode = watched
    call()
    assert seen == [(torch.float32, torch.float32)] and pipe.vae.dtype == torch.float16
    assert decode_dtype(ProfileSpec(model="tiny-sdxl", dtype="float16", **settings)) == "float32"


def test_only_a_float16_sdxl_vae_that_asks_for_it_is_upcast():
    assert decode_dtype(ProfileSpec(model="sdxl", dtype="float16")) == "float32"  # the config: force_upcast true
    assert decode_dtype(ProfileSpec(model="sdxl", dtype="bfloat16")) is None  # needs_upcasting: float16 only
    assert decode_dtype(ProfileSpec(model="sd15", dtype="float16")) is None  # StableDiffusionPipeline never does
    assert decode_dtype(ProfileSpec(model="sdxl", dtype="float16", component_dtypes=(("vae", "float32"),))) is None


def test_the_config_can_turn_the_upcast_off(monkeypatch):
    """A VAE whose config says force_upcast false (the fp16-fix VAEs) decodes in float16."""
    entry = resolve("tiny-sdxl")
    vae = entry.components["vae"]
    fixed = vae.model_copy(update={"config": {**vae.config, "force_upcast": False}})
    changed = entry.model_copy(update={"components": {**entry.components, "vae": fixed}})
    monkeypatch.setattr("diffmeter.predict.memory.entry_of", lambda spec: changed)
    assert decode_dtype(ProfileSpec(model="tiny-sdxl", dtype="float16")) is None


@pytest.mark.slow
def test_the_float16_decode_is_predicted_and_counted_as_the_float32_one():
    """Memory: during the decode the VAE's weights are float32 (the other components' stay float16) and its
    activations are the float32 pipeline's; operators: the same bytes as the float32 decode."""
    half = predict_memory(ProfileSpec(model="tiny-sdxl", dtype="float16"), on_cuda=True)
    full = predict_memory(ProfileSpec(model="tiny-sdxl", dtype="float32"), on_cuda=True)
    (decode,) = [stage for stage in half.stages if stage.stage == VAE_DECODE]
    (decode32,) = [stage for stage in full.stages if stage.stage == VAE_DECODE]
    vae16, vae32 = half.component_param_bytes["vae"], full.component_param_bytes["vae"]
    assert vae32 == 2 * vae16 and decode.component_param_bytes == vae32
    assert decode.resident_param_bytes == sum(half.component_param_bytes.values()) - vae16 + vae32
    assert decode.activation_bytes == pytest.approx(decode32.activation_bytes, rel=1e-9)
    # the stage says so, and the table's call names it (a new user's trial: the parameters rose at the decode unsaid)
    assert decode.cast_to == "float32" and decode32.cast_to is None
    assert {stage.cast_to for stage in half.stages if stage.stage != VAE_DECODE} == {None}
    from rich.console import Console

    from diffmeter.report.memory_table import memory_table

    console = Console(width=200, record=True)
    console.print(memory_table(half, None))
    assert "vae (batch 1, cast to float32)" in console.export_text()
    # what fit, "left" and bench's stored prediction read: the same peak, the upcast VAE counted as the stages count it
    assert peak_under(half, ()) == half.peak_bytes
    with_offload = stage_peaks_under(half, ("offload-model",))[VAE_DECODE]
    assert with_offload == vae32 + decode.carried_bytes + decode.activation_bytes

    def decode_bytes(dtype: str) -> int:
        work = operator_work(ProfileSpec(model="tiny-sdxl", dtype=dtype))
        return sum(g.bytes * g.calls * c.count for c in work.calls if c.stage == VAE_DECODE for g in c.operators)

    assert decode_bytes("float16") == decode_bytes("float32")


def test_the_float16_decode_is_timed_at_float32s_peaks():
    """The time model charges each call at the dtype it runs at: the float16 run's decode at TF32 for its
    convolutions and matmuls (a bench's TF32 default), float32 for the rest, the UNet at float16. On the H200 the
    decode took 0.116 s against 0.041-0.061 s expected at the float16 peak (gpu_calibration_nvidia-h200.jsonl)."""
    work = operator_work(ProfileSpec(model="tiny-sdxl", dtype="float16"))
    assert {call.dtype for call in work.calls if call.stage == "vae_decode"} == {"float32"}
    assert {call.dtype for call in work.calls if call.stage != "vae_decode"} == {"float16"}
    # a card whose memory is so fast that every operator is bound by its FLOPs
    card = Device(
        name="card",
        memory_bytes=None,
        bandwidth_bytes_per_s=1e30,
        tflops={"fp16": 100, "tf32": 10, "fp32": 1},
        source="",
    )

    def seconds(stage: str, tflops_of_kind) -> float:
        operators = [(g, c.count) for c in work.calls if c.stage == stage for g in c.operators]
        return sum(g.flops * g.calls * count / (tflops_of_kind(g.kind) * 1e12) for g, count in operators)

    lower = {stage.stage: stage.lower_s for stage in predict_time(work, card).stages}
    tf32 = seconds("vae_decode", lambda kind: 10 if kind in ("matmul", "convolution") else 1)
    assert lower["vae_decode"] == pytest.approx(tf32) and lower["denoising"] == pytest.approx(
        seconds("denoising", lambda _: 100)
    )
    strict = predict_time(work, card, fp32_math={"matmul": "ieee", "convolution": "ieee"})  # bench --no-tf32
    assert {s.stage: s.lower_s for s in strict.stages}["vae_decode"] == pytest.approx(
        seconds("vae_decode", lambda _: 1)
    )
    assert tf32 < seconds("vae_decode", lambda _: 1)


def test_a_cpu_prediction_measures_the_peak_of_every_dtype_a_call_runs_at(cli):
    """``--gpu cpu`` measures this CPU's matmul rate at float16 and at float32, for the float32 decode."""
    code, out, err = cli("profile", "tiny-sdxl", "--dtype", "float16", "--gpu", "cpu", "--json")
    assert code == 0, err
    time = json.loads(out)["time"]
    assert time is not None and [s["stage"] for s in time["stages"]] == ["text_encoding", "denoising", "vae_decode"]
    # the float32 decode's peaks, and the float16 UNet's convolutions at the rate measured on convolutions
    vae = [line for line in time["other_peaks"] if line.startswith("vae in float32: ")]
    assert len(vae) == 1 and "convolution at" in vae[0]
    assert all(line in vae or "(measured on convolutions)" in line for line in time["other_peaks"])
