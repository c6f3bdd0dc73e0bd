"""Refuse, before loading, a run that cannot fit in memory, instead of dying mid-run (or being
killed by the kernel on a CPU machine).

The estimate is a lower bound, so the check only refuses what surely does not fit: the
parameters at the run's dtype, plus what every decode must hold: the VAE decoder's last feature
map at full resolution (its first block's channels, at the image size, for every image of the
batch, or one at a time with VAE slicing) and the decoded images themselves. Quantized weights (int8,
float8) count at one byte per parameter; offloading runs skip the check (weights are not all resident),
and ``--no-memory-check`` skips it on request.
"""

from __future__ import annotations

import torch

from diffmeter import units
from diffmeter.errors import DoesNotFit
from diffmeter.flops.schema import Profile

BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}
#: decoder config keys holding the channels of the full-resolution feature map, by VAE kind
FULL_RESOLUTION_CHANNELS = ("decoder_block_out_channels", "block_out_channels", "base_dim")


def available_bytes(device: torch.device) -> int:
    """Memory a run can still take: free GPU memory, or the system's available RAM."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    import psutil

    return psutil.virtual_memory().available


def full_resolution_channels(config: dict) -> int:
    """Channels of the decoder's last feature map, at the image size (3 when the config does not say)."""
    for key in FULL_RESOLUTION_CHANNELS:
        value = config.get(key)
        if value:
            return value[0] if isinstance(value, list) else value
    return 3


def decode_bytes(spec, entry, decoder: str, batch: int) -> tuple[int, int]:
    """(bytes, channels) a decode of ``batch`` images surely holds: the full-resolution feature map of
    the images decoded at once (one with VAE slicing; not counted with tiling), and the decoded images."""
    names = {o.name for o in spec.optimizations}
    pixels = (spec.num_frames or 1) * spec.height * spec.width * BYTES[spec.dtype]
    channels = 0 if "vae-tiling" in names else full_resolution_channels(entry.components[decoder].config)
    at_once = 1 if "vae-slicing" in names else batch
    return (at_once * channels + 3 * batch) * pixels, channels


def check_fits(
    spec, entry, decoder: str, profile: Profile, device: torch.device, one_byte: set[str] = frozenset()
) -> None:
    """Raise with the figures when the lower bound exceeds what ``device`` has available; when one
    image would fit, name --batch-size and the largest batch that fits. The ``one_byte`` components'
    weights count at one byte per parameter (quantized to int8 or float8)."""
    if any(o.name == "offload" for o in spec.optimizations):
        return
    parameters = sum(c.params if c.name in one_byte else c.param_bytes for c in profile.weights())
    decode, channels = decode_bytes(spec, entry, decoder, spec.batch_size)
    needed = parameters + decode
    available = available_bytes(device)
    if needed <= available:
        return
    held = f"the VAE decoder's {channels}-channel full-resolution activations and " if channels else "the "
    figures = (
        f"at least {units.gib(needed)} on {device} (parameters {units.gib(parameters)} + {held}decoded "
        f"images {units.gib(decode)}) and {units.gib(available)} is available"
    )
    if parameters > available:  # the decode does not tip it over: no decode setting helps
        raise DoesNotFit(f"this run needs {figures}: the weights alone do not fit; {_lighter(spec, device, one_byte)}")
    one = decode_bytes(spec, entry, decoder, 1)[0]
    extra = decode_bytes(spec, entry, decoder, 2)[0] - one  # what each further image adds
    most = 1 + (available - parameters - one) // extra if parameters + one <= available else 0
    if most >= 1:
        slicing = ", add --vae-slicing" if channels and one * spec.batch_size == decode else ""
        raise DoesNotFit(
            f"--batch-size {spec.batch_size} is too large: it needs {figures}; pass --batch-size {most} or "
            f"less{slicing}, or pass --no-memory-check"
        )
    raise DoesNotFit(
        f"this run needs {figures}: lower the size (--height/--width), add --vae-slicing or --vae-tiling, "
        "or pass --no-memory-check"
    )


def _lighter(spec, device: torch.device, one_byte: set[str]) -> str:
    """What holds fewer weights on ``device`` than this run (bench's options, those ``device`` takes), and the
    command that predicts which fit."""
    quantize = [] if one_byte else ["quantize the denoiser (--quantize int8)"]
    if device.type == "cuda":
        ways = ["offload the weights (--offload model, or group or sequential for less)", *quantize]
        ways.append(f"use a GPU with more memory (`diffmeter fit {spec.model} --gpu NAME` predicts what fits where)")
    else:  # offloading moves weights to the CPU: nothing to gain on it
        ways = [
            *(["run in bfloat16 (--dtype bfloat16, half float32's bytes)"] if spec.dtype == "float32" else []),
            *quantize,
        ]
        ways.append("use a machine with more memory")
    return f"{', '.join(ways)}, or pass --no-memory-check"
