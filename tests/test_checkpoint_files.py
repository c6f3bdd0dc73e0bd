"""Single-file checkpoints written from catalog components (predict/checkpoint_files.py): Forge's NF4 bundles of
FLUX.1-dev and ComfyUI's fp8/fp16 casts, each predicted as a range over the per-tensor widths its source does not
publish, checked against files written here the way those tools write them and against the published sizes."""

from __future__ import annotations

import json
import struct

import pytest
import torch
from safetensors.torch import save_file

from diffmeter.catalog import resolve
from diffmeter.catalog.quantized_files import all_files
from diffmeter.pipelines import build_component
from diffmeter.predict.checkpoint_files import part_range, predicted_ranges, range_errors, verdict
from diffmeter.predict.footprints import meta_module
from diffmeter.report.quantized_files_table import range_error_text, range_text

WITHIN = "within 0.5% whatever the unpublished choice"


def linear_weights(module: torch.nn.Module) -> set[str]:
    return {f"{name}.weight" for name, m in module.named_modules() if isinstance(m, torch.nn.Linear)}


def data_bytes(path) -> int:
    """A safetensors file's tensor data: its size less the 8-byte length and the JSON header."""
    raw = path.read_bytes()
    (header,) = struct.unpack("<Q", raw[:8])
    return len(raw) - 8 - header


@pytest.mark.parametrize("nested", [True, False], ids=["v1-double-quant", "v2-float32-absmax"])
def test_forge_nf4_layers_take_the_bytes_bitsandbytes_writes(nested):
    """tiny-flux's transformer quantized by bitsandbytes itself on the CPU (Params4bit, blocks of 64, double
    quantization on or off as Forge 2.0.0 and its next release set it) and saved as Forge's ForgeLoader4Bit saves a
    layer: the weight and its quant_state.as_dict(packed=True) (the packed JSON left out, as predicted)."""
    from bitsandbytes.nn import Params4bit

    module = build_component(resolve("tiny-flux").components["transformer"], "cpu").to(torch.bfloat16)
    linears, state = linear_weights(module), {}
    for name, tensor in module.state_dict().items():
        if name not in linears:
            state[name] = tensor
            continue
        weight = Params4bit(tensor.clone(), requires_grad=False, compress_statistics=nested, blocksize=64,
                            quant_type="nf4", quant_storage=torch.uint8)._quantize("cpu")  # fmt: skip
        state[name] = weight.data
        packed = weight.quant_state.as_dict(packed=True)
        state |= {f"{name}.{key}": value for key, value in packed.items() if not key.startswith("quant_state.")}
    written = sum(t.numel() * t.element_size() for t in state.values())
    rest = sum(t.numel() for name, t in module.state_dict().items() if name not in linears)
    low, high = part_range(module, "bnb-nf4-nested" if nested else "bnb-nf4")
    assert (low, high) == (written, written + rest * 2)  # biases and norms at bfloat16, or at float32


def test_a_scaled_fp8_file_written_as_comfyui_writes_it_has_the_predicted_ends(tmp_path):
    """tiny-wan22's transformer cast as ComfyUI's scaled fp8 (a float32 scale_weight per Linear, the empty scaled_fp8
    marker) and written by safetensors: everything at fp8 is the low end, the rest at float32 the high end."""
    module = build_component(resolve("tiny-wan22").components["transformer"], "cpu")
    linears, fp8 = linear_weights(module), torch.float8_e4m3fn
    scales = {f"{name[: -len('weight')]}scale_weight": torch.ones((), dtype=torch.float32) for name in linears}
    marker = {"scaled_fp8": torch.tensor([], dtype=fp8)}
    state = {name: t.detach().contiguous() for name, t in module.state_dict().items()}
    for end, rest in (("low", fp8), ("high", torch.float32)):
        cast = {name: t.to(fp8 if name in linears else rest) for name, t in state.items()}
        save_file(cast | scales | marker, tmp_path / f"{end}.safetensors")
    assert part_range(module, "float8_e4m3fn-scaled") == (
        data_bytes(tmp_path / "low.safetensors"),
        data_bytes(tmp_path / "high.safetensors"),
    )


def test_forge_bundles_are_the_sum_of_their_parts_within_half_a_percent():
    """flux1-dev-bnb-nf4 (v1) and -v2: NF4 transformer, fp8 T5, fp16 CLIP-L, bf16 VAE, as their README states; the T5
    part holds the tied embedding under both names, as ComfyUI's T5 file does: written once, v1 would miss."""
    files = [file for file in all_files() if file.rules == "forge-bnb"]
    assert sorted(file.file for file in files) == ["flux1-dev-bnb-nf4-v2.safetensors", "flux1-dev-bnb-nf4.safetensors"]
    ranges = predicted_ranges(files)
    for file, span in zip(files, ranges, strict=True):
        assert file.predicted_as == "range" and verdict(range_errors(span, file)) == WITHIN, file.file
    t5 = meta_module(resolve("flux-dev").components["text_encoder_2"], torch.bfloat16)
    every_name = sum(p.numel() for _, p in t5.named_parameters(remove_duplicate=False))
    assert part_range(t5, "float8_e4m3fn", stated=True) == (every_name, every_name)
    once = every_name - sum(p.numel() for p in t5.parameters())
    v1 = next(i for i, file in enumerate(files) if file.file == "flux1-dev-bnb-nf4.safetensors")
    assert range_errors((ranges[v1][0] - once, ranges[v1][0] - once), files[v1])[0] < -0.005
    # v2 stores the absmax of each block of 64 as float32, not as one byte with the nested tables: about 0.5 GB more,
    # as its README says ("V2 is 0.5 GB larger than the previous version")
    assert 0.5e9 < ranges[1 - v1][0] - ranges[v1][0] < 0.6e9


def test_comfyui_casts_are_ranges_within_half_a_percent_whatever_the_unpublished_widths():
    files = [file for file in all_files() if file.rules == "comfy-cast"]
    assert len(files) == 3 and all(file.predicted_as == "range" and not file.rules_modelled for file in files)
    for file, (low, high) in zip(files, predicted_ranges(files), strict=True):
        assert low < high and verdict(range_errors((low, high), file)) == WITHIN, file.file
    assert predicted_ranges([file.model_copy(update={"parts": None}) for file in files]) == [None] * 3


def test_a_range_is_shown_to_a_digit_past_the_published_figure_and_a_miss_names_its_end():
    v1, v2 = sorted((f for f in all_files() if f.rules == "forge-bnb"), key=lambda f: f.file)[::-1]
    # in GiB first, as memory is shown everywhere, then in the published figure's unit
    assert range_text((11_452_366_022, 11_458_536_774), v1) == "10.67 GiB (11.45-11.46 GB)"
    assert range_text((12_006_676_934, 12_012_847_686), v2) == "11.18-11.19 GiB (12.01 GB)"  # "12": two decimals
    assert range_error_text((0.0, 0.0)) == "+0.00%" and range_error_text((0.0, 0.0123)) == "+0.00% to +1.23%"
    assert verdict((0.0, 0.0123)) == "the high end misses (+1.23%)"
    assert verdict((-0.007, 0.0)) == "the low end misses (-0.70%)"
    with pytest.raises(ValueError, match="not a stored form"):
        part_range(torch.nn.Linear(2, 2), "int4")


def test_models_json_gives_each_bundle_its_range_and_verdict(cli):
    code, out, err = cli("models", "flux-dev", "--json")
    assert code == 0, err
    rows = {row["file"]: row for row in json.loads(out)["files"]}
    forge = rows["flux1-dev-bnb-nf4-v2.safetensors"]
    low, high = forge["predicted_bytes_range"]
    assert forge["parts"]["transformer"] == "bnb-nf4" and 11.95e9 < low <= high < 12.05e9
    assert forge["verdict"] == WITHIN and forge["error_range"] == [0.0, 0.0]
    assert "predicted_bytes_range" not in rows["flux1-dev-Q4_K_S.gguf"]
