"""How diffusers decodes with a tiled or sliced VAE: the modes, how each is switched on, and the parts of the decode
run again alike (what the fake-tensor runs record once and replay)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from diffmeter.errors import DiffmeterError

if TYPE_CHECKING:
    import torch

#: diffusers' decode modes whose activations a prediction can hold (``MemoryPrediction.vae_activation_bytes``)
VAE_MODES = ("vae-tiling", "vae-slicing")
#: how diffusers switches a VAE to each mode (AutoencoderMixin): the ``enable_*`` method, and the flag it sets
DECODE_SWITCHES = {"vae-tiling": ("enable_tiling", "use_tiling"), "vae-slicing": ("enable_slicing", "use_slicing")}


def switch_on(entry, vae: torch.nn.Module, modes: tuple[str, ...]) -> None:
    """Turn ``modes`` on in ``vae`` as the pipeline's user would, or say plainly that it has no such mode."""
    for mode in modes:
        try:
            getattr(vae, DECODE_SWITCHES[mode][0])()
        except (AttributeError, NotImplementedError):  # ModelMixin's own enable_tiling raises for VAEs without it
            raise DiffmeterError(f"{entry.name}: its VAE ({type(vae).__name__}) has no {mode}: drop --{mode}") from None


def decode_units(vae: torch.nn.Module) -> list[tuple[torch.nn.Module, str]]:
    """The parts of a VAE decode that diffusers runs again alike: ``_decode`` once per slice of a sliced decode
    (diffusers 0.42.1 autoencoder_kl.py:232, autoencoder_kl_wan.py:1238, autoencoder_kl_cogvideox.py:1223,
    autoencoder_kl_hunyuan_video.py:841, autoencoder_kl_ltx.py:1304), ``post_quant_conv`` and ``decoder`` once per
    tile of a tiled one (autoencoder_kl.py:390-391, autoencoder_kl_hunyuan_video.py:959-960,
    autoencoder_kl_cogvideox.py:1378-1379, autoencoder_kl_ltx.py:1424; per frame of a tile in Wan's and
    Qwen-Image's, autoencoder_kl_wan.py:1382, whose decoder fills the frame cache it is handed: ``replay`` writes
    the recorded items back)."""
    import torch

    units = [(vae, "_decode")] if callable(getattr(vae, "_decode", None)) else []
    return units + [
        (part, "forward")
        for part in (getattr(vae, name, None) for name in ("post_quant_conv", "decoder"))
        if isinstance(part, torch.nn.Module)
    ]
