"""The pre-quantized backends on the fake CUDA device (tests/fake_cuda): a Nunchaku Lite folder refused on a Hopper
GPU and, for nvfp4, short of Blackwell, with diffusers' reasons, and placed on its own GPU where it loads (its kernels
come from the Hub, which cannot be reached here, so the folder loader is a recorder that loads the saved component
back unquantized); a BFL file's single-file loader handed the run's compute dtype on cuda:1, recorded the same way
(BFL's quantized parameter is a tensor subclass, which the fake cannot hold); ModelOpt refused on every card;
torchao's bfloat16-only types and quanto's int4 at bfloat16 refused on a GPU as diffusers' load would fail."""

from __future__ import annotations

import json
from unittest import mock

import pytest
import torch
from bfl_file import write_bfl
from fake_cuda import LEDGER, FakeCuda, unavailable_reason
from test_fake_cuda import assert_ran_on_its_own_gpu

from diffmeter.catalog import resolve
from diffmeter.families import get_family
from diffmeter.optimize import Target, build
from diffmeter.quantization_spec import optimization_specs
from diffmeter.runs.lifecycle import bench
from diffmeter.runs.spec import BenchSpec

REASON = unavailable_reason()
pytestmark = [pytest.mark.fake_cuda, pytest.mark.skipif(REASON is not None, reason=REASON or "")]


def nunchaku_folder(root, kind: str):
    """tiny-flux's transformer saved with a Nunchaku Lite quantization_config in its config.json (its tensors as
    saved: the recorder below loads them back unquantized)."""
    from diffmeter.tiny import tiny_pipeline

    folder = root / "svdq-tiny-flux"
    tiny_pipeline(resolve("tiny-flux")).transformer.save_pretrained(folder)
    config = json.loads((folder / "config.json").read_text())
    section = {"precision": kind, "group_size": 64 if kind == "int4" else 16, "rank": 8, "targets": ["proj_out"]}
    config["quantization_config"] = {"quant_method": "nunchaku_lite", "compute_dtype": "bfloat16", "svdq_w4a4": section}
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def fake_bench(out, specs, capability, name="NVIDIA GeForce RTX 4090"):
    spec = BenchSpec(
        model="tiny-flux", device="cuda:1", steps=2, iterations=1, dtype="bfloat16", predict=False, optimizations=specs
    )
    with FakeCuda(own="cuda:1", capability=capability, name=name) as cuda:
        result, folder = bench(spec, out=out)
    return result, folder, cuda


@pytest.mark.parametrize(
    ("kind", "capability", "says"),
    [
        ("int4", (9, 0), "does not load Nunchaku Lite checkpoints on Hopper GPUs"),
        ("nvfp4", (8, 9), "nunchaku:nvfp4 needs a Blackwell GPU (compute capability 10.0+), this is 8.9"),
        ("int4", (7, 0), "nunchaku:int4 needs compute capability 7.5+ (Turing), this is 7.0"),
    ],
)
def test_nunchaku_is_refused_where_diffusers_refuses_it(tmp_path, kind, capability, says):
    (nunchaku,) = build(optimization_specs([f"nunchaku:{kind}"], str(nunchaku_folder(tmp_path, kind))))
    entry = resolve("tiny-flux")
    with FakeCuda(own="cuda:1", capability=capability):
        reason = nunchaku.supports(Target(entry, get_family(entry.family), torch.device("cuda", 1), "bfloat16", 2))
    assert says in reason


def test_nunchaku_is_refused_as_diffusers_reads_the_trust_flags(tmp_path, monkeypatch):
    """diffusers reads DIFFUSERS_TRUST_REMOTE_KERNELS once, and DIFFUSERS_DISABLE_REMOTE_CODE wins over it
    (utils/constants.py:60-66): the refusal was of the variable alone, which let such a run through to its load."""
    import diffusers.utils.constants

    (nunchaku,) = build(optimization_specs(["nunchaku:int4"], str(nunchaku_folder(tmp_path, "int4"))))
    monkeypatch.setattr("diffmeter.optimize.base.importable", lambda module: True)
    monkeypatch.setenv("DIFFUSERS_TRUST_REMOTE_KERNELS", "true")  # set, yet diffusers' flag is off: remote code off
    monkeypatch.setattr(diffusers.utils.constants, "DIFFUSERS_TRUST_REMOTE_KERNELS", False)
    monkeypatch.setattr(diffusers.utils.constants, "DIFFUSERS_DISABLE_REMOTE_CODE", True)
    entry = resolve("tiny-flux")
    with FakeCuda(own="cuda:1", capability=(8, 9)):
        reason = nunchaku.supports(Target(entry, get_family(entry.family), torch.device("cuda", 1), "bfloat16", 2))
    assert "set DIFFUSERS_TRUST_REMOTE_KERNELS=true and unset DIFFUSERS_DISABLE_REMOTE_CODE" in reason


def test_a_nunchaku_folder_loads_on_its_own_gpu(tmp_path, monkeypatch):
    import diffmeter.quantized_loading as loading

    folder = nunchaku_folder(tmp_path, "int4")
    import diffusers.utils.constants

    monkeypatch.setattr(diffusers.utils.constants, "DIFFUSERS_TRUST_REMOTE_KERNELS", True)  # as diffusers read it
    monkeypatch.setattr("diffmeter.optimize.base.importable", lambda module: True)  # kernels: not installed here
    seen = {}

    def from_folder(name, found, root, dtype):
        seen[name] = (found.path, dtype)
        return torch_model(root / name, dtype)

    with mock.patch.object(loading, "from_folder", from_folder):
        result, run, cuda = fake_bench(tmp_path / "runs", optimization_specs(["nunchaku:int4"], str(folder)), (8, 9))
    assert_ran_on_its_own_gpu(result, run, cuda)
    assert seen == {"transformer": (folder, torch.bfloat16)}
    LEDGER.append(("nunchaku:int4 on tiny-flux", "placement covered with the folder loader recorded (RTX 4090, 8.9)"))


def test_a_bfl_file_loads_on_its_own_gpu(tmp_path):
    import diffmeter.quantized_loading as loading
    from diffmeter.tiny import tiny_pipeline

    file = tmp_path / "tiny-flux-fp8.safetensors"
    write_bfl(tiny_pipeline(resolve("tiny-flux")).transformer, file, "fp8")
    seen = {}

    def from_single_file(name, single, root, dtype):
        seen[name] = (single.path, type(single.config).__name__, single.config.compute_dtype, dtype)
        return torch_model(root / name, dtype)

    with mock.patch.object(loading, "from_single_file", from_single_file):
        result, run, cuda = fake_bench(tmp_path / "runs", optimization_specs(["bfl:fp8"], str(file)), (9, 0))
    assert_ran_on_its_own_gpu(result, run, cuda)
    assert seen == {"transformer": (file, "BFLQuantizationConfig", torch.bfloat16, torch.bfloat16)}
    LEDGER.append(("bfl:fp8 on tiny-flux", "placement covered with from_single_file recorded"))


def torch_model(folder, dtype):
    import diffusers

    return diffusers.FluxTransformer2DModel.from_pretrained(folder, torch_dtype=dtype)


@pytest.mark.parametrize(("kind", "capability"), [("fp8", (9, 0)), ("nvfp4", (10, 0)), ("int8", (8, 6))])
def test_modelopt_is_refused_on_every_gpu_since_diffusers_leaves_its_layers_unconverted(monkeypatch, kind, capability):
    """diffusers 0.42.1 compresses each layer alone (mtq.compress(module)), which nvidia-modelopt 0.43 does not convert
    to a RealQuantLinear: the first forward fails on any device (quantize_modelopt.py's sources). An H100 or B200 was
    let through for fp8 and nvfp4; now every card is refused with that reason, whatever modelopt is installed."""
    monkeypatch.setattr("diffmeter.optimize.base.importable", lambda module: True)
    (modelopt,) = build(optimization_specs([f"modelopt:{kind}"]))
    entry = resolve("tiny-flux")
    with FakeCuda(own="cuda:1", capability=capability):
        reason = modelopt.supports(Target(entry, get_family(entry.family), torch.device("cuda", 1), "bfloat16", 2))
    assert "mtq.compress(module)" in reason and "on any device" in reason


@pytest.mark.parametrize(
    ("value", "dtype", "says"),
    [
        ("torchao:float8dq-row", "float16", "quantizes per row only bfloat16 weights"),
        ("torchao:int4wo", "float32", "mslk's bf16i4bf16 kernel, bfloat16 activations only"),
    ],
)
def test_torchaos_bfloat16_only_types_are_refused_at_other_dtypes_on_a_gpu(monkeypatch, value, dtype, says):
    """torchao asserts bfloat16 weights for per-row float8 (quant_api.py:1237-1242) and int4's kernel takes bfloat16
    activations: on an H100 at another dtype the load (or first forward) failed after the checks let it through."""
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: object() if name == "mslk" else find_spec(name, *a)
    )
    (technique,) = build(optimization_specs([value]))
    entry = resolve("tiny-flux")
    with FakeCuda(own="cuda:1", capability=(9, 0)):
        at = {d: Target(entry, get_family(entry.family), torch.device("cuda", 1), d, 2) for d in (dtype, "bfloat16")}
        assert says in technique.cannot_run(at[dtype]) and "add --dtype bfloat16" in technique.cannot_run(at[dtype])
        assert technique.cannot_run(at["bfloat16"]) is None


def test_quanto_int4_at_bfloat16_is_refused_on_a_gpu_too(tmp_path):
    """diffusers quantizes each layer on the CPU as it loads it (no device_map), where torch packs tinygemm's int4
    only in output rows of 16: tiny-sana's 8-row embedder failed a CUDA run's load as it fails a CPU run's."""
    (quanto,) = build(optimization_specs(["quanto:int4"]))
    entry = resolve("tiny-sana")
    with FakeCuda(own="cuda:1", capability=(9, 0)):
        reason = quanto.supports(Target(entry, get_family(entry.family), torch.device("cuda", 1), "bfloat16", 2))
    assert "transformer.time_embed.emb.timestep_embedder.linear_1 has 8" in reason and "on the CPU" in reason
