"""AutoRound folders (``--quantize autoround:TYPE --weights DIR``): written from tiny components by auto-round's own
packing (tests/autoround_folder.py), loaded through diffusers' AutoRound quantizer as bench loads them, benched on
this CPU against the unquantized images, their bytes predicted exactly; refused in one line at float32 (auto-round's
layers compute in bfloat16 or float16) and for a folder of another type; placed on its own fake GPU."""

from __future__ import annotations

import json

import pytest
import torch
from autoround_folder import write_autoround
from fake_cuda import LEDGER, FakeCuda, unavailable_reason
from test_fake_cuda import assert_ran_on_its_own_gpu

from diffmeter.catalog import resolve
from diffmeter.families import get_family
from diffmeter.loading import load_pipeline
from diffmeter.measure.stored_weights import storages_bytes
from diffmeter.optimize import Target, build, check
from diffmeter.predict.footprints import meta_module
from diffmeter.predict.quantized_formats import checkpoint_types, footprint
from diffmeter.quantization_spec import optimization_specs
from diffmeter.runs.lifecycle import bench
from diffmeter.runs.spec import BenchSpec
from diffmeter.runs.storage import RESULTS
from diffmeter.weights import locate_weights

pytest.importorskip("auto_round")
QUICK = ("--steps", "2", "--iterations", "1", "-q")
REASON = unavailable_reason()


def folder_of(tmp_path, model: str, component: str, bits: int):
    from diffmeter.tiny import tiny_pipeline

    folder = tmp_path / f"{model}-int{bits}"
    write_autoround(getattr(tiny_pipeline(resolve(model)), component), folder, bits)
    return folder


def target(model: str, dtype: str, device: str = "cpu") -> Target:
    entry = resolve(model)
    return Target(entry, get_family(entry.family), torch.device(device), dtype, 2)


@pytest.mark.parametrize(
    ("model", "component", "bits", "dtype"),
    [
        ("tiny-flux", "transformer", 4, "bfloat16"),
        ("tiny-flux", "transformer", 2, "float16"),
        ("tiny-flux", "transformer", 3, "bfloat16"),
        ("tiny-flux", "transformer", 8, "bfloat16"),
        ("tiny-sd", "unet", 4, "float16"),
    ],
)
def test_an_autoround_folder_loads_with_auto_rounds_layers_and_its_bytes_predicted(
    tmp_path, model, component, bits, dtype
):
    """The loaded component holds auto-round's packed layers (int32 words, scales at the run's dtype) and exactly
    the bytes predicted from the folder's quantization_config on a meta build of the catalog's config."""
    folder = folder_of(tmp_path, model, component, bits)
    t = target(model, dtype)
    specs = optimization_specs([f"{component}=autoround:int{bits}"], str(folder))
    optimizations = build(specs)
    check(optimizations, t)
    configs = optimizations[0].load_configs(t)
    loaded = getattr(
        load_pipeline(t.entry, locate_weights(t.entry, False), t.device, dtype, quantization=configs), component
    )
    layers = [m for m in loaded.modules() if hasattr(m, "qweight")]
    assert layers and {type(m).__module__ for m in layers} == {"auto_round_extension.torch.qlinear_torch_zp"}
    assert {m.qweight.dtype for m in layers} == {torch.int32} and {m.scales.dtype for m in layers} == {
        getattr(torch, dtype)
    }
    assert {m.bits for m in layers} == {bits}
    module = meta_module(t.entry.components[component], getattr(torch, dtype))
    stored, dequantized, _ = footprint(
        module, "autoround", f"int{bits}", getattr(torch, dtype), checkpoint_types("autoround", folder)
    )
    assert storages_bytes([loaded]) == stored
    assert dequantized == max(m.infeatures * m.outfeatures for m in layers) * getattr(torch, dtype).itemsize


def test_bench_measures_an_autoround_folder_against_the_unquantized_images(cli, tmp_path):
    folder = folder_of(tmp_path, "tiny-flux", "transformer", 4)
    code, out, err = cli(
        "bench", "tiny-flux", *QUICK, "--dtype", "bf16", "--quantize", "autoround:int4", "--weights", folder,
        "--compare-baseline", "--out", tmp_path / "runs",
    )  # fmt: skip
    assert code == 0, err
    run = sorted((tmp_path / "runs").iterdir())[1]
    result = json.loads((run / RESULTS).read_text())
    assert run.name.endswith("+opt-autoround-int4-tiny-flux-int4") and not result["optimizations"][0]["lossless"]
    assert 10 < result["quality"]["mean_psnr_db"] < 100 and result["quality"]["identical"] == 0


def test_autoround_at_float32_is_one_line_naming_the_dtype_it_needs(cli, tmp_path):
    """On a CPU bench runs float32 unless told: auto-round would cast the loaded model, which diffusers refuses."""
    folder = folder_of(tmp_path, "tiny-flux", "transformer", 4)
    code, out, err = cli("bench", "tiny-flux", *QUICK, "--quantize", "autoround:int4", "--weights", folder)
    said = (out + err).strip().splitlines()
    assert code != 0 and len(said) == 1 and "Traceback" not in out + err, out + err
    assert "compute in bfloat16 or float16" in said[0] and "add --dtype bfloat16" in said[0]


def test_an_autoround_folder_of_another_type_or_scheme_or_none_is_refused(tmp_path):
    folder = tmp_path / "ar"
    folder.mkdir()
    config = {"quant_method": "auto-round", "bits": 4, "group_size": 128, "sym": True, "data_type": "int"}
    (folder / "config.json").write_text(json.dumps({"quantization_config": config}))

    def refusal(value: str, weights) -> str | None:
        return build(optimization_specs([value], weights))[0].folder_refusal(target("tiny-flux", "bfloat16"))

    assert refusal("autoround:int4", str(folder)) is None
    assert "ar holds AutoRound int4 weights, not int2: say --quantize autoround:int4" in refusal(
        "autoround:int2", str(folder)
    )
    (folder / "config.json").write_text(json.dumps({"quantization_config": {**config, "data_type": "nv_fp"}}))
    assert "holds AutoRound nv_fp weights" in refusal("autoround:int4", str(folder))
    (folder / "config.json").write_text(json.dumps({"quantization_config": {"quant_method": "nunchaku_lite"}}))
    assert "holds no AutoRound quantization_config" in refusal("autoround:int4", str(folder))
    assert "is no component folder with a config.json" in refusal("autoround:int4", str(tmp_path))
    assert "add --weights DIR" in refusal("autoround:int4", None)


@pytest.mark.fake_cuda
@pytest.mark.skipif(REASON is not None, reason=REASON or "")
def test_an_autoround_folder_loads_and_runs_on_its_own_gpu(tmp_path, monkeypatch):
    """Loaded with the run's GPU as its device_map, as diffusers' AutoRound guide loads it, so auto-round picks its
    layers for CUDA (it picked the CPU's, then moved them, when diffmeter gave no device_map); they unpack and
    dequantize on the fake device (no Triton or Marlin here: the torch layers, which run on CUDA too)."""
    from auto_round.inference import convert_model

    folder = folder_of(tmp_path, "tiny-flux", "transformer", 4)
    spec = BenchSpec(
        model="tiny-flux", device="cuda:1", steps=2, iterations=1, dtype="bfloat16", predict=False,
        optimizations=optimization_specs(["autoround:int4"], str(folder)),
    )  # fmt: skip
    targets = []
    infer = convert_model.infer_target_device
    monkeypatch.setattr(convert_model, "infer_target_device", lambda found: targets.append(infer(found)) or targets[-1])
    with FakeCuda(own="cuda:1", capability=(8, 9), name="NVIDIA GeForce RTX 4090") as cuda:
        result, run = bench(spec, out=tmp_path / "runs")
    assert_ran_on_its_own_gpu(result, run, cuda)
    assert targets == ["cuda"]  # the layers auto-round chose were for CUDA
    LEDGER.append(("autoround:int4 on tiny-flux", "covered: auto-round's layers for CUDA run on the fake GPU"))
