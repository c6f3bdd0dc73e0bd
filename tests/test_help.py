"""`--help` of every command at 80 columns: no line wider, every option name whole, no type tags."""

import re

import pytest
import typer.main

from diffmeter.cli import app

GROUP = typer.main.get_command(app)
COMMANDS = ["", *GROUP.commands]  # "": `diffmeter --help` itself


def help_at(cli, monkeypatch, command: str, columns: int = 80) -> str:
    monkeypatch.setenv("COLUMNS", str(columns))
    code, out, err = cli(*([command] if command else []), "--help")
    assert code == 0 and not err, err
    return out


def written(param) -> list[str]:
    """How each name of a parameter must appear: ``--[no-]x`` for a switch with its ``--no-x``."""
    longs = [o for o in param.opts if o.startswith("--")]
    if len(longs) == 1 and param.secondary_opts == [f"--no-{longs[0][2:]}"]:
        return [o for o in param.opts if o not in longs] + [f"--[no-]{longs[0][2:]}"]
    return [*param.opts, *param.secondary_opts]


@pytest.mark.parametrize("command", COMMANDS)
def test_help_fits_80_columns_with_every_option_name_whole(cli, monkeypatch, command):
    out = help_at(cli, monkeypatch, command)
    lines = out.splitlines()
    assert max(len(line) for line in lines) <= 80, max(lines, key=len)
    assert len(lines) < 120 and "…" not in out
    assert not re.search(r"<(bool|int|float|str|list|path)", out, re.IGNORECASE)  # no type tags
    assert "[[" not in out  # an optional argument's metavar bracketed once (typer adds the brackets)
    params = (GROUP.commands[command] if command else GROUP).params
    options = [p for p in params if p.param_type_name == "option" and not p.hidden]
    assert options
    for param in options:
        for name in written(param):
            assert re.search(rf"(?<![\w\-\[]){re.escape(name)}(?![\w\-])", out), f"{name} is cut or missing"


def test_switches_say_their_default_once_and_values_their_kind(cli, monkeypatch):
    out = " ".join(help_at(cli, monkeypatch, "bench").split())
    assert "--[no-]save-images write the images to the run folder's images/ (default: on)" in out
    assert "--batch-size N images per pipeline call (default: 1)" in out
    assert "--out DIR folder for the run folders (default: results)" in out
    assert "[default:" not in out and "no-save-images]" not in out


def test_every_variable_an_option_reads_is_named(cli, monkeypatch):
    out = " ".join(help_at(cli, monkeypatch, "bench").split())
    environment = out[out.index("Environment: DIFFMETER_<OPTION>") :]
    for param in GROUP.commands["bench"].params:
        if (
            getattr(param, "envvar", None)
            and param.rich_help_panel != "Optimizations (all of them: diffmeter optimizations)"
        ):
            assert param.opts[-1] in environment, param.opts
    assert "the optimizations (not --opt, --compare-baseline)" in environment
    assert environment.endswith("a flag wins over it, and it over --config.")


def test_a_command_without_config_does_not_name_it(cli, monkeypatch):
    for command in ("profile", "sweep"):
        out = " ".join(help_at(cli, monkeypatch, command).split())
        assert "a flag wins over it." in out and "--config" not in out


def test_a_wide_terminal_gets_one_line_per_short_option(cli, monkeypatch):
    narrow = help_at(cli, monkeypatch, "bench", 80).splitlines()
    wide = help_at(cli, monkeypatch, "bench", 100).splitlines()
    assert len(wide) < len(narrow) and max(len(line) for line in wide) <= 100
