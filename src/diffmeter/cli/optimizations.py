"""`diffmeter optimizations` (the registry and why a technique does not apply) and
`diffmeter ladder` (one technique added per rung, measured)."""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.console import Console

from diffmeter import units
from diffmeter.cli import options as o
from diffmeter.cli.app import command, console
from diffmeter.cli.progress import progress_bar
from diffmeter.measure.speedup import DEFAULT_CALLS
from diffmeter.quiet import load_libraries


@command()
def optimizations(
    model: Annotated[
        str | None,
        typer.Argument(metavar="MODEL", help="say which techniques apply to MODEL, and why not", show_default=False),
    ] = None,
    device: Annotated[
        str | None,
        typer.Option(metavar="DEVICE", help="the device the run would use: cuda or cpu (default: cuda when present)"),
    ] = None,
    as_json: o.AsJson = False,
) -> None:
    """The optimization registry: every technique, and which apply to a model and why not."""
    load_libraries()
    import diffmeter.optimize  # noqa: F401  (registers the techniques)
    from diffmeter.catalog import all_entries, resolve
    from diffmeter.optimize.matrix import compatibility, family_compatibility
    from diffmeter.report.optimizations_table import matrix_table, model_table
    from diffmeter.runs.spec import resolve_device

    target_device = resolve_device(device)
    if model is not None:
        entry = resolve(model)
        rows = compatibility(entry, target_device)
        if as_json:
            print(json.dumps([row.model_dump(mode="json") for row in rows], indent=2))
        else:
            console.print(model_table(f"optimizations for {entry.name} ({entry.id}) on {target_device.type}", rows))
        return
    families = {}
    for entry in all_entries():
        if entry.origin == "catalog":
            families.setdefault(entry.family, []).append(entry)
    columns = {family: family_compatibility(entries, target_device) for family, entries in families.items()}
    names = [row.name for row in next(iter(columns.values()))]
    matrix = {name: [next(r for r in rows if r.name == name) for rows in columns.values()] for name in names}
    if as_json:
        payload = {
            name: {family: cell.model_dump(mode="json") for family, cell in zip(columns, cells, strict=True)}
            for name, cells in matrix.items()
        }
        print(json.dumps(payload, indent=2))
    else:
        title = f"optimizations x families on {target_device.type} (a family where any of its catalog models takes it)"
        console.print(matrix_table(title, list(columns), matrix))
        from diffmeter.optimize.quantization_backends import backend_rows
        from diffmeter.report.quantization_table import backends_table

        console.print(backends_table(backend_rows()))


@command()
def ladder(
    model: o.ModelArgument,
    rungs: Annotated[
        str,
        typer.Option(
            metavar="A,B,...",
            help="techniques added in turn: scheduler, compile, half, attention, cache, runtime "
            "(ONNX Runtime or TensorRT; not with compile or a cache)",
        ),
    ] = "scheduler,compile,half,attention,cache",
    steps: Annotated[
        int | None, typer.Option(help="baseline steps (default: the model's)", rich_help_panel=o.GENERATION)
    ] = None,
    fast_steps: Annotated[
        int | None,
        typer.Option(help="steps from the scheduler rung on (default: min(20, steps))", rich_help_panel=o.GENERATION),
    ] = None,
    compile_mode: Annotated[
        str, typer.Option(metavar="MODE", help="torch.compile mode of the compile rung")
    ] = "default",
    batch_size: o.BatchSize = 1,
    height: o.Height = None,
    width: o.Width = None,
    seed: o.Seed = 0,
    device: o.Device = None,
    warmup: Annotated[
        int, typer.Option(help="untimed calls per rung, the first one cold", rich_help_panel=o.MEASUREMENT)
    ] = 1,
    iterations: Annotated[
        int, typer.Option(help="measured calls per rung", rich_help_panel=o.MEASUREMENT)
    ] = DEFAULT_CALLS,
    random_weights: o.RandomWeights = False,
    out: Annotated[
        str,
        typer.Option(metavar="DIR", help="folder for the rung runs and ladder-*.json", rich_help_panel=o.OUTPUT),
    ] = "results",
    force: Annotated[bool, typer.Option(help="re-run rungs already stored in --out", rich_help_panel=o.OUTPUT)] = False,
    recheck: Annotated[
        bool,
        typer.Option(help="measure the baseline again at the end, to show drift", rich_help_panel=o.MEASUREMENT),
    ] = True,
    as_json: Annotated[bool, typer.Option("--json", help="print the ladder as JSON", rich_help_panel=o.OUTPUT)] = False,
) -> None:
    """Measure a ladder of speed-ups: the baseline, then one technique added per rung, each against the baseline."""
    load_libraries()
    from diffmeter.report.ladder_table import ladder_table
    from diffmeter.runs.ladder import climb, plan
    from diffmeter.runs.spec import BenchSpec

    spec = BenchSpec(
        model=model,
        steps=steps,
        batch_size=batch_size,
        height=height,
        width=width,
        seed=seed,
        device=device,
        warmup=warmup,
        iterations=iterations,
        random_weights=random_weights,
    )
    names = tuple(part.strip() for part in rungs.split(",") if part.strip())
    planned = plan(spec, names, fast_steps, compile_mode)
    done: list[tuple[str, object, object]] = []
    try:
        with progress_bar(as_json) as progress:
            result = climb(
                planned, out, force=force, progress=progress, recheck=recheck,
                finished=lambda *rung: _rung_finished(done, len(planned), *rung),
            )  # fmt: skip
    except KeyboardInterrupt:
        _interrupted(done, out)
        raise
    if as_json:
        print(json.dumps(result.model_dump(mode="json"), indent=2))
    else:
        console.print(ladder_table(result))


def _rung_finished(done: list, planned: int, name: str, result, folder) -> None:
    """Remember the rung; without a terminal (no progress bar), say it in a line, so a log shows progress."""
    done.append((name, result, folder))
    stderr = Console(stderr=True, soft_wrap=True)
    if not stderr.is_terminal:
        what = "skipped" if result is None else f"median {units.seconds(result.summary.latency_s.median)} per call"
        stderr.print(f"ladder: rung {len(done)} of {planned} ({name}) done: {what}", markup=False, highlight=False)


def _interrupted(done: list, out: str) -> None:
    """What an interrupted ladder keeps: each finished rung's folder, and how to resume."""
    stderr = Console(stderr=True, soft_wrap=True)
    measured = [(name, result, folder) for name, result, folder in done if result is not None]
    for name, result, folder in measured:
        stderr.print(
            f"  {name}: median {units.seconds(result.summary.latency_s.median)} per call, stored in {folder}",
            markup=False, highlight=False,
        )  # fmt: skip
    stderr.print(
        f"kept: {len(measured)} finished rung(s), stored under {out}; run the same command "
        "again to resume (finished rungs are reused, not measured again)",
        markup=False, highlight=False,
    )  # fmt: skip
