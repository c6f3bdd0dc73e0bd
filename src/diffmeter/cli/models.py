"""`diffmeter models`: the catalog, one line per entry at any terminal width.

The columns that matter for choosing a model (name, parameters, default size, steps, guidance,
dtype) always show; the hub id, family and components follow as the terminal allows, and a
caption names what was left out and how to see it (a wider terminal, or ``--json``).
"""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from diffmeter import units
from diffmeter.cli.app import command, console
from diffmeter.cli.options import AsJson
from diffmeter.cli.progress import progress_bar
from diffmeter.quiet import load_libraries

#: header, justification; the first six always show, the rest in this order while they fit
COLUMNS = [
    ("name", "left"),
    ("params", "right"),
    ("size (WxH)", "left"),
    ("steps", "right"),
    ("cfg", "right"),
    ("dtype", "left"),
    ("hub id", "left"),
    ("family", "left"),
    ("components", "left"),
]
ALWAYS = 6
SHORT_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}


@command()
def models(
    model: Annotated[
        str | None,
        typer.Argument(metavar="MODEL", help="one catalog model: its published quantized files", show_default=False),
    ] = None,
    as_json: AsJson = False,
    controlnets: Annotated[
        bool, typer.Option("--controlnets", help="list the ControlNets (--controlnet NAME) instead")
    ] = False,
) -> None:
    """List the catalog: parameters, default settings, hub id, family and components; with MODEL, the quantized files
    published for it (GGUF, bitsandbytes, SVDQuant), their sizes as published and as predicted."""
    from diffmeter.catalog import all_entries

    if controlnets:
        return _controlnets(as_json)
    if model is not None:
        return _quantized_files(model, as_json)
    entries = list(all_entries())
    params = parameter_counts(entries)
    modes = guidance_modes(entries)
    if as_json:
        rows = [
            {
                "name": e.name,
                "id": e.id,
                "aliases": e.aliases,
                "family": e.family,
                "origin": e.origin,
                "components": {n: c.class_name for n, c in e.components.items()},
                "params": params[e.id],
                "defaults": e.defaults.model_dump(),
                "defaults_from": e.sources.get("defaults"),
                "guidance": modes[e.id],
                "text_max_length": e.text_max_length,
            }
            for e in entries
        ]
        print(json.dumps(rows, indent=2))
    else:
        console.print(catalog_table(entries, params, modes, console.width))


def _quantized_files(name: str, as_json: bool) -> None:
    """The published quantized files of one catalog model, each with its predicted size."""
    from diffmeter.catalog import resolve
    from diffmeter.catalog.quantized_files import files_of

    entry = resolve(name)
    files = files_of(entry.name)
    if not files:
        console.print(f"{entry.name}: no published quantized file is listed (catalog/data/quantized/files.json)")
        return
    load_libraries()
    from diffmeter.predict.checkpoint_files import predicted_ranges, range_errors, verdict
    from diffmeter.predict.quantized_files import error, predicted_bytes
    from diffmeter.report.quantized_files_table import files_table

    predicted = predicted_bytes(files)
    errors = [None if size is None else error(size, file) for file, size in zip(files, predicted, strict=True)]
    ranges = predicted_ranges(files)
    range_error = [
        None if found is None else range_errors(found, file) for file, found in zip(files, ranges, strict=True)
    ]
    if as_json:
        rows = [
            {**file.model_dump(), "size_gib": file.size.gib(), "size_bytes": file.size.byte_range()}
            | {"predicted_bytes": size, "error": found}
            | ({} if span is None else {"predicted_bytes_range": span, "error_range": ends, "verdict": verdict(ends)})
            for file, size, found, span, ends in zip(files, predicted, errors, ranges, range_error, strict=True)
        ]
        print(json.dumps({"model": entry.name, "files": rows}, indent=2))
        return
    console.print(files_table(entry.name, files, predicted, errors, ranges, range_error))


def _controlnets(as_json: bool) -> None:
    """The ControlNets: what each steers, the pipeline that runs it and its parameters (counted on meta tensors); the
    real ones, then the tiny random ones for the tiny pipelines, as the model list shows both."""
    from diffmeter.catalog.controlnets import all_controlnets

    found = all_controlnets()
    load_libraries()
    from diffmeter.flops.profile import MetaComponent

    rows = [
        {
            "name": entry.name,
            "id": entry.id,
            "class": entry.class_name,
            "base": entry.base,
            "params": MetaComponent(entry.component()).params,
            "pipelines": entry.pipelines,
            "tiny": entry.is_tiny,
        }
        for entry in found
    ]
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    table = Table(title="diffmeter ControlNets (--controlnet NAME)", title_justify="left", box=box.SIMPLE_HEAD)
    for header in ("name", "params", "made for", "runs in", "hub id"):
        table.add_column(header, justify="right" if header == "params" else "left")
    for row in rows:
        runs = ", ".join(row["pipelines"].values())
        table.add_row(
            row["name"], units.params(row["params"]).removesuffix(" params"), row["base"], runs, escape(row["id"])
        )
    console.print(table)


def parameter_counts(entries) -> dict[str, int]:
    """Each entry's parameters: from the cache, or counted once on meta tensors and cached."""
    from diffmeter.flops.cached import cached_params

    stored = [[cached_params(component) for component in e.components.values()] for e in entries]
    counts = [sum(values) if None not in values else None for values in stored]
    missing = [entry for entry, count in zip(entries, counts, strict=True) if count is None]
    if missing:
        load_libraries()
        from diffmeter.parallel import parallel_map

        with progress_bar(False) as progress:
            report = (lambda finished, total: progress("counting parameters", finished, total)) if progress else None
            counted = iter(parallel_map(entry_params, missing, done=report))
        counts = [count if count is not None else next(counted) for count in counts]
    return dict(zip((e.id for e in entries), counts, strict=True))


def guidance_modes(entries) -> dict[str, str]:
    """How each entry's default guidance scale acts (``families.guidance``): from the cache, or decided by its
    family and cached."""
    from diffmeter.flops.cached import cached_guidance, remember_guidance

    modes = {entry.id: cached_guidance(entry) for entry in entries}
    if None in modes.values():
        load_libraries()
        from diffmeter.families.guidance import guidance_mode

        for entry in entries:
            if modes[entry.id] is None:
                modes[entry.id] = guidance_mode(entry)
                remember_guidance(entry, modes[entry.id])
    return modes


def entry_params(entry) -> int:
    from diffmeter.flops.profile import MetaComponent

    return sum(MetaComponent(component).params for component in entry.components.values())


def default_made_size(entry) -> tuple[int, int]:
    """(height, width) the pipeline makes at the entry's defaults: where its default input image sets the output's
    (Qwen-Image-Edit called without a size), that one, else the default size."""
    from diffmeter.families import get_family
    from diffmeter.families.images import image_sized
    from diffmeter.spec import ProfileSpec

    d = entry.defaults
    if not d.image_sizes:
        return d.height, d.width
    made = image_sized(get_family(entry.family), entry, ProfileSpec(model=entry.name).with_defaults(d))
    return made[:2] if made else (d.height, d.width)


def cells(entry, params: int, mode: str) -> list[str]:
    d = entry.defaults
    frames = f"x{d.num_frames}f" if d.num_frames else ""
    guidance = f"{d.guidance_scale:g}" if mode == "cfg" else "-"  # an embedded scale is no CFG
    height, width = default_made_size(entry)
    return [
        entry.name,
        units.params(params).removesuffix(" params"),
        f"{width}x{height}{frames}",
        str(d.steps),
        guidance,
        SHORT_DTYPES.get(d.dtype, d.dtype),
        entry.id,
        entry.family,
        ", ".join(c.class_name for c in entry.components.values()),
    ]


def build(rows: list[list[str]], shown: int, caption: str | None = None) -> Table:
    table = Table(
        title="diffmeter catalog",
        title_justify="left",
        caption=caption,
        caption_justify="left",
        box=box.SIMPLE_HEAD,
        show_edge=False,
        pad_edge=False,
        collapse_padding=True,
    )
    for header, justify in COLUMNS[:shown]:
        table.add_column(header, justify=justify, no_wrap=True)
    for row in rows:
        table.add_row(*(escape(cell) for cell in row[:shown]))
    return table


def catalog_table(entries, params: dict[str, int], modes: dict[str, str], width: int) -> Table:
    """The catalog in ``width`` columns: a line per entry, as many columns as fit whole."""
    rows = [cells(entry, params[entry.id], modes[entry.id]) for entry in entries]
    measure = Console(width=10_000)
    shown = ALWAYS
    while shown < len(COLUMNS) and measure.measure(build(rows, shown + 1)).maximum <= width:
        shown += 1
    hidden = [header for header, _ in COLUMNS[shown:]]
    caption = (
        "size: default width x height made (x frames); cfg: guidance scale, - where the model runs no CFG (an embedded "
        "scale: --json). Defaults are the model card's recommended call where it gives one, else the pipeline's "
        "own __call__ defaults (flux-dev: the card's 50 steps, FluxPipeline's 28); --steps, --height, --width, "
        "--guidance-scale and --dtype change them."
    )
    if hidden:
        caption += f" Not shown at this width: {', '.join(hidden)} (widen the terminal, or use --json)."
    return build(rows, shown, caption)
