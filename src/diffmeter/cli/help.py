"""`--help` laid out for the terminal (80 columns and up): option names always whole, no type tags.

Options print as ``--name VALUE`` (``--[no-]name`` for a switch that has an off form), grouped in
the panels the commands declare (``rich_help_panel``), their help wrapped beside them; a name too
long for its column takes a line of its own. Literal defaults print as ``(default: X)``, the same
words the help texts use for computed defaults. Options that read a ``DIFFMETER_<OPTION>``
variable are named once, at the end, instead of a tag on every line.
"""

from __future__ import annotations

import inspect
import textwrap

from rich.console import Console
from rich.text import Text

#: help wider than this is hard to read, however wide the terminal
MOST_COLUMNS = 100
#: the name column never takes more than this; longer names get a line of their own
NAME_COLUMN = 30
INDENT = "  "
GAP = "  "
#: a short value name by the option's type, for options that declare none
VALUES = {"int": "N", "float": "X", "str": "TEXT", "Path": "PATH"}


def width() -> int:
    """The terminal's width ($COLUMNS when set; 80 when not a terminal), at most ``MOST_COLUMNS``."""
    return min(Console().width, MOST_COLUMNS)


def paragraphs(text: str | None) -> list[str]:
    """A docstring or help text as paragraphs, each on one line."""
    return [" ".join(block.split()) for block in inspect.cleandoc(text or "").split("\n\n") if block.strip()]


def wrapped(text: str, columns: int) -> list[str]:
    """``text`` in lines of at most ``columns``, never breaking a word or an option name."""
    return textwrap.wrap(text, max(columns, 20), break_long_words=False, break_on_hyphens=False) or [""]


def switch_name(param) -> str | None:
    """``--[no-]name`` for a switch whose off form is ``--no-name``; None otherwise."""
    longs = [o for o in param.opts if o.startswith("--")]
    if len(longs) == 1 and param.secondary_opts == [f"--no-{longs[0][2:]}"]:
        return f"--[no-]{longs[0][2:]}"
    return None


def names(param, ctx) -> str:
    """How the parameter is written: ``MODEL``, ``-q, --quiet``, ``--[no-]force``, ``--steps N``."""
    if param.param_type_name == "argument":
        return param.metavar or param.name.upper()
    shorts = [o for o in param.opts if not o.startswith("--")]
    longs = [o for o in param.opts if o.startswith("--")]
    written = ", ".join([*shorts, switch_name(param) or " / ".join([*longs, *param.secondary_opts])])
    if param.is_flag or getattr(param, "count", False):
        return written
    value = param.metavar or VALUES.get(param.display_type_rich(ctx=ctx).strip("<>"), "VALUE")
    return f"{written} {value}"


def default_text(param, ctx) -> str:
    """``(default: X)`` for a literal default worth saying; empty when the help already says it."""
    if param.show_default is False or "default:" in (param.help or ""):
        return ""
    if isinstance(param.show_default, str):
        return f"(default: {param.show_default})"
    value = param.get_default(ctx, call=False)
    if param.param_type_name == "option" and param.is_flag:
        return "(default: on)" if value is True and param.secondary_opts else ""
    if value is None or value == "" or value == [] or value == () or callable(value):
        return ""
    return f"(default: {value:g})" if isinstance(value, float) else f"(default: {value})"


def plain(text: str | None) -> str:
    """Help as printed: typer reads it as rich markup (``\\[ray]`` is ``[ray]``), on one line."""
    return " ".join(Text.from_markup(text or "").plain.split())


def describe(param, ctx) -> str:
    if param.name == "help":  # click's own words, in the lower case of every other option's help
        return "show this help and exit"
    words = [plain(param.help), default_text(param, ctx)]
    if getattr(param, "required", False):
        words.append("(required)")
    return " ".join(word for word in words if word)


def environment_line(params: list, panel_of: dict) -> str | None:
    """One sentence naming the options that read ``DIFFMETER_<OPTION>``; a panel most of whose
    options read one is named once, with the exceptions."""

    def reads(param) -> bool:
        longs = [o for o in param.opts if o.startswith("--")]
        return bool(longs and param.envvar == "DIFFMETER_" + longs[0][2:].upper().replace("-", "_"))

    reading = [p for p in params if p.param_type_name == "option" and reads(p)]
    if not reading:
        return None
    said, whole, panels = [], [], {}
    for param in params:
        panels.setdefault(panel_of[param], []).append(param)
    for panel, members in panels.items():
        readers = [p for p in members if p in reading]
        if len(readers) >= 4 and len(readers) > len(members) / 2:
            others = [p.opts[-1] for p in members if p not in readers]
            whole.append(f"the {panel.split(' (')[0].lower()}" + (f" (not {', '.join(others)})" if others else ""))
        else:
            said += [p.opts[-1] for p in readers]
    said += whole
    listed = ", ".join(said[:-1]) + " and " + said[-1] if len(said) > 1 else said[0]
    config = ", and it over --config" if any("--config" in p.opts for p in params) else ""
    return f"Environment: DIFFMETER_<OPTION> (e.g. {reading[0].envvar}) sets {listed}; a flag wins over it{config}."


class Lines:
    """Help text built line by line: plain lines of known length, printed with a few styles."""

    def __init__(self, columns: int):
        self.columns = columns
        self.lines: list[Text] = []

    def blank(self) -> None:
        if self.lines and self.lines[-1].plain:
            self.lines.append(Text(""))

    def text(self, text: str, indent: str = "", style: str = "") -> None:
        for line in wrapped(text, self.columns - len(indent)):
            self.lines.append(Text(indent + line, style=style))

    def rows(self, title: str, rows: list[tuple[str, str]], name_width: int) -> None:
        """A panel: its title, then each name with its description wrapped beside it."""
        self.blank()
        self.lines.append(Text(title, style="bold"))
        beside = self.columns - len(INDENT) - name_width - len(GAP)
        for name, description in rows:
            head = Text(INDENT + name, style="bold cyan")
            if len(name) > name_width or beside < 24:  # the name whole on its own line, the help below
                self.lines.append(head)
                self.text(description, INDENT * 3)
                continue
            lines = wrapped(description, beside)
            head.append(" " * (name_width - len(name)) + GAP + lines[0])
            self.lines.append(head)
            self.lines += [Text(" " * (len(INDENT) + name_width + len(GAP)) + line) for line in lines[1:]]

    def print(self) -> None:
        console = Console(highlight=False, soft_wrap=True)
        for line in self.lines:
            console.print(line)


def name_width(all_names: list[str]) -> int:
    return min(max((len(n) for n in all_names), default=0), NAME_COLUMN)


def print_help(command, ctx) -> None:
    """Print ``command``'s help (a single command, or the group with its commands)."""
    out = Lines(width())
    out.text(command.get_usage(ctx), style="bold")
    for paragraph in paragraphs(command.help):
        out.blank()
        out.text(plain(paragraph), INDENT)
    params = [p for p in command.get_params(ctx) if not getattr(p, "hidden", False)]
    panel_of = {
        p: getattr(p, "rich_help_panel", None) or ("Arguments" if p.param_type_name == "argument" else "Options")
        for p in params
    }
    panels: dict[str, list] = {"Arguments": []}
    for param in params:
        panels.setdefault(panel_of[param], []).append(param)
    panels["Options"] = panels.pop("Options", [])  # with --help, after the named panels
    for title, members in panels.items():
        rows = [(names(p, ctx), describe(p, ctx)) for p in members]
        if rows:
            out.rows(title, rows, name_width([name for name, _ in rows]))
    listed = command.list_commands(ctx) if hasattr(command, "list_commands") else []
    subcommands = [(name, command.get_command(ctx, name)) for name in listed]
    rows = [(name, plain((paragraphs(sub.help) or [""])[0])) for name, sub in subcommands if sub and not sub.hidden]
    if rows:
        out.rows("Commands", rows, name_width([name for name, _ in rows]))
    environment = environment_line(params, panel_of)
    if environment:
        out.blank()
        out.text(environment)
    out.print()
