"""Run a tiny catalog pipeline for real on CPU under the FLOP counter."""

from __future__ import annotations

import inspect

import pytest
import torch
from PIL import Image

from diffmeter.catalog import PipelineEntry, all_entries
from diffmeter.families import get_family
from diffmeter.flops.counter import count_flops
from diffmeter.tiny import tiny_pipeline

PROMPT = "a photo of a cat riding a horse"
TINY = [entry for entry in all_entries() if entry.is_tiny]
REAL = [entry for entry in all_entries() if entry.origin == "catalog"]

#: the tiny pipelines plain ``pytest`` checks every per-pipeline rule on (a UNet and an MMDiT); the others' checks run
#: with the slow part, which CI runs too
QUICK = ("tiny-sd", "tiny-flux")


def quick_or_slow(values: list, quick=QUICK) -> list:
    """One pytest parameter per value (a catalog entry or a name), each id its name; those not in ``quick`` marked
    slow."""
    params = []
    for value in values:
        name = value if isinstance(value, str) else value.name
        params.append(pytest.param(value, id=name, marks=() if name in quick else pytest.mark.slow))
    return params


def token_settings(entry: PipelineEntry, pipe, prompt: str = PROMPT) -> dict[str, int]:
    """The prompt-dependent lengths of the real run, read from the pipeline's own tokenizer."""
    return get_family(entry.family).prompt_settings(pipe, [prompt])


def tiny_call(
    entry: PipelineEntry,
    batch_size: int = 1,
    guidance_scale: float | None = None,
    steps: int | None = None,
    max_sequence_length: int | None = None,
    pipe=None,
    image_sizes: tuple[tuple[int, int], ...] = (),
):
    """The real diffusers pipeline (``pipe``, else the tiny one at float32) and its call: (pipeline, call(),
    settings before the prompt's). ``image_sizes``: (height, width) input images, each output its own, handed
    over as bench does (one generator per output)."""
    pipe = pipe or tiny_pipeline(entry)
    defaults = entry.defaults
    settings = {
        "height": defaults.height,
        "width": defaults.width,
        "steps": steps or defaults.steps,
        "guidance_scale": defaults.guidance_scale if guidance_scale is None else guidance_scale,
        "batch_size": batch_size,
        "resolution_binning": defaults.resolution_binning,
    }
    get_family(entry.family).prepare_pipeline(pipe, settings["guidance_scale"], batch_size)
    kwargs = dict(
        num_inference_steps=settings["steps"],
        **get_family(entry.family).guidance_arguments(entry, settings["guidance_scale"]),
        output_type="np",
        generator=torch.Generator().manual_seed(0),
        **entry.extra.get("runtime", {}).get("call", {}),
    )
    if entry.family == "dit":
        inputs = {"class_labels": [1] * batch_size}
    else:
        inputs = {"prompt": [PROMPT] * batch_size, "height": defaults.height, "width": defaults.width}
    if max_sequence_length is not None:
        kwargs["max_sequence_length"] = settings["max_sequence_length"] = max_sequence_length
    if defaults.num_frames:
        kwargs["num_frames"] = defaults.num_frames
        settings["num_frames"] = defaults.num_frames
    image_sizes = image_sizes or tuple(tuple(size) for size in defaults.image_sizes)  # an image-to-video checkpoint's
    if image_sizes:
        pipe = get_family(entry.family).conditioned_pipeline(pipe)
        own = [[Image.new("RGB", (w, h), (90, 40 * k % 256, 160)) for h, w in image_sizes] for k in range(batch_size)]
        inputs.update(get_family(entry.family).image_arguments(entry, own))
        kwargs["generator"] = [torch.Generator().manual_seed(k) for k in range(batch_size)]
        settings["image_sizes"] = tuple(image_sizes)
    accepted = inspect.signature(type(pipe).__call__).parameters  # HunyuanVideo 1.5 i2v takes no size: its image's
    inputs = {name: value for name, value in inputs.items() if name in accepted}
    settings = {name: value for name, value in settings.items() if name not in ("height", "width") or name in accepted}
    if image_sizes:  # as bench calls it: one generator per output, where the pipeline would repeat work for each
        seeded = get_family(entry.family).seeded_call(pipe, {**inputs, **kwargs})
        return pipe, lambda: pipe(**seeded), settings
    return pipe, lambda: pipe(**inputs, **kwargs), settings


def run_tiny(
    entry: PipelineEntry,
    batch_size: int = 1,
    guidance_scale: float | None = None,
    steps: int | None = None,
    max_sequence_length: int | None = None,
):
    """Generate with the real diffusers pipeline; return (pipeline, per-component MACs, settings)."""
    pipe, call, settings = tiny_call(entry, batch_size, guidance_scale, steps, max_sequence_length)
    components = {name: getattr(pipe, name) for name in entry.components}
    with torch.no_grad(), count_flops(components) as counts:
        call()
    macs = {name: sum(counts.by_module.get(name, {}).values()) // 2 for name in entry.components}
    return pipe, macs, {**settings, **token_settings(entry, pipe)}


def counted_run(entry: PipelineEntry, **options):
    """``tiny_call(entry, **options)`` run for real under the counter, each VAE encode's input shape recorded: the
    pipeline, its MACs per component, the profile settings of the run, the encoded shapes and the output."""
    pipe, call, settings = tiny_call(entry, **options)
    encode, encoded = pipe.vae.encode, []

    def spy(x, *args, **kwargs):
        encoded.append(tuple(x.shape))
        return encode(x, *args, **kwargs)

    pipe.vae.encode = spy
    with torch.no_grad(), count_flops({name: getattr(pipe, name) for name in entry.components}) as counts:
        output = call()
    macs = {name: sum(counts.by_module.get(name, {}).values()) // 2 for name in entry.components}
    return pipe, macs, {**settings, **token_settings(entry, pipe)}, encoded, output


def macs_by_name(result) -> dict[str, int]:
    """A profile's MACs per component name, over its roles (a VAE that encodes an input image and decodes the
    output is two rows of one component), as the counter attributes a real run's."""
    macs: dict[str, int] = {}
    for component in result.components:
        macs[component.name] = macs.get(component.name, 0) + component.macs
    return macs


class _Encoded(Exception):
    pass


def encoded_size(pipe, **call) -> tuple[int, int]:
    """Call ``pipe`` and stop it where its VAE encodes the input image: that image's (height, width), as the
    pipeline resized it (the run stops there: a real-size image is too big for a tiny transformer)."""

    def stop(x, *args, **kwargs):
        raise _Encoded(tuple(x.shape[-2:]))

    pipe.vae.encode = stop
    try:
        pipe(**call)
    except _Encoded as caught:
        return caught.args[0]
    raise AssertionError("the pipeline never encoded an image")


def default_images(entry: PipelineEntry) -> dict:
    """The ``__call__`` arguments of the input image an image-to-video checkpoint needs (its catalog default), for
    the tests that call a pipeline directly; none for the others."""
    own = [[Image.new("RGB", (w, h), (90, 40, 160)) for h, w in entry.defaults.image_sizes]]
    return get_family(entry.family).image_arguments(entry, own) if entry.defaults.image_sizes else {}
