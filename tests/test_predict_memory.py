"""Predicted peak memory (fake tensors under MemTracker) against the real CPU run's profiler timeline."""

from __future__ import annotations

import pytest
import torch
from tiny_runs import TINY, quick_or_slow, tiny_call, token_settings

from diffmeter.catalog import resolve
from diffmeter.families import Call
from diffmeter.loading import load_pipeline
from diffmeter.measure.memory_timeline import measure_stage_peaks
from diffmeter.predict.devices import CUDA_HOLDBACK_BYTES, named_gpu
from diffmeter.predict.memory import (
    STAGE_OF_ROLE,
    cached_memory,
    fake_copy,
    param_bytes,
    predict_memory,
    settled_plan,
    track_call,
)
from diffmeter.predict.memory_checks import memory_check
from diffmeter.predict.operators import operator_work, predict_memory_and_work
from diffmeter.predict.schema import DENOISING_STEP, TEXT_ENCODING, VAE_DECODE
from diffmeter.report.memory_table import fit_table, memory_table
from diffmeter.spec import ProfileSpec
from diffmeter.weights import locate_weights

#: one tiny pipeline of every family predict/data/memory_checks.json calls checked: the claim shown beside their
#: predictions is held here (a UNet, MMDiTs, DiTs with cross-attention, video DiTs with causal video VAEs, ...)
CHECKED = sorted(
    {
        entry.family: entry.name
        for entry in reversed(TINY)
        if "checked:" in memory_check(entry.family) and not entry.defaults.image_sizes  # text alone: the family check
    }.values()
)
#: families whose models read their masks' values (predict/fake_run.py): predicted, not yet within 2%
HOST_MASKS = ["tiny-lumina2", "tiny-hunyuanimage", "tiny-hunyuanvideo15", "tiny-qwenimage21"]


def measured(name: str, guidance_scale: float | None = None):
    entry = resolve(name)
    pipe, call, settings = tiny_call(entry, guidance_scale=guidance_scale)
    spec = ProfileSpec(model=name, **settings, **token_settings(entry, pipe))
    _, _, plan = settled_plan(spec)
    # every component of the plan is resident, called or not (HunyuanImage's ByT5 without quoted text)
    # keyed by component and method: a VAE that encodes an input image also decodes the output
    components = {(c.component, c.method): (getattr(pipe, c.component), c.method, STAGE_OF_ROLE[c.role]) for c in plan}
    return spec, measure_stage_peaks(call, components)


def test_the_checked_families_cover_the_architectures():
    families = {resolve(name).family for name in CHECKED}
    assert len(CHECKED) >= 10 and {"sd", "sdxl", "flux", "sd3", "pixart", "wan", "cogvideox", "dit"} <= families


@pytest.mark.parametrize("name", quick_or_slow(CHECKED))
def test_predicted_peaks_equal_the_profiler_timeline_within_2_percent(name):
    spec, real = measured(name)
    predicted = predict_memory(spec, on_cuda=False)  # the CPU's timeline: no cuDNN copies
    assert {s.stage for s in predicted.stages} == set(real.stage_peak_bytes)
    assert predicted.stages[0].resident_param_bytes == real.resident_param_bytes  # exact: same storages
    for stage in predicted.stages:
        assert stage.peak_bytes == pytest.approx(real.stage_peak_bytes[stage.stage], rel=0.02), stage.stage
    assert predicted.peak_bytes == pytest.approx(real.peak_bytes, rel=0.02)


@pytest.mark.parametrize("name", quick_or_slow(HOST_MASKS))
def test_models_that_read_their_masks_are_predicted_and_flagged_until_checked(name):
    """On fake tensors their masks keep their values (they were refused before); their parameters are exact, and
    the prediction says plainly that the family is not yet within 2% of its real run."""
    spec, real = measured(name)
    predicted = predict_memory(spec, on_cuda=False)
    assert {s.stage for s in predicted.stages} == set(real.stage_peak_bytes)
    assert predicted.stages[0].resident_param_bytes == real.resident_param_bytes
    assert predicted.checked.startswith("NOT within 2%")
    # and it says so wherever the figure is shown: under profile's memory table and in fit's notes
    gpu = named_gpu("H100 SXM")
    assert predicted.checked in memory_table(predicted, gpu).caption
    assert predicted.checked in fit_table(name, predicted, gpu, [], CUDA_HOLDBACK_BYTES, []).caption


@pytest.mark.slow
def test_a_float32_vae_under_a_bfloat16_pipeline_is_predicted_per_stage_within_2_percent(tmp_path):
    """Wan's model cards load the VAE in float32 beside a bfloat16 transformer; the real CPU run, loaded by
    bench's own loader, against the prediction of the same component dtypes; bench records them as loaded."""
    from diffmeter.runs.lifecycle import bench
    from diffmeter.runs.spec import BenchSpec

    entry, own = resolve("tiny-wan"), {"vae": "float32"}
    pipe = load_pipeline(entry, locate_weights(entry, False), torch.device("cpu"), "bfloat16", component_dtypes=own)
    pipe, call, settings = tiny_call(entry, pipe=pipe)
    spec = ProfileSpec(
        model="tiny-wan",
        dtype="bfloat16",
        component_dtypes=(("vae", "float32"),),
        **settings,
        **token_settings(entry, pipe),
    )
    _, _, plan = settled_plan(spec)
    # every component of the plan is resident, called or not (HunyuanImage's ByT5 without quoted text)
    # keyed by component and method: a VAE that encodes an input image also decodes the output
    components = {(c.component, c.method): (getattr(pipe, c.component), c.method, STAGE_OF_ROLE[c.role]) for c in plan}
    real = measure_stage_peaks(call, components)
    predicted = predict_memory(spec, on_cuda=False)
    assert predicted.stages[0].resident_param_bytes == real.resident_param_bytes
    for stage in predicted.stages:
        assert stage.peak_bytes == pytest.approx(real.stage_peak_bytes[stage.stage], rel=0.02), stage.stage
    assert (
        predicted.component_param_bytes["vae"]
        == 2 * predict_memory(ProfileSpec(model="tiny-wan", dtype="bfloat16")).component_param_bytes["vae"]
    )
    result, _ = bench(
        BenchSpec(model="tiny-wan", dtype="bfloat16", component_dtypes=own, steps=2, iterations=1, height=32, width=32),
        out=tmp_path,
    )
    assert result.component_dtypes == {"transformer": "bfloat16", "text_encoder": "bfloat16", "vae": "float32"}
    assert result.spec.component_dtypes == own and result.profile.component_dtypes == own


def test_stage_peak_splits_into_its_parts_and_cfg_doubles_the_denoiser_batch():
    spec = ProfileSpec(model="tiny-sd", guidance_scale=7.5)
    guided, unguided = predict_memory(spec), predict_memory(ProfileSpec(model="tiny-sd", guidance_scale=1.0))
    step = {s.stage: s for s in guided.stages}[DENOISING_STEP]
    assert step.batch == 2 and {s.stage: s for s in unguided.stages}[DENOISING_STEP].batch == 1
    assert step.peak_bytes == step.resident_param_bytes + step.carried_bytes + step.activation_bytes
    assert step.activation_bytes > {s.stage: s for s in unguided.stages}[DENOISING_STEP].activation_bytes
    assert guided.peak_bytes == max(s.peak_bytes for s in guided.stages)
    assert [s.stage for s in guided.stages] == [TEXT_ENCODING, DENOISING_STEP, VAE_DECODE]


def test_half_precision_parameters_equal_the_bench_loaders():
    entry = resolve("tiny-flux")
    pipe = load_pipeline(entry, locate_weights(entry, False), torch.device("cpu"), "bfloat16")
    loaded = {name: getattr(pipe, name) for name in entry.components}
    predicted = predict_memory(ProfileSpec(model="tiny-flux", dtype="bfloat16"))
    # bfloat16 everywhere but what the model classes keep in float32 at bfloat16
    assert predicted.component_param_bytes == {name: param_bytes(module) for name, module in loaded.items()}
    assert (
        predicted.stages[0].resident_param_bytes
        < predict_memory(ProfileSpec(model="tiny-flux")).stages[0].resident_param_bytes
    )


def test_convolution_scratch_is_reported_apart_from_tensors():
    _, real = measured("tiny-sd")
    # CPU convolutions allocate im2col columns no tensor holds: counted only in the "with scratch" peaks
    assert real.stage_peak_with_scratch_bytes[VAE_DECODE] > real.stage_peak_bytes[VAE_DECODE]
    assert real.peak_with_scratch_bytes >= real.peak_bytes


def test_a_prediction_is_remembered_and_a_changed_question_is_a_miss(tmp_path, monkeypatch):
    monkeypatch.setenv("DIFFMETER_CACHE_DIR", str(tmp_path))
    spec = ProfileSpec(model="tiny-flux", steps=2)
    assert cached_memory(spec) is None
    predicted = predict_memory(spec)
    assert cached_memory(spec) == predicted
    assert cached_memory(ProfileSpec(model="tiny-flux", steps=2, dtype="bfloat16")) is None


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_float32_modules_are_kept_as_transformers_and_diffusers_load_them(tmp_path, dtype):
    import transformers

    from diffmeter.loading import keep_fp32_modules
    from diffmeter.tiny import tiny_pipeline

    pipe = tiny_pipeline(resolve("tiny-flux"), "cpu", 0)
    pipe.text_encoder_2.save_pretrained(tmp_path / "t5")
    loaded = transformers.T5EncoderModel.from_pretrained(tmp_path / "t5", torch_dtype=dtype)
    ours = pipe.text_encoder_2.to(dtype)
    keep_fp32_modules(ours, dtype)
    # T5 keeps its feed-forward output (wo) in float32 at float16 only: transformers' own rule
    assert {n: p.dtype for n, p in ours.named_parameters()} == {n: p.dtype for n, p in loaded.named_parameters()}
    assert any(p.dtype == torch.float32 for p in loaded.parameters()) == (dtype == torch.float16)


def one_convolution(kernel: int) -> tuple[torch.nn.Module, Call]:
    convolution = torch.nn.Conv2d(4, 8, kernel, padding=kernel // 2)

    def build(device):
        return {"input": torch.empty(1, 4, 16, 16, device=device)}

    return fake_copy(convolution), Call(component="vae", role="vae_decoder", batch=1, count=1, build=build)


def test_a_cuda_prediction_adds_cudnns_copies_of_a_convolutions_input_weight_and_output():
    """Measured on an H200 (benchmarks/results/cuda_overhead_nvidia-h200.json): cuDNN holds a copy of a 3x3
    convolution's input, weight and output while it runs; none for a 1x1 kernel."""
    module, call = one_convolution(3)
    cpu, cuda = track_call(module, call, torch.float32, on_cuda=False), track_call(module, call, torch.float32)
    output, inputs, weight = 8 * 16 * 16 * 4, 4 * 16 * 16 * 4, 8 * 4 * 3 * 3 * 4
    assert cpu.activation_bytes == output
    assert cuda.activation_bytes == output + (inputs + weight + output)
    module, call = one_convolution(1)
    assert track_call(module, call, torch.float32).activation_bytes == output


def test_sd15s_vae_decode_on_cuda_holds_its_largest_convolutions_copies():
    """The H200 run's sd15 peak (512 px, bf16) was 10.8% above the prediction without the copies, 2.5% with them
    (benchmarks/results/gpu_validation_nvidia-h200.md); the copies sit in the decode, the stage that peaks."""
    spec = ProfileSpec(model="sd15", height=512, width=512, steps=1, dtype="bfloat16")
    cpu, cuda = predict_memory(spec, on_cuda=False), predict_memory(spec)
    assert cuda.on_cuda and not cpu.on_cuda
    extra = {s.stage: c.peak_bytes - s.peak_bytes for s, c in zip(cpu.stages, cuda.stages, strict=True)}
    # at most the largest copy (the decoder's 256-to-256 3x3 convolution at 512 px: 128 MiB in, 128 MiB out,
    # 1.1 MiB of weight), at least the copy of its 256-to-128 one (192 MiB)
    assert 192 * 2**20 <= extra[VAE_DECODE] <= 258 * 2**20
    assert extra[TEXT_ENCODING] == 0 and cuda.peak_stage == VAE_DECODE


@pytest.mark.slow
@pytest.mark.parametrize("name", ["tiny-flux", "tiny-wan"])
def test_one_fake_run_for_memory_and_operators_equals_the_two_passes(monkeypatch, tmp_path, name):
    """profile --gpu, fit and bench run the memory tracker and the operator tally in one fake run of the plan;
    each figure equals its own pass's, and both are remembered."""
    monkeypatch.setenv("DIFFMETER_CACHE_DIR", "off")
    spec = ProfileSpec(model=name, steps=2, dtype="bfloat16")
    alone = predict_memory(spec), operator_work(spec)
    monkeypatch.setenv("DIFFMETER_CACHE_DIR", str(tmp_path))
    assert predict_memory_and_work(spec) == alone
    assert cached_memory(spec) == alone[0] and operator_work(spec) == alone[1]
