"""Refuse, before loading, a run that cannot fit in memory, instead of dying mid-run (or being
killed by the kernel on a CPU machine).

The estimate is a lower bound, so the check only refuses what surely does not fit: the
parameters at the run's dtype, plus the one activation every decode must hold, the VAE
decoder's last feature map at full resolution (its first block's channels, at the image size,
for every image of the batch, or one at a time with VAE slicing). Offloading runs skip the
check (weights are not all resident), and ``--no-memory-check`` skips it on request.
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


def decoder_bytes(spec, entry, decoder: str) -> tuple[int, int]:
    """(bytes, channels) of the decoder's full-resolution feature map for the images decoded at once."""
    config = entry.components[decoder].config
    channels = 3
    for key in FULL_RESOLUTION_CHANNELS:
        value = config.get(key)
        if value:
            channels = value[0] if isinstance(value, list) else value
            break
    images = 1 if any(o.name == "vae-slicing" for o in spec.optimizations) else spec.batch_size
    frames = spec.num_frames or 1
    return images * channels * frames * spec.height * spec.width * BYTES[spec.dtype], channels


def check_fits(spec, entry, decoder: str, profile: Profile, device: torch.device) -> None:
    """Raise with the figures when the lower bound exceeds what ``device`` has available."""
    names = {o.name for o in spec.optimizations}
    if "offload" in names:
        return
    decode, channels = (0, 0) if "vae-tiling" in names else decoder_bytes(spec, entry, decoder)
    parameters = profile.param_bytes
    needed = parameters + decode
    available = available_bytes(device)
    if needed > available:
        raise DoesNotFit(
            f"this run needs at least {units.nbytes(needed)} on {device} (parameters {units.nbytes(parameters)} "
            f"+ the VAE decoder's {channels}-channel full-resolution activations {units.nbytes(decode)}) and "
            f"{units.nbytes(available)} is available: lower --batch-size or the size, add --vae-slicing or "
            "--vae-tiling, or pass --no-memory-check"
        )
