"""benchmarks/published_comparison.py runs `diffmeter profile` per published figure: a one-line refusal becomes the
row's text (a memory row cannot do without it), a success its JSON."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks"))

from published_comparison import (  # noqa: E402
    commands,
    load_figures,
    profile_command,
    run_profile,
    settings,
    sources,
)


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


def test_a_figures_own_max_sequence_length_reaches_its_profile_and_no_other_figure_gets_one():
    """OneDiff's FLUX script encodes 256 T5 tokens, not the pipeline's 512: its profile is asked for 256."""
    figures = {f["id"]: f for f in load_figures()}
    short, plain = figures["onediff-flux-dev-20steps-h20"], figures["mlenergy-flux-h100-bs1"]
    assert profile_command(short, settings(short)[0])[-2:] == ["--max-sequence-length", "256"]
    assert "--max-sequence-length" not in profile_command(plain, settings(plain)[0])


def test_a_figures_stated_stack_and_partial_coverage_are_listed_with_its_source():
    """The PyTorch 2.0 page's rate covers the denoising loop only, on torch 2.0 with SDPA: the source line says so."""
    figures = {f["id"]: f for f in load_figures()}
    (line,) = sources([figures["diffusers-pt2-sd15-a100-bs1"]])
    assert "Stack: torch 2.0, diffusers 0.17.0.dev0, attention sdpa." in line
    assert "Covers: denoising only." in line
