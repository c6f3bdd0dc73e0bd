"""The rules CUDA runs depend on, shown on CPU: what each kernel and backend accepts, where a
technique acts, that compiled code keeps running compiled under offloading, that nothing
leaks from one run into the next. (The CUDA-only effects themselves are checked by
benchmarks/gpu_validation.py on a GPU machine.)"""

import dataclasses
import inspect

import pytest
import torch
import torch.nn.functional as F
from tiny_runs import default_images, quick_or_slow
from torch._dynamo import register_backend
from torch.overrides import TorchFunctionMode

from diffmeter import profile
from diffmeter.catalog import all_entries, resolve
from diffmeter.errors import DiffmeterError
from diffmeter.families import get_family
from diffmeter.measure.clock import HostClock
from diffmeter.measure.stages import StageTimer
from diffmeter.optimize import OptimizationSpec, Target, build, check
from diffmeter.tiny import tiny_pipeline

GRAPH_RUNS = {"n": 0}


@register_backend(name="diffmeter_test_counting")
def _counting_backend(graph_module, example_inputs):
    """A torch.compile backend that runs the captured graph eagerly and counts each run."""

    def run(*args):
        GRAPH_RUNS["n"] += 1
        return graph_module.forward(*args)

    return run


def target(model: str, device: str = "cpu", dtype: str = "float32", steps: int = 2) -> Target:
    entry = resolve(model)
    return Target(entry, get_family(entry.family), torch.device(device), dtype, steps)


def techniques(*asked: tuple[str, dict]):
    return build([OptimizationSpec(name=name, params=params) for name, params in asked])


def graph_runs_per_call(pipe, calls: int = 3, **arguments) -> list[int]:
    runs = []
    for _ in range(calls):
        GRAPH_RUNS["n"] = 0
        pipe("a cat", num_inference_steps=2, height=32, width=32, output_type="np", guidance_scale=1.0, **arguments)
        runs.append(GRAPH_RUNS["n"])
    return runs


# ---- attention kernels and backends ---------------------------------------------------------


class _MaskSpy(TorchFunctionMode):
    """Records whether scaled_dot_product_attention got an attention mask."""

    def __init__(self):
        super().__init__()
        self.masked = False

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            self.masked |= (kwargs.get("attn_mask", args[3] if len(args) > 3 else None)) is not None
        return func(*args, **kwargs)


def takes_batches(entry) -> bool:
    try:
        profile(entry.name, batch_size=2)
    except DiffmeterError:
        return False
    return True


@pytest.mark.parametrize("entry", quick_or_slow([e for e in all_entries() if e.is_tiny]))
def test_masks_attention_says_what_each_denoiser_passes_to_sdpa(entry):
    """The family attribute the kernel refusals rest on, held to the real pipeline's behaviour."""
    family = get_family(entry.family)
    pipe = tiny_pipeline(entry)
    spy = _MaskSpy()
    denoiser = getattr(pipe, family.denoiser)

    def enter(*_):
        spy.__enter__()

    def leave(*_):
        spy.__exit__(None, None, None)

    denoiser.register_forward_pre_hook(enter)
    denoiser.register_forward_hook(leave)
    defaults = entry.defaults
    arguments = dict(num_inference_steps=1, output_type="np", **entry.extra["runtime"].get("call", {}))
    if defaults.num_frames:
        arguments["num_frames"] = defaults.num_frames
    arguments.update(default_images(entry))
    if entry.family == "dit":
        calls = [dict(class_labels=[1])]
    else:  # a short prompt, and a batch of unequal ones (which pipelines that do not pad must mask)
        accepted = inspect.signature(type(pipe).__call__).parameters  # HunyuanVideo 1.5 I2V takes no size
        size = {k: v for k, v in dict(height=defaults.height, width=defaults.width).items() if k in accepted}
        calls = [dict(prompt="a cat", **size), dict(prompt=["a cat", " ".join(["a photo of a cat"] * 12)], **size)]
        if not takes_batches(entry):  # Qwen-Image-Edit makes one output per call: no batch to mask
            calls = calls[:1]
    family.prepare_pipeline(pipe, defaults.guidance_scale, batch_size=2)
    with torch.no_grad():
        for call in calls:
            pipe(**family.guidance_arguments(entry, defaults.guidance_scale), **arguments, **call)
    assert family.masks_attention == spy.masked


@pytest.mark.parametrize(
    ("model", "dtype", "kernel", "refusal"),
    [
        ("tiny-sd", "float32", "flash", "float16/bfloat16 inputs only"),
        ("tiny-sd", "float32", "cudnn", "float16/bfloat16 inputs only"),
        ("tiny-pixart", "bfloat16", "flash", "passes an attention mask"),
        ("tiny-sana", "float16", "flash", "passes an attention mask"),
        ("tiny-pixart", "bfloat16", "efficient", None),
        ("tiny-pixart", "float32", "efficient", None),
        ("tiny-sd", "bfloat16", "flash", None),
        ("tiny-pixart", "bfloat16", "cudnn", None),
    ],
)
def test_sdpa_kernels_are_refused_where_pytorch_would_find_no_kernel(model, dtype, kernel, refusal):
    (technique,) = techniques(("sdpa-kernel", {"kernel": kernel}))
    reason = technique.supports(target(model, "cuda", dtype))
    assert reason is None if refusal is None else refusal in reason


def test_the_sdpa_kernel_choice_holds_inside_the_denoiser_only():
    """Text encoders keep PyTorch's choice (T5's padding masks would break a forced flash kernel)."""
    t = target("tiny-pixart")
    pipe = tiny_pipeline(t.entry)
    (technique,) = techniques(("sdpa-kernel", {"kernel": "math"}))
    technique.apply(pipe, t)
    flash_enabled = {}

    def record(name):
        def hook(*_):
            flash_enabled.setdefault(name, torch.backends.cuda.flash_sdp_enabled())

        return hook

    for name in ("text_encoder", "transformer"):
        getattr(pipe, name).register_forward_pre_hook(record(name))
    pipe("a cat", num_inference_steps=1, height=32, width=32, output_type="np", use_resolution_binning=False)
    assert flash_enabled == {"text_encoder": True, "transformer": False}
    assert torch.backends.cuda.flash_sdp_enabled()  # left after each denoiser call
    technique.restore(pipe, t)
    assert len(pipe.transformer._forward_pre_hooks) == 1 and not pipe.transformer._forward_hooks  # ours only


@pytest.mark.parametrize(
    ("backend", "dtype", "refusal"),
    [
        ("_native_flash", "float32", "takes bfloat16 or float16 only"),
        ("_native_cudnn", "float32", "takes bfloat16 or float16 only"),
        ("_native_flash", "bfloat16", None),
        ("_native_efficient", "float32", None),
    ],
)
def test_attention_backends_take_the_dtypes_diffusers_registers_for_them(backend, dtype, refusal):
    (technique,) = techniques(("attention", {"backend": backend}))
    reason = technique.supports(target("tiny-flux", "cuda", dtype))
    assert reason is None if refusal is None else refusal in reason


def test_attention_backends_that_raise_on_masks_are_refused_for_masked_denoisers():
    from diffmeter.optimize.attention import refuses_masks

    assert refuses_masks("_native_flash") and refuses_masks("sage") and not refuses_masks("native")
    masked = dataclasses.replace(target("tiny-flux", "cuda", "bfloat16"), family=get_family("pixart"))
    masked.__dict__["denoiser_class"] = target("tiny-flux").denoiser_class  # a dispatching denoiser with masks
    (technique,) = techniques(("attention", {"backend": "_native_flash"}))
    assert "passes an attention mask" in technique.supports(masked)
    (native,) = techniques(("attention", {"backend": "native"}))
    assert native.supports(masked) is None


def test_the_global_attention_backend_is_restored_after_a_run():
    from diffusers.models.attention_dispatch import _AttentionBackendRegistry

    before = _AttentionBackendRegistry._active_backend
    t = target("tiny-flux")
    pipe = tiny_pipeline(t.entry)
    (technique,) = techniques(("attention", {"backend": "_native_math"}))
    technique.apply(pipe, t)
    assert _AttentionBackendRegistry._active_backend != before  # diffusers sets it process-wide
    technique.restore(pipe, t)
    assert _AttentionBackendRegistry._active_backend == before


# ---- torch.compile ----------------------------------------------------------------------------


def test_compiled_denoiser_runs_compiled_in_every_call_under_model_offload():
    """A torch.compile(module) wrapper ran compiled in the first call only (graph runs 2, 0, 0):
    the pipeline re-installs its offload hooks after each call and restored the eager forward."""
    t = target("tiny-sd")
    optimizations = techniques(("offload", {}), ("compile", {"backend": "diffmeter_test_counting"}))
    assert [o.name for o in optimizations] == ["compile", "offload"]  # compiled in place, then hooked
    pipe = tiny_pipeline(t.entry)
    for optimization in optimizations:  # offload's CUDA-only check is skipped: its hooks work on CPU too
        optimization.apply(pipe, t)
    assert graph_runs_per_call(pipe) == [2, 2, 2]  # one graph run per denoising step, every call


def test_compiled_vae_decode_is_what_runs_and_survives_the_stage_timer():
    t = target("tiny-sd")
    (technique,) = techniques(("compile", {"backend": "diffmeter_test_counting", "components": ["vae"]}))
    pipe = tiny_pipeline(t.entry)
    technique.apply(pipe, t)
    decode = pipe.vae.decode
    assert graph_runs_per_call(pipe, calls=2) == [1, 1]  # decode, not forward, is compiled
    with StageTimer(pipe, ["text_encoder"], "unet", "vae", HostClock()) as timer:
        timer.begin()
        graph_runs_per_call(pipe, calls=1)
        assert timer.end().stages.vae_decode_s > 0
    assert pipe.vae.decode is decode and graph_runs_per_call(pipe, calls=1) == [1]


def test_channels_last_only_for_2d_convolution_models():
    def refusal(model):
        (technique,) = techniques(("compile", {"channels_last": True}))
        return technique.supports(target(model))

    assert "3-D convolutions" in refusal("tiny-wan")  # Conv3d weights are 5-D: module.to() would raise
    assert "no 2-D convolution" in refusal("tiny-flux")
    assert refusal("tiny-sd") is None
    t = target("tiny-sd")
    pipe = tiny_pipeline(t.entry)
    techniques(("compile", {"channels_last": True, "backend": "eager"}))[0].apply(pipe, t)
    assert pipe.unet.conv_in.weight.is_contiguous(memory_format=torch.channels_last)


@pytest.mark.parametrize(
    ("asked", "clash"),
    [
        ([("compile", {"mode": "reduce-overhead"}), ("first-block-cache", {})], "keeps denoiser activations"),
        ([("compile", {"mode": "max-autotune"}), ("taylorseer", {})], "keeps denoiser activations"),
        ([("compile", {"mode": "reduce-overhead"}), ("offload", {"mode": "model"})], "moves the weights"),
        ([("compile", {"mode": "reduce-overhead"}), ("offload", {"mode": "group"})], "moves the weights"),
        ([("compile", {"fullgraph": True}), ("offload", {"mode": "group"})], "drop fullgraph"),
        ([("compile", {}), ("offload", {"mode": "sequential"})], "sequential offload do not combine"),
        ([("compile", {"fullgraph": True}), ("offload", {"mode": "model"})], None),
        ([("compile", {"mode": "max-autotune-no-cudagraphs"}), ("first-block-cache", {})], None),
    ],
)
def test_compile_modes_that_cannot_combine_are_refused(asked, clash):
    optimizations = techniques(*asked)
    t = target("tiny-flux", "cuda", "bfloat16", 4)
    if clash is None:
        check(optimizations, t)
    else:
        with pytest.raises(DiffmeterError, match=clash):
            check(optimizations, t)


def test_cuda_graph_modes_hand_out_copies_of_outputs():
    """CUDA-graph replays overwrite their output memory: a pipeline that holds one call's output
    across the next (Wan's and Lumina 2's separate CFG calls) must get a copy."""
    from diffmeter.optimize.compile import cloned

    t = target("tiny-wan")
    pipe = tiny_pipeline(t.entry)
    (technique,) = techniques(("compile", {"mode": "reduce-overhead"}))
    technique.apply(pipe, t)  # compiles lazily: nothing runs on CPU here
    (hook,) = pipe.transformer._forward_hooks.values()
    output = (torch.ones(2, 3),)
    copied = hook(pipe.transformer, (), output)
    assert torch.equal(copied[0], output[0]) and copied[0].data_ptr() != output[0].data_ptr()
    from diffusers.models.modeling_outputs import Transformer2DModelOutput

    wrapped = Transformer2DModelOutput(sample=torch.ones(2))
    assert cloned(wrapped).sample.data_ptr() != wrapped.sample.data_ptr()
    technique.restore(pipe, t)


def test_compile_restores_inductor_settings_and_drops_compiled_code():
    import torch._inductor.config as inductor

    before = inductor.get_config_copy()
    t = target("tiny-sd")
    pipe = tiny_pipeline(t.entry)
    (technique,) = techniques(("compile", {"inductor_flags": True, "backend": "eager"}))
    technique.apply(pipe, t)
    assert inductor.conv_1x1_as_mm and inductor.get_config_copy() != before
    technique.restore(pipe, t)
    assert inductor.get_config_copy() == before


def test_torchao_quantization_leaves_inductor_settings_as_it_found_them():
    pytest.importorskip("torchao")
    import torch._inductor.config as inductor

    before = inductor.get_config_copy()
    t = target("tiny-sd")
    pipe = tiny_pipeline(t.entry)
    (technique,) = techniques(("quantize", {"weights": "int8"}))
    technique.apply(pipe, t)
    assert inductor.get_config_copy() != before  # torchao sets its recommended flags globally
    technique.restore(pipe, t)
    assert inductor.get_config_copy() == before


def test_cache_dit_patch_of_the_pipeline_class_is_undone():
    pytest.importorskip("cache_dit")
    t = target("tiny-flux", steps=4)
    pipe = tiny_pipeline(t.entry)
    original = type(pipe).__call__
    (technique,) = techniques(("cache-dit", {"fn": 1, "warmup_steps": 1}))
    technique.apply(pipe, t)
    assert type(pipe).__call__ is not original  # patched on the class: every FluxPipeline in the process
    technique.restore(pipe, t)
    assert type(pipe).__call__ is original


# ---- devices, precision, compilation inside measured calls -----------------------------------


def test_techniques_on_the_denoiser_reach_both_wan22_experts():
    """Wan 2.2 A14B runs its low-noise expert (transformer_2) for most steps: compiling, quantizing or
    hooking `transformer` alone would measure a technique on part of the steps only."""
    t = target("tiny-wan22")
    (compiled,) = techniques(("compile", {"backend": "diffmeter_test_counting"}))
    assert compiled.components(t) == ["transformer", "transformer_2"]
    pipe = tiny_pipeline(t.entry)
    compiled.apply(pipe, t)
    with_experts = get_family("wan").expert_steps(t.entry, 2)
    assert with_experts == {"transformer": 1, "transformer_2": 1}
    assert graph_runs_per_call(pipe, calls=1, num_frames=5) == [2]  # one step on each expert, both compiled

    (kernel,) = techniques(("sdpa-kernel", {"kernel": "math"}))
    pipe = tiny_pipeline(t.entry)
    kernel.apply(pipe, t)
    assert all(module._forward_pre_hooks for module in (pipe.transformer, pipe.transformer_2))
    kernel.restore(pipe, t)
    assert not any(module._forward_pre_hooks for module in (pipe.transformer, pipe.transformer_2))
