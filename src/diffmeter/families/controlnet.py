"""ControlNet calls, shared by the families whose pipelines diffusers runs with one (``--controlnet``).

Every diffusers 0.42.1 ControlNet pipeline calls its ControlNet at every step, whatever ``control_guidance_start``
and ``control_guidance_end``: outside that range it only multiplies the residuals by a conditioning scale of 0
(``cond_scale = controlnet_cond_scale * controlnet_keep[i]``: pipeline_controlnet_sd_xl.py 1492, pipeline_controlnet.py
1290, pipeline_flux_controlnet.py 1109), so the range changes no compute. The ControlNet's outputs (residuals) are
added to the denoiser's hidden states: the denoiser calls get them as inputs, as the pipeline passes them."""

from __future__ import annotations

from dataclasses import replace

import torch

from diffmeter.catalog.controlnets import CONTROLNET, controlnet_of
from diffmeter.errors import DiffmeterError
from diffmeter.families.base import DENOISER, IMAGE_ENCODER, Call, Shapes

#: what every ControlNet note says about the active step range
STEP_RANGE = (
    "control_guidance_start/end change no compute: the pipeline runs it every step, scaling its residuals by 0 "
    "outside the range"
)


def denoiser_call(calls: list[Call]) -> Call:
    """The plan's first denoiser call: the one the ControlNet's calls go before."""
    return next(call for call in calls if call.role == DENOISER)


def control_image_encoding(decoder: str, batch: int, size: tuple[int, int], per: str, video: bool = False) -> Call:
    """The VAE encoding the control image at the output ``size`` ((height, width)) once per call, repeated to
    ``batch`` by the pipeline's ``prepare_image`` (``video``: as one frame, a video VAE's)."""
    return Call(
        decoder,
        IMAGE_ENCODER,
        batch,
        1,
        lambda device: {"x": torch.zeros(batch, 3, *((1,) if video else ()), *size)},
        method="encode",
        note=f"the control image, {size[1]}x{size[0]} (WxH), {per}",
    )


def steered(
    shapes: Shapes,
    calls: list[Call],
    denoiser: str,
    build,
    residuals,
    detail: str,
    batch: int | None = None,
    count: int | None = None,
    encode: Call | None = None,
    step_range: str = STEP_RANGE,
) -> list[Call]:
    """The plan with the ControlNet: ``encode`` (its control image) and its calls (inputs from ``build``) before the
    first denoiser call, one each unless ``batch`` or ``count`` say otherwise (a ControlNet run once per step on
    the prompt alone, beside a true-CFG denoiser's two calls); the ``denoiser``'s calls given its residuals
    (``residuals(batch, device)``); the note says ``detail`` and what the active step range does (``step_range``)."""
    first = calls.index(denoiser_call(calls))
    ran = Call(
        CONTROLNET,
        DENOISER,
        calls[first].batch if batch is None else batch,
        calls[first].count if count is None else count,
        build,
        note=f"once per step; {step_range}",
    )
    note(shapes, detail, step_range)
    planned = with_residuals(calls, denoiser, residuals)
    return [*planned[:first], *([encode] if encode else []), ran, *planned[first:]]


def with_residuals(calls: list[Call], denoiser: str, residuals) -> list[Call]:
    """The ``denoiser``'s calls with the ControlNet's residuals among their inputs (``residuals(batch, device)``)."""

    def adding(call: Call) -> Call:
        def build(device: torch.device, call=call) -> dict:
            return {**call.build(device), **residuals(call.batch, device)}

        return replace(call, build=build)

    return [adding(call) if call.component == denoiser and call.role == DENOISER else call for call in calls]


def unet_residuals(config: dict, batch: int, height: int, width: int) -> dict:
    """What a ControlNetModel hands a UNet2DConditionModel: one residual per down-block output (conv_in, each
    resnet of each down block, each downsampler) and one for the mid block, at the UNet's own sizes
    (UNet2DConditionModel.forward, diffusers 0.42.1: ``down_block_additional_residuals``)."""
    channels = config["block_out_channels"]
    layers = config.get("layers_per_block", 2)
    layers = [layers] * len(channels) if isinstance(layers, int) else layers
    shapes = [(channels[0], height, width)]
    for index, width_ in enumerate(channels):
        shapes += [(width_, height, width)] * layers[index]
        if index < len(channels) - 1:  # Downsample2D: a 3x3 convolution, stride 2, padding 1
            height, width = (height + 1) // 2, (width + 1) // 2
            shapes.append((width_, height, width))
    return {
        "down_block_additional_residuals": tuple(torch.zeros(batch, *shape) for shape in shapes),
        "mid_block_additional_residual": torch.zeros(batch, channels[-1], height, width),
    }


def note(shapes: Shapes, detail: str, step_range: str = STEP_RANGE) -> None:
    found = controlnet_of(shapes.entry)
    shapes.note(f"ControlNet {found['name']} ({found['id']}): {detail}; {step_range}")
    options = call_options(shapes)
    if options:
        said = ", ".join(f"{name} {value:g}" for name, value in options.items())
        shapes.note(
            f"{said}: no MACs change; {shapes.entry.pipeline_class} still calls its ControlNet at every step and only "
            "scales its residuals by them (cond_scale = controlnet_cond_scale * controlnet_keep[i]: "
            "pipeline_controlnet_sd_xl.py 1486-1492, diffusers 0.42.1)"
        )


def call_options(shapes: Shapes) -> dict[str, float]:
    """The ControlNet call options the spec gives, as ``__call__`` names them; one line where the pipeline takes none
    (ZImageControlNetPipeline has no step range)."""
    import inspect

    import diffusers

    spec, names = shapes.spec, ("control_guidance_start", "control_guidance_end", "controlnet_conditioning_scale")
    given = {name: getattr(spec, name) for name in names if getattr(spec, name) is not None}
    accepted = inspect.signature(getattr(diffusers, shapes.entry.pipeline_class).__call__).parameters
    refused = [name for name in given if name not in accepted]
    if refused:
        flags = ", ".join(f"--{name.replace('_', '-')}" for name in refused)
        raise DiffmeterError(
            f"{shapes.entry.pipeline_class} (diffusers 0.42.1) takes no {', '.join(refused)}: drop {flags}"
        )
    return given
