"""The weight a quanto layer holds while it runs, per device (predict/quantized_kernels.py): on this CPU, what a real
quantized layer's forward allocates (torch.profiler's timeline, ``measure_stage_peaks``) is the prediction; on the
fake CUDA device, quanto's own choice of kernel (``WeightQBitsTensor.create``, ``WeightQBytesTensor.create``) is the
one predicted, and ``profile --gpu`` drops the dequantized copy of the layers tinygemm takes on an sm_80 GPU."""

from __future__ import annotations

import json
from unittest import mock

import pytest
import torch
from fake_cuda import FakeCuda, unavailable_reason

from diffmeter.predict.footprints import meta_module
from diffmeter.predict.kernel_kinds import CPU, OTHER_GPU, SM80, of_architecture
from diffmeter.predict.quantized_kernels import of_device, quanto_in_flight, torchao_in_flight

SHAPES = [(384, 256), (384, 96), (112, 384), (128, 512)]  # groups of 128; rows of 96; 112 outputs; AWQ's 128


#: CPU matrix multiplications: a bfloat16 GEMM on a transposed weight may pack it into scratch it frees before it
#: returns, for some shapes (a 112 x 384 weight: a copy with its rows padded to 128); a kernel's scratch, set apart
#: as ``measure.memory_timeline`` sets convolution scratch apart, not a tensor quanto holds
GEMM_KERNELS = ("aten::mm", "aten::addmm", "aten::bmm")


def forward_peak(layer: torch.nn.Module, rows: int = 2) -> tuple[int, int]:
    """The most a forward of ``layer`` on ``rows`` inputs holds live in tensors (bytes, its weights not counted, a
    GEMM's own scratch set apart), and its output's bytes."""
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile
    from torch.profiler._memory_profiler import OpTree

    weight = layer[0].weight
    inputs = torch.randn(rows, weight.shape[1], dtype=weight.dtype)
    with torch.no_grad(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        layer(inputs)
    events = []
    for event in OpTree(prof.profiler.kineto_results).dfs():
        if event.typed[0] == _EventType.Allocation:
            gemm = event.parent is not None and event.parent.name in GEMM_KERNELS
            events.append((event.start_time_ns, event.typed[1].alloc_size, event.typed[1].ptr, gemm))
    events.sort(key=lambda item: item[0])
    opened, scratch = {}, set()  # an allocation and its own free, both inside a GEMM (an address is reused later)
    for index, (_, size, ptr, gemm) in enumerate(events):
        if size > 0:
            opened[ptr] = (index, gemm)
        elif ptr in opened:
            start, made_in_gemm = opened.pop(ptr)
            if made_in_gemm and gemm:
                scratch.update((start, index))
    live = peak = 0
    for index, (_, size, _, _) in enumerate(events):
        live += 0 if index in scratch else size
        peak = max(peak, live)
    return peak, rows * weight.shape[0] * weight.dtype.itemsize


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kind", ["int4", "int8", "float8"])
@pytest.mark.parametrize("shape", SHAPES)
def test_a_quanto_layer_on_this_cpu_allocates_what_is_predicted(kind, shape, dtype):
    """A frozen quanto layer runs on this CPU for real: where the prediction says it dequantizes, its forward's peak is
    exactly the bytes predicted (the weight's copies and the unpacked int4 bytes outweigh a two-row output); where it
    says a kernel multiplies the stored weight (tinygemm at bfloat16, ``_weight_int8pack_mm``), nothing the size of
    the weight is allocated: the output and its bias added are all."""
    from optimum.quanto import freeze, qfloat8, qint4, qint8, quantize

    torch.manual_seed(0)
    layer = torch.nn.Sequential(torch.nn.Linear(shape[1], shape[0], dtype=dtype))
    quantize(layer, weights={"int4": qint4, "int8": qint8, "float8": qfloat8}[kind])
    freeze(layer)
    predicted = quanto_in_flight(kind, torch.Size(shape), dtype, CPU)
    peak, output = forward_peak(layer)
    if predicted:
        assert peak == predicted
    else:
        assert peak <= 2 * output < shape[0] * shape[1] * dtype.itemsize
    # the rule is quanto's: the weight it built is the kernel's type exactly where none is predicted in flight
    kernel = type(layer[0].weight).__name__ in ("TinyGemmWeightQBitsTensor",)
    assert kernel == (kind == "int4" and predicted == 0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kind", ["int8wo", "float8wo"])
@pytest.mark.parametrize("shape", SHAPES[:3])
def test_a_torchao_weight_only_layer_allocates_what_is_predicted(kind, shape, dtype):
    """torchao's weight-only layers run eagerly on this CPU as on a GPU (explicit casts): int8's weight cast to the
    activations' dtype lives through the matmul, beside its output; float8's float32 copies peak before it."""
    from torchao.quantization import Float8WeightOnlyConfig, Int8WeightOnlyConfig, quantize_

    layer = torch.nn.Sequential(torch.nn.Linear(shape[1], shape[0], dtype=dtype))
    quantize_(layer, {"int8wo": Int8WeightOnlyConfig, "float8wo": Float8WeightOnlyConfig}[kind]())
    peak, output = forward_peak(layer)
    predicted = torchao_in_flight(kind, shape[0] * shape[1], dtype)
    assert predicted > 0 and peak == predicted + (output if kind == "int8wo" else 0)


CASES = [
    (kind, shape, dtype, capability, cuda)
    for kind in ("int4", "float8")
    for shape in [*SHAPES, (64, 64), (192, 64)]
    for dtype in (torch.float16, torch.bfloat16)
    for capability, cuda in (((9, 0), "12.4"), ((8, 0), "12.1"), ((7, 5), "12.4"), ((9, 0), None))
]


@pytest.mark.fake_cuda
@pytest.mark.skipif(unavailable_reason() is not None, reason=unavailable_reason() or "")
@pytest.mark.parametrize(("kind", "shape", "dtype", "capability", "cuda"), CASES)
def test_quantos_own_kernel_choice_on_a_gpu_is_the_predicted_one(kind, shape, dtype, capability, cuda):
    """quanto picks a weight's kernel in ``create`` when the weight reaches its device; called on the fake CUDA device
    (its capability set) with the CUDA version ``torch.version.cuda`` would give and quanto's CUDA extension
    registered (a CPU build has neither: both mocked, and the kernels' classes, whose packing needs CUDA, replaced by
    recorders), the class it builds is a kernel's exactly where the prediction holds no weight in flight; int8 has no
    CUDA kernel for weights alone (library/qbytes_mm.py:73-88)."""
    from optimum.quanto import qfloat8, qint4
    from optimum.quanto.tensor.weights import awq, marlin, qbits, qbytes, tinygemm

    create = {"int4": qbits.WeightQBitsTensor.create, "float8": qbytes.WeightQBytesTensor.create}[kind]
    chosen = []

    def recorder(name):
        return lambda *args, **kwargs: chosen.append(name)

    with (
        FakeCuda(own="cuda:1", capability=capability),
        mock.patch.object(torch.version, "cuda", cuda),
        mock.patch.object(qbits, "is_extension_available", lambda name: True),
        mock.patch.object(qbytes, "is_extension_available", lambda name: True),
        mock.patch.object(tinygemm, "TinyGemmWeightQBitsTensor", recorder("tinygemm")),
        mock.patch.object(awq, "AWQWeightQBitsTensor", recorder("awq")),
        mock.patch.object(marlin, "MarlinF8QBytesTensor", recorder("marlin")),
        mock.patch.object(qbits, "WeightQBitsTensor", recorder("dequantized")),
        mock.patch.object(qbytes, "WeightQBytesTensor", recorder("dequantized")),
    ):
        device = torch.device("cuda", 1)
        rows, columns = shape
        data = torch.zeros(rows, columns, dtype=torch.uint8, device=device)
        scale = torch.ones(rows, 1, dtype=dtype, device=device)
        kernels = of_device(device)
        if kind == "int4":
            group = 128 if columns > 128 and columns % 128 == 0 else None  # as the layer groups it (qmodule.py:120-129)
            create(qint4, 0, group, torch.Size(shape), (columns, 1), data, scale, scale)
        else:
            create(qfloat8, 0, torch.Size(shape), (columns, 1), data, scale)
    assert chosen and (chosen[-1] != "dequantized") == (quanto_in_flight(kind, torch.Size(shape), dtype, kernels) == 0)


def test_the_tables_architectures_name_their_kernels():
    assert of_architecture("hopper") == of_architecture("ampere") == of_architecture(None) == SM80
    assert of_architecture("turing") == of_architecture("volta") == of_architecture("cdna3") == OTHER_GPU


def test_profile_drops_the_copy_tinygemm_does_not_make_on_an_sm80_gpu(cli):
    """tiny-flux at bfloat16, quanto int4: its timestep and guidance embedders' first linear layers (256 inputs, groups
    of 128) run on tinygemm on an H100, so the largest weight in flight is the largest other layer's, dequantized
    without the CPU's promoted copy; on a T4 (sm_75) they are dequantized too."""
    found = {}
    for gpu in ("h100", "t4"):
        code, out, err = cli(
            "profile", "tiny-flux", "--gpu", gpu, "--dtype", "bfloat16", "--quantize", "quanto:int4", "--json"
        )
        assert code == 0, err
        found[gpu] = json.loads(out)["memory"]["dequantized_bytes"]["quantize-quanto-int4"]["transformer"]
    from diffmeter.catalog import resolve

    module = meta_module(resolve("tiny-flux").components["transformer"], torch.bfloat16)
    shapes = [m.weight.shape for m in module.modules() if isinstance(m, torch.nn.Linear)]
    eligible = [s for s in shapes if s[1] == 256]
    assert eligible and found["t4"] == max(s.numel() * 3 for s in shapes)  # a byte unpacked, two at bfloat16
    assert found["h100"] == max(s.numel() * 3 for s in shapes if s[1] != 256) < found["t4"]


def fake_levels(layer: torch.nn.Module, rows: int) -> dict:
    """``layer_levels.LayerLevels`` of ``layer`` (its meta copy on fake tensors) on ``rows`` inputs: its input held
    outside, as ``forward_peak`` holds it."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from diffmeter.predict.layer_levels import LayerLevels
    from diffmeter.predict.memory import PeakTracker, fake_copy

    module = fake_copy(layer.to("meta"))
    with FakeTensorMode(allow_non_fake_inputs=True), torch.no_grad():
        inputs = torch.empty(rows, module[0].weight.shape[1], dtype=module[0].weight.dtype)
        tracker = PeakTracker()
        tracker.track_external(module, inputs)
        levels = LayerLevels(tracker)
        unhook = levels.hooked(module)
        with tracker:
            module(inputs)
        unhook()
    return levels.levels


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    ("backend", "kind"), [("quanto", "int8"), ("quanto", "int4"), ("quanto", "float8"), ("torchao", "int8wo")]
)
@pytest.mark.parametrize("rows", [2, 512])  # the weight's copies outweigh the output; the output outweighs them
@pytest.mark.parametrize("bias", [True, False])
def test_a_quantized_layer_peaks_where_its_copies_and_outputs_say(backend, kind, rows, bias, dtype):
    """A real quantized layer on this CPU peaks at what ``layer_levels.in_flight_peak`` adds to its plain layer's
    levels on fake tensors: its weight's copies before the matmul, the dequantized weight beside the output, or two
    outputs where the bias (quanto) or the scales (torchao int8wo) are applied out of place; with a long input the
    outputs, not the weight, set the peak."""
    from diffmeter.predict.in_flight import in_flight_peak
    from diffmeter.predict.quantized_formats import footprint

    torch.manual_seed(0)
    layer = torch.nn.Sequential(torch.nn.Linear(384, 112, bias=bias, dtype=dtype))
    plain, _ = forward_peak(layer, rows)
    meta = torch.nn.Sequential(torch.nn.Linear(384, 112, bias=bias, dtype=dtype, device="meta"))
    copies = footprint(meta, backend, kind, dtype, after_loading=True, kernels=CPU)[2]
    if backend == "quanto":
        from optimum.quanto import freeze, qfloat8, qint4, qint8, quantize

        quantize(layer, weights={"int8": qint8, "int4": qint4, "float8": qfloat8}[kind])
        freeze(layer)
    else:
        from torchao.quantization import Int8WeightOnlyConfig, quantize_

        quantize_(layer, Int8WeightOnlyConfig())
    peak, _ = forward_peak(layer, rows)
    assert peak == in_flight_peak(fake_levels(meta, rows), copies, plain)


def test_a_quanto_convolution_holds_one_output_on_any_device():
    """quanto dequantizes a convolution's weight and calls ``F.conv2d`` with the bias (tensor/qtensor.py ``qfallback``):
    one output, on a GPU whose linear layers would take Marlin's fp8 GEMM too (its shape test is for 2-D weights)."""
    from diffmeter.predict.quantized_kernels import quanto_outputs

    for kernels in (CPU, SM80, OTHER_GPU):
        assert quanto_outputs("float8", torch.Size((128, 64, 3, 3)), torch.bfloat16, kernels, bias=True) == 1
    assert quanto_outputs("float8", torch.Size((128, 128)), torch.bfloat16, SM80, bias=True) == 1  # Marlin: no bias
    assert quanto_outputs("float8", torch.Size((128, 128)), torch.bfloat16, CPU, bias=True) == 2
