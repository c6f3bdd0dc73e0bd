"""The onnxruntime technique: tiny UNet and MMDiT pipelines through ONNX Runtime's CPU provider,
the export cache, and the refusals (decided before any weight loads)."""

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from diffmeter.errors import DiffmeterError, MissingPackage
from diffmeter.optimize import OptimizationSpec, Target, build, check
from diffmeter.runs.ladder import plan
from diffmeter.runs.lifecycle import bench
from diffmeter.runs.spec import BenchSpec

sys.path.insert(0, str(Path(__file__).parent))
from test_optimize import generate, one, target  # noqa: E402


def _exports(cache: Path) -> dict[Path, float]:
    return {path: path.stat().st_mtime_ns for path in (cache / "onnx").glob("*/model.onnx")}


@pytest.mark.slow
def test_a_dit_and_its_decoder_match_pytorch_and_their_exports_are_reused(tmp_path, monkeypatch):
    monkeypatch.setenv("DIFFMETER_CACHE_DIR", str(tmp_path))
    first = one("onnxruntime", target("tiny-flux"), decoder=True)
    images = generate("tiny-flux", [first])
    assert [(type(owner).__name__, name) for owner, name in first._replaced] == [
        ("FluxTransformer2DModel", "forward"),
        ("AutoencoderKL", "decode"),
    ]
    for owner, name in first._replaced:
        assert len(vars(owner)[name].sessions) == 1  # one input shape: one session, and it ran
    assert first.export_s > 0
    exported = _exports(tmp_path)
    assert len(exported) == 2
    np.testing.assert_allclose(images, generate("tiny-flux"), atol=1e-4)  # PyTorch eager, same seeds

    second = one("onnxruntime", target("tiny-flux"), decoder=True, release_weights=True)
    again = generate("tiny-flux", [second])
    assert second.export_s == 0 and _exports(tmp_path) == exported  # loaded, not exported again
    np.testing.assert_array_equal(again, images)
    ((denoiser, _), (vae, _)) = second._replaced
    assert {p.device.type for p in [*denoiser.parameters(), *vae.parameters()]} == {"meta"}  # only ORT holds them
    with pytest.raises(DiffmeterError, match="new input shape"):
        denoiser.forward(hidden_states=torch.zeros(1, 3, 4))


@pytest.mark.slow
def test_a_unet_run_compares_one_to_one_with_pytorch_and_reuses_its_export(tmp_path, monkeypatch):
    monkeypatch.setenv("DIFFMETER_CACHE_DIR", str(tmp_path / "cache"))
    spec = BenchSpec(
        model="tiny-sd",
        steps=2,
        iterations=1,
        compare_baseline=True,
        optimizations=[OptimizationSpec(name="onnxruntime")],
    )
    result, _ = bench(spec, out=tmp_path / "out")
    assert result.optimizations[0].name == "onnxruntime" and result.optimizations[0].params["provider"] == "cpu"
    assert result.quality.identical == 1 or result.quality.min_psnr_db > 40  # against PyTorch at the same seeds
    assert all(len(iteration.stages.steps_s) == 2 for iteration in result.iterations)  # stages timed as in PyTorch
    exported = _exports(tmp_path / "cache")
    assert len(exported) == 1

    again, _ = bench(spec, out=tmp_path / "out", force=True)
    assert _exports(tmp_path / "cache") == exported
    assert again.summary.cold_start_overhead_s < result.summary.cold_start_overhead_s  # no export this time
    assert again.quality.identical == result.quality.identical


def _target(model: str, device: str = "cpu", dtype: str = "float32") -> Target:
    t = target(model)
    return Target(t.entry, t.family, torch.device(device), dtype, t.steps)


@pytest.mark.parametrize(
    ("model", "device", "dtype", "params", "reason"),
    [
        ("tiny-sd", "cpu", "float32", {"provider": "cuda"}, "needs a CUDA device"),
        ("tiny-sd", "cpu", "float32", {"provider": "tensorrt"}, "needs a CUDA device"),
        ("tiny-sd", "cuda", "float16", {"provider": "cpu"}, "runs on the host"),
        ("tiny-sd", "cpu", "bfloat16", {}, "bfloat16"),
        ("tiny-pixart", "cpu", "float32", {}, "Squeeze"),
        ("tiny-lumina2", "cpu", "float32", {}, ".tolist()"),
    ],
)
def test_refusals_name_the_reason(model, device, dtype, params, reason):
    """A CUDA target is only a description here: support is decided before anything touches a device."""
    (technique,) = build([OptimizationSpec(name="onnxruntime", params=params)])
    assert reason in technique.supports(_target(model, device, dtype))
    if device == "cpu":
        with pytest.raises(DiffmeterError, match="cannot be used with"):
            check([technique], _target(model, device, dtype))


@pytest.mark.parametrize(
    "other", ["first-block-cache", "attention", "sdpa-kernel", "offload", "quantize", "vae-tiling"]
)
def test_techniques_the_exported_graph_would_bypass_are_refused(other):
    params = {"attention": {"backend": "native"}, "sdpa-kernel": {"kernel": "math"}}
    ours = OptimizationSpec(name="onnxruntime", params={"decoder": other == "vae-tiling"})
    built = build([ours, OptimizationSpec(name=other, params=params.get(other, {}))])
    technique, added = sorted(built, key=lambda technique: technique.name != "onnxruntime")
    assert f"onnxruntime and {other} do not combine" in technique.clashes([added])


def test_one_compiler_at_a_time():
    with pytest.raises(DiffmeterError, match="pick one"):
        check(build([OptimizationSpec(name="onnxruntime"), OptimizationSpec(name="compile")]), _target("tiny-sd"))


def test_a_missing_package_names_the_extra(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "onnxscript" else real(name, *a))
    (technique,) = build([OptimizationSpec(name="onnxruntime")])
    with pytest.raises(MissingPackage, match=r"onnxscript.*diffmeter\[onnx\]"):
        check([technique], _target("tiny-sd"))


def test_listed_and_a_ladder_rung(cli):
    code, out, _ = cli("optimizations")
    assert code == 0 and "onnxruntime" in out
    rungs = plan(BenchSpec(model="tiny-sd", steps=3), ("runtime",), None, "default")
    assert [rung.spec.optimizations[-1].name for rung in rungs[1:]] == ["onnxruntime"]
    rungs = plan(BenchSpec(model="tiny-flux", steps=3), ("cache", "runtime"), None, "default")
    assert rungs[-1].spec is None and "onnxruntime" in rungs[-1].skipped


@pytest.mark.slow
def test_pixart_is_refused_because_its_export_does_not_load(tmp_path, monkeypatch):
    """Holds the PixArt refusal to the exporter's real behaviour: lift it when this fails."""
    import onnxruntime

    from diffmeter.optimize import onnxruntime as technique

    monkeypatch.setitem(technique.UNEXPORTABLE, "PixArtTransformer2DModel", None)
    monkeypatch.setenv("DIFFMETER_CACHE_DIR", str(tmp_path))
    with pytest.raises(onnxruntime.capi.onnxruntime_pybind11_state.Fail, match="Squeeze"):
        generate("tiny-pixart", [one("onnxruntime", target("tiny-pixart"))], batch=1)


def test_providers_run_on_the_runs_own_gpu_and_stream_with_tensorrt_backed_by_cuda():
    """Without device_id every session ran on GPU 0 whatever cuda:N the run was on; TensorRT had no CUDA
    fallback (rejected nodes went to the CPU) and no fp16 flag (float16 graphs could build FP32 engines)."""
    from diffmeter.optimize.onnxruntime_session import execution_providers

    cuda_1 = torch.device("cuda", 1)
    assert execution_providers("cpu", torch.device("cpu"), "float32", None) == ["CPUExecutionProvider"]
    own = {"device_id": 1, "user_compute_stream": "4096"}
    assert execution_providers("cuda", cuda_1, "float32", 4096) == [
        ("CUDAExecutionProvider", own),
        "CPUExecutionProvider",
    ]
    assert execution_providers("tensorrt", cuda_1, "float16", 4096) == [
        ("TensorrtExecutionProvider", {**own, "trt_fp16_enable": True}),
        ("CUDAExecutionProvider", own),
        "CPUExecutionProvider",
    ]
    assert execution_providers("tensorrt", cuda_1, "float32", 4096)[0][1]["trt_fp16_enable"] is False


def test_the_cuda_binding_waits_for_pytorchs_stream_and_keeps_its_inputs_alive(monkeypatch):
    """IOBinding holds bare pointers: a contiguous copy freed before the run could be reused by PyTorch's allocator
    (the first of two non-contiguous inputs was); and ONNX Runtime must not read inputs before PyTorch's stream has
    made them. CUDA cannot exist here: the stream and the session are stand-ins recording what happens, the
    tensors are real."""
    import gc
    from unittest import mock

    from diffmeter.optimize import onnxruntime as ort

    events = []
    stream = mock.Mock(synchronize=lambda: events.append("stream synchronized"))
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: stream)

    class Binding:
        def __init__(self):
            self.pointers = []

        def bind_input(self, name, device, index, dtype, shape, pointer):
            self.pointers.append(pointer)

        def bind_output(self, *args):
            pass

        def synchronize_outputs(self):
            events.append("outputs synchronized")

    binding = Binding()

    def run(bound):
        live = {t.data_ptr() for t in gc.get_objects() if type(t) is torch.Tensor and t.numel()}
        events.append(("run", all(pointer in live for pointer in bound.pointers)))

    output = mock.Mock(type="tensor(float)", shape=[2, 3])
    output.name = "out"
    session = mock.Mock(io_binding=lambda: binding, run_with_iobinding=run, get_outputs=lambda: [output])
    inputs = [torch.randn(3, 2).t(), torch.randn(3, 2).t(), torch.ones(2, 3, dtype=torch.bool)]
    (result,) = ort._run_on_cuda(session, ["a", "b", "mask"], inputs)
    assert events == ["stream synchronized", ("run", True), "outputs synchronized"]
    assert result.shape == (2, 3) and result.dtype == torch.float32


@pytest.mark.slow
def test_every_dtype_a_catalog_pipeline_hands_its_denoiser_can_cross_into_onnx_runtime():
    """The first denoiser call of every tiny pipeline, its tensor arguments' dtypes read (LTX-Video passes a
    boolean mask, which raised KeyError on the cuda and tensorrt providers); bfloat16 is refused up front."""
    from diffmeter.catalog import all_entries
    from diffmeter.families import get_family
    from diffmeter.optimize.onnxruntime import _NUMPY, UNEXPORTABLE
    from diffmeter.runs.workload import Workload
    from diffmeter.tiny import tiny_pipeline

    class Seen(Exception):
        pass

    dtypes = {}
    for entry in (e for e in all_entries() if e.is_tiny):
        pipe = tiny_pipeline(entry)
        family = get_family(entry.family)
        denoiser = getattr(pipe, family.denoiser)
        if type(denoiser).__name__ in UNEXPORTABLE:
            continue  # refused before loading (test_refusals_name_the_reason holds the reasons)

        def record(module, args, kwargs, name=entry.name):
            leaves = torch.utils._pytree.tree_leaves((args, kwargs))
            dtypes[name] = {leaf.dtype for leaf in leaves if isinstance(leaf, torch.Tensor)}
            raise Seen

        denoiser.register_forward_pre_hook(record, with_kwargs=True)
        spec = BenchSpec(model=entry.name, steps=1, iterations=1).settle(entry)
        workload = Workload(spec, entry)
        with pytest.raises(Seen):
            pipe(**workload.call_arguments(pipe, workload.batch(0)))
    assert len(dtypes) >= 25
    assert torch.bool in set().union(*dtypes.values())
    assert {name: seen - set(_NUMPY) for name, seen in dtypes.items() if seen - set(_NUMPY)} == {}


def test_runs_through_onnx_runtime_on_cuda_say_its_memory_is_not_in_the_peak():
    from diffmeter.optimize.onnxruntime import Config, OnnxRuntime

    on_gpu = target("tiny-flux")
    assert OnnxRuntime(Config()).note(on_gpu) is None  # the CPU provider: host memory, in the process's RSS
    said = OnnxRuntime(Config(provider="tensorrt")).note(on_gpu)
    assert "ONNX Runtime's own GPU memory" in said and "TensorRT engines" in said and "stays resident" in said
    assert "stays resident" not in OnnxRuntime(Config(provider="cuda", release_weights=True)).note(on_gpu)


def _relu_onnx(path):
    """A real one-node ONNX graph (Relu), written with onnx's helpers."""
    import onnx
    from onnx import TensorProto, helper

    tensor = [helper.make_tensor_value_info(name, TensorProto.FLOAT, [2, 4]) for name in ("x", "y")]
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "relu", [tensor[0]], [tensor[1]])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_a_session_that_cannot_start_the_provider_asked_for_is_an_error_not_a_silent_fallback(tmp_path):
    """On a GPU machine without TensorRT's libnvinfer, ONNX Runtime printed the error and ran the graph on CUDA
    (on GPU 0, without the provider options), and the run was stored as TensorRT's. Here, this CPU-only
    onnxruntime starts a session asked for CUDA on the CPU, with a warning: the same silent substitution."""
    import onnxruntime

    from diffmeter.optimize.onnxruntime_session import execution_providers, started_session

    path = _relu_onnx(tmp_path / "relu.onnx")
    providers = execution_providers("cuda", torch.device("cuda", 1), "float32", None)
    with pytest.raises(DiffmeterError, match="could not start CUDAExecutionProvider and fell back to CPU"):
        started_session(onnxruntime, path, onnxruntime.SessionOptions(), providers)
    session = started_session(onnxruntime, path, onnxruntime.SessionOptions(), ["CPUExecutionProvider"])
    assert session.get_providers() == ["CPUExecutionProvider"]


def test_a_provider_that_fails_to_start_is_reported_with_onnx_runtimes_reason(tmp_path):
    """TensorRT's libraries cannot exist here: a stand-in for onnxruntime raises what onnxruntime-gpu 1.31.1
    raised on an H200 without them, and records that its own fallback was turned off."""
    from types import SimpleNamespace

    from diffmeter.optimize.onnxruntime_session import started_session

    asked = {}

    def session(path, options, providers, **kwargs):
        asked.update(kwargs)
        raise RuntimeError("Failed to load library libonnxruntime_providers_tensorrt.so with error: libnvinfer.so.10")

    fake = SimpleNamespace(InferenceSession=session)
    providers = [("TensorrtExecutionProvider", {}), ("CUDAExecutionProvider", {}), "CPUExecutionProvider"]
    with pytest.raises(DiffmeterError, match="could not start TensorrtExecutionProvider: .*libnvinfer.so.10"):
        started_session(fake, tmp_path / "model.onnx", None, providers)
    assert asked == {"enable_fallback": 0}
