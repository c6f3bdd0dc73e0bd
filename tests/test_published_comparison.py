"""benchmarks/published_comparison.py runs `diffmeter profile` per published figure: a one-line refusal becomes the
row's text (a memory row cannot do without it), a success its JSON."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks"))

from published_comparison import commands, load_figures, run_profile  # noqa: E402


@pytest.mark.slow
def test_a_one_line_refusal_is_kept_as_the_rows_text_and_cached():
    cache: dict = {}
    command = ["profile", "tiny-kandinsky3", "--gpu", "h100", "--vae-tiling", "--json"]
    found = run_profile(command, cache)
    assert found == {"error": "tiny-kandinsky3: its VAE (VQModel) has no vae-tiling: drop --vae-tiling"}
    assert cache[tuple(command)] is found


@pytest.mark.slow
def test_a_run_that_succeeds_returns_the_profiles_json():
    found = run_profile(["profile", "tiny-sd", "--steps", "2", "--json"], {})
    assert found["name"] == "tiny-sd" and found["steps"] == 2


def test_figures_of_one_setting_share_one_profile_and_unusable_ones_run_none():
    """The profiles run at once are the distinct commands of the usable figures: ML.ENERGY's and ORT's FLUX.1-dev at
    50 steps are one run; a figure marked unusable runs nothing."""
    figures = {f["id"]: f for f in load_figures()}
    same = [figures["mlenergy-flux-h100-bs1"], figures["ort-flux-dev-h100-50steps"]]
    unusable = [f for f in figures.values() if not f["usable"]][0]
    found = commands([*same, unusable])
    assert len(found) == 1 and found[0][:2] == ["profile", "flux-dev"] and "--steps" in found[0]
