"""benchmarks/published_comparison.py runs `diffmeter profile` per published figure: a one-line refusal becomes the
row's text (a memory row cannot do without it), a success its JSON."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks"))

from published_comparison import run_profile  # noqa: E402


def test_a_one_line_refusal_is_kept_as_the_rows_text_and_cached():
    cache: dict = {}
    command = ["profile", "tiny-kandinsky3", "--gpu", "h100", "--vae-tiling", "--json"]
    found = run_profile(command, cache)
    assert found == {"error": "tiny-kandinsky3: its VAE (VQModel) has no vae-tiling: drop --vae-tiling"}
    assert cache[tuple(command)] is found


def test_a_run_that_succeeds_returns_the_profiles_json():
    found = run_profile(["profile", "tiny-sd", "--steps", "2", "--json"], {})
    assert found["name"] == "tiny-sd" and found["steps"] == 2
