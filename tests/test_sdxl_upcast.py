"""SDXL's pipelines decode a float16 VAE in float32 (``force_upcast``): the plan, the memory prediction and the
operator count follow the real pipeline. On an H200, SDXL at 1024 px in float16 peaked 23% above the prediction
before this rule (benchmarks/results/gpu_validation_nvidia-h200.md, fourth session)."""

from __future__ import annotations

import pytest
import torch
from tiny_runs import tiny_call

from diffmeter.catalog import resolve
from diffmeter.families import VAE_DECODER
from diffmeter.loading import load_pipeline, locate_weights
from diffmeter.predict.memory import predict_memory, settled_plan
from diffmeter.predict.operators import operator_work
from diffmeter.predict.schema import VAE_DECODE
from diffmeter.spec import ProfileSpec


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

    def decode_bytes(dtype: str) -> int:
        work = operator_work(ProfileSpec(model="tiny-sdxl", dtype=dtype))
        return sum(g.bytes * g.calls * c.count for c in work.calls if c.stage == VAE_DECODE for g in c.operators)

    assert decode_bytes("float16") == decode_bytes("float32")
