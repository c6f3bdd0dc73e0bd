"""Loading at a dtype leaves every tensor at the dtype ``from_pretrained`` leaves it (``loading.cast_as_loaded``):
parameters and stored buffers cast, a non-persistent buffer the class builds in float32 kept in float32. Held to
diffusers' own ``from_pretrained`` of a saved tiny pipeline, for the random-weight loader and the memory
prediction's meta build alike."""

from __future__ import annotations

import torch

from diffmeter.catalog import resolve
from diffmeter.loading import load_pipeline
from diffmeter.predict.footprints import meta_module
from diffmeter.tiny import tiny_pipeline
from diffmeter.weights import WeightsSource


def dtypes(module: torch.nn.Module) -> dict[str, torch.dtype]:
    return {name: t.dtype for name, t in [*module.named_parameters(), *module.named_buffers()]}


def test_random_and_predicted_components_hold_the_dtypes_from_pretrained_gives(tmp_path):
    import diffusers

    entry = resolve("tiny-pixart")
    tiny_pipeline(entry, seed=3).save_pretrained(tmp_path / "pixart")
    real = diffusers.PixArtSigmaPipeline.from_pretrained(tmp_path / "pixart", torch_dtype=torch.bfloat16)
    loaded = load_pipeline(entry, WeightsSource("tiny-random", None, None), torch.device("cpu"), "bfloat16")
    transformer = dtypes(real.transformer)
    assert transformer["pos_embed.pos_embed"] == torch.float32  # non-persistent: no checkpoint value casts it
    assert transformer["pos_embed.proj.weight"] == torch.bfloat16
    for name in ("transformer", "vae", "text_encoder"):
        expected = dtypes(getattr(real, name))
        assert dtypes(getattr(loaded, name)) == expected, name
        assert dtypes(meta_module(entry.components[name], torch.bfloat16)) == expected, name
