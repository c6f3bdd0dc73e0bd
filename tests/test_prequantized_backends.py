"""The pre-quantized backends of diffusers 0.42.1: Nunchaku Lite folders (refused on a CPU in one line, with
diffusers' reason), BFL fp8 and nvfp4 single files (written with diffusers' own quantizing functions, loaded and
benched on this CPU, their bytes predicted exactly), ModelOpt (refused on a CPU in one line), and
the stored bytes of one layer of each format against the tensors the quantizers build."""

from __future__ import annotations

import importlib
import json
import sys
import types

import pytest
import torch
from bfl_file import write_bfl

from diffmeter.catalog import resolve
from diffmeter.errors import DiffmeterError
from diffmeter.families import get_family
from diffmeter.loading import load_pipeline
from diffmeter.measure.stored_weights import storages_bytes
from diffmeter.optimize import Target, build, check
from diffmeter.predict.footprints import meta_module
from diffmeter.predict.prequantized_formats import bfl_file_types
from diffmeter.predict.quantized_formats import quantized_bytes
from diffmeter.predict.quantized_layouts import bfl_bytes, nunchaku_bytes
from diffmeter.quantization_spec import optimization_specs
from diffmeter.runs.storage import RESULTS
from diffmeter.weights import locate_weights

QUICK = ("--steps", "2", "--iterations", "1", "-q")


def tiny_transformer():
    from diffmeter.tiny import tiny_pipeline

    return tiny_pipeline(resolve("tiny-flux")).transformer


@pytest.mark.parametrize("kind", ["int4", "nvfp4", "awq-int4"])
def test_nunchaku_on_a_cpu_is_one_line_naming_the_gpu_it_needs(cli, tmp_path, kind):
    code, out, err = cli("bench", "tiny-flux", *QUICK, "--quantize", f"nunchaku:{kind}", "--out", tmp_path)
    said = (out + err).strip().splitlines()
    assert code != 0 and len(said) == 1 and "Traceback" not in out + err, out + err
    assert "only on a CUDA GPU" in said[0] and "not on cpu" in said[0] and "--device cuda" in said[0]


def test_a_pre_quantized_single_file_is_asked_for_and_a_folder_is_refused_after_the_device():
    with pytest.raises(DiffmeterError, match="bfl:fp8 loads a pre-quantized single file: add --weights FILE"):
        optimization_specs(["bfl:fp8"])
    assert optimization_specs(["nunchaku:int4"])[0].params == {"type": "int4"}
    with pytest.raises(DiffmeterError, match="one of gguf, bfl, nunchaku, autoround per run"):
        optimization_specs(["bfl:fp8", "text_encoder=gguf:Q8_0"], "x.safetensors")


def test_modelopt_on_a_cpu_is_one_line_naming_why_no_device_runs_it(cli, tmp_path):
    """diffusers 0.42.1 leaves nvidia-modelopt's layers unconverted, on any device (quantize_modelopt.py)."""
    code, out, err = cli("bench", "tiny-flux", *QUICK, "--quantize", "modelopt:fp8", "--out", tmp_path)
    said = (out + err).strip().splitlines()
    assert code != 0 and len(said) == 1 and "Traceback" not in out + err, out + err
    assert "mtq.compress(module)" in said[0] and "use quanto:int8 or torchao:int8wo" in said[0]  # they run here


def bfl_loaded(file, kind: str, dtype: str):
    entry = resolve("tiny-flux")
    t = Target(entry, get_family(entry.family), torch.device("cpu"), dtype, 2)
    optimizations = build(optimization_specs([f"bfl:{kind}"], str(file)))
    check(optimizations, t)
    configs = optimizations[0].load_configs(t)
    return load_pipeline(entry, locate_weights(entry, False), t.device, dtype, quantization=configs).transformer


@pytest.mark.parametrize(("kind", "dtype"), [("fp8", "float32"), ("fp8", "bfloat16"), ("nvfp4", "float32")])
def test_a_bfl_file_loads_with_its_layers_and_the_bytes_predicted(tmp_path, kind, dtype):
    """diffusers' BFL layers hold the file's weights and scales; the loaded bytes are the prediction's, from the
    file's keys and offline alike."""
    file = tmp_path / f"tiny-flux-{kind}.safetensors"
    quantized = write_bfl(tiny_transformer(), file, kind)
    transformer = bfl_loaded(file, kind, dtype)
    layer = transformer.transformer_blocks[0].attn.to_q
    assert type(layer).__name__ == {"fp8": "BFLFP8RLinear", "nvfp4": "BFLNVFP4Linear"}[kind]
    assert layer.weight.dtype == {"fp8": torch.float8_e4m3fn, "nvfp4": torch.uint8}[kind]
    assert layer.bias.dtype == getattr(torch, dtype)
    module = meta_module(resolve("tiny-flux").components["transformer"], getattr(torch, dtype))
    types = bfl_file_types(file)
    assert set(types) == quantized and set(types.values()) == {kind}
    measured = storages_bytes([transformer])
    assert measured == quantized_bytes(module, "bfl", kind, getattr(torch, dtype), types)
    assert measured == quantized_bytes(module, "bfl", kind, getattr(torch, dtype))


def test_a_bfl_file_of_another_type_or_unscaled_is_refused(tmp_path):
    write_bfl(tiny_transformer(), tmp_path / "n.safetensors", "nvfp4")
    for value, says in [("bfl:fp8", "n.safetensors holds BFL nvfp4 weights, not fp8: say --quantize bfl:nvfp4")]:
        with pytest.raises(DiffmeterError, match=says):
            check(build(optimization_specs([value], str(tmp_path / "n.safetensors"))), target_cpu())
    from safetensors.torch import save_file

    save_file({"w": torch.ones(2)}, str(tmp_path / "plain.safetensors"))
    with pytest.raises(DiffmeterError, match="has no weight_scale tensors"):
        check(build(optimization_specs(["bfl:fp8"], str(tmp_path / "plain.safetensors"))), target_cpu())


def target_cpu() -> Target:
    entry = resolve("tiny-flux")
    return Target(entry, get_family(entry.family), torch.device("cpu"), "float32", 2)


def test_bench_measures_a_bfl_file_against_the_unquantized_images(cli, tmp_path):
    write_bfl(tiny_transformer(), tmp_path / "t.safetensors", "fp8")
    code, out, err = cli(
        "bench", "tiny-flux", *QUICK, "--quantize", "bfl:fp8", "--weights", tmp_path / "t.safetensors",
        "--compare-baseline", "--out", tmp_path / "runs",
    )  # fmt: skip
    assert code == 0, err
    folder = sorted((tmp_path / "runs").iterdir())[1]
    result = json.loads((folder / RESULTS).read_text())
    assert folder.name.endswith("+opt-bfl-fp8-t") and not result["optimizations"][0]["lossless"]
    assert 20 < result["quality"]["mean_psnr_db"] < 100 and result["quality"]["identical"] == 0
    assert "GGUF" not in " ".join(result["notes"])  # its prediction read the file as BFL's


@pytest.mark.parametrize(("out_features", "in_features"), [(48, 64), (32, 16)])
def test_bfl_layer_bytes_are_the_tensors_diffusers_quantizes_to(out_features, in_features):
    from diffusers.quantizers.bfl.utils import quantize_fp8r, quantize_nvfp4

    weight = torch.randn(out_features, in_features)
    made = {"fp8": quantize_fp8r(weight), "nvfp4": (*quantize_nvfp4(weight), torch.tensor(1.0))}  # + input_scale
    for kind, tensors in made.items():
        assert sum(t.numel() * t.element_size() for t in tensors) == bfl_bytes(kind, out_features, in_features)


@pytest.fixture
def nunchaku_utils(monkeypatch):
    """diffusers' Nunchaku Lite layers (quantizers/nunchaku/utils.py), imported with the Hub's kernel faked: the
    ``kernels`` package is not installed and the Hub cannot be reached, and only the layers' constructors run."""
    import diffusers.utils
    import diffusers.utils.constants

    fake = types.ModuleType("kernels")
    fake.get_kernel = lambda *args, **kwargs: types.SimpleNamespace(ops=None)
    monkeypatch.setitem(sys.modules, "kernels", fake)
    monkeypatch.setattr(diffusers.utils, "is_kernels_available", lambda: True)
    monkeypatch.setattr(diffusers.utils, "is_kernels_version", lambda *args: True)
    monkeypatch.setattr(diffusers.utils.constants, "DIFFUSERS_TRUST_REMOTE_KERNELS", True)
    name = "diffusers.quantizers.nunchaku.utils"
    sys.modules.pop(name, None)
    yield importlib.import_module(name)
    sys.modules.pop(name, None)


@pytest.mark.parametrize(
    ("kind", "dtype"), [("int4", torch.bfloat16), ("nvfp4", torch.bfloat16), ("int4", torch.float16)]
)
def test_nunchaku_bytes_are_the_layers_diffusers_builds(nunchaku_utils, kind, dtype):
    """A tiny-flux transformer on meta with its wide linear layers SVDQ (rank 8) but one AWQ, replaced by diffusers'
    own ``replace_with_nunchaku_linear``: its bytes are the prediction's."""
    entry = resolve("tiny-flux").components["transformer"]
    model = meta_module(entry, dtype)
    # the linear layers whose rows split into groups of 64 (tiny-flux's are 32 wide but for the feed-forwards' outputs)
    wide = [name for name, m in model.named_modules() if isinstance(m, torch.nn.Linear) and m.in_features % 64 == 0]
    assert len(wide) >= 2
    config = {
        "quant_method": "nunchaku_lite",
        "svdq_w4a4": {"precision": kind, "group_size": {"int4": 64, "nvfp4": 16}[kind], "rank": 8, "targets": wide[1:]},
        "awq_w4a16": {"precision": "int4", "group_size": 64, "targets": wide[:1]},
    }
    nunchaku_utils.replace_with_nunchaku_linear(model, config, dtype)
    layer = model.get_submodule(wide[1])
    assert type(layer).__name__ == "SVDQW4A4Linear" and layer.rank == 8
    assert type(model.get_submodule(wide[0])).__name__ == "AWQW4A16Linear"
    built = sum(t.numel() * t.element_size() for t in model.state_dict(keep_vars=True).values())
    assert built == quantized_bytes(meta_module(entry, dtype), "nunchaku", kind, dtype, config)
    own = sum(t.numel() * t.element_size() for n, t in layer.named_parameters() if n != "bias")
    assert own == nunchaku_bytes(kind, layer.out_features, layer.in_features, 8, dtype)


def test_a_nunchaku_folder_of_another_type_or_none_is_refused(tmp_path):
    """The folder's config.json says its type (diffuse-compressor's compact config), read before loading."""
    folder = tmp_path / "svdq"
    folder.mkdir()
    section = {"precision": "nvfp4", "group_size": 16, "rank": 32, "targets": ["proj_out"]}
    config = {"_class_name": "FluxTransformer2DModel", "quantization_config": {"quant_method": "nunchaku_lite"}}
    config["quantization_config"]["svdq_w4a4"] = section
    (folder / "config.json").write_text(json.dumps(config))

    def refusal(value: str, weights: str | None) -> str | None:
        return build(optimization_specs([value], weights))[0].folder_refusal(target_cpu())

    assert refusal("nunchaku:nvfp4", str(folder)) is None
    assert "svdq holds nunchaku nvfp4 layers, not int4: say --quantize nunchaku:nvfp4" in refusal(
        "nunchaku:int4", str(folder)
    )
    assert "is no component folder with a config.json" in refusal("nunchaku:int4", str(tmp_path))
    assert "add --weights DIR" in refusal("nunchaku:awq-int4", None)
