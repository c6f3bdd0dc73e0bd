"""`diffmeter models MODEL`: the quantized files published for a catalog model, each size as published beside the
size predicted from the catalog's config (``predict.quantized_files``)."""

from __future__ import annotations

from rich.markup import escape

from diffmeter.catalog.quantized_files import UNITS, QuantizedFile
from diffmeter.report.layout import Column, FittedTable


def published_text(file: QuantizedFile) -> str:
    """The size in its source's unit: exact bytes, or the Hub's rounded decimal figure."""
    unit = file.size.unit.split()[0]
    return f"{int(file.size.value):,} B" if unit == "B" else f"{file.size.value:g} {unit}"


def predicted_text(predicted: int | None, file: QuantizedFile) -> str:
    """The prediction in the published figure's unit (decimal GB: 10^9 bytes, as the Hub counts)."""
    if predicted is None:
        return "-"
    unit = file.size.unit.split()[0]
    return f"{predicted:,} B" if unit == "B" else f"{predicted / UNITS[unit]:.3f} {unit}"


def files_table(model: str, files: list[QuantizedFile], predicted: list[int | None], errors) -> FittedTable:
    """A row per file: where it is, its type, the published and predicted sizes, the error and whether the
    converter's rules are modelled (the 0.5% the tests hold)."""
    table = FittedTable(
        escape(f"{model}: quantized files as published, and as predicted from the catalog's config"),
        [
            Column("repo / file", justify="left"),
            Column("component", justify="left", drop=0),
            Column("type", justify="left", drop=1),
            Column("published"),
            Column("predicted"),
            Column("error", drop=3),
            Column("rules", justify="left", drop=2),
        ],
    )
    reasons = list(dict.fromkeys(file.not_modelled for file in files if not file.rules_modelled))
    for file, size, found in zip(files, predicted, errors, strict=True):
        table.add_row(
            escape(f"{file.repo}/{file.file}"),
            file.component,
            escape(file.quant_type),
            published_text(file),
            predicted_text(size, file),
            "-" if found is None else f"{found:+.2%}",
            "modelled" if file.rules_modelled else f"not modelled ({reasons.index(file.not_modelled) + 1})",
        )
    said = " ".join(f"({number}) {escape(reason)}." for number, reason in enumerate(reasons, 1))
    table.caption = (
        "Rules: whether the converter's per-tensor types are modelled (then within 0.5%, held by the tests); not "
        f"modelled: {said} "
        "Published: the Hugging Face commit page's exact bytes (B) or its file list's rounded decimal GB (10^9 "
        "bytes); error 0 inside a rounded figure's range. Predicted: the tensor data (header left out; an SVDQuant "
        "safetensors file's counted). Sources: "
        "benchmarks/published_quantized.yaml."
    )
    return table
