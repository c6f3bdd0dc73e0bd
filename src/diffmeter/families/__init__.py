"""Per-family descriptions of how a pipeline calls its components (see base.py).

Every module in this package is imported, so a new family is one new file here (see
docs/adding-a-family.md).
"""

import importlib
import pkgutil

from diffmeter.families.base import (
    DENOISER,
    FAMILIES,
    IMAGE_ENCODER,
    TEXT_ENCODER,
    VAE_DECODER,
    Call,
    Family,
    Shapes,
    get_family,
)

for _module in pkgutil.iter_modules(__path__):
    if _module.name != "base":
        importlib.import_module(f"{__name__}.{_module.name}")

__all__ = [
    "DENOISER",
    "FAMILIES",
    "IMAGE_ENCODER",
    "TEXT_ENCODER",
    "VAE_DECODER",
    "Call",
    "Family",
    "Shapes",
    "get_family",
]
