"""The `diffmeter` command line."""

from __future__ import annotations

import itertools
import json
import sys
import warnings
from typing import Annotated

import typer
from rich.console import Console

from diffmeter.errors import DiffmeterError

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Measure diffusion-model inference.")
console = Console(width=None if sys.stdout.isatty() else 160)


def _numbers(text: str | None, option: str, kind=int) -> list:
    """Parse '512,768,1024' into numbers, or fail with one clear line."""
    if text is None:
        return [None]
    try:
        return [kind(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise DiffmeterError(f"{option} takes numbers separated by commas, got '{text}'") from None


def _sizes(height: str | None, width: str | None) -> list[tuple[int | None, int | None]]:
    heights, widths = _numbers(height, "--height"), _numbers(width, "--width")
    if width is None:
        return [(h, h) for h in heights]
    if height is None:
        return [(w, w) for w in widths]
    if len(heights) != len(widths):
        raise DiffmeterError("--height and --width lists must have the same length (they are paired)")
    return list(zip(heights, widths, strict=True))


def _version(value: bool) -> None:
    if value:
        from diffmeter import __version__

        print(f"diffmeter {__version__}")
        raise typer.Exit()


@app.callback()
def _options(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="print the version and exit")
    ] = False,
) -> None:
    """Measure diffusion-model inference: exact MACs/FLOPs per component, from configs alone."""


@app.command()
def profile(
    models: Annotated[
        list[str] | None,
        typer.Argument(metavar="MODEL", help="catalog name or hub id, local diffusers dir, or hub id in the HF cache"),
    ] = None,
    all_models: Annotated[bool, typer.Option("--all", help="profile every real catalog model")] = False,
    height: Annotated[str | None, typer.Option(help="pixels; a comma list for a scaling table (width follows)")] = None,
    width: Annotated[str | None, typer.Option(help="pixels; comma list paired with --height")] = None,
    steps: Annotated[str | None, typer.Option(help="denoising steps; a comma list for a scaling table")] = None,
    batch_size: Annotated[int, typer.Option(help="prompts per generation")] = 1,
    guidance_scale: Annotated[float | None, typer.Option(help="CFG scale; <= 1 disables CFG")] = None,
    num_frames: Annotated[int | None, typer.Option(help="video models: frames")] = None,
    dtype: Annotated[str | None, typer.Option(help="float16 | bfloat16 | float32 (parameter memory)")] = None,
    prompt_tokens: Annotated[
        int | None,
        typer.Option(help="real prompt tokens, for pipelines whose compute depends on it (Kandinsky 3, Lumina)"),
    ] = None,
    negative_prompt_tokens: Annotated[
        int | None, typer.Option(help="real negative-prompt tokens (Lumina-Image-2.0)")
    ] = None,
    max_sequence_length: Annotated[
        int | None, typer.Option(help="the pipeline's max_sequence_length: tokens of its T5/Gemma/UMT5 encoder")
    ] = None,
    instruction_tokens: Annotated[
        int | None, typer.Option(help="SANA: tokens of the complex human instruction")
    ] = None,
    resolution_binning: Annotated[
        bool, typer.Option(help="snap sizes to the pipeline's aspect-ratio bins, as PixArt/SANA/HunyuanDiT do")
    ] = True,
    depth: Annotated[int, typer.Option(help="also break MACs down by module, this many levels deep")] = 0,
    jobs: Annotated[int, typer.Option(help="worker processes for several profiles (default: CPU count)")] = 0,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
    as_csv: Annotated[bool, typer.Option("--csv", help="print CSV, a row per component")] = False,
) -> None:
    """Count MACs and FLOPs of a whole generation, per component, from configs alone."""
    from diffmeter.catalog import all_entries
    from diffmeter.flops.profile import profile_many
    from diffmeter.report.export import profiles_csv
    from diffmeter.report.tables import profile_table, summary_table
    from diffmeter.spec import ProfileSpec

    names = list(models or [])
    if all_models:
        names += [entry.name for entry in all_entries() if not entry.is_tiny]
    if not names:
        raise DiffmeterError("name a MODEL (see `diffmeter models`) or pass --all")
    if depth < 0:
        raise DiffmeterError(f"--depth must be 0 or more, got {depth}")
    if jobs < 0:
        raise DiffmeterError(f"--jobs must be 0 (one per CPU) or more, got {jobs}")
    specs = [
        ProfileSpec(
            model=name,
            height=h,
            width=w,
            steps=n,
            batch_size=batch_size,
            guidance_scale=guidance_scale,
            num_frames=num_frames,
            dtype=dtype,
            prompt_tokens=prompt_tokens,
            negative_prompt_tokens=negative_prompt_tokens,
            instruction_tokens=instruction_tokens,
            max_sequence_length=max_sequence_length,
            resolution_binning=None if resolution_binning else False,
        )
        for name, (h, w), n in itertools.product(names, _sizes(height, width), _numbers(steps, "--steps"))
    ]
    results = profile_many(specs, depth=depth, jobs=jobs)
    if as_json:
        payload = results[0].to_json_dict() if len(results) == 1 else {"profiles": [p.to_json_dict() for p in results]}
        print(json.dumps(payload, indent=2))
    elif as_csv:
        sys.stdout.write(profiles_csv(results))
    elif len(results) == 1:
        console.print(profile_table(results[0]))
    else:
        console.print(summary_table(results))


@app.command()
def models(as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False) -> None:
    """List the catalog: family, components, parameters and defaults."""
    from diffmeter.catalog import all_entries
    from diffmeter.parallel import parallel_map
    from diffmeter.report.tables import catalog_table

    entries = list(all_entries())
    params = dict(zip((e.id for e in entries), parallel_map(_entry_params, entries), strict=True))
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
                "text_max_length": e.text_max_length,
            }
            for e in entries
        ]
        print(json.dumps(rows, indent=2))
    else:
        console.print(catalog_table(entries, params))


def _entry_params(entry) -> int:
    from diffmeter.flops.profile import MetaComponent

    return sum(MetaComponent(component).params for component in entry.components.values())


def main() -> None:
    """Entry point: user errors become one line on stderr and exit code 2."""
    import diffusers
    import transformers

    warnings.filterwarnings("ignore")
    transformers.utils.logging.set_verbosity_error()
    diffusers.utils.logging.set_verbosity_error()
    try:
        app(standalone_mode=False)
    except DiffmeterError as error:
        Console(stderr=True).print(f"[bold red]error:[/] {error}", highlight=False, soft_wrap=True)
        raise SystemExit(2) from None
    except typer.Abort:
        raise SystemExit(130) from None
    except Exception as error:  # click usage errors carry their own exit code
        import click

        if isinstance(error, click.ClickException):
            error.show()
            raise SystemExit(error.exit_code) from None
        raise


if __name__ == "__main__":
    main()
