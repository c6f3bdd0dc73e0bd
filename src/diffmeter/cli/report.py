"""`diffmeter report`: a study as one self-contained HTML page; `diffmeter compare`: run B against run A."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from diffmeter.cli.app import command, console
from diffmeter.cli.options import AsJson


@command()
def report(
    directory: Annotated[
        str,
        typer.Argument(
            metavar="DIR", help="the --out folder of bench, ladder or sweep (any depth)", show_default=False
        ),
    ],
    out: Annotated[str, typer.Option("-o", "--out", metavar="FILE", help="the HTML file to write")] = "report.html",
    title: Annotated[str, typer.Option(help="the page's title")] = "diffmeter report",
    images: Annotated[int, typer.Option(help="image pairs shown per lossy run (0: none)")] = 4,
    force: Annotated[bool, typer.Option(help="replace the HTML file if it exists")] = False,
) -> None:
    """Every run, ladder and profile under DIR as one HTML page that opens offline: summary, plots, images."""
    from diffmeter.report.html import write_report

    skipped: list[str] = []
    path = write_report(directory, out, title, images, force, skipped)
    for line in skipped:  # one unreadable results.json does not hide the rest of the study
        console.print(line, markup=False, highlight=False)
    size = path.stat().st_size / 2**20
    console.print(f"report written to {path} ({size:.1f} MiB, self-contained)", markup=False, highlight=False)


@command()
def compare(
    a: Annotated[str, typer.Argument(metavar="A", help="a run folder, or a folder of runs", show_default=False)],
    b: Annotated[str, typer.Argument(metavar="B", help="the same kind, compared against A", show_default=False)],
    images: Annotated[bool, typer.Option(help="compare B's images with A's at the same seeds")] = True,
    confidence: Annotated[float, typer.Option(help="coverage asked of each speed-up's interval")] = 0.95,
    min_effect: Annotated[
        float, typer.Option(help="smallest difference reported as faster or slower, as a fraction (0.05: 5%)")
    ] = 0.05,
    as_json: AsJson = False,
) -> None:
    """B against A: speed-up per stage with an exact interval, within noise or not; memory, energy, images."""
    from diffmeter.report.compare_table import comparison_tables
    from diffmeter.runs.compare import Criteria, compare_paths

    comparison = compare_paths(a, b, images, Criteria(confidence=confidence, min_effect=min_effect))
    if as_json:
        print(json.dumps(comparison.model_dump(mode="json"), indent=2))
        return
    for table in comparison_tables(comparison):
        console.print(table)
