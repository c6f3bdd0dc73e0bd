"""The time of ``--quantize BACKEND:TYPE`` runs (predict/quantized_time.py): each backend's operators per quantized
linear layer held to the backend's real forward counted under torch's dispatch on CPU (the code its CUDA path runs:
GGUF's native dequantization, torchao's int8 and float8 weight-only linear, quanto's ``qbytes_mm``, bitsandbytes'
``dequantize_4bit`` then ``F.linear``, torchao's float8 activation quantization); the matmuls of a tiny pipeline's
quantized layers found and replaced; the held-out calibration leaking nothing; ``profile --json``'s fields."""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch

from diffmeter.predict.operators import OperatorTally, operator_work
from diffmeter.predict.quantized_memory import Format
from diffmeter.predict.quantized_time import Layer, activation_quantize, layer_ops, quantized_layers, quantized_work
from diffmeter.spec import ProfileSpec

K, N, T, DTYPE = 256, 512, 64, torch.bfloat16


def tallied(run) -> Counter:
    """(kind, FLOPs, bytes) -> calls of every operator ``run`` dispatches that moves data."""
    with torch.no_grad(), OperatorTally(DTYPE) as tally:
        run()
    return Counter({(g.kind, g.flops, g.bytes): g.calls for g in tally.operators()})


def modelled(backend: str, kind: str, layer: Layer) -> Counter:
    return Counter((op, flops, moved) for op, flops, moved, _ in layer_ops(backend, kind, layer, T, DTYPE.itemsize))


@pytest.fixture(scope="module")
def linear():
    torch.manual_seed(0)
    return torch.nn.Linear(K, N).to(DTYPE), torch.randn(1, T, K, dtype=DTYPE)


@pytest.mark.parametrize("kind", ["Q8_0", "Q4_K", "Q4_1", "Q2_K", "Q6_K", "Q5_0"])
def test_gguf_operators_are_its_native_forward(kind, linear):
    import gguf
    from diffusers.quantizers.gguf.utils import GGUFLinear, GGUFParameter

    quant = gguf.GGMLQuantizationType[kind]
    block, size = gguf.GGML_QUANT_SIZES[quant]
    layer = GGUFLinear(K, N, bias=True, compute_dtype=DTYPE)
    layer.weight = GGUFParameter(torch.randint(0, 255, (N, K // block * size), dtype=torch.uint8), quant_type=quant)
    layer.bias = torch.nn.Parameter(linear[0].bias.detach().clone())
    stored = N * K // block * size
    assert tallied(lambda: layer.forward_native(linear[1])) == modelled("gguf", kind, Layer(K, N, True, stored, kind))


@pytest.mark.parametrize("kind", ["int8wo", "float8wo"])
def test_torchao_weight_only_operators_are_its_linear(kind, linear):
    from torchao.quantization import Float8WeightOnlyConfig, Int8WeightOnlyConfig, quantize_

    model = torch.nn.Sequential(torch.nn.Linear(K, N).to(DTYPE))
    model[0].load_state_dict(linear[0].state_dict())
    quantize_(model, Int8WeightOnlyConfig() if kind == "int8wo" else Float8WeightOnlyConfig())
    assert tallied(lambda: model(linear[1])) == modelled("torchao", kind, Layer(K, N, True, K * N))


@pytest.mark.parametrize("kind", ["int8", "float8"])
def test_quanto_operators_are_its_qbytes_mm(kind, linear):
    """quanto's CUDA op runs the default ``qbytes_mm`` for floating activations (qbytes_mm.py:73-89); its CPU op takes
    other kernels, so the default is called here as CUDA calls it, then the bias (qbytes.py:78-81)."""
    from optimum.quanto import freeze, qfloat8, qint8, quantize
    from optimum.quanto.library.qbytes_mm import qbytes_mm

    model = torch.nn.Sequential(torch.nn.Linear(K, N).to(DTYPE))
    model[0].load_state_dict(linear[0].state_dict())
    quantize(model, weights=qint8 if kind == "int8" else qfloat8)
    freeze(model)
    weight, bias = model[0].weight, model[0].bias
    found = tallied(lambda: qbytes_mm(linear[1].reshape(-1, K), weight._data, weight._scale) + bias)
    assert found == modelled("quanto", kind, Layer(K, N, True, K * N))


def test_bitsandbytes_4bit_operators_are_its_dequantize_then_linear(linear):
    """MatMul4Bit.forward (autograd/_functions.py:446-447) on CPU tensors: the same two calls its CUDA path makes."""
    import bitsandbytes.functional as F

    from diffmeter.predict.quantized_layouts import bnb_bytes

    packed, state = F.quantize_4bit(linear[0].weight.detach().float(), quant_type="nf4")
    state.dtype = DTYPE
    bias = linear[0].bias
    found = tallied(lambda: torch.nn.functional.linear(linear[1], F.dequantize_4bit(packed, state).to(DTYPE), bias))
    assert found == modelled("bnb", "nf4", Layer(K, N, True, bnb_bytes("nf4", N, K)))


@pytest.mark.parametrize("granularity", ["tensor", "row"])
def test_float8_activation_quantization_is_torchaos(granularity, linear):
    from torchao.quantization.granularity import PerRow, PerTensor
    from torchao.quantization.quantize_.workflows.float8.float8_tensor import Float8Tensor

    chosen = PerRow() if granularity == "row" else PerTensor()
    found = tallied(lambda: Float8Tensor.from_hp(linear[1], torch.float8_e4m3fn, granularity=chosen))
    rows = T if granularity == "row" else 1
    assert found == Counter((k, f, b) for k, f, b, _ in activation_quantize(T * K, rows, DTYPE.itemsize))


def test_a_float8_matmul_runs_at_the_fp8_peak_on_one_byte_operands():
    ops = layer_ops("torchao", "float8dq-row", Layer(K, N, False, K * N), T, 2)
    matmul = [op for op in ops if op[0] == "matmul"]
    assert matmul == [("matmul", 2 * T * K * N, T * K + K * N + 2 * T * N + 4 * (T + N), "float8_e4m3fn")]


@pytest.fixture(scope="module")
def tiny_flux():
    spec = ProfileSpec(model="tiny-flux")
    return spec, operator_work(spec)


def test_every_quantized_layer_call_of_a_tiny_pipeline_is_replaced(tiny_flux):
    """int8 weight-only adds one cast of each quantized weight per call (K.N int8 read, 2.K.N bfloat16 written): the
    added bytes of that kind are exactly the quantized layers' of the transformer, times its calls."""
    from diffmeter.catalog import resolve
    from diffmeter.predict.footprints import meta_module

    spec, work = tiny_flux
    entry = resolve("tiny-flux")
    dtype = getattr(torch, work.dtype)
    layers = quantized_layers(meta_module(entry.components["transformer"], dtype), "torchao", "int8wo", dtype)
    quantized = [layer for found in layers.values() for layer in found if layer is not None]
    assert quantized
    calls = sum(call.count for call in work.calls if call.component == "transformer")
    changed = quantized_work(work, spec, [Format("torchao", "int8wo", ("transformer",))])

    def casts(found) -> int:
        s = dtype.itemsize
        return sum(
            g.calls * c.count for c in found.calls for g in c.operators if g.kind == "other" and g.bytes > 0
            and c.component == "transformer" and any(g.bytes == layer.k * layer.n * (1 + s) for layer in quantized)
        )  # fmt: skip

    assert casts(changed) - casts(work) == len(quantized) * calls
    flops = [sum(g.flops * g.calls * c.count for c in w.calls for g in c.operators) for w in (work, changed)]
    assert flops[0] == flops[1]  # weight-only: the same matmuls, in bfloat16


def test_the_held_out_source_is_never_in_the_fit():
    sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks"))
    from calibrate_quantized import held_out

    from diffmeter.predict.fit_published import PublishedRun

    def run(name, source):
        return PublishedRun(name, source, "hopper", "flux-dev", 1.0, {})

    class Recorded:
        def __init__(self, runs):
            self.sources, self.gpus = {r.source for r in runs}, {"hopper": object()}

        def midpoint(self, run, gpu):
            assert run.source not in self.sources, f"{run.source} predicted by a fit that holds it"
            return 1.0

        def range(self, run, gpu):
            return 0.9, 1.1

    eager = [run("a-bf16", "A"), run("b-bf16", "B"), run("c-bf16", "C")]
    found = held_out(eager, [("bnb:nf4", run("a-nf4", "A")), ("gguf:Q8_0", run("b-q8", "B"))], fitter=Recorded)
    assert [h.run.id for _, h in found] == ["a-nf4", "b-q8"]


def test_profile_times_a_modelled_format_and_leaves_out_the_others(cli):
    code, out, _ = cli("profile", "tiny-flux", "--gpu", "h100", "--json")
    plain = json.loads(out)
    code, out, _ = cli("profile", "tiny-flux", "--gpu", "h100", "--quantize", "torchao:int8wo", "--json")
    assert code == 0
    found = json.loads(out)
    assert found["time_left_out"] == [] and found["memory_techniques"] == ["quantize-torchao-int8wo"]
    operators = [sum(stage["operators"] for stage in p["time"]["stages"]) for p in (plain, found)]
    assert operators[1] > operators[0] and found["time"]["expected_s"][0] > plain["time"]["expected_s"][0]
    code, out, _ = cli("profile", "tiny-flux", "--gpu", "h100", "--quantize", "bnb:int8", "--json")
    assert code == 0 and json.loads(out)["time_left_out"] == ["quantize-bnb-int8"]


def test_a_float8_format_on_a_card_without_fp8_is_one_line(cli):
    code, out, err = cli("profile", "tiny-flux", "--gpu", "a100", "--quantize", "torchao:float8dq-row")
    assert code == 2 and "FP8 tensor cores" in err + out and "Traceback" not in err + out
