"""The typer application, the console, and the entry point that turns every user error into
one line and an exit code (2 for bad input, 130 for Ctrl-C) instead of a traceback."""

from __future__ import annotations

import re
import sys
import warnings
from typing import Annotated

import typer
import typer.core
from rich.console import Console
from rich.markup import escape

from diffmeter.errors import DiffmeterError

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Measure diffusion-model inference: exact MACs/FLOPs per component, measured latency, memory, energy.",
    context_settings={"help_option_names": ["-h", "--help"]},
)
console = Console(width=None if sys.stdout.isatty() else 160)


class Command(typer.core.TyperCommand):
    """A command whose usage line names arguments plainly (``MODEL``, not typer's ``{MODEL}``)."""

    def collect_usage_pieces(self, ctx) -> list[str]:
        return [re.sub(r"\{([^{}]*)\}", r"\1", piece) for piece in super().collect_usage_pieces(ctx)]


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


def main() -> None:
    """Entry point: user errors become one line on stderr and exit code 2; Ctrl-C exits 130."""
    warnings.filterwarnings("ignore")
    try:
        code = app(standalone_mode=False)
    except DiffmeterError as error:
        fail(str(error))
    except _aborts():
        Console(stderr=True).print("interrupted: nothing was stored for the unfinished run", highlight=False)
        raise SystemExit(130) from None
    except _usage_errors() as error:
        message = error.format_message()
        if not message.strip() or "Usage:" in message:  # no arguments: the help was shown
            raise SystemExit(getattr(error, "exit_code", 2)) from None
        name = sys.argv[1] if len(sys.argv) > 1 else ""
        hint = f" (see `diffmeter {name} --help`)" if name in app_commands() else " (see `diffmeter --help`)"
        fail(message + hint, getattr(error, "exit_code", 2))
    raise SystemExit(code if isinstance(code, int) else 0)


def app_commands() -> set[str]:
    return {command.name or command.callback.__name__ for command in app.registered_commands}
