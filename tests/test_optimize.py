"""Every technique on real tiny pipelines: it applies or says why not; lossless ones keep the
images; caches skip work the FLOP counter can see; samplers run the steps asked for."""

import contextlib
import importlib.util

import numpy as np
import pytest
import torch
from tiny_runs import quick_or_slow

from diffmeter.catalog import resolve
from diffmeter.errors import DiffmeterError
from diffmeter.families import get_family
from diffmeter.flops.counter import count_flops
from diffmeter.measure.clock import HostClock
from diffmeter.measure.stages import StageTimer
from diffmeter.optimize import REGISTRY, OptimizationSpec, Target, build, check
from diffmeter.optimize.scheduler import SCHEDULERS
from diffmeter.quantized_loading import quantize_built
from diffmeter.tiny import tiny_pipeline

MODELS = ["tiny-sd", "tiny-flux", "tiny-pixart"]  # UNet; dispatching MMDiT with cache hooks; SDPA DiT with T5
#: parameters that keep CPU tests fast: compile through dynamo without inductor code generation
FAST = {"compile": {"backend": "eager"}, "cache-dit": {"fn": 1, "warmup_steps": 1}}


def target(model: str, steps: int = 3) -> Target:
    entry = resolve(model)
    return Target(entry, get_family(entry.family), torch.device("cpu"), "float32", steps)


def one(technique: str, t: Target, **params):
    if technique == "scheduler" and "name" not in params:
        params["name"] = "flow-euler" if t.is_flow else "dpm++2m"
    (optimization,) = build([OptimizationSpec(name=technique, params={**FAST.get(technique, {}), **params})])
    return optimization


def generate(model: str, optimizations=(), steps: int = 3, batch: int = 2, count: dict | None = None):
    """Images of a tiny pipeline with ``optimizations`` applied; with ``count``, the denoiser's
    executed FLOPs are stored under count['flops']."""
    t = target(model, steps)
    pipe = tiny_pipeline(t.entry)
    configs = {name: config for optimization in optimizations for name, config in optimization.load_configs(t).items()}
    quantize_built(pipe, configs, {name: torch.float32 for name in configs})  # --quantize BACKEND:TYPE, at load
    for optimization in optimizations:
        optimization.apply(pipe, t)
    defaults = t.entry.defaults
    arguments = dict(
        prompt=["a red cat", "a blue dog"][:batch],
        height=defaults.height,
        width=defaults.width,
        num_inference_steps=steps,
        **t.family.guidance_arguments(t.entry, defaults.guidance_scale),
        output_type="np",
        generator=[torch.Generator().manual_seed(seed) for seed in range(batch)],
        **t.entry.extra["runtime"].get("call", {}),
    )
    if defaults.num_frames:
        arguments["num_frames"] = defaults.num_frames
    contexts = [optimization.call_context() for optimization in optimizations]
    denoiser = {t.family.denoiser: getattr(pipe, t.family.denoiser)}
    # the counter only where asked: its dispatch mode stops torch.compile'd kernels (sdnq's dequantization)
    with torch.no_grad(), count_flops(denoiser) if count is not None else contextlib.nullcontext() as counts:
        for context in contexts:
            context.__enter__()
        try:
            output = pipe(**arguments)
        finally:
            for context in reversed(contexts):
                context.__exit__(None, None, None)
    if count is not None:
        count["flops"] = counts.total
    return output.frames if defaults.num_frames else output.images


@pytest.mark.parametrize("model", quick_or_slow(MODELS))
# ONNX exports take tens of seconds: with the slow part
@pytest.mark.parametrize("name", quick_or_slow(sorted(REGISTRY), quick=set(REGISTRY) - {"onnxruntime"}))
def test_every_technique_applies_or_says_why_not(model, name):
    t = target(model)
    optimization = one(name, t)
    reason = optimization.missing_package() or optimization.supports(t)
    if reason:
        assert len(reason) > 20
        # a technique that applies but whose package is missing here (modelopt) is refused for the package alone
        with pytest.raises(DiffmeterError, match="cannot be used with" if optimization.supports(t) else "needs the"):
            check([optimization], t)
        return
    check([optimization], t)
    images = generate(model, [optimization])
    assert images.shape[0] == 2 and np.isfinite(images).all()


LOSSLESS = [
    ("tiny-flux", "fuse-qkv", {}),
    ("tiny-sd", "fuse-qkv", {}),
    ("tiny-pixart", "fuse-qkv", {}),
    ("tiny-flux", "attention", {"backend": "native"}),
    ("tiny-sd", "sdpa-kernel", {"kernel": "math"}),
    ("tiny-flux", "compile", {}),
    ("tiny-sd", "vae-slicing", {}),
]


@pytest.mark.parametrize(("model", "name", "params"), LOSSLESS)
def test_lossless_techniques_keep_the_images(model, name, params):
    optimization = one(name, target(model), **params)
    assert optimization.lossless
    np.testing.assert_allclose(generate(model, [optimization]), generate(model), atol=2e-4)


CACHES = [
    ("tiny-flux", "first-block-cache", {"threshold": 5.0}),  # random weights: force the skip
    ("tiny-flux", "taylorseer", {"disable_cache_before_step": 1, "cache_interval": 2}),
    ("tiny-flux", "mag-cache", {}),
    ("tiny-flux", "pab", {"timestep_skip_range": [0, 1000]}),
    ("tiny-cogvideox", "faster-cache", {}),
    ("tiny-sd", "deep-cache", {}),
    ("tiny-flux", "cache-dit", {"threshold": 5.0}),
]


@pytest.mark.slow
@pytest.mark.parametrize(("model", "name", "params"), CACHES)
def test_caches_skip_denoiser_work_the_counter_can_see(model, name, params):
    optimization = one(name, target(model, 8), **params)
    if optimization.missing_package():
        pytest.skip(optimization.missing_package())
    full, cached = {}, {}
    generate(model, steps=8, count=full)
    generate(model, [optimization], steps=8, count=cached)
    assert cached["flops"] < 0.99 * full["flops"]


@pytest.mark.parametrize("scheduler", sorted(SCHEDULERS))
def test_schedulers_run_the_steps_asked_for(scheduler):
    model = "tiny-flux" if SCHEDULERS[scheduler][2] else "tiny-sd"
    t = target(model, 5)
    optimization = one("scheduler", t, name=scheduler)
    check([optimization], t)
    pipe = tiny_pipeline(t.entry)
    optimization.apply(pipe, t)
    assert type(pipe.scheduler).__name__ == SCHEDULERS[scheduler][0]
    with StageTimer(pipe, list(t.family.text_encoders), t.family.denoiser, t.family.decoder, HostClock()) as timer:
        timer.begin()
        pipe(
            "a cat",
            num_inference_steps=5,
            height=32,
            width=32,
            output_type="np",
            **t.entry.extra["runtime"].get("call", {}),
        )
        times = timer.end()
    assert len(times.stages.steps_s) == 5


def test_a_scheduler_swap_keeps_the_schedule_the_pipeline_patched():
    """tiny-sd's DDIM config sets nothing; StableDiffusionPipeline sets clip_sample=False and steps_offset=1 on it,
    which ``from_config`` drops as defaults: "ddim" over DDIM gave other images (PSNR 14 dB, a new user's sweep).
    Swapped for the same sampler, the images are the same ones."""
    import numpy as np
    import torch

    t = target("tiny-sd", 3)
    images = []
    for swap in (False, True):
        pipe = tiny_pipeline(t.entry)
        if swap:
            one("scheduler", t, name="ddim").apply(pipe, t)
            assert pipe.scheduler.config.clip_sample is False and pipe.scheduler.config.steps_offset == 1
        generator = torch.Generator().manual_seed(0)
        images.append(pipe("a cat", num_inference_steps=3, height=32, width=32, output_type="np", generator=generator))
    np.testing.assert_array_equal(images[0].images, images[1].images)


REFUSALS = [
    ("tiny-flux", [("scheduler", {"name": "ddim"})], "is a flow model: use flow-euler"),
    ("tiny-sd", [("scheduler", {"name": "flow-euler"})], "predicts noise, not a flow"),
    ("tiny-sd", [("first-block-cache", {})], "not a CacheMixin model"),
    ("tiny-sd", [("attention", {"backend": "flash"})], "use sdpa-kernel"),
    ("tiny-wan", [("mag-cache", {})], "FLUX only"),
    ("tiny-flux", [("deep-cache", {})], "no such UNet"),
    ("tiny-flux", [("first-block-cache", {}), ("taylorseer", {})], "both cache techniques; pick one"),
    ("tiny-flux", [("offload", {})], "this run is on cpu"),
    ("tiny-flux", [("tf32", {})], "NVIDIA tensor-core mode"),
    ("tiny-sd", [("fp8-text-encoder", {})], "no large text encoder"),
    ("tiny-pixart", [("compile", {"regional": True})], "declares no repeated blocks"),
    ("tiny-flux", [("compile", {"components": ["unet"]})], "it has no component unet"),
]


@pytest.mark.parametrize(("model", "asked", "message"), REFUSALS)
def test_unsupported_combinations_are_refused_with_the_reason(model, asked, message):
    optimizations = build([OptimizationSpec(name=name, params=params) for name, params in asked])
    with pytest.raises(DiffmeterError, match=message):
        check(optimizations, target(model))


def test_unknown_names_and_parameters_are_one_clear_line():
    with pytest.raises(DiffmeterError, match="unknown optimization 'first-blok-cache'.*Did you mean first-block-cache"):
        build([OptimizationSpec(name="first-blok-cache")])
    with pytest.raises(DiffmeterError, match="first-block-cache: bad parameter treshold.*its parameters: threshold"):
        build([OptimizationSpec(name="first-block-cache", params={"treshold": 0.1})])
    with pytest.raises(DiffmeterError, match="scheduler: bad parameter name"):
        build([OptimizationSpec(name="scheduler", params={"name": "heun"})])


def test_a_missing_package_names_the_extra(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "DeepCache" else real(name, *a))
    with pytest.raises(DiffmeterError, match=r"pip install 'diffmeter\[deepcache\]'"):
        check(build([OptimizationSpec(name="deep-cache")]), target("tiny-sd"))


def test_techniques_are_applied_in_registry_order():
    names = ["compile", "first-block-cache", "fuse-qkv", "scheduler"]
    built = build([OptimizationSpec(name=n, params={"name": "flow-euler"} if n == "scheduler" else {}) for n in names])
    assert [o.name for o in built] == ["scheduler", "fuse-qkv", "first-block-cache", "compile"]


def test_every_flag_maps_to_its_technique_and_parameter():
    from diffmeter.optimize.options import from_flags

    specs = from_flags(
        compile="max-autotune",
        compile_fullgraph=True,
        compile_regional=True,
        compile_components="transformer,vae",
        compile_inductor_flags=True,
        channels_last=True,
        attention="flash",
        sdpa_kernel="efficient",
        fuse_qkv=True,
        cache="first-block-cache",
        cache_threshold=0.1,
        scheduler="unipc",
        offload="group",
        vae_tiling=True,
        vae_slicing=True,
        quantize="int8",
        fp8_text_encoder=True,
        opt=["taylorseer:cache_interval=4,max_order=2"],
    )
    assert {spec.name: spec.params for spec in specs} == {
        "compile": {
            "mode": "max-autotune",
            "fullgraph": True,
            "regional": True,
            "components": ["transformer", "vae"],
            "inductor_flags": True,
            "channels_last": True,
        },
        "attention": {"backend": "flash"},
        "sdpa-kernel": {"kernel": "efficient"},
        "fuse-qkv": {},
        "first-block-cache": {"threshold": 0.1},
        "scheduler": {"name": "unipc"},
        "offload": {"mode": "group"},
        "vae-tiling": {},
        "vae-slicing": {},
        "quantize": {"weights": "int8"},
        "fp8-text-encoder": {},
        "taylorseer": {"cache_interval": 4, "max_order": 2},
    }
    assert all(build([spec]) for spec in specs)  # every one is a valid registry entry with valid parameters


def test_deep_cache_lets_go_of_the_pipeline_when_restored():
    """DeepCacheSDHelper(pipe=pipe) was kept after restore: the pipeline outlived its run (issue 51, item 3)."""
    import gc
    import weakref

    t = target("tiny-sd", 4)
    optimization = one("deep-cache", t)
    if optimization.missing_package():
        pytest.skip(optimization.missing_package())
    pipe = tiny_pipeline(t.entry)
    optimization.apply(pipe, t)
    pipe("a cat", num_inference_steps=4, height=32, width=32, output_type="np")
    optimization.restore(pipe, t)
    alive = weakref.ref(pipe)
    del pipe
    gc.collect()
    assert alive() is None


def test_faster_cache_defaults_are_diffusers_own_and_separate_cfg_is_refused():
    """Its defaults had been diffusers' docstring example (-1, 781) and 0.3, not FasterCacheConfig's (-1, 641) and the
    0.5 the hook uses without a weight callback; on Wan, whose pipeline runs CFG as two calls, the hook failed at the
    first call (IndexError), a new user's trial."""
    from diffusers.hooks import FasterCacheConfig

    (faster,) = build([OptimizationSpec(name="faster-cache")])
    ours, theirs = faster.config, FasterCacheConfig()
    assert ours.timestep_skip_range == theirs.spatial_attention_timestep_skip_range
    assert ours.unconditional_batch_timestep_skip_range == theirs.unconditional_batch_timestep_skip_range
    assert ours.unconditional_batch_skip_range == theirs.unconditional_batch_skip_range
    assert ours.block_skip_range == theirs.spatial_attention_block_skip_range and ours.attention_weight == 0.5
    assert "separate calls" in faster.supports(target("tiny-wan"))
    assert faster.supports(target("tiny-cogvideox")) is None


def test_a_timestep_window_is_ordered_and_takes_its_commas_on_the_command_line():
    """``--opt pab:timestep_skip_range=[100,800]`` was split at its comma ("write parameters as key=value, got
    '800]'"), and a reversed window [800, 100], in which the hook never acts, was accepted (a new user's trial)."""
    from diffmeter.optimize.options import parse_opt

    spec = parse_opt("pab:timestep_skip_range=[200,700],block_skip_range=3")
    assert spec.params == {"timestep_skip_range": [200, 700], "block_skip_range": 3}
    (pab,) = build([spec])
    assert pab.config.timestep_skip_range == (200, 700)
    with pytest.raises(DiffmeterError, match="low < high"):
        build([parse_opt("pab:timestep_skip_range=[800,100]")])
    with pytest.raises(DiffmeterError, match="low < high"):
        build([parse_opt("faster-cache:unconditional_batch_timestep_skip_range=[641,-1]")])


def test_a_quantization_type_without_its_key_names_both_ways_to_ask_for_it():
    """``--opt torchao:int8wo`` (bench's --quantize spelling) said only "write parameters as key=value"."""
    from diffmeter.optimize.options import parse_opt

    with pytest.raises(DiffmeterError, match="--quantize torchao:int8wo, or --opt torchao:type=int8wo"):
        parse_opt("torchao:int8wo")
    (backend,) = build([parse_opt("torchao:type=int8wo")])
    assert backend.config.type == "int8wo"
    with pytest.raises(DiffmeterError) as refused:  # not a quantization backend: no such hint
        parse_opt("deep-cache:3")
    assert "--quantize" not in str(refused.value)
