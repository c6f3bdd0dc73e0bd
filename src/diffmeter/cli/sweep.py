"""`diffmeter sweep`: a study over models x settings x optimizations; `diffmeter table`: stored runs as one table."""

from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import typer

from diffmeter import units
from diffmeter.cli import options as o
from diffmeter.cli.app import aside, command, console
from diffmeter.errors import DiffmeterError
from diffmeter.quiet import load_libraries

AXES = "Axes (comma-separated values; each combination is a cell)"
FIXED = "Fixed (the same in every cell)"


def _axis(help: str):
    return Annotated[str | None, typer.Option(metavar="A,B,...", help=help, rich_help_panel=AXES)]


@command()
def sweep(
    file: Annotated[
        str | None,
        typer.Argument(
            metavar="SWEEP.yaml", help="sweep file (see docs/sweep.md); or the axes below", show_default=False
        ),
    ] = None,
    model: Annotated[str | None, typer.Option(metavar="A,B,...", help="models", rich_help_panel=AXES)] = None,
    batch_size: Annotated[
        str | None,
        typer.Option(metavar="A,B,...", help="batch sizes, or auto (double until out of memory)", rich_help_panel=AXES),
    ] = None,
    height: _axis("heights in pixels") = None,
    width: _axis("widths in pixels") = None,
    size: Annotated[
        str | None, typer.Option(metavar="A,B,...", help="512 or WIDTHxHEIGHT", rich_help_panel=AXES)
    ] = None,
    steps: _axis("denoising steps") = None,
    guidance_scale: _axis("guidance scales") = None,
    dtype: _axis("bf16, fp16, fp32") = None,
    opt: Annotated[
        list[str] | None,
        typer.Option(
            metavar="NAME+NAME:k=v",
            help='optimization set, repeatable: "" for none, techniques joined by +',
            rich_help_panel=AXES,
        ),
    ] = None,
    iterations: Annotated[int | None, typer.Option(help="measured calls per cell", rich_help_panel=FIXED)] = None,
    warmup: Annotated[int | None, typer.Option(help="untimed calls first", rich_help_panel=FIXED)] = None,
    device: Annotated[
        str | None, typer.Option(metavar="DEVICE", help="cuda or cpu for every cell", rich_help_panel=FIXED)
    ] = None,
    seed: Annotated[int | None, typer.Option(help="image n gets seed + n", rich_help_panel=FIXED)] = None,
    prompt: Annotated[str | None, typer.Option(help="one prompt for every image", rich_help_panel=FIXED)] = None,
    random_weights: Annotated[
        bool | None, typer.Option("--random-weights", help="real-size random weights", rich_help_panel=FIXED)
    ] = None,
    compare_baseline: Annotated[
        bool | None,
        typer.Option(
            "--compare-baseline", help="quality and speed-up against the unoptimized run", rich_help_panel=FIXED
        ),
    ] = None,
    timeout: Annotated[
        float | None, typer.Option(metavar="SECONDS", help="per cell: stop it and store it as failed past this")
    ] = None,
    out: o.Out = "results",
    dry_run: Annotated[bool, typer.Option(help="print the cells, their status and compute; run nothing")] = False,
    retry_failed: Annotated[bool, typer.Option(help="run again the cells whose stored result failed")] = False,
    remeasure: Annotated[
        bool,
        typer.Option(
            "--remeasure",
            help="measure again the cells stored with other measuring settings (iterations, warm-up, ...), "
            "replacing their results",
        ),
    ] = False,
    ray: Annotated[
        str | None,
        typer.Option(metavar="auto|ADDRESS", help="run the cells as Ray tasks (pip install 'diffmeter\\[ray]')"),
    ] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="no progress and no table")] = False,
    as_json: Annotated[
        bool, typer.Option("--json", help="print the plan (--dry-run) or the sweep's record as JSON")
    ] = False,
) -> None:
    """Run a study over models x settings x optimizations: one bench run folder per cell, resumable."""
    load_libraries()
    from diffmeter.sweep.file import SweepFile, check_options, read_sweep_file

    axes = {
        "model": model,
        "batch_size": batch_size,
        "height": height,
        "width": width,
        "size": size,
        "steps": steps,
        "guidance_scale": guidance_scale,
        "dtype": dtype,
    }
    axes = {name: _values(text) for name, text in axes.items() if text is not None}
    if opt is not None:
        axes["optimizations"] = list(opt)
    fixed = {
        "iterations": iterations,
        "warmup": warmup,
        "device": device,
        "seed": seed,
        "prompt": prompt,
        "random_weights": random_weights,
        "compare_baseline": compare_baseline,
    }
    fixed = {name: value for name, value in fixed.items() if value is not None}
    if file is not None:
        if axes:
            raise DiffmeterError(f"pass either a sweep file or axes on the command line, not both ({', '.join(axes)})")
        definition = read_sweep_file(file)
        clash = set(fixed) & set(definition.axes)
        if clash:
            raise DiffmeterError(f"--{sorted(clash)[0].replace('_', '-')} is an axis of {file}; drop the option")
        definition = definition.model_copy(update={"fixed": {**definition.fixed, **fixed}})
    else:
        if "model" not in axes:
            raise DiffmeterError("no sweep file and no --model: pass SWEEP.yaml, or --model A,B with other axes")
        definition = SweepFile(name="command-line", axes=axes, fixed=fixed)
        check_options(definition, "the command line")
    if timeout is not None:
        definition = definition.model_copy(update={"timeout_s": timeout})
    _run(definition, Path(out).expanduser(), dry_run, retry_failed, remeasure, ray, quiet, as_json)


def _values(text: str) -> list:
    """``1,2,auto`` -> [1, 2, "auto"]: numbers as numbers, the rest as written."""
    import yaml

    values = []
    for item in text.split(","):
        item = item.strip()
        try:
            value = yaml.safe_load(item) if item else ""
        except yaml.YAMLError:
            value = item
        values.append(value if isinstance(value, int | float) and not isinstance(value, bool) else item)
    return values


def _run(
    definition,
    out: Path,
    dry_run: bool,
    retry_failed: bool,
    remeasure: bool,
    ray: str | None,
    quiet: bool,
    as_json: bool,
) -> None:
    from diffmeter.report.results_table import sweep_plan_table, sweep_summary_table
    from diffmeter.sweep.file import expand
    from diffmeter.sweep.plan import plan
    from diffmeter.sweep.run import run_sweep

    cells = expand(definition)
    if dry_run:
        planned = plan(cells, out, retry_failed, here=ray is None, remeasure=remeasure)
        if as_json:
            print(json.dumps([_planned_json(cell) for cell in planned], indent=2))
        else:
            console.print(sweep_plan_table(planned, out))
        return
    if ray is not None:
        from diffmeter.sweep.ray_executor import RayExecutor

        executor = RayExecutor(out, ray, definition.timeout_s)
    else:
        from diffmeter.sweep.local import LocalExecutor

        executor = LocalExecutor(out, timeout_s=definition.timeout_s)
    with _progress(len(cells), quiet or as_json) as callbacks:
        record = run_sweep(
            definition, out, executor, retry_failed, here=ray is None, callbacks=callbacks, remeasure=remeasure
        )
    if as_json:
        print(json.dumps(record.model_dump(mode="json"), indent=2))
    counts = record.counts()
    stored = counts["done"] + counts["skipped"]
    if not as_json and not quiet:
        console.print(sweep_summary_table(record))
        compare = f"; compare: diffmeter table {out}" if stored else ""
        console.print(f"record: {out / f'sweep-{record.name}.json'}{compare}", markup=False)
    if not stored and counts["refused"] and not counts["failed"]:
        raise DiffmeterError(
            f"all {counts['refused']} cells of sweep '{record.name}' were refused (the reasons are above and in its "
            "record): nothing was measured; change the settings they name"
        )
    if counts["failed"]:
        raise typer.Exit(1)


def _planned_json(cell) -> dict:
    return {
        "label": cell.cell.label,
        "values": cell.cell.values,
        "status": cell.status,
        "reason": cell.reason,
        "folder": cell.run.name if cell.run else None,
        "tflops_per_call": cell.tflops,
        "batch_search": cell.cell.batch_auto,
    }


@contextmanager
def _progress(total: int, quiet: bool):
    """One bar over the cells with ETA, the running cells named; a line per finished cell."""
    from rich.console import Console
    from rich.markup import escape
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    from diffmeter.sweep.run import Callbacks

    stderr = Console(stderr=True)
    if quiet or not stderr.is_terminal:
        yield Callbacks()
        return
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn())
    with Progress(*columns, console=stderr, transient=True) as bar:
        task = bar.add_task("planning", total=total)
        running: list[str] = []

        def started(label: str) -> None:
            running.append(label)
            bar.update(task, description=escape(f"running {running[-1]}"))

        def finished(cell) -> None:
            if cell.label in running:
                running.remove(cell.label)
            bar.advance(task)
            bar.console.print(f"{cell.status}: {escape(cell.label)}", highlight=False)
            bar.update(task, description=escape(f"running {running[-1]}" if running else "finishing"))

        yield Callbacks(started, finished)


@command()
def table(
    directory: Annotated[
        str, typer.Argument(metavar="DIR", help="a folder of run folders (any depth): bench, ladder or sweep --out")
    ],
    csv: Annotated[str | None, typer.Option(metavar="FILE", help="write the table as CSV")] = None,
    parquet: Annotated[
        str | None, typer.Option(metavar="FILE", help="write the table as Parquet (needs pyarrow)")
    ] = None,
    as_json: o.AsJson = False,
    sort: Annotated[
        str | None, typer.Option(metavar="COL", help="sort by a column (-COL: descending); see docs/table.md")
    ] = None,
    where: Annotated[
        str | None,
        typer.Option(metavar="EXPR", help="keep rows matching a pandas query: \"batch >= 2 and status == 'complete'\""),
    ] = None,
) -> None:
    """Every stored run under DIR as one table: settings, s/image, stage shares, memory, energy, MFU, quality."""
    from diffmeter.report.results_table import results_table
    from diffmeter.runs.collect import filtered, load_results, to_json
    from diffmeter.runs.storage import write_file  # atomically: never half a table

    skipped: list[str] = []
    every = load_results(directory, skipped)
    for line in skipped:  # one unreadable results.json does not hide the others; --json stays parseable
        aside(line, as_json)
    if every.empty:  # in every output alike: --json's [] read as a table of nothing, exit 0
        raise DiffmeterError(f"no stored runs under {directory}; run bench or sweep first")
    frame = filtered(every, where, sort)
    written = []
    if csv:
        write_file(Path(csv), lambda path: frame.to_csv(path, index=False))
        written.append(csv)
    if parquet:
        try:
            import pyarrow  # noqa: F401
        except ImportError:
            raise DiffmeterError("--parquet needs pyarrow: pip install 'diffmeter[parquet]' (or use --csv)") from None
        write_file(Path(parquet), lambda path: frame.to_parquet(path, index=False))
        written.append(parquet)
    if as_json:
        print(to_json(frame))
    elif not written:
        if frame.empty:  # --where matched nothing (--json: [], an answer)
            raise DiffmeterError(f"no stored run under {directory} matches --where {where!r}; loosen it")
        console.print(results_table(frame, f"{units.counted(len(frame), 'run')} under {directory}"))
    for path in written:
        console.print(f"{units.counted(len(frame), 'row')} written to {path}", markup=False, highlight=False)
