"""ControlNets (``--controlnet``): each tiny kind runs for real in its diffusers ControlNet pipeline under the counter
and equals the offline profile per component, with and without guidance; bench runs it and times it inside the
steps; a ControlNet for another base model, or an unknown one, is one line and exit 2."""

import json

import pytest
import torch
from PIL import Image
from tiny_runs import PROMPT, macs_by_name

from diffmeter import profile
from diffmeter.catalog import resolve
from diffmeter.catalog.controlnets import CONTROLNET, all_controlnets, find_controlnet, with_controlnet
from diffmeter.errors import DiffmeterError
from diffmeter.families import get_family
from diffmeter.flops.counter import count_flops
from diffmeter.flops.profile import MetaComponent
from diffmeter.measure.ops import OpsTable
from diffmeter.measure.trace import OPS_FILE
from diffmeter.predict.memory import predict_memory
from diffmeter.runs.collect import rows
from diffmeter.runs.lifecycle import bench
from diffmeter.runs.spec import BenchSpec
from diffmeter.spec import ProfileSpec
from diffmeter.tiny import tiny_pipeline
from diffmeter.weights import locate_weights

PAIRS = {"tiny-sd": "tiny-controlnet-sd", "tiny-sdxl": "tiny-controlnet-sdxl", "tiny-flux": "tiny-controlnet-flux"}
#: each kind of ControlNet with its tiny base: SD3's with text (InstantX's) and without (SD3.5's own)
KINDS = [
    *PAIRS.items(),
    ("tiny-sd3", "tiny-controlnet-sd3"),
    ("tiny-sd3", "tiny-controlnet-sd35"),
    ("tiny-qwenimage", "tiny-controlnet-qwenimage"),
    # Z-Image's runs the transformer's own refiners: 2.1's control refiner layout and 1.0's plain one
    ("tiny-z-image", "tiny-controlnet-z-image"),
    ("tiny-z-image", "tiny-controlnet-z-image-v1"),
]


def real_macs(model: str, batch_size: int, guidance_scale: float, controlnet: str | None = None, **extra):
    """The real ControlNet pipeline of ``model`` and its tiny ControlNet, run on a control image at the output
    size: MACs per component, and the profile settings its prompt sets."""
    entry = with_controlnet(resolve(model), controlnet or PAIRS[model])
    family = get_family(entry.family)
    # its published config: the pipeline itself completes what it completes (SD3.5's position embedding)
    published = find_controlnet(controlnet or PAIRS[model]).component()
    pipe = tiny_pipeline(entry.model_copy(update={"components": {**entry.components, CONTROLNET: published}}))
    size = (entry.defaults.width, entry.defaults.height)
    control = [Image.new("RGB", size, (90, 40 * k, 160)) for k in range(batch_size)]
    name = "image" if "StableDiffusion" in entry.pipeline_class and "3" not in entry.pipeline_class else "control_image"
    call = {**entry.extra["runtime"].get("call", {}), **entry.extra[CONTROLNET]["call"], name: control, **extra}
    with torch.no_grad(), count_flops({n: getattr(pipe, n) for n in entry.components}) as counts:
        pipe(
            prompt=[PROMPT] * batch_size,
            height=entry.defaults.height,
            width=entry.defaults.width,
            num_inference_steps=2,
            **family.guidance_arguments(entry, guidance_scale),
            output_type="np",
            generator=torch.Generator().manual_seed(0),
            **call,
        )
    macs = {n: sum(counts.by_module.get(n, {}).values()) // 2 for n in entry.components}
    return macs, family.prompt_settings(pipe, [PROMPT])


@pytest.mark.slow
@pytest.mark.parametrize("model, controlnet", KINDS)
@pytest.mark.parametrize("batch_size, guided", [(1, True), (2, False)])
def test_each_controlnet_kind_is_counted_exactly(model, controlnet, batch_size, guided):
    guidance = resolve(model).defaults.guidance_scale if guided else 1.0
    real, prompt = real_macs(model, batch_size, guidance, controlnet)
    offline = profile(model, controlnet=controlnet, steps=2, batch_size=batch_size, guidance_scale=guidance, **prompt)
    assert macs_by_name(offline) == real
    assert real[CONTROLNET] > 0
    denoiser = get_family(resolve(model).family).denoiser  # the residual additions count no MACs
    assert (
        macs_by_name(profile(model, steps=2, batch_size=batch_size, guidance_scale=guidance, **prompt))[denoiser]
        == real[denoiser]
    )


def test_flux_true_cfg_runs_the_controlnet_once_per_step():
    """FluxControlNetPipeline: the negative prompt's transformer call reuses the ControlNet's block samples."""
    real, _ = real_macs("tiny-flux", 1, 3.5, true_cfg_scale=2.0, negative_prompt=[""])
    offline = profile("tiny-flux", controlnet="tiny-controlnet-flux", steps=2, true_cfg_scale=2.0)
    assert macs_by_name(offline) == real
    rows = {(c.name, c.role): c for c in offline.components}
    assert rows[(CONTROLNET, "denoiser")].calls == 2 and rows[("transformer", "denoiser")].calls == 4
    assert rows[("vae", "image_encoder")].calls == 1  # the control image, VAE-encoded once


def test_catalog_controlnets_count_their_published_architecture():
    """The catalog's ControlNets build at their stated sizes; each runs every step beside its base's denoiser."""
    params = {entry.name: MetaComponent(entry.component()).params for entry in all_controlnets() if not entry.is_tiny}
    assert params == {
        "controlnet-flux-union": 3_301_956_608,
        "controlnet-qwen-image-union": 1_768_003_584,
        "controlnet-sd3-canny": 538_805_760,
        "controlnet-sd35-large-canny": 2_153_518_976,
        "controlnet-sdxl-canny": 1_251_014_160,
        "controlnet-sdxl-depth": 1_251_014_160,
        # Z-Image's own parameters alone: the embedders and refiners it runs are the transformer's
        "controlnet-z-image-union": 3_356_225_792,
        "controlnet-z-image-union-1.0": 1_550_778_368,
    }
    sdxl = profile("sdxl", controlnet="controlnet-sdxl-canny")
    rows = {(c.name, c.role): c for c in sdxl.components}
    assert rows[(CONTROLNET, "denoiser")].calls == sdxl.steps
    assert rows[(CONTROLNET, "denoiser")].batch_per_call == 2  # the CFG batch, as the UNet's
    assert sdxl.controlnet == "diffusers/controlnet-canny-sdxl-1.0"
    plain = profile("sdxl")
    assert sdxl.denoiser_macs_per_step == plain.denoiser_macs_per_step + rows[(CONTROLNET, "denoiser")].macs_per_call
    assert any("control_guidance_start/end change no compute" in note for note in sdxl.notes)


@pytest.mark.slow
@pytest.mark.parametrize(
    "model, controlnet", [("tiny-sdxl", "tiny-controlnet-sdxl"), ("tiny-z-image", "tiny-controlnet-z-image")]
)
def test_memory_prediction_holds_the_controlnet(model, controlnet):
    """Its own weights (Z-Image's borrows the transformer's refiners for its calls and gives them back) and its
    activations: a higher peak than the base's."""
    found = predict_memory(ProfileSpec(model=model, controlnet=controlnet), on_cuda=False)
    plain = predict_memory(ProfileSpec(model=model), on_cuda=False)
    own = MetaComponent(with_controlnet(resolve(model), controlnet).components[CONTROLNET]).params
    assert found.component_param_bytes[CONTROLNET] == 4 * own
    assert (
        found.component_param_bytes[get_family(resolve(model).family).denoiser]
        == plain.component_param_bytes[get_family(resolve(model).family).denoiser]
    )
    assert found.peak_bytes > plain.peak_bytes
    stepping = next(stage for stage in found.calls if stage.component == CONTROLNET)
    assert stepping.activation_bytes > 0


@pytest.fixture(scope="module")
def steered(tmp_path_factory):
    out = tmp_path_factory.mktemp("controlnet")
    return {
        model: bench(BenchSpec(model=model, controlnet=PAIRS[model], iterations=2, trace=True), out=out)
        for model in ("tiny-sdxl", "tiny-flux")
    }


@pytest.mark.slow
@pytest.mark.parametrize("model", ["tiny-sdxl", "tiny-flux"])
def test_bench_runs_and_times_the_controlnet(steered, model):
    result, folder = steered[model]
    assert result.status == "complete"
    assert f"controlnet-{PAIRS[model]}" in folder.name
    table = OpsTable.model_validate_json((folder / OPS_FILE).read_text())
    denoising = next(stage for stage in table.stages if stage.stage == "denoising")
    # the traced steps (from the ControlNet's first call) hold the FLOPs the profile counts for them
    assert sum(row.flops for row in denoising.rows if row.flops) == result.summary.flops["denoising"]
    stored = next(row for row in rows(folder.parent) if row["folder"] == folder.name)
    assert stored["controlnet"] == PAIRS[model]  # `diffmeter table` tells it from the plain run
    if model == "tiny-flux":  # the control image's VAE encoding, its own stage
        assert all(iteration.stages.image_encoding_s > 0 for iteration in result.iterations)


def test_bad_controlnets_are_one_line_and_exit_2(cli):
    for args, said in (
        (("profile", "tiny-flux", "--controlnet", "tiny-controlnet-sdxl"), "steers StableDiffusionXLPipeline"),
        (("profile", "flux-dev", "--controlnet", "controlnet-flux-unoin"), "Did you mean controlnet-flux-union"),
        (("profile", "pixart-sigma-1024", "--controlnet", "controlnet-flux-union"), "pick a ControlNet for"),
        (("profile", "tiny-flux", "--controlnet", "controlnet-flux-union"), "pair tiny with tiny"),
        (("profile", "tiny-sd3", "--controlnet", "tiny-controlnet-flux"), "steers FluxPipeline"),
        (
            ("profile", "sd35-large", "--controlnet", "controlnet-sd3-canny"),
            "num_attention_heads 24 (its denoiser: 38)",
        ),
        (("profile", "flux-dev", "--controlnet", "controlnet-sdxl-canny"), "steers StableDiffusionXLPipeline"),
        (("fit", "--all", "--controlnet", "controlnet-flux-union"), "--controlnet"),
    ):
        code, _, err = cli(*args)
        assert code == 2 and said in err and len(err.strip().splitlines()) == 1, (args, err)


def test_a_controlnet_for_another_width_of_the_same_pipeline_is_refused():
    """Same pipeline class, another denoiser width (a local checkpoint): the ControlNet's residuals could not add."""
    entry = resolve("tiny-flux")
    wider = entry.components["transformer"].model_copy(
        update={"config": {**entry.components["transformer"].config, "num_attention_heads": 4}}
    )
    other = entry.model_copy(update={"components": {**entry.components, "transformer": wider}})
    with pytest.raises(DiffmeterError, match="num_attention_heads 2 \\(its denoiser: 4\\)"):
        with_controlnet(other, "tiny-controlnet-flux")


def test_models_lists_the_controlnets(cli):
    code, out, _ = cli("models", "--controlnets", "--json")
    assert code == 0
    listed = {row["name"]: row for row in json.loads(out)}
    assert set(listed) == {entry.name for entry in all_controlnets()}  # the tiny ones too, for the tiny pipelines
    assert listed["tiny-controlnet-sdxl"]["tiny"] and not listed["controlnet-sdxl-canny"]["tiny"]
    assert listed["tiny-controlnet-sdxl"]["base"] == "tiny-sdxl"
    assert listed["controlnet-sdxl-canny"]["params"] == 1_251_014_160
    assert listed["controlnet-flux-union"]["pipelines"] == {"FluxPipeline": "FluxControlNetPipeline"}
    code, out, _ = cli("models", "--controlnets")
    assert code == 0 and "controlnet-qwen-image-union" in out and "made for" in out and "tiny-controlnet-flux" in out


def test_missing_controlnet_weights_name_the_download():
    """bench with pretrained weights: the ControlNet's own repository must be in the HF cache; one line says how."""
    entry = with_controlnet(resolve("sdxl"), "controlnet-sdxl-canny")
    with pytest.raises(DiffmeterError, match="hf download diffusers/controlnet-canny-sdxl-1.0"):
        locate_weights(entry, random_weights=False)
