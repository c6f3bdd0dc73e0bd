"""benchmarks/compare_quantized_memory.py: the published quantized memory figures parsed, each one's setting turned
into a prediction request, and a couple predicted from their setting."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks"))

from compare_quantized_memory import (  # noqa: E402
    DECODE_2024_09,
    QUANTIZED,
    compare,
    format_of,
    markdown,
    old_decode,
    predict,
    spec_of,
    why_excluded,
)
from source_stacks import legacy_t5, source_kinds, stack_difference, tiled_int4  # noqa: E402

from diffmeter.predict.quantized_memory import Format  # noqa: E402
from diffmeter.predict.schema import VAE_DECODE, MemoryPrediction, StageMemory  # noqa: E402


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
    # the quanto blog's own rows: quantizing SD3's text_encoder_2 changed nothing, so that row is not of it
    assert "text_encoder_2 left the memory unchanged" in why_excluded(figures["sd3-quanto-fp8-all-te-memory"])
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


def meta_t5():
    """A small T5 encoder on meta at bfloat16, its ``wo`` (keep-in-float32) layers 2 x (64 x 128) weights."""
    import torch
    from transformers import T5Config, T5EncoderModel

    config = T5Config(d_model=64, d_ff=128, d_kv=16, num_layers=2, num_heads=4, vocab_size=128)
    with torch.device("meta"):
        return T5EncoderModel(config).to(torch.bfloat16)


def test_transformers_4_kept_t5_s_wo_whole_and_bitsandbytes_upcast_it():
    """transformers 4.51.3 left T5's ``wo`` whole under every quantizer, in float32 under bitsandbytes'; the installed
    5.x leaves it whole at bfloat16 under bitsandbytes and quanto and quantizes it under torchao."""
    import torch

    module, wo = meta_t5(), 2 * 64 * 128
    assert legacy_t5(module, "bnb", "nf4", torch.bfloat16) == wo * (4 - 2)
    assert legacy_t5(module, "bnb", "int8", torch.bfloat16) == wo * (4 - 2)
    assert legacy_t5(module, "quanto", "int8", torch.bfloat16) == 0
    int8_rows = 2 * 64 * (4 + 1)  # torchao 0.18's Int8Tensor: a byte per weight, a float32 scale and int8 zero per row
    assert legacy_t5(module, "torchao", "int8wo", torch.bfloat16) == wo * 2 - (wo + int8_rows)


def test_torchao_0_5_padded_int4_weights_to_rows_of_1024():
    import torch

    module = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.Linear(1024, 1000), torch.nn.Linear(64, 8))
    module = module.to(device="meta", dtype=torch.bfloat16)

    def tiled(out_features, in_features):  # packed two per byte, bfloat16 scale and zero per 128 of each row
        return out_features * in_features // 2 + 2 * 2 * out_features * in_features // 128

    # 512 -> 1024 columns; 1000 -> 1000 rows already a multiple of 8; 64 columns: not a group of 128, left whole
    assert tiled_int4(module, torch.bfloat16) == tiled(1024, 1024) - tiled(1024, 512)


def test_the_source_s_stack_applies_to_its_own_figures_only(figures):
    quanto = figures["flux-quantblog-quanto-int8-loaded"]
    found, _ = format_of(quanto)
    assert stack_difference(quanto, found, spec_of(quanto)[0]) == (0, "")
    readme = figures["flux-torchao-fp8dq-bs1-loaded"]
    found, _ = format_of(readme)
    assert stack_difference(readme, found, spec_of(readme)[0]) == (0, "")


def test_transformers_quanto_config_drops_weights_dtype_so_the_post_s_t5_ran_in_int8(figures):
    """The post writes ``TransformersQuantoConfig(weights_dtype=...)``; transformers' config reads ``weights``."""
    import torch
    from diffusers import QuantoConfig as DiffusersQuantoConfig
    from transformers import QuantoConfig as TransformersQuantoConfig

    assert TransformersQuantoConfig(weights_dtype="int4").weights == "int8"
    assert DiffusersQuantoConfig(weights_dtype="int4").weights_dtype == "int4"
    int4 = figures["flux-quantblog-quanto-int4-loaded"]
    found, _ = format_of(int4)
    spec = spec_of(int4)[0]
    assert source_kinds(int4, found, spec) == {"transformer": "int4", "text_encoder_2": "int8"}
    extra, rule = stack_difference(int4, found, spec)
    assert extra > 2**30 and rule == "transformers' QuantoConfig(weights_dtype=...): text_encoder_2 int8"
    # what the figure's settings say is the rule's trigger: named otherwise, or quantized after loading, no change
    assert (
        source_kinds({**int4, "settings_from": "QuantoConfig(weights='int4')"}, found, spec)["text_encoder_2"] == "int4"
    )
    float8 = figures["flux-quantblog-quanto-float8-loaded"]
    assert set(source_kinds(float8, format_of(float8)[0], spec_of(float8)[0]).values()) == {"float8"}
    # the bytes: a 128 x 256 bfloat16 layer as int8 (a byte per weight, a scale per row) less as int4 (tinygemm:
    # half a byte per weight, a scale and a shift per 128)
    from source_stacks import kind_difference

    layer = torch.nn.Linear(256, 128).to(device="meta", dtype=torch.bfloat16)
    assert kind_difference(layer, Format("quanto", "int4"), "int8", torch.bfloat16) == (
        (128 * 256 + 128 * 2) - (128 * 256 // 2 + 2 * (128 * 256 // 128) * 2)
    )


def prediction_with_decode(activation: int) -> MemoryPrediction:
    call = StageMemory(
        stage=VAE_DECODE,
        component="vae",
        batch=1,
        resident_param_bytes=10,
        component_param_bytes=1,
        carried_bytes=0,
        activation_bytes=activation,
        peak_bytes=10 + activation,
    )
    return MemoryPrediction(
        dtype="bfloat16",
        stages=[call],
        component_param_bytes={"vae": 1},
        peak_bytes=10 + activation,
        peak_stage=VAE_DECODE,
        calls=[call],
        decoder="vae",
    )


def test_the_readme_s_cogvideox_peaks_take_the_decode_of_its_diffusers(figures):
    figure = figures["cogvideox-5b-torchao-int8wo-a100-peak"]
    spec, _ = spec_of(figure)
    older, why = old_decode(figure, spec, prediction_with_decode(7))
    assert older.calls[0].activation_bytes == DECODE_2024_09["cogvideox-5b"] and "2024-09-04" in why
    # another size than the replayed one, or another source: the prediction as it is
    other = spec_of({**figure, "num_frames": 25})[0]
    assert old_decode(figure, other, prediction_with_decode(7))[0].calls[0].activation_bytes == 7
    flux = figures["flux-torchao-int8wo-bs8-peak"]
    assert old_decode(flux, spec_of(flux)[0], prediction_with_decode(7))[1] == ""


@pytest.mark.slow
def test_the_replayed_decode_replaced_the_prediction_s_own():
    """``DECODE_2024_09`` replaces the installed decode's activations, which benchmarks/replay_cogvideox_decode.py
    measured beside it (15821568000 bytes): the prediction's figure must still be that one (else replay again)."""
    from replay_cogvideox_decode import SETTING

    from diffmeter.predict.memory import predict_memory
    from diffmeter.spec import ProfileSpec

    prediction = predict_memory(ProfileSpec(model="cogvideox-5b", batch_size=1, **SETTING), True, ())
    decode = next(call for call in prediction.calls if call.stage == VAE_DECODE)
    assert decode.activation_bytes == 15821568000
