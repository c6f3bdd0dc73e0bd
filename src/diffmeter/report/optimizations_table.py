"""The registry as tables: techniques for one model (applies, or why not), and the
technique x family matrix, both computed from ``supports``."""

from __future__ import annotations

from rich.markup import escape
from rich.table import Table

from diffmeter.optimize.matrix import Compatibility


def model_table(title: str, rows: list[Compatibility]) -> Table:
    table = Table(title=escape(title), title_justify="left")
    for column in ("technique", "kind", "images", "applies", "parameters (defaults) / why not"):
        table.add_column(column, overflow="fold")
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
    table.caption = "images: 'same' = lossless up to float reassociation; 'changed' = compare with --compare-baseline"
    return table


def matrix_table(title: str, columns: list[str], rows: dict[str, list[Compatibility]]) -> Table:
    """rows: technique -> one Compatibility per column (model or family)."""
    table = Table(title=title, title_justify="left")
    table.add_column("technique")
    for column in columns:
        table.add_column(column, justify="center")
    for name, cells in rows.items():
        table.add_row(name, *("[green]✓[/]" if cell.applies else "[red]✗[/]" for cell in cells))
    table.caption = "✗: `diffmeter optimizations MODEL` says why"
    return table


def _parameters(row: Compatibility) -> str:
    return ", ".join(f"{key}={value}" for key, value in row.parameters.items()) or "-"
