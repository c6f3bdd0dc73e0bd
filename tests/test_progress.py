"""Progress where stderr is not a terminal: a plain line at most every so often, never silent for a long run."""

from __future__ import annotations

import io

from rich.console import Console

from diffmeter.cli import progress
from diffmeter.cli.progress import plain_update, progress_bar


def test_a_plain_line_once_the_interval_has_passed_and_none_before():
    out = io.StringIO()
    update = plain_update(Console(file=out, width=200), every_s=0.0)
    update("predicting flux-dev", 3, 40)
    update("predicting sd15", 4, None)
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("predicting flux-dev: 3 of 40 (") and lines[0].endswith(" s)")
    assert lines[1].startswith("predicting sd15: 4 (")
    quiet = io.StringIO()
    slow = plain_update(Console(file=quiet), every_s=3600.0)
    slow("predicting flux-dev", 1, 40)
    assert quiet.getvalue() == ""


def test_not_a_terminal_gets_the_plain_lines_and_quiet_gets_nothing(monkeypatch, capsys):
    monkeypatch.setattr(progress, "PLAIN_EVERY_S", 0.0)
    with progress_bar(False) as update:
        assert update is not None  # pytest's captured stderr is not a terminal
        update("counting parameters", 1, 2)
    assert "counting parameters: 1 of 2" in capsys.readouterr().err
    with progress_bar(True) as update:
        assert update is None
