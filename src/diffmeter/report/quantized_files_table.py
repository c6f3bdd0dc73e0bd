"""`diffmeter models MODEL`: the quantized files published for a catalog model, each size as published beside the
size predicted from the catalog's config (``predict.quantized_files``)."""

from __future__ import annotations

from decimal import Decimal

from rich.markup import escape

from diffmeter.catalog.quantized_files import UNITS, QuantizedFile
from diffmeter.report.layout import Column, FittedTable


def published_text(file: QuantizedFile) -> str:
    """The size in GiB, then in brackets as its source publishes it: exact bytes, or the Hub's rounded decimal
    figure ("22.2 GiB (23.8 GB)")."""
    unit = file.size.unit.split()[0]
    published = f"{int(file.size.value):,} B" if unit == "B" else f"{file.size.value:g} {unit}"
    return f"{file.size.gib():,.{file.size.gib_decimals()}f} GiB ({published})"


def predicted_text(predicted: int | None, file: QuantizedFile) -> str:
    """The prediction in GiB, then in brackets in the published figure's unit (decimal GB: 10^9 bytes, as the Hub
    counts), as ``published_text`` shows the published size."""
    if predicted is None:
        return "-"
    unit = file.size.unit.split()[0]
    same = f"{predicted:,} B" if unit == "B" else f"{predicted / UNITS[unit]:.3f} {unit}"
    return f"{predicted / 2**30:,.3f} GiB ({same})"


def range_text(span: tuple[int, int], file: QuantizedFile) -> str:
    """A predicted range in GiB, then in the published figure's unit, to one digit past the figure (two at least):
    the ends that digit tells apart, one figure where it does not."""
    unit = file.size.unit.split()[0]
    digits = max(2, 1 - Decimal(str(file.size.value)).as_tuple().exponent)
    low, high = (f"{end / UNITS[unit]:.{digits}f}" for end in span)
    gib_low, gib_high = (f"{end / 2**30:,.{digits}f}" for end in span)
    gib = f"{gib_low} GiB" if gib_low == gib_high else f"{gib_low}-{gib_high} GiB"
    return f"{gib} ({low} {unit})" if low == high else f"{gib} ({low}-{high} {unit})"


def range_error_text(ends: tuple[float, float]) -> str:
    """Each end's error, one figure where both agree."""
    low, high = (f"{end:+.2%}" for end in ends)
    return low if low == high else f"{low} to {high}"


def files_table(
    model: str, files: list[QuantizedFile], predicted: list[int | None], errors, ranges=None, range_errors=None
) -> FittedTable:
    """A row per file: where it is, its type, the published and predicted sizes (a range where the file's source
    leaves per-tensor choices unpublished), the error and whether the converter's rules are modelled (the 0.5% the
    tests hold)."""
    ranges = ranges or [None] * len(files)
    range_errors = range_errors or [None] * len(files)
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
    for file, size, found, span, ends in zip(files, predicted, errors, ranges, range_errors, strict=True):
        table.add_row(
            escape(f"{file.repo}/{file.file}"),
            ", ".join(file.parts) if file.parts else file.component,
            escape(file.quant_type),
            published_text(file),
            predicted_text(size, file) if span is None else range_text(span, file),
            range_error_text(ends) if ends is not None else "-" if found is None else f"{found:+.2%}",
            "modelled" if file.rules_modelled else f"not modelled ({reasons.index(file.not_modelled) + 1})",
        )
    said = " ".join(f"({number}) {escape(reason)}." for number, reason in enumerate(reasons, 1))
    table.caption = (
        "Rules: whether the converter's per-tensor types are modelled (then within 0.5%, held by the tests)"
        + (f"; not modelled: {said} " if said else ". ")
        + "Published: the size in GiB (2^30 bytes, as GPU memory is counted; to the published figure's precision), "
        "then as published: the Hugging Face commit page's exact bytes (B) or its file list's rounded decimal GB "
        "(10^9 bytes); error 0 inside a rounded figure's range. Predicted: in GiB, then in the published figure's "
        "unit: the tensor data (header left out; an SVDQuant "
        "safetensors file's counted); a range (low-high) spans the per-tensor widths the file's source does not "
        "publish, with each end's error. Sources: "
        "benchmarks/published_quantized.yaml."
    )
    return table
