"""The compatibility of every registered technique with a model, computed from the registry."""

from __future__ import annotations

import torch
from pydantic import BaseModel

from diffmeter.catalog.entry import PipelineEntry
from diffmeter.families import get_family
from diffmeter.optimize.base import Target
from diffmeter.optimize.registry import REGISTRY


class Compatibility(BaseModel):
    """One technique on one model: which of its variants apply, or why none does."""

    name: str
    kind: str
    lossless: bool
    summary: str
    parameters: dict[str, object]
    applies: bool
    #: the variants that apply, when the technique has several (schedulers)
    variants: list[str] = []
    reason: str | None = None
    #: in a family's row, the family's models it applies to where that is not all of them (``family_compatibility``)
    models: list[str] = []
    #: a backend that reads the user's pre-quantized file or folder (``--weights``): without one, whether it applies is
    #: not known (GGUF, BFL, Nunchaku, AutoRound)
    needs_weights: bool = False


def compatibility(entry: PipelineEntry, device: torch.device, dtype: str | None = None) -> list[Compatibility]:
    target = Target(entry, get_family(entry.family), device, dtype or entry.defaults.dtype, entry.defaults.steps)
    rows = []
    for name, cls in sorted(REGISTRY.items(), key=lambda item: (item[1].kind, item[0])):
        variants = cls.variants()
        reasons = {variant.label(): variant.refusal(target)[0] for variant in variants}
        fitting = [label for label, reason in reasons.items() if reason is None]
        rows.append(
            Compatibility(
                name=name,
                kind=cls.kind,
                lossless=cls.lossless,
                summary=cls.summary,
                parameters={
                    key: "(required)" if field.is_required() else field.default
                    for key, field in cls.Config.model_fields.items()
                },
                applies=bool(fitting),
                variants=fitting if len(reasons) > 1 else [],
                reason=None if fitting else next(iter(reasons.values())),
                needs_weights=_needs_weights(variants[0], target),
            )
        )
    return rows


def _needs_weights(variant, target: Target) -> bool:
    """Whether only the user's file is missing to tell: a backend reading one, none given, and able to run on this
    device (Nunchaku on a CPU is refused there whatever the file)."""
    if getattr(variant.config, "file", "") is not None:
        return False
    return getattr(variant, "cannot_run", lambda target: None)(target) is None


def family_compatibility(entries: list[PipelineEntry], device: torch.device) -> list[Compatibility]:
    """One row per technique over a family's models: the first model's row it applies to (else the first model's),
    naming in ``models`` those it applies to when some do not (SeaCache: Wan's text-to-video models, not its
    image-to-video ones)."""
    per_model = [compatibility(entry, device) for entry in entries]
    rows = []
    for cells in zip(*per_model, strict=True):
        fits = [entry.name for entry, cell in zip(entries, cells, strict=True) if cell.applies]
        first = next((cell for cell in cells if cell.applies), cells[0])
        rows.append(first.model_copy(update={"models": fits if len(fits) < len(entries) else []}))
    return rows
