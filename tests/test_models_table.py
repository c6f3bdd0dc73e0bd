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
    assert len(lines) <= len(entries) + 9  # title, header, rule, a six-line caption
    from diffmeter.cli.models import default_made_size

    for entry in entries:
        (row,) = [line for line in lines if line.split()[:1] == [entry.name]]
        height, width = default_made_size(entry)  # an editing model's from its default input image
        assert f"{width}x{height}" in row and f" {entry.defaults.steps} " in row
    caption = " ".join(" ".join(lines[len(entries) + 3 :]).split())
    assert "Not shown at this width: hub id, family, components" in caption and "--json" in caption
    # where the defaults come from: flux-dev's card says 50 steps where FluxPipeline.__call__ says 28
    assert "Defaults are the model card's recommended call where it gives one, else the pipeline's own" in caption
    assert "(flux-dev: the card's 50 steps, FluxPipeline's 28)" in caption
    from diffmeter.catalog import resolve
    from diffmeter.catalog.pipeline_defaults import call_defaults

    assert resolve("flux-dev").defaults.steps == 50 and call_defaults("FluxPipeline")["num_inference_steps"] == 28


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
    assert flux["defaults"]["steps"] == 50 and "num_inference_steps=50" in flux["defaults_from"]


def test_cfg_is_a_scale_only_where_the_model_runs_cfg(cli, monkeypatch, cache):
    """FLUX.1 [dev] embeds its 3.5 (one denoiser pass, no CFG), [schnell] ignores guidance, SD 1.5 runs CFG: a
    bare scale beside all three read as if each ran CFG."""
    lines = models_at(cli, monkeypatch, cache, 80)
    cfg = {line.split()[0]: line.split()[4] for line in lines[3:] if len(line.split()) == 6}
    assert cfg["flux-dev"] == cfg["flux2-dev"] == cfg["flux-schnell"] == cfg["sd35-large-turbo"] == "-"
    assert cfg["sd15"] == "7.5" and cfg["qwen-image"] == "4"
    code, out, _ = cli("models", "--json")
    modes = {row["name"]: row["guidance"] for row in json.loads(out)}
    assert (modes["flux-dev"], modes["flux-schnell"], modes["sd15"]) == ("embedded", "none", "cfg")
