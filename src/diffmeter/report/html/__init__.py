"""`diffmeter report`: a study (run folders, ladders, profiles) as one self-contained HTML page.

``study`` reads what is under a folder, ``figures`` lists the plots (Plotly, a module per question), ``gallery``
embeds the images of lossy runs beside their baselines, ``page`` assembles the page."""

from __future__ import annotations

from pathlib import Path

from diffmeter.errors import DiffmeterError, MissingPackage


def write_report(
    directory: str | Path,
    out: str | Path,
    title: str,
    images_per_run: int = 4,
    force: bool = False,
    skipped: list[str] | None = None,
) -> Path:
    """Build the report of everything under ``directory`` and write it atomically to ``out``; results that
    cannot be read are left out, each named in ``skipped`` when given."""
    try:
        import plotly  # noqa: F401
    except ImportError:
        raise MissingPackage("the report draws its plots with Plotly: pip install 'diffmeter[report]'") from None
    from diffmeter.report.html.page import render
    from diffmeter.report.html.study import read_study
    from diffmeter.runs.storage import writable, write_text

    if images_per_run < 0:
        raise DiffmeterError(f"--images must be 0 or more, got {images_per_run}")
    study = read_study(directory)  # first: a folder that is not one is the problem to name, not an existing page
    out = writable(out)
    if out.exists() and not force:
        raise DiffmeterError(f"{out} exists; pass --force to replace it, or -o another file")
    if skipped is not None:
        skipped += study.skipped
    write_text(out, render(study, title, images_per_run))
    return out
