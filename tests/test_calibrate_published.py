"""benchmarks/calibrate_published.py's own rules: one harness's pages held out together, a figure timing the
denoising loop alone fitted as such, and the test of an architecture predicted by its neighbour's fit with none
of its runs in that fit."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks"))
sys.path.insert(0, str(Path(__file__).parent))

from calibrate_published import borrowed_test  # noqa: E402
from published_runs import source_of  # noqa: E402
from test_fit_published import MADE, made  # noqa: E402


def figure(title: str) -> dict:
    return {"source": {"title": title}}


def test_one_harnesss_pages_are_one_source():
    assert source_of(figure("OneDiff: SD 1.5 example README (siliconflow/onediff, commit 72a11f9)")) == "OneDiff"
    assert source_of(figure("OneDiff: SDXL example README (siliconflow/onediff)")) == "OneDiff"
    assert source_of(figure("TeaCache4HiDream-I1 README (ali-vilab/TeaCache)")) == "TeaCache"
    assert source_of(figure("TeaCache4LTX-Video README")) == "TeaCache"
    blog = "Exploring Quantization Backends in Diffusers (Hugging Face blog, 2025-05-21)"
    assert source_of(figure(blog)) == "Exploring Quantization Backends in Diffusers"


def test_an_architecture_is_predicted_by_its_neighbours_fit_with_none_of_its_runs_in_it():
    """Ampere runs made 2x slower on the GPU than Hopper's, on the same host: predicted by Hopper's GPU fit (fitted
    without them) they come out at half their time, not at their own (fitted with them, every error would be 0)."""
    hopper = [made(MADE, f"s{i % 3}", i) for i in range(24)]
    slower = {group: 2 * a for group, a in MADE.items()}
    ampere = [made(slower, f"a{i % 3}", i, 1.0, 2 * 0.8e-12, 2 * 2e-6, architecture="ampere") for i in range(24)]
    held = borrowed_test(hopper + ampere, {"hopper", "ampere"})
    assert {h.run.architecture for h in held} == {"ampere"} and len(held) == 24
    gpu_bound = [h for h in held if int(h.run.id.rsplit("-", 1)[1]) % 3]  # every third run is host-bound
    assert all(h.error == pytest.approx(-0.5, abs=0.02) for h in gpu_bound)
