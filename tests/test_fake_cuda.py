"""diffmeter's CUDA paths run on the fake CUDA device (tests/fake_cuda): every tiny family at float16 and
bfloat16 and every technique on cuda:1, each rank of a parallel run on its own GPU, ``fit`` -> ``bench``,
and the harness's own checks (planted device bugs still fail). Times and memory under the fake are
invented: no test asserts one. What cannot run under the fake is listed with its reason and still run, so
a list entry that starts passing (or fails for another reason) fails here."""

from __future__ import annotations

import contextlib
from pathlib import Path
from unittest import mock

import pytest
import torch
from fake_cuda import LEDGER, FakeCuda, FakeCudaViolation, unavailable_reason
from tiny_runs import TINY

from diffmeter.predict.schema import DENOISING_STEP, VAE_DECODE
from diffmeter.runs.lifecycle import bench
from diffmeter.runs.results import BenchResult
from diffmeter.runs.spec import BenchSpec

REASON = unavailable_reason()
pytestmark = [pytest.mark.fake_cuda, pytest.mark.skipif(REASON is not None, reason=REASON or "")]

#: techniques that do not run under the fake, with what a run of each meets there: each is still run, and a run that
#: ends otherwise (an error of another kind, or a run that works) fails the test until its entry goes
NOT_RUNNABLE = {
    "offload-sequential": "FakeTensor.__new__() missing required argument: 'fake_mode'",  # accelerate's Tensor.__new__
    "offload-group": "Cannot access accelerator device when none is available",  # torch.Stream asks the runtime
    "quantize-int8": "Creating a Parameter from an instance of type Int8Tensor",  # torchao subclass under fake
    "quantize-fp8": "Creating a Parameter from an instance of type Float8Tensor",
    "torchao-int4wo": "int4 weight-only packing needs the mslk kernels",  # not installed (a CUDA-only package)
    # --quantize BACKEND:TYPE: the backends' tensor subclasses under fake, as quantize's; placement:
    # test_a_backend_quantized_at_load_is_placed_on_its_own_gpu
    "torchao-int8wo": "Creating a Parameter from an instance of type Int8Tensor",
    "torchao-float8wo": "Creating a Parameter from an instance of type Float8Tensor",
    "torchao-float8dq-tensor": "Float8 dynamic activation quantization is only supported on CUDA>=8.9",  # torchao
    "torchao-float8dq-row": "Float8 dynamic activation quantization is only supported on CUDA>=8.9",  # asks CUDA
    "quanto-int8": "Creating a Parameter from an instance of type WeightQBytesTensor",
    "quanto-int4": "Creating a Parameter from an instance of type WeightQBitsTensor",
    "quanto-float8": "Creating a Parameter from an instance of type WeightQBytesTensor",
    "bnb-nf4": "Creating a new Tensor subclass Params4bit",
    "bnb-fp4": "Creating a new Tensor subclass Params4bit",
    "bnb-int8": "Creating a new Tensor subclass Int8Params",
    "attention-flex": "There was no rule registered for HigherOrderOperator flex_attention",  # no fake rule for it
    "compile": "complete, first call: 0 graphs compiled",  # dynamo skips frames under a dispatch mode: eager code
    "tensorrt": "tensorrt needs the torch_tensorrt package",  # not installed; its engines need real device memory
    "onnxruntime": "provider=cpu runs on the host",  # refused on any GPU; tests/test_onnxruntime.py runs it
    "onnxruntime-provider=cuda": "this onnxruntime has no CUDAExecutionProvider",  # onnxruntime-gpu: real memory
    "onnxruntime-provider=tensorrt": "this onnxruntime has no TensorrtExecutionProvider",
}
#: the dtype a technique runs at where bfloat16 is refused (numpy, ONNX Runtime's way in, has no bfloat16)
DTYPES = {"onnxruntime": "float16"}
#: the tiny model each technique runs on: the first in this order that it applies to
TECHNIQUE_MODELS = ("tiny-flux", "tiny-sd", "tiny-wan", "tiny-sdxl", "tiny-pixart", "tiny-cogvideox")
#: cache-dit's default keeps 8 blocks always computed; the tiny transformers have 1 or 2
PARAMS = {"cache-dit": {"fn": 1, "bn": 0}}


def fake_bench(out: Path, model: str, dtype: str = "bfloat16", optimizations=(), **settings):
    """``bench`` on cuda:1 of two fake GPUs: (result, run folder, the fake's record)."""
    spec = BenchSpec(
        model=model, device="cuda:1", steps=2, iterations=1, dtype=dtype, predict=False,
        optimizations=list(optimizations), **settings,
    )  # fmt: skip
    with FakeCuda(own="cuda:1") as cuda:
        result, folder = bench(spec, out=out)
    return result, folder, cuda


def assert_ran_on_its_own_gpu(result: BenchResult, folder: Path, cuda: FakeCuda) -> None:
    """Complete, nothing on another device, and the CUDA path taken: stages timed with events on cuda:1,
    its peaks reset and read, energy asked of GPU 1, images written from the device's output."""
    assert result.status == "complete" and not cuda.violations
    assert result.spec.device == "cuda:1"
    assert {call.device for call in cuda.calls if call.name == "Event.record"} == {1}
    assert ("reset_peak_memory_stats", 1) in {(call.name, call.device) for call in cuda.calls}
    assert result.summary.peak_memory.cuda_max_allocated_bytes is not None
    assert {DENOISING_STEP, VAE_DECODE} <= set(result.summary.peak_memory.cuda_stage_max_allocated_bytes)
    assert result.summary.energy.gpu_indices == [1]
    assert result.images and all((folder / image.path).exists() for image in result.images)


DTYPE_RUNS = [(entry, dtype) for entry in TINY for dtype in ("float16", "bfloat16")]


@pytest.mark.parametrize(("entry", "dtype"), DTYPE_RUNS, ids=[f"{entry.id}-{dtype}" for entry, dtype in DTYPE_RUNS])
def test_every_tiny_family_runs_on_its_own_gpu(tmp_path, entry, dtype):
    result, folder, cuda = fake_bench(tmp_path, entry.id, dtype)
    assert_ran_on_its_own_gpu(result, folder, cuda)
    assert result.spec.dtype == dtype
    LEDGER.append((f"{entry.id} at {dtype}", "covered"))


def technique_cases() -> list:
    from diffmeter.catalog import resolve
    from diffmeter.families import get_family
    from diffmeter.optimize import REGISTRY, OptimizationSpec, Target
    from diffmeter.optimize.attention import Attention, Config, backend_names

    cases = []
    # every attention backend, not only the matrix's variant: those whose package is here run (the rest are refused)
    backends = [Attention(Config(backend=name)) for name in backend_names()]
    for cls in REGISTRY.values():
        if cls.name in ("gguf", "bfl", "nunchaku", "autoround", "modelopt"):  # a file or folder, or not installed:
            continue  # test_a_gguf_file_loads_on_its_own_gpu, test_fake_cuda_prequantized.py, test_autoround.py
        for variant in backends if cls is Attention else cls.variants():
            spec = OptimizationSpec(
                name=variant.name, params={**variant.config.model_dump(mode="json"), **PARAMS.get(variant.name, {})}
            )
            optimization, dtype = cls(cls.Config(**spec.params)), DTYPES.get(variant.name, "bfloat16")
            for model in TECHNIQUE_MODELS:
                entry = resolve(model)
                target = Target(entry, get_family(entry.family), torch.device("cuda", 1), dtype, 2)
                if optimization.refusal(target)[0] is None or variant.label() in NOT_RUNNABLE:
                    cases.append(pytest.param(model, spec, dtype, id=f"{variant.label()}-{model}"))
                    break
            else:
                if cls is not Attention:
                    raise AssertionError(f"{variant.label()} applies to none of {TECHNIQUE_MODELS}: add a model")
    return cases


def outcome(out: Path, model: str, technique, dtype: str) -> str:
    """How a run of ``technique`` under the fake ends: its error, or its status and what its first (cold) call
    compiled, where torch.compile compiles."""
    try:
        result, _, _ = fake_bench(out, model, dtype, optimizations=[technique])
    except Exception as error:
        return f"{type(error).__name__}: {error}"
    compiled = result.summary.first_call_compilation
    return f"{result.status}, first call: {compiled.text() if compiled else 'compilation not counted'}"


TECHNIQUE_CASES = technique_cases()


@pytest.mark.parametrize(("model", "technique", "dtype"), TECHNIQUE_CASES)
def test_every_technique_runs_on_its_own_gpu(tmp_path, model, technique, dtype):
    from diffmeter.optimize import build

    label = build([technique])[0].label()
    if label in NOT_RUNNABLE:
        ended = outcome(tmp_path, model, technique, dtype)
        assert NOT_RUNNABLE[label] in ended, f"{label} under the fake no longer ends as listed: {ended}"
        LEDGER.append((f"{label} on {model}", f"not runnable under the fake: {NOT_RUNNABLE[label]}"))
        return
    result, folder, cuda = fake_bench(tmp_path, model, dtype, optimizations=[technique])
    assert_ran_on_its_own_gpu(result, folder, cuda)
    assert label in [applied.label for applied in result.optimizations]
    LEDGER.append((f"{label} on {model}", "covered"))


def test_every_technique_not_runnable_under_the_fake_is_run_and_documented():
    """A technique leaves NOT_RUNNABLE only by running under the fake: every entry names a variant the test above
    runs (a renamed one would silently run nowhere), and docs/fake-cuda.md names it."""
    from diffmeter.optimize import build

    run = {build([case.values[1]])[0].label() for case in TECHNIQUE_CASES}
    documented = (Path(__file__).parents[1] / "docs" / "fake-cuda.md").read_text()
    for label in NOT_RUNNABLE:
        assert label in run, f"NOT_RUNNABLE lists {label}, which is no technique variant the fake runs"
        assert f"`{label}`" in documented, f"docs/fake-cuda.md does not list {label}"


def test_a_quantized_denoiser_is_never_whole_and_unquantized_on_the_gpu(tmp_path):
    """quantize loads the denoiser on the CPU and hands torchao each linear layer on cuda:1 to quantize there
    (``quantize_(device=...)``), so the unquantized weights are never all on the GPU; the other components load
    on cuda:1. torchao's tensor subclasses cannot be faked, so its quantize_ is a recorder here, moving each
    layer as torchao would."""
    import torchao.quantization

    seen = {}

    def quantize_(module, config, filter_fn=None, device=None):
        seen["denoiser on"] = {str(parameter.device) for parameter in module.parameters()}
        seen["device"] = device
        for layer in module.modules():
            if isinstance(layer, torch.nn.Linear):
                layer.to(device)

    spec = BenchSpec(
        model="tiny-flux",
        device="cuda:1",
        steps=2,
        iterations=1,
        dtype="bfloat16",
        predict=False,
        optimizations=[{"name": "quantize", "params": {"weights": "int8"}}],
    )
    with FakeCuda(own="cuda:1") as cuda, mock.patch.object(torchao.quantization, "quantize_", quantize_):
        result, folder = bench(spec, out=tmp_path)
    assert not cuda.violations and result.status == "complete"
    assert seen == {"denoiser on": {"cpu"}, "device": torch.device("cuda:1")}
    LEDGER.append(
        (
            "quantize (int8) on tiny-flux",
            "covered with torchao's quantize_ recorded: loaded on the CPU, each layer quantized on cuda:1",
        )
    )


def test_what_fit_lists_bench_runs_on_a_card_that_small(tmp_path):
    """``fit`` on a card just too small for the plain run lists settings; the first that runs under the fake
    is measured on a fake card of that size, and bench's own memory check lets it through."""
    from diffmeter.optimize import REGISTRY, OptimizationSpec
    from diffmeter.predict.memory import predict_memory
    from diffmeter.predict.techniques import fitting, peak_under
    from diffmeter.spec import ProfileSpec

    prediction = predict_memory(ProfileSpec(model="tiny-flux", steps=2, dtype="bfloat16"))
    card = peak_under(prediction, ()) - 1
    variants = {v.label(): v for cls in REGISTRY.values() for v in cls.variants()}
    fits = [chosen for chosen, _ in fitting(prediction, card) if not set(chosen) & set(NOT_RUNNABLE)]
    assert fits, "fit lists nothing that runs under the fake"
    chosen = fits[0]
    techniques = [
        OptimizationSpec(name=variants[label].name, params=variants[label].config.model_dump(mode="json"))
        for label in chosen
    ]
    spec = BenchSpec(
        model="tiny-flux", device="cuda:1", steps=2, iterations=1, dtype="bfloat16", predict=False,
        optimizations=techniques,
    )  # fmt: skip
    with FakeCuda(own="cuda:1", memory_gib=card / 2**30) as cuda:
        result, folder = bench(spec, out=tmp_path)
    assert_ran_on_its_own_gpu(result, folder, cuda)
    LEDGER.append((f"fit -> bench ({' + '.join(chosen)})", "covered"))


# the harness's own checks: bugs planted in a real run still fail it, each with one clear line


def loading_then(change):
    """``lifecycle.load_pipeline``, then ``change(pipe)``: a bug planted in the loaded pipeline."""
    from diffmeter.runs import lifecycle

    real = lifecycle.load_pipeline

    def load(*args, **kwargs):
        pipe = real(*args, **kwargs)
        change(pipe)
        return pipe

    return mock.patch.object(lifecycle, "load_pipeline", load)


def test_a_cpu_tensor_added_in_a_forward_hook_is_caught(tmp_path):
    def plant(pipe):
        pipe.unet.register_forward_hook(lambda module, args, output: (output[0] + torch.ones(output[0].shape[-1]),))

    caught = r"aten.add.Tensor got tensors on \['cpu', 'cuda:1'\]"
    with loading_then(plant), pytest.raises(FakeCudaViolation, match=caught):
        fake_bench(tmp_path, "tiny-sd")


def test_a_layer_left_on_another_gpu_is_caught(tmp_path):
    with loading_then(lambda pipe: pipe.unet.conv_in.to("cuda:0")), pytest.raises(FakeCudaViolation, match=r"cuda:0"):
        fake_bench(tmp_path, "tiny-sd")


def test_a_query_made_before_placing_the_run_is_caught(tmp_path):
    """No placement, no device scope and an index-less peak reset: it resolves to GPU 0, not the run's."""
    from diffmeter.runs import lifecycle
    from diffmeter.runs.placement import Placement

    def reset(device):
        torch.cuda.reset_peak_memory_stats()
        return False

    caught = r"reset_peak_memory_stats index-less, resolved to the current device cuda:0"
    with (
        mock.patch.object(Placement, "enter", lambda self: None),
        mock.patch.object(lifecycle, "device_scope", lambda device: contextlib.nullcontext()),
        mock.patch.object(lifecycle, "reset_peaks", reset),
        pytest.raises(FakeCudaViolation, match=caught),
    ):
        fake_bench(tmp_path, "tiny-sd")


def test_the_same_query_inside_the_run_is_on_its_own_gpu(tmp_path):
    """The control of the test above: once the run is placed an index-less reset is on cuda:1."""
    from diffmeter.runs import lifecycle

    def reset(device):
        torch.cuda.reset_peak_memory_stats()
        return False

    with mock.patch.object(lifecycle, "reset_peaks", reset):
        result, folder, cuda = fake_bench(tmp_path, "tiny-sd")
    assert result.status == "complete" and not cuda.violations
    assert ("reset_peak_memory_stats", 1) in {(call.name, call.device) for call in cuda.calls}


def test_the_fake_leaves_torch_as_it_found_it():
    """Index-less "cuda" follows set_device; a tensor made on another GPU is caught; afterwards CUDA is gone."""
    with FakeCuda(own="cuda:1"):
        assert torch.cuda.is_available() and torch.cuda.device_count() == 2
        torch.cuda.set_device(1)
        assert torch.ones(2, device="cuda").device == torch.device("cuda", 1)
        assert torch.nn.Linear(2, 2).to("cuda").weight.device == torch.device("cuda", 1)
        with pytest.raises(FakeCudaViolation, match="has a tensor on cuda:0"):
            torch.ones(2, device="cuda:0")
    assert not torch.cuda.is_available()
    with pytest.raises((RuntimeError, AssertionError), match="CUDA|cuda"):
        torch.ones(2, device="cuda")


@pytest.mark.parametrize("value", ["bnb:nf4", "bnb:int8", "torchao:int8wo", "quanto:int8", "fp8dq", "fp8dq-row"])
def test_a_backend_quantized_at_load_is_placed_on_its_own_gpu(tmp_path, value):
    """``--quantize BACKEND:TYPE`` on cuda:1 hands the quantizing loader the denoiser's config at the run's dtype,
    and the run stays on its own GPU. The backends' tensor subclasses cannot be faked (NOT_RUNNABLE), so the loader
    is a recorder here that loads the saved component back unquantized."""
    import diffmeter.quantized_loading as loading
    from diffmeter.quantization_spec import optimization_specs

    seen = {}

    def load_quantized(cls, folder, config, dtype):
        seen[folder.name] = (type(config).__module__.split(".")[0], config.to_dict(), dtype)
        return cls.from_pretrained(folder, torch_dtype=dtype)

    with mock.patch.object(loading, "load_quantized", load_quantized):
        result, folder, cuda = fake_bench(tmp_path, "tiny-flux", optimizations=optimization_specs([value]))
    assert_ran_on_its_own_gpu(result, folder, cuda)
    ((name, (library, config, dtype)),) = seen.items()
    assert name == "transformer" and library == "diffusers" and dtype == torch.bfloat16
    backend, _, kind = value.partition(":")
    if backend.startswith("fp8dq"):  # torchao's float8 activations and weights, scaled per tensor or per row
        made = config["quant_type"]["default"]
        granularity = {g["_type"] for g in made["_data"]["granularity"]}
        assert made["_type"] == "Float8DynamicActivationFloat8WeightConfig"
        assert granularity == {"PerRow" if backend == "fp8dq-row" else "PerTensor"}
        assert made["_data"]["activation_dtype"]["_data"] == made["_data"]["weight_dtype"]["_data"] == "float8_e4m3fn"
    if backend == "bnb":
        assert config["load_in_4bit"] == (kind != "int8") and config["load_in_8bit"] == (kind == "int8")
        assert kind == "int8" or (config["bnb_4bit_quant_type"], config["bnb_4bit_compute_dtype"]) == (kind, "bfloat16")
    LEDGER.append((f"{value} on tiny-flux", "placement covered with the quantizing loader recorded"))


def test_a_gguf_file_loads_on_its_own_gpu(tmp_path):
    """``--quantize gguf:Q8_0 --weights FILE`` on cuda:1 hands from_single_file the file with a compute dtype of the
    run's, and the run stays on its own GPU. GGUFParameter cannot be faked, so the single-file loader is a recorder
    here that loads the saved component back unquantized."""
    import diffusers
    from gguf_file import write_gguf

    import diffmeter.quantized_loading as loading
    from diffmeter.catalog import resolve
    from diffmeter.quantization_spec import optimization_specs
    from diffmeter.tiny import tiny_pipeline

    file = tmp_path / "tiny-flux-Q8_0.gguf"
    write_gguf(tiny_pipeline(resolve("tiny-flux")).transformer, file)
    seen = {}

    def from_single_file(name, single, root, dtype):
        seen[name] = (single.path, single.config.compute_dtype, dtype)
        return diffusers.FluxTransformer2DModel.from_pretrained(root / name, torch_dtype=dtype)

    specs = optimization_specs(["gguf:Q8_0"], str(file))
    with mock.patch.object(loading, "from_single_file", from_single_file):
        result, folder, cuda = fake_bench(tmp_path / "runs", "tiny-flux", optimizations=specs)
    assert_ran_on_its_own_gpu(result, folder, cuda)
    assert seen == {"transformer": (file, torch.bfloat16, torch.bfloat16)}
    LEDGER.append(("gguf:Q8_0 on tiny-flux", "placement covered with from_single_file recorded"))
