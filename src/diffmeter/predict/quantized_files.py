"""The predicted size of a published quantized file of a catalog model (``catalog.quantized_files``): a GGUF file's
tensor data as city96's tools lay it out (``quantized_formats.gguf_file_bytes``) from the catalog's config alone."""

from __future__ import annotations

import torch

from diffmeter.catalog import resolve
from diffmeter.catalog.quantized_files import QuantizedFile
from diffmeter.predict.footprints import meta_module
from diffmeter.predict.quantized_formats import gguf_file_bytes


def predicted_bytes(files: list[QuantizedFile]) -> list[int | None]:
    """Each file's predicted bytes (None: not a GGUF file, whose layout is not predicted from the config); each
    component built on meta once."""
    built: dict[tuple[str, str], torch.nn.Module] = {}
    found = []
    for file in files:
        if file.format != "gguf":
            found.append(None)
            continue
        key = (file.model, file.component)
        if key not in built:  # the dtype does not change a file's bytes: its types do
            built[key] = meta_module(resolve(file.model).components[file.component], torch.bfloat16)
        found.append(gguf_file_bytes(built[key], file.quant_type))
    return found


def error(predicted: int, file: QuantizedFile) -> float:
    """The prediction's relative error against the published size (0 inside a rounded figure's range)."""
    low, high = file.size.byte_range()
    if low <= predicted <= high:
        return 0.0
    return predicted / (low if predicted < low else high) - 1
