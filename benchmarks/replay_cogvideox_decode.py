"""CogVideoX's VAE decode as diffusers ran it in September 2024, replayed on fake tensors beside the installed one
(benchmarks/compare_quantized_memory.py reads the result: the diffusers-torchao README's CogVideoX peaks are of
that code).

Until diffusers bd4df2856a ("[refactor] remove conv_cache from CogVideoX VAE", 2024-09-28) each causal 3D convolution
kept its two-frame cache on the module and replaced it conv by conv; since then ``forward`` returns every
convolution's new cache, and the decoder holds the previous frame batch's caches while it runs the next. The
README's table (added 2024-09-04) ran diffusers main of then ("updated diffusers and torchao codebases").

Usage, with a diffusers checkout (no network here):
    git -C DIFFUSERS show 2ee3215949:src/diffusers/models/autoencoders/autoencoder_kl_cogvideox.py > old.py
    python benchmarks/replay_cogvideox_decode.py old.py cogvideox-5b
It prints the decode's activation bytes, installed and old, measured by the prediction's own tracker
(``predict.memory.track_call``, every frame batch run: no replay of repeated units, which the old module-held
caches would break). One line of the old file is changed: ``CogVideoXSafeConv3d``'s ``torch.prod(torch.tensor(
input.shape)).item()`` becomes ``input.numel()``, the same number, which a fake tensor can give.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import torch

from diffmeter.loading import cast_as_loaded, default_dtype
from diffmeter.predict.footprints import meta_module
from diffmeter.predict.memory import DTYPES, fake_copy, settled_plan, track_call
from diffmeter.spec import ProfileSpec
from diffmeter.stages import VAE_DECODER

#: the README's CogVideoX setting: the pipeline's default 720x480, 49 frames, bfloat16 (benchmark_video.py)
SETTING = {"height": 480, "width": 720, "num_frames": 49, "steps": 50, "dtype": "bfloat16"}
FAKE_SAFE = (
    "memory_count = torch.prod(torch.tensor(input.shape)).item() * 2 / 1024**3",
    "memory_count = input.numel() * 2 / 1024**3",
)


def old_class(path: Path):
    """``AutoencoderKLCogVideoX`` of the old file, imported inside diffusers' package (its relative imports)."""
    source = path.read_text()
    if FAKE_SAFE[0] not in source:
        raise SystemExit(f"{path}: not the September 2024 file (no `{FAKE_SAFE[0]}`)")
    name = "diffusers.models.autoencoders.autoencoder_kl_cogvideox_2024_09"
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader(name, loader=None))
    module.__package__ = "diffusers.models.autoencoders"
    sys.modules[name] = module
    exec(compile(source.replace(*FAKE_SAFE), str(path), "exec"), module.__dict__)
    return module.AutoencoderKLCogVideoX


def decode_bytes(model: str, path: Path) -> tuple[int, int]:
    """(installed, old) activation bytes of the VAE decode at ``SETTING``."""
    spec = ProfileSpec(model=model, batch_size=1, **SETTING)
    entry, settled, plan = settled_plan(spec)
    call = next(c for c in plan if c.role == VAE_DECODER)
    dtype = DTYPES[settled.dtype_of("vae")]
    installed = fake_copy(meta_module(entry.components["vae"], dtype))
    with default_dtype(dtype), torch.device("meta"):
        old = old_class(path).from_config(dict(installed.config))
    cast_as_loaded(old, dtype)
    return (
        track_call(installed, call, dtype, True, replay=False).activation_bytes,
        track_call(fake_copy(old), call, dtype, True, replay=False).activation_bytes,
    )


def main() -> int:
    if len(sys.argv) != 3:
        print("usage: python benchmarks/replay_cogvideox_decode.py OLD_FILE MODEL")
        return 2
    installed, old = decode_bytes(sys.argv[2], Path(sys.argv[1]))
    print(f"{sys.argv[2]} VAE decode activations: installed {installed} bytes, 2024-09 {old} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
