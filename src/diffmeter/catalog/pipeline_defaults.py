"""How a pipeline folder runs when called with nothing but a prompt: the defaults of its own
pipeline class's ``__call__`` (steps, guidance, size, frames, resolution binning, the padded
length of its sequence encoder), the folder's tokenizer configs, and the family's rule for the
default size where ``__call__`` leaves it to the model config.

A PixArt-Sigma folder therefore pads T5 to the 300 tokens ``PixArtSigmaPipeline`` does, not to
PixArt-Alpha's 120.
"""

from __future__ import annotations

import inspect
import json
from pathlib import Path

from diffmeter.catalog.entry import Defaults, PipelineEntry

#: tokenizer_config.json sentinels meaning "no limit"
UNLIMITED = 100_000
#: encoders the pipelines pad to their tokenizer's model_max_length (CLIP in SD, SDXL, SD3, FLUX);
#: other encoders' lengths are pipeline constants, kept from the family's catalog entry
PADDED_TO_TOKENIZER_LIMIT = ("CLIPTextModel", "CLIPTextModelWithProjection")


def call_defaults(pipeline_class: str) -> dict:
    """The keyword defaults of ``pipeline_class.__call__`` (empty when diffusers lacks the class)."""
    import diffusers

    cls = getattr(diffusers, pipeline_class, None)
    if cls is None:
        return {}
    parameters = inspect.signature(cls.__call__).parameters
    return {name: p.default for name, p in parameters.items() if p.default is not inspect.Parameter.empty}


def derive(entry: PipelineEntry, root: Path, template: PipelineEntry | None) -> tuple[Defaults, dict[str, int]]:
    """(defaults, text_max_length) for ``entry`` read from ``root``; ``template`` (a catalog entry of
    the same family) fills what neither the class nor the folder says (dtype, fixed encoder lengths)."""
    from diffmeter.families import get_family

    family = get_family(entry.family)
    called = call_defaults(entry.pipeline_class)
    fallback = template.defaults if template else Defaults(height=1024, width=1024, steps=30, guidance_scale=5.0)
    height, width = called.get("height"), called.get("width")
    if height is None or width is None:
        height, width = family.default_size(entry)
    frames = (called.get("num_frames") or family.default_frames(entry)) if family.is_video else None
    defaults = Defaults(
        height=height,
        width=width,
        steps=called.get("num_inference_steps") or fallback.steps,
        guidance_scale=_or(family.called_guidance(entry, called), fallback.guidance_scale),
        dtype=fallback.dtype,
        num_frames=frames if frames is not None else fallback.num_frames,
        resolution_binning=called.get("use_resolution_binning", fallback.resolution_binning),
    )
    lengths = dict(template.text_max_length) if template else {}
    for encoder in family.text_encoders:
        if encoder not in entry.components:
            continue
        if encoder == family.sequence_encoder and isinstance(called.get("max_sequence_length"), int):
            lengths[encoder] = called["max_sequence_length"]
        elif entry.components[encoder].class_name in PADDED_TO_TOKENIZER_LIMIT:
            tokenizer = root / encoder.replace("text_encoder", "tokenizer") / "tokenizer_config.json"
            limit = _model_max_length(tokenizer)
            if limit is not None:
                lengths[encoder] = limit
    return defaults, lengths


def _or(value, fallback):
    return fallback if value is None else value


def _model_max_length(path: Path) -> int | None:
    try:
        value = json.loads(path.read_text()).get("model_max_length")
    except (OSError, ValueError):
        return None
    return int(value) if isinstance(value, int | float) and 0 < value < UNLIMITED else None


def bare_call_differences(entry: PipelineEntry) -> dict[str, str]:
    """Where a bare ``pipeline(prompt)`` call runs otherwise than the entry's defaults (a catalog entry's are its
    model card's): {"steps": "28 steps", "size": "832x480 px", "guidance_scale": "guidance 5", "num_frames": ...},
    each as the call runs it; empty where they agree or diffusers lacks the class."""
    from diffmeter.families import get_family

    called = call_defaults(entry.pipeline_class)
    if not called:
        return {}
    family, ours = get_family(entry.family), entry.defaults
    found = {}
    steps = called.get("num_inference_steps")
    if isinstance(steps, int) and steps != ours.steps:
        found["steps"] = f"{steps} steps"
    height, width = called.get("height"), called.get("width")
    if height is None or width is None:
        try:
            height, width = family.default_size(entry)
        except (KeyError, TypeError):  # a config without the sample size the rule reads: the size is not said
            height = width = None
    if height and width and (height, width) != (ours.height, ours.width):
        found["size"] = f"{width}x{height} px"
    guidance = family.called_guidance(entry, called)
    if isinstance(guidance, int | float) and guidance != ours.guidance_scale:
        found["guidance_scale"] = f"guidance {guidance:g}" + (" (no CFG)" if guidance <= 1 else "")
    frames = (called.get("num_frames") or family.default_frames(entry)) if family.is_video else None
    if isinstance(frames, int) and frames != ours.num_frames:
        found["num_frames"] = f"{frames} frames"
    return found
