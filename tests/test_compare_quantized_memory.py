"""benchmarks/compare_quantized_memory.py: the published quantized memory figures parsed, each one's setting turned
into a prediction request, and a couple predicted from their setting."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks"))

from compare_quantized_memory import (  # noqa: E402
    QUANTIZED,
    compare,
    format_of,
    markdown,
    predict,
    spec_of,
    why_excluded,
)

from diffmeter.predict.quantized_memory import Format  # noqa: E402


@pytest.fixture(scope="module")
def figures() -> dict[str, dict]:
    return {f["id"]: f for f in yaml.safe_load(QUANTIZED.read_text())["figures"] if f["kind"] == "memory"}


def test_every_memory_figure_is_predicted_or_excluded_with_a_reason(figures):
    predictable = [f for f in figures.values() if not why_excluded(f)]
    excluded = [f for f in figures.values() if why_excluded(f)]
    assert len(predictable) + len(excluded) == len(figures) > 60
    assert all(format_of(f)[0] is not None for f in predictable)
    assert all(why_excluded(f).strip() for f in excluded)


def test_a_figure_s_setting_is_its_format_and_generation(figures):
    found, _ = format_of(figures["flux-quantblog-bitsandbytes-nf4-loaded"])
    assert found == Format("bnb", "nf4", ("transformer", "text_encoder_2"))
    spec, assumed = spec_of(figures["flux-quantblog-bitsandbytes-nf4-loaded"])
    assert (spec.height, spec.width, spec.steps, spec.max_sequence_length, spec.dtype) == (
        1024,
        1024,
        50,
        512,
        "bfloat16",
    )
    assert assumed == ()
    # the quanto blog quantizes the loaded modules (quantize + freeze) and states no size: its predict_with, assumed
    found, _ = format_of(figures["pixart-quanto-int8-te-fp16-bs4-memory"])
    assert found == Format("quanto", "int8", ("transformer", "text_encoder"), after_loading=True)
    spec, assumed = spec_of(figures["pixart-quanto-int8-te-fp16-bs4-memory"])
    assert (spec.height, spec.batch_size, spec.dtype) == (1024, 4, "float16")
    assert set(assumed) == {"height", "width", "steps"}


def test_settings_the_prediction_cannot_reproduce_are_excluded(figures):
    assert "not a --quantize backend" in why_excluded(figures["flux-quantblog-layerwise-fp8-loaded"])
    assert "not a --quantize type" in why_excluded(figures["cogvideox-5b-torchao-int4dq-a100-loaded"])
    assert "torch.compile" in why_excluded(figures["flux-torchao-fp8dq-bs16-compiled-compilevae-peak"])
    assert "not usable" in why_excluded(figures["flux-pr10009-int4wo-loaded"])
    # compile leaves the parameters after loading as they are: that figure is predicted
    assert why_excluded(figures["flux-torchao-fp8dq-bs16-compiled-compilevae-loaded"]) == ""


@pytest.mark.slow
def test_figures_are_predicted_from_their_setting_in_their_unit(figures):
    """Two figures the prediction is within 5% of: PixArt with its T5 quantized by quanto after loading (float16: T5's
    float32 ``wo`` quantized too, 5.363 'GB' read as GiB), and FLUX's transformer quantized by torchao (GiB)."""
    chosen = [figures["pixart-quanto-fp8-te-bs1-memory"], figures["flux-torchao-fp8dq-bs1-loaded"]]
    compared, excluded = compare(chosen)
    assert excluded == []
    for row in compared:
        assert row.per_unit == 2**30
        assert row.predicted == row.predicted_bytes / 2**30
        assert abs(row.error) < 0.05, (row.figure["id"], row.predicted, row.published)
    at_load = predict({**chosen[0], "settings_from": "at load"})  # T5's wo left whole, in float32: far above
    assert at_load.error > 0.3
    text = markdown(compared, [])
    assert "**2 of 2 within 5%**" in text
