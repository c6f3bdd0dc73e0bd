"""A tiled and sliced VAE decode replays its repeated parts (``vae_decode.decode_units``: the decode of one slice,
the decoder on one tile) and every figure equals the full run's: the memory tracker's peak and categories, cuDNN's
convolution copies and the operator tally, for every VAE class the catalog's pipelines use, on sizes that tile
(the VAE's own tile sizes, several tiles per side, edge tiles of other shapes, temporal tiles where it has them)."""

from __future__ import annotations

import pytest
from test_replay import both_ways
from tiny_runs import quick_or_slow

from diffmeter.families import VAE_DECODER
from diffmeter.predict import memory
from diffmeter.predict.memory import DTYPES, fake_module, settled_plan
from diffmeter.predict.replay import RUN_ALWAYS, replayed_calls
from diffmeter.spec import ProfileSpec

#: one tiny pipeline per VAE class, with a size (and frames) over its default tiles
SIZES = {
    "tiny-sd": (96, None),  # AutoencoderKL: 32 px tiles
    "tiny-flux2": (96, None),  # AutoencoderKLFlux2
    "tiny-hunyuanimage": (160, None),  # AutoencoderKLHunyuanImage: 64 px tiles
    "tiny-sana": (1024, None),  # AutoencoderDC: 512 px tiles
    "tiny-qwenimage": (512, None),  # AutoencoderKLQwenImage: 256 px tiles, a frame cache it is handed
    "tiny-qwenimage21": (512, None),  # AutoencoderKLQwenImage21
    "tiny-cogvideox": (560, 9),  # AutoencoderKLCogVideoX: 240 x 360 px tiles, a conv cache handed on
    "tiny-hunyuanvideo": (512, 33),  # AutoencoderKLHunyuanVideo: 256 px and 16-frame tiles
    "tiny-hunyuanvideo15": (512, 9),  # AutoencoderKLHunyuanVideo15
    "tiny-wan": (512, 9),  # AutoencoderKLWan: 256 px tiles, a frame cache
    "tiny-ltx": (1024, 25),  # AutoencoderKLLTXVideo: 512 px and 16-frame tiles
    "tiny-ltx2": (1024, 25),  # AutoencoderKLLTX2Video
}


def tiled_sliced_decode(name: str):
    size, frames = SIZES[name]
    video = {"num_frames": frames} if frames else {}
    entry, spec, plan = settled_plan(ProfileSpec(model=name, steps=1, batch_size=2, height=size, width=size, **video))
    (call,) = [c for c in plan if c.role == VAE_DECODER and c.component == "vae"]
    dtype = DTYPES[spec.dtype_of(call.component, call.dtype)]

    def make():
        vae = fake_module(entry.components["vae"], dtype)
        vae.enable_tiling()
        vae.enable_slicing()
        return vae

    return make, call, dtype


@pytest.mark.parametrize("name", quick_or_slow(list(SIZES), quick=("tiny-sd",)))
def test_a_tiled_sliced_decode_replayed_gives_the_full_runs_figures(name, monkeypatch):
    counted = []

    def counting(*args):
        class Counting:
            def __enter__(self):
                self.inner = replayed_calls(*args)
                counted.append(self.inner.__enter__())
                return counted[-1]

            def __exit__(self, *exc):
                return self.inner.__exit__(*exc)

        return Counting()

    monkeypatch.setattr(memory, "replayed_calls", counting)
    make, call, dtype = tiled_sliced_decode(name)
    full, replayed = both_ways(make, call, dtype)
    assert replayed == full
    (tally,) = counted  # the run with replay on
    assert tally["replayed"] >= 2  # the second video's decode at least, or tiles
    assert RUN_ALWAYS not in tally  # Wan's and Qwen-Image's decoders, which fill a frame cache, replayed too
