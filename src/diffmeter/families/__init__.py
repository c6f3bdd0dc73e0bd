"""Per-family descriptions of how a pipeline calls its components (see base.py)."""

from diffmeter.families import dit, flux, hunyuandit, kandinsky3, lumina, pixart, sana, sd3, unet, video  # noqa: F401
from diffmeter.families.base import DENOISER, FAMILIES, TEXT_ENCODER, VAE_DECODER, Call, Family, Shapes, get_family

__all__ = ["DENOISER", "FAMILIES", "TEXT_ENCODER", "VAE_DECODER", "Call", "Family", "Shapes", "get_family"]
