"""The registry as tables: techniques for one model (applies, or why not), and the technique x
family matrix, both computed from ``supports``."""

from __future__ import annotations

from rich.markup import escape

from diffmeter.optimize.matrix import Compatibility
from diffmeter.report.layout import Column, FittedTable


def model_table(title: str, rows: list[Compatibility]) -> FittedTable:
    table = FittedTable(
        escape(title),
        [
            Column("technique", justify="left"),
            Column("kind", justify="left", drop=1),
            Column("images", justify="left", drop=2),
            Column("applies", justify="left"),
            Column("parameters (defaults) / why not", justify="left"),
        ],
        caption="images: 'same' = lossless up to float reassociation; 'changed' = compare with --compare-baseline",
    )
    for row in rows:
        detail = row.reason if not row.applies else _parameters(row)
        if row.variants:
            detail = "fits: " + ", ".join(v.removeprefix(row.name + "-") for v in row.variants)
        table.add_row(
            row.name,
            row.kind,
            "same" if row.lossless else "changed",
            "[green]yes[/]" if row.applies else "[red]no[/]",
            escape(detail),
        )
    return table


def matrix_table(title: str, columns: list[str], rows: dict[str, list[Compatibility]]) -> FittedTable:
    """rows: technique -> one Compatibility per column (model or family), listed as words so the
    table reads at any width."""
    table = FittedTable(
        escape(title),
        [
            Column("technique", justify="left"),
            Column("applies to", justify="left"),
            Column("does not apply to", justify="left", drop=1),
        ],
        caption="`diffmeter optimizations MODEL` says why a technique does not apply",
    )
    for name, cells in rows.items():
        fits = [
            f"{column} ({', '.join(cell.models)})" if cell.models else column
            for column, cell in zip(columns, cells, strict=True)
            if cell.applies
        ]
        misses = [column for column, cell in zip(columns, cells, strict=True) if not cell.applies]
        if not fits and all(cell.needs_weights for cell in cells):  # no file here to tell: not "none"
            table.add_row(name, "[dim]checked with its file (--weights)[/]", "-")
            continue
        table.add_row(name, ", ".join(fits) or "[dim]none here[/]", ", ".join(misses) or "-")
    return table


def _parameters(row: Compatibility) -> str:
    return ", ".join(f"{key}={value}" for key, value in row.parameters.items()) or "-"
