"""Typed catalog entries: a pipeline's components, configs and defaults, as data."""

from __future__ import annotations

import difflib
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

DType = Literal["float16", "bfloat16", "float32"]


class Defaults(BaseModel):
    """How the model is meant to be run, from its model card or pipeline defaults."""

    height: int
    width: int
    steps: int
    guidance_scale: float
    dtype: DType = "float32"
    num_frames: int | None = None
    #: the pipeline snaps sizes to aspect-ratio bins by default (PixArt, SANA, HunyuanDiT)
    resolution_binning: bool = True
    #: components the model card loads at another dtype than ``dtype`` (Wan's float32 VAE)
    component_dtypes: dict[str, DType] = {}
    #: the input image an image-to-video or editing checkpoint is run on without ``--image-size`` ((height, width):
    #: its model card's, or one its pipeline resizes any image to); empty: text alone
    image_sizes: list[tuple[int, int]] = []
    #: the sequence encoder's ``max_sequence_length`` where the model card passes one (FLUX.1-schnell's 256; bench
    #: passes it too, and ``text_max_length`` records it); None: the pipeline's own
    max_sequence_length: int | None = None
    #: Lumina2Pipeline's ``cfg_trunc_ratio`` where the model card passes one: the unconditional call runs only on
    #: the first steps; None: the pipeline's 1.0 (every step)
    cfg_trunc_ratio: float | None = None


class ComponentEntry(BaseModel):
    """One pipeline component: its class and the config it is built from."""

    model_config = ConfigDict(populate_by_name=True)

    class_name: str = Field(alias="class")
    config: dict[str, Any]
    published_params: int | None = None
    published_params_source: str | None = None


class Named:
    """What a catalog item (a pipeline, a ControlNet) is called, and whether it is a tiny random test one."""

    @property
    def name(self) -> str:
        return self.aliases[0] if self.aliases else self.id

    @property
    def is_tiny(self) -> bool:
        return self.origin == "tiny"


class PipelineEntry(Named, BaseModel):
    """A whole pipeline: what the catalog, a local directory or the HF cache describes."""

    id: str
    aliases: list[str] = []
    family: str
    pipeline_class: str
    defaults: Defaults
    text_max_length: dict[str, int] = {}
    components: dict[str, ComponentEntry]
    sources: dict[str, str] = {}
    extra: dict[str, Any] = {}
    notes: str = ""
    origin: str = "catalog"


def closest_names(query: str, names: dict[str, Any], n: int = 3) -> list[str]:
    """Up to ``n`` names of ``names`` (name -> the entry it names) closest to ``query``, one per entry: an entry's id
    and its aliases ("flux-dev", "flux1-dev") are one suggestion, its closest name. Names the query begins ("ltx":
    ltx-video) come first, shortest first, then the closest by difflib's ratio."""
    query = query.lower()
    begun = sorted((name for name in names if name.startswith(query)), key=len)
    close = begun + [n for n in difflib.get_close_matches(query, names, n=len(names), cutoff=0.5) if n not in begun]
    firsts: dict[int, str] = {}
    for name in close:
        firsts.setdefault(id(names[name]), name)
    return list(firsts.values())[:n]
