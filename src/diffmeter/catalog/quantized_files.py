"""The quantized checkpoints people download for catalog models (``data/quantized/files.json``, copied from
benchmarks/published_quantized.yaml with its sources): each file's size as published, and whether diffmeter models
its converter's per-tensor rules (``rules_modelled``; ``not_modelled`` says why not)."""

from __future__ import annotations

import json
from decimal import Decimal
from functools import cache
from importlib import resources
from typing import Literal

from pydantic import BaseModel

#: the published size units: bytes per unit
UNITS = {"B": 1, "MB": 10**6, "GB": 10**9}


class PublishedSize(BaseModel):
    """A size as its source shows it: exact bytes ("B"), or the Hub's rounded decimal MB or GB."""

    value: int | float  # as published: 128 (MB) is not 128.0
    unit: str

    def byte_range(self) -> tuple[int, int]:
        """The bytes the published figure stands for: exact, or its rounding's half a last digit either side."""
        scale = UNITS[self.unit.split()[0]]
        if scale == 1:
            return int(self.value), int(self.value)
        half = Decimal(10) ** Decimal(str(self.value)).as_tuple().exponent / 2
        return int((Decimal(str(self.value)) - half) * scale), int((Decimal(str(self.value)) + half) * scale)


class QuantizedFile(BaseModel):
    """One published file of a catalog model's component."""

    model: str
    component: str
    repo: str
    file: str
    format: str
    quant_type: str
    size: PublishedSize
    source: str
    url: str
    quote: str
    converter: str
    rules_modelled: bool
    #: the converter rule set a GGUF file is predicted with (``predict.gguf_city96.RULES``)
    rules: str = "city96"
    not_modelled: str | None = None
    note: str | None = None
    #: a single file written from catalog components (``predict.checkpoint_files``): component -> how it is stored
    parts: dict[str, str] | None = None
    #: "bytes": one predicted size; "range": the bytes over the per-tensor choices its source does not publish
    predicted_as: Literal["bytes", "range"] = "bytes"


@cache
def all_files() -> tuple[QuantizedFile, ...]:
    raw = json.loads((resources.files("diffmeter.catalog") / "data" / "quantized" / "files.json").read_text())
    return tuple(QuantizedFile.model_validate(row) for row in raw["files"])


def files_of(model: str) -> list[QuantizedFile]:
    """The listed files of the catalog model named ``model`` (its first alias)."""
    return [found for found in all_files() if found.model == model]
