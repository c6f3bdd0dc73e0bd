"""The typer application, the console, and the entry point that turns every user error into
one line and an exit code (2 for bad input, 130 for Ctrl-C) instead of a traceback."""

from __future__ import annotations

import os
import re
import sys
import warnings
from typing import Annotated

import typer
import typer.core
from rich.console import Console
from rich.markup import escape

from diffmeter.cli.help import print_help
from diffmeter.errors import DiffmeterError
from diffmeter.quiet import keep_library_warnings_off_the_terminal


class Group(typer.core.TyperGroup):
    """The command group, its help laid out by ``help`` like every command's."""

    def format_help(self, ctx, formatter) -> None:
        print_help(self, ctx)


app = typer.Typer(
    cls=Group,
    add_completion=False,
    no_args_is_help=True,
    help="Measure diffusion-model inference: exact MACs/FLOPs per component, measured latency, memory, energy.",
    context_settings={"help_option_names": ["-h", "--help"]},
)
#: a terminal's width, or $COLUMNS; 160 columns when writing to a file or a pipe
console = Console(width=None if sys.stdout.isatty() or "COLUMNS" in os.environ else 160)


def aside(line: str, machine_readable: bool = False) -> None:
    """A line beside the output: on standard output beside tables, on standard error beside --json or --csv
    (which stay parseable)."""
    (Console(stderr=True, soft_wrap=True) if machine_readable else console).print(line, highlight=False, markup=False)


def note(text: str, machine_readable: bool = False) -> None:
    """A "note:" line (``aside``)."""
    aside(f"note: {text}", machine_readable)


class Command(typer.core.TyperCommand):
    """A command whose usage line names arguments plainly (``MODEL``, not typer's ``{MODEL}``),
    that refuses an option given twice instead of silently keeping the last one, and whose help
    fits the terminal (``help``)."""

    def format_help(self, ctx, formatter) -> None:
        print_help(self, ctx)

    def collect_usage_pieces(self, ctx) -> list[str]:
        return [re.sub(r"\{([^{}]*)\}", r"\1", piece) for piece in super().collect_usage_pieces(ctx)]

    def parse_args(self, ctx, args: list[str]) -> list[str]:
        if args:
            _, _, order = self.make_parser(ctx).parse_args(args=list(args))
            seen = set()
            for param in order:
                repeatable = getattr(param, "multiple", False) or getattr(param, "count", False)
                if param.param_type_name == "option" and not repeatable and param.name in seen:
                    raise DiffmeterError(f"{'/'.join(param.opts + param.secondary_opts)} is given twice; pass it once")
                seen.add(param.name)
        return super().parse_args(ctx, args)


def command(**settings):
    """``@app.command`` with the plain usage line; every diffmeter command is declared with it."""
    return app.command(cls=Command, **settings)


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
    """Measure diffusion-model inference: exact MACs/FLOPs per component, measured latency, memory, energy."""


def _usage_errors() -> tuple[type[BaseException], ...]:
    """The usage-error base classes of the click typer runs on (typer >= 0.25 vendors its own)."""
    errors: list[type[BaseException]] = []
    if hasattr(typer, "TyperException"):
        errors.append(typer.TyperException)
    try:
        import click

        errors.append(click.ClickException)
    except ImportError:  # typer without click installed: the vendored class above covers it
        pass
    return tuple(errors)


def _aborts() -> tuple[type[BaseException], ...]:
    """Ctrl-C as click and typer report it."""
    aborts: list[type[BaseException]] = [KeyboardInterrupt, typer.Abort]
    try:
        from typer._click.exceptions import Abort  # the vendored click's own Abort

        aborts.append(Abort)
    except ImportError:
        import click

        aborts.append(click.Abort)
    return tuple(aborts)


def fail(message: str, code: int = 2) -> None:
    """Print ``message`` as one line on stderr (brackets shown as written) and exit with ``code``."""
    line = " ".join(str(message).split())
    Console(stderr=True, soft_wrap=True).print(f"[bold red]error:[/] {escape(line)}", highlight=False)
    raise SystemExit(code)


#: the exit code of a run stopped with Ctrl-C (128 + SIGINT)
INTERRUPTED = 130


def main() -> None:
    """Entry point: user errors become one line on stderr and exit code 2; Ctrl-C exits 130."""
    warnings.filterwarnings("ignore")
    keep_library_warnings_off_the_terminal()
    try:
        code = app(standalone_mode=False, prog_name="diffmeter")
    except DiffmeterError as error:
        fail(str(error))
    except _aborts():
        code = INTERRUPTED
    except _usage_errors() as error:
        message = error.format_message()
        if not message.strip() or "Usage:" in message:  # no arguments: the help was shown
            raise SystemExit(getattr(error, "exit_code", 2)) from None
        name = sys.argv[1] if len(sys.argv) > 1 else ""
        option = getattr(error, "option_name", None)
        if option in TECHNIQUE_FLAGS and name in CHOOSES_TECHNIQUES:  # not a typo of one of its own options
            fail(f"{name} does not take {option}: {CHOOSES_TECHNIQUES[name]}", getattr(error, "exit_code", 2))
        hint = f" (see `diffmeter {name} --help`)" if name in app_commands() else " (see `diffmeter --help`)"
        fail(message + hint, getattr(error, "exit_code", 2))
    if code == INTERRUPTED:  # typer turns Ctrl-C into this exit code itself
        kept = RESUMES.get(sys.argv[1] if len(sys.argv) > 1 else "", "")
        Console(stderr=True).print(f"interrupted: nothing was stored for the unfinished run{kept}", highlight=False)
    raise SystemExit(code if isinstance(code, int) else 0)


#: bench's technique flags: a command that chooses the techniques itself refuses them with why, not a near name
TECHNIQUE_FLAGS = (
    "--opt", "--quantize", "--offload", "--compile", "--cache", "--attention", "--sdpa-kernel", "--vae-tiling",
    "--vae-slicing", "--fp8-text-encoder", "--weights",
)  # fmt: skip
CHOOSES_TECHNIQUES = {
    "fit": "fit tries the memory settings (offload, quantized formats, VAE tiling, the fp8 text encoder) and, on a "
    "named GPU, the speed-ups bench combines with them (compile, a first-block cache) itself and lists those that "
    "fit; to predict one setting, `diffmeter profile MODEL --gpu NAME` takes it as --opt NAME[:key=value], "
    "--quantize BACKEND:TYPE or --offload MODE",
}
#: what an interrupted command kept, and how to go on from it (the ladder says so itself, rung by rung)
RESUMES = {
    "sweep": "; the cells that finished are stored: the same command again resumes the sweep",
}


def app_commands() -> set[str]:
    return {command.name or command.callback.__name__ for command in app.registered_commands}
