"""`diffmeter models`: one line per catalog entry at 80 columns, and what is left out said."""

import json

import pytest

from diffmeter.catalog import all_entries
from diffmeter.cli.app import console


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """Parameters counted by the first test, read back by the next (each count takes seconds)."""
    return tmp_path_factory.mktemp("cache")


def models_at(cli, monkeypatch, cache, columns: int) -> list[str]:
    monkeypatch.setenv("DIFFMETER_CACHE_DIR", str(cache))
    monkeypatch.setattr(console, "width", columns)
    code, out, err = cli("models")
    assert code == 0, err
    return out.splitlines()


def test_models_at_80_columns_is_a_line_per_entry(cli, monkeypatch, cache):
    lines = models_at(cli, monkeypatch, cache, 80)
    entries = all_entries()
    assert max(len(line) for line in lines) <= 80 and "…" not in "".join(lines)
    assert len(lines) <= len(entries) + 5  # title, header, rule, a two-line caption
    for entry in entries:
        (row,) = [line for line in lines if line.split()[:1] == [entry.name]]
        d = entry.defaults
        assert f"{d.width}x{d.height}" in row and f" {d.steps} " in row
    caption = " ".join(" ".join(lines[-2:]).split())
    assert "Not shown at this width: hub id, family, components" in caption and "--json" in caption


def test_a_wide_terminal_adds_the_hub_ids_whole(cli, monkeypatch, cache):
    lines = models_at(cli, monkeypatch, cache, 160)
    assert max(len(line) for line in lines) <= 160
    for entry in all_entries():
        (row,) = [line for line in lines if line.split()[:1] == [entry.name]]
        assert entry.id in row.split()
    assert "hub id" in lines[1] and "hub id" not in " ".join(" ".join(lines[-2:]).split())


def test_the_json_keeps_what_the_table_leaves_out(cli, monkeypatch, cache):
    monkeypatch.setenv("DIFFMETER_CACHE_DIR", str(cache))
    code, out, _ = cli("models", "--json")
    flux = next(row for row in json.loads(out) if row["name"] == "flux-dev")
    assert code == 0 and flux["family"] == "flux" and flux["components"]["transformer"] == "FluxTransformer2DModel"
