"""The quantized checkpoints people download for catalog models (``data/quantized/files.json``, copied from
benchmarks/published_quantized.yaml with its sources): each file's size as published, and whether diffmeter models
its converter's per-tensor rules (``rules_modelled``; ``not_modelled`` says why not)."""

from __future__ import annotations

import json
import math
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

    def gib_decimals(self) -> int:
        """The decimals of the GiB figure, no more precise than the published one: two for exact bytes, else as many
        significant digits as the figure shows (23.8 GB: 22.2 GiB; 12 GB: 11 GiB; 128 MB: 0.119 GiB)."""
        if UNITS[self.unit.split()[0]] == 1:
            return 2
        shown = len(Decimal(str(self.value)).as_tuple().digits)
        return max(0, shown - 1 - math.floor(math.log10(self.value * UNITS[self.unit.split()[0]] / 2**30)))

    def gib(self) -> float:
        """The size in GiB (2^30 bytes, as GPU memory is counted), rounded to ``gib_decimals``."""
        return round(self.value * UNITS[self.unit.split()[0]] / 2**30, self.gib_decimals())


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
