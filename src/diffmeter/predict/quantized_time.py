"""The time of a ``--quantize BACKEND:TYPE`` run: each quantized ``nn.Linear``'s matmul in the operator work
(``operators``) replaced by what the backend's forward runs on CUDA in eager mode, so the roofline and its calibrated
range (``roofline.predict_time``) time it like any other operator. Read in the installed sources (paths under
site-packages; T tokens, K in and N out features, s bytes per element of the compute dtype):

* GGUF: ``GGUFLinear.forward_native`` (diffusers/quantizers/gguf/utils.py:611-617; ``forward_cuda`` only with
  ``DIFFUSERS_GGUF_CUDA_KERNELS``, :34-39): the block dequantization in plain torch operators (:524-543 and the
  type's ``dequantize_blocks_*``), a cast to the compute dtype, then the layer's bf16 matmul. Its operators are
  counted here by running that code on fake tensors at the layer's shape (``gguf_dequantize_groups``), every
  dispatch the host issues counted (views too). Every type but Q8_0 and BF16 builds its shift table with
  ``torch.tensor([...], device=d.device)`` on each call (:259, :295, :309, :382, :434, ...): a host-to-device copy
  with ``non_blocking=False``, which PyTorch ends with ``cudaStreamSynchronize`` (aten/src/ATen/native/cuda/
  Copy.cu ``copy_kernel_cuda`` -> ``memcpy_and_sync``), so the GPU drains and then waits for the host to launch
  again: each such copy is charged one more operator's fixed cost (``SYNC``).

Passes over narrow or mixed-dtype elements (``DequantizeTally``): PyTorch's CUDA loops give each thread a fixed
number of output elements and issue one load per operand and one store per element (aten/src/ATen/native/cuda/
CUDALoops.cuh ``gpu_kernel_impl``; an operand of another dtype than the result takes the dynamic-casting loop,
``LoadWithCast``, whose broadcast operands are loaded per element through the offset calculator), so such a pass
takes as long per element as the same pass at the compute dtype: the calibrated fractions were fitted on passes
whose elements are the compute dtype's width. An ATen operator with an operand narrower than the compute dtype
(GGUF's uint8 codes, int8 and float8 weights) or a non-cast operator with an input of another dtype than its
output is charged at least the compute dtype's width per output element for each operand (a broadcast one too)
and the output, or its counted bytes where those are more (``narrow_bytes``). The bitwise and shift operators
run the same loops as mul and add (aten/src/ATen/native/cuda/BinaryBitwiseOpsKernels.cu, BinaryShiftOpsKernels.cu:
``gpu_kernel_with_scalars``) and are timed as elementwise (flops/kinds.py names them "other", the kind of copies,
by their words).
* bitsandbytes NF4/FP4: ``MatMul4Bit.forward`` (bitsandbytes/autograd/_functions.py:446-447): one
  ``dequantize_4bit`` kernel (reads the packed weight and its absmax, not the code table; writes s.K.N), then
  ``F.linear``.
* optimum-quanto int8/float8: ``qbytes_mm`` (optimum/quanto/library/qbytes_mm.py:25-33, the CUDA op's path for
  floating activations, :73-89): float8 cast to the compute dtype, the scales (one per output row) multiplied into
  the weight, a matmul; the bias added after it (tensor/weights/qbytes.py:78-81). The whole weight is dequantized
  to a compute-dtype copy on every call; nothing is fused.
* torchao int8 weight-only (torchao/quantization/quantize_/workflows/int8/int8_tensor.py:344-355): the int8 weight
  cast, a matmul, the output times the row scales, the bias added in place.
* torchao float8 weight-only (float8/float8_tensor.py:465): the weight dequantized through float32
  (cast, times the scale, cast back), a matmul, the bias added.
* torchao float8 dynamic activation, per tensor or per row (float8_tensor.py:350-353, :431-445;
  torchao/float8/inference.py:114-123): the activation quantized in eager operators (abs, amax, scale, a float32
  copy divided and clamped, cast to float8), then one ``_scaled_mm`` at the card's fp8 peak reading 1 byte per
  operand element.

Not modelled (their time is left out, as before): bitsandbytes int8 (LLM.int8(): outlier decomposition by value),
torchao int4 and quanto int4 (packed int4 kernels whose eager speed the published runs show far off any bound), SDNQ.
"""

from __future__ import annotations

import functools
import json
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.utils._pytree import tree_leaves

from diffmeter.errors import DiffmeterError
from diffmeter.families import get_family
from diffmeter.flops.kinds import kind_of
from diffmeter.predict.operators import NO_TRAFFIC_KEY, OperatorTally, moves_nothing, tensor_bytes
from diffmeter.predict.schema import CallWork, OperatorGroup, OperatorWork
from diffmeter.quantization_spec import DENOISER

#: the types whose time is modelled, per backend
MODELLED = {
    "gguf": None,  # every block type (BF16 and F16 tensors are whole: no change)
    "bnb": ("nf4", "fp4"),
    "quanto": ("int8", "float8"),
    "torchao": ("int8wo", "float8wo", "float8dq-tensor", "float8dq-row"),
}
INT4 = (
    "its packed int4 kernels run far from any bound in eager mode: FLUX.1-dev on an H100, 109 s against 12 s in "
    "bfloat16 (benchmarks/published_quantized.yaml)"
)
#: why a type's time is not modelled
NOT_MODELLED = {
    "bnb": "LLM.int8() splits outlier columns by their values at run time",
    "torchao": INT4,
    "quanto": INT4,
    "sdnq": "no published quantized latency to check it on",
}
FP8 = "float8_e4m3fn"
#: bitsandbytes' stored NF4/FP4 code table (``quantized_layouts.bnb_bytes``), which ``dequantize_4bit`` does not read
BNB_CODE = 16 * 4

#: what the held-out test of these formats found, per format and for all (benchmarks/calibrate_quantized.py writes
#: it beside benchmarks/results/calibration_quantized.md): the claim printed beside a quantized time
HELD_OUT = Path(__file__).parent / "data" / "quantized_held_out.json"


def held_out_claim(names: list[str]) -> str:
    """The held-out figure of each quantized format in ``names`` ("gguf:Q4_K_S"): its own published eager runs'
    where there are any, else that there are none (benchmarks/calibrate_quantized.py leaves compiled runs out:
    torchao:float8dq-row's published runs are all compiled), with every eager quantized run's."""
    found = json.loads(HELD_OUT.read_text())

    def said(stats: dict) -> str:
        misses = stats["runs"] - stats["inside"]
        where = f"; the misses predicted too fast {stats['too_fast']}, too slow {misses - stats['too_fast']}"
        return (
            f"held out by source, {stats['inside']} of {stats['runs']} ({stats['inside'] / stats['runs']:.0%}) inside "
            f"such a range, midpoint median error {stats['median_error']:.1%}{where if misses else ''}"
        )

    formats, names = found["formats"], list(dict.fromkeys(names))  # one format on several components: said once
    claims = [f"{name}: its published runs {said(formats[name])}" for name in names if name in formats]
    if unpublished := [name for name in names if name not in formats]:  # said once for all of them
        which = "these formats" if len(unpublished) > 1 else "this format"
        claims.append(
            f"{', '.join(unpublished)}: no published eager run of {which} (the test takes eager runs only: no "
            f"compiled quantized run is held out); all {found['all']['runs']} published eager quantized runs: "
            f"{said(found['all'])}"
        )
    return "; ".join(claims) + " (benchmarks/results/calibration_quantized.md)"


def why_not_modelled(backend: str, kind: str) -> str | None:
    """Why the time of ``backend``:``kind`` is not modelled, or None where it is."""
    types = MODELLED.get(backend, ())
    if backend in MODELLED and (types is None or kind in types):
        return None
    return NOT_MODELLED.get(backend, "not modelled")


def needs_fp8(backend: str, kind: str) -> bool:
    """Whether the type runs its matmuls on FP8 tensor cores (CUDA, compute capability 8.9 and up)."""
    return backend == "torchao" and kind.startswith("float8dq")


@dataclass(frozen=True)
class Layer:
    """One quantized ``nn.Linear``: in and out features, a bias, its weight's stored bytes, its GGUF type."""

    k: int
    n: int
    bias: bool
    stored: int
    gguf: str | None = None


#: (kind, FLOPs, bytes, dtype) of one operator
Op = tuple[str, int, int, str | None]


def activation_quantize(elements: int, rows: int, s: int) -> list[Op]:
    """torchao's float8 activation quantization (``_choose_scale_float8``, ``_quantize_affine_float8``), its eager
    operators as they dispatch: abs, amax (one per ``rows``), the scale's cast and clamp, a float32 copy, divided by
    the scale, clamped, cast to float8 (its bytes, or two elements' at the compute width, ``narrow_bytes``)."""
    return [
        ("elementwise", 0, 2 * s * elements, None),  # abs
        ("other", 0, s * elements + s * rows, None),  # amax
        ("other", 0, (s + 4) * rows, None),  # the amax to float32
        ("elementwise", 0, 4 * rows, None),  # the scale
        ("other", 0, (s + 4) * elements, None),  # the activation to float32
        ("elementwise", 0, 8 * elements + 4 * rows, None),  # divided by its scale
        ("elementwise", 0, 8 * elements, None),  # clamped to float8's range
        ("other", 0, max(5, 2 * s) * elements, None),  # cast to float8
    ]


def layer_ops(backend: str, kind: str, layer: Layer, tokens: int, s: int) -> list[Op]:
    """The operators one call of the quantized ``layer`` runs on ``tokens`` rows, in place of its matmul."""
    k, n, t, b = layer.k, layer.n, tokens, int(layer.bias)
    flops = 2 * t * k * n
    plain: Op = ("matmul", flops, s * (t * k + k * n + t * n + b * n), None)
    unbiased: Op = ("matmul", flops, s * (t * k + k * n + t * n), None)
    add_bias = [("elementwise", 0, s * (2 * t * n + n), None)] * b  # an out-of-place bias add
    if backend == "gguf":
        return [*gguf_dequantize(layer.gguf, k, n, {2: "bfloat16", 4: "float32"}[s]).ops, plain]
    if backend == "bnb":
        # the stored 16-value float32 code is not read: the kernel decodes NF4/FP4 with its own table
        return [("other", 0, layer.stored - BNB_CODE + s * k * n, None), plain]
    if backend == "quanto":
        # float8 cast to the compute dtype (a one-byte operand: per element, at the compute width); int8 multiplied
        # by the scales as it is (mixed dtypes: each output element loads a scale, a weight and stores one)
        cast = [("other", 0, 2 * s * k * n, None)] if kind == "float8" else []
        scaled = ("elementwise", 0, s * n + 2 * s * k * n if kind == "float8" else 3 * s * k * n, None)
        return [*cast, scaled, unbiased, *add_bias]
    if kind == "int8wo":
        cast = ("other", 0, 2 * s * k * n, None)  # int8 to the compute dtype, per element at its width
        scales = [("other", 0, 4 * n + s * n, None), ("elementwise", 0, s * (2 * t * n + n), None)]
        return [cast, unbiased, *scales, *[("elementwise", 0, s * (t * n + n), None)] * b]
    if kind == "float8wo":
        cast = ("other", 0, max(5, 2 * s) * k * n, None)  # float8 to float32: its bytes, or 2 elements' at the width
        dequantize = [cast, ("elementwise", 0, 8 * k * n + 4 * n, None)]
        return [*dequantize, ("other", 0, (4 + s) * k * n, None), unbiased, *add_bias]
    if kind.startswith("float8dq"):
        rows = t if kind == "float8dq-row" else 1
        scales = 4 * (rows + (n if kind == "float8dq-row" else 1))
        scaled_mm = ("matmul", flops, t * k + k * n + s * t * n + b * s * n + scales, FP8)
        return [*activation_quantize(t * k, rows, s), scaled_mm]
    raise ValueError(f"{backend}:{kind}: its time is not modelled")


#: a synchronizing host-to-device copy and the GPU idle after it until the host launches again: one operator's fixed
#: cost
SYNC: Op = ("other", 0, 0, None)
#: ATen operators PyTorch runs with mul's and add's loops, which flops/kinds.py names "other" by their words
BITWISE = ("bitwise_", "rshift", "lshift")


def narrow_bytes(func, inputs: list, out, s: int) -> int | None:
    """The bytes an ATen pass over narrow or mixed-dtype elements is charged (module docstring): at least ``s``
    bytes per output element for each tensor operand (a broadcast one loaded per element too) and the output, or
    its counted bytes where those are more (a float32 output); None for any other operator (its counted bytes
    stand)."""
    if func.namespace != "aten" or not isinstance(out, torch.Tensor):
        return None
    tensors = [t for t in inputs if isinstance(t, torch.Tensor) and t.dim() and t.device == out.device]
    cast = func._schema.name in ("aten::_to_copy", "aten::copy_")
    narrow = any(t.element_size() < s for t in (*tensors, out))
    if not tensors or not (narrow or (not cast and any(t.dtype != out.dtype for t in tensors))):
        return None
    counted = sum(tensor_bytes(t) for t in {id(t): t for t in (*tensors, out)}.values())
    return max(counted, s * (len(tensors) + 1) * out.numel())


class DequantizeTally(OperatorTally):
    """``OperatorTally`` for a backend's own operators: passes over narrow or mixed-dtype elements charged per
    element (``narrow_bytes``), the bitwise ones timed as elementwise, and the tensors built from host data counted
    (``syncs``): ``torch.tensor(data, device=...)`` builds on the host and copies with ``non_blocking=False``
    (torch/csrc/utils/tensor_new.cpp ``internal_new_from_data``), ``lift_fresh`` marking each."""

    def __init__(self, dtype: torch.dtype) -> None:
        super().__init__(dtype)
        self.syncs = 0

    def record(self, func, args, kwargs: dict, out) -> None:
        if func._schema.name == "aten::lift_fresh":  # a tensor built from host data: on a GPU, copied there
            self.syncs += 1
            self.groups[NO_TRAFFIC_KEY] += 1  # the copy, dispatched by the host, timed as ``SYNC``
        inputs = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        charged = None if moves_nothing(func, out) else narrow_bytes(func, inputs, out, self.dtype.itemsize)
        if charged is None:
            return super().record(func, args, kwargs, out)
        name = func._schema.name.removeprefix("aten::").strip("_")
        kind = "elementwise" if name.startswith(BITWISE) else kind_of(func._schema.name)
        self.groups[(kind, 0, charged, 0, None)] += 1
        self.chain_step(False, inputs, out)  # a pointwise operator: fusible


@dataclass(frozen=True)
class Dequantized:
    """One call's GGUF dequantization: its operators (``SYNC`` per synchronizing copy), the operators the host
    dispatches (views too), its synchronizing copies, and the bytes it moves fused into one kernel (``fused``)."""

    ops: tuple[Op, ...]
    dispatched: int
    syncs: int
    fused: int = 0


@functools.lru_cache(maxsize=256)
def gguf_dequantize(kind: str, k: int, n: int, dtype: str) -> Dequantized:
    """What diffusers' GGUF dequantization of a ``kind`` weight of n x k and its cast to the compute ``dtype`` run
    (gguf/utils.py:524-543, :612-613), counted by running them on fake tensors (a float16 run moves the bytes a
    bfloat16 one does)."""
    import gguf
    from diffusers.quantizers.gguf.utils import dequantize_functions
    from torch._subclasses.fake_tensor import FakeTensorMode

    quant = gguf.GGMLQuantizationType[kind]
    block, size = gguf.GGML_QUANT_SIZES[quant]
    compute = getattr(torch, dtype)
    with FakeTensorMode():
        stored = torch.empty((n, k // block * size), dtype=torch.uint8)
        with DequantizeTally(compute) as tally:  # dequantize_gguf_tensor's views (:535-538), then the type's blocks
            blocks = stored.view(torch.uint8).reshape((n * k // block, size))
            # alive as the call ends, the weight is written once (for the matmul), its intermediates never
            weight = dequantize_functions[quant](blocks, block, size).reshape(n, k).to(compute)
    ops = tuple((g.kind, g.flops, g.bytes, g.dtype) for g in tally.operators() for _ in range(g.calls))
    del weight
    counted = tally.host_counts()
    return Dequantized((*ops, *[SYNC] * tally.syncs), counted["dispatched"], tally.syncs, counted["fused_bytes"])


def quantized_layers(module: torch.nn.Module, backend: str, kind: str, dtype: torch.dtype) -> dict[tuple, list]:
    """Per (in, out features, bias) of ``module``'s ``nn.Linear`` layers: a ``Layer`` per quantized one, None per
    one the backend leaves whole (``quantized_formats.stored_tensors``)."""
    from diffmeter.predict.quantized_formats import gguf_file_types, stored_tensors

    stored = {t.name: t for t in stored_tensors(module, backend, kind, dtype)}
    types = gguf_file_types(module, kind) if backend == "gguf" else {}
    found = defaultdict(list)
    for name, linear in module.named_modules():
        if not isinstance(linear, torch.nn.Linear):
            continue
        weight = stored.get(f"{name}.weight" if name else "weight")
        key = (linear.in_features, linear.out_features, linear.bias is not None)
        if weight is None or not weight.quantized:
            found[key].append(None)
            continue
        found[key].append(Layer(*key, weight.bytes, types.get(weight.name)))
    return dict(found)


def added_dispatches(backend: str, layer: Layer, ops: list[Op], s: int) -> int:
    """The operators the host dispatches per call of ``layer`` beyond the matmul it replaces: GGUF's as counted
    (views, the shift tables' copies), the other backends' one per operator."""
    if backend == "gguf":
        return gguf_dequantize(layer.gguf, layer.k, layer.n, {2: "bfloat16", 4: "float32"}[s]).dispatched
    return len(ops) - 1


def fused_dequantize(backend: str, kind: str, layer: Layer, ops: list[Op], s: int) -> tuple[int, int]:
    """(bytes, kernels) one call of ``layer`` adds to its compiled call's fused chains (``CallWork.fused_bytes``,
    ``fused_chains``; inductor on this CPU, tiny linears, graph.count_bytes, 2026-11-30): GGUF's dequantization and
    torchao's float8 weight's fuse into one kernel reading the stored weight once and writing it dequantized once for
    the matmul (measured: float8 exactly; GGUF Q8_0 4% more, its scales copied in a kernel of their own; Q4_K 29%
    more, cause not traced). On CUDA too outside max-autotune, whose Triton matmul templates alone take a prologue
    (torch 2.13 torch/_inductor/utils.py:2089, ``use_triton_template``): not modelled. bitsandbytes'
    ``dequantize_4bit`` and quanto's ``qbytes_mm`` are torch.library custom ops inductor does not enter: their passes
    as eager. Left as they are: torchao int8 weight-only, whose cast, matmul and scaling inductor rewrites into
    ``_weight_int8pack_mm`` reading the int8 weight (measured; its pattern admits CUDA: torch/_inductor/fx_passes/
    quantization.py:1152-1170), no dequantized copy, but its matmul still charged the compute-width weight; float8
    activation quantization (fusible passes over the activation, not measured); a bias added after the matmul, which
    the next chain reads (n elements)."""
    if backend == "gguf":
        return gguf_dequantize(layer.gguf, layer.k, layer.n, {2: "bfloat16", 4: "float32"}[s]).fused, 1
    if backend == "torchao" and kind == "float8wo":
        return layer.stored + s * layer.k * layer.n, 1
    if backend in ("bnb", "quanto"):
        before = ops[: [op[0] for op in ops].index("matmul")]
        return sum(op[2] for op in before), len(before)
    return 0, 0


def match(group: OperatorGroup, s: int, shapes) -> tuple[tuple, int] | None:
    """The (in, out, bias) of the linear layers a matmul ``group`` is, and their tokens, where its FLOPs and bytes
    are exactly such a layer's (2.T.K.N FLOPs; s.(T.K + K.N + T.N + bias N) bytes)."""
    if group.kind != "matmul" or group.scores:
        return None
    for key in shapes:
        k, n, bias = key
        tokens, rest = divmod(group.flops, 2 * k * n)
        if tokens and not rest and group.bytes == s * (tokens * k + k * n + tokens * n + bias * n):
            return key, tokens
    return None


def rewrite_call(call: CallWork, backend: str, kind: str, layers: dict[tuple, list], s: int) -> CallWork:
    """``call`` with each matmul group of quantized layers replaced by their operators (their share of the group's
    calls: the layers of that shape the backend quantizes, each type of a GGUF mix in proportion), its fused chains
    with what their dequantization adds compiled (``fused_dequantize``)."""
    operators, extra, fused, kernels = [], 0, 0, 0
    for group in call.operators:
        found = match(group, s, layers) if group.dtype is None else None
        if found is None:
            operators.append(group)
            continue
        key, tokens = found
        kinds = layers[key]
        shares = defaultdict(int)
        for layer in kinds:
            shares[layer] += 1
        left = group.calls
        for layer, count in shares.items():
            if layer is None:
                continue
            calls = round(group.calls * count / len(kinds))
            left -= calls
            ops = layer_ops(backend, kind, layer, tokens, s)
            for op_kind, flops, moved, dtype in ops:
                operators.append(OperatorGroup(kind=op_kind, flops=flops, bytes=moved, calls=calls, dtype=dtype))
            extra += calls * added_dispatches(backend, layer, ops, s)
            moved, made = fused_dequantize(backend, kind, layer, ops, s)
            fused, kernels = fused + calls * moved, kernels + calls * made
        if left:
            operators.append(group.model_copy(update={"calls": left}))
    update = {"operators": operators, "dispatched": call.dispatched + extra}
    if call.fused_bytes is not None and call.fused_chains is not None:
        update |= {"fused_bytes": call.fused_bytes + fused, "fused_chains": call.fused_chains + kernels}
    return call.model_copy(update=update)


def quantized_work(work: OperatorWork, spec, formats) -> OperatorWork:
    """``work`` (of ``spec``) with every modelled format's quantized linear layers as the backend runs them; a format
    whose time is not modelled raises (``why_not_modelled``)."""
    from diffmeter.predict.footprints import meta_module
    from diffmeter.predict.memory import DTYPES, settled_plan

    entry, settled, _ = settled_plan(spec)
    denoisers = [name for name in get_family(entry.family).denoisers(entry) if name in entry.components]
    calls = list(work.calls)
    for found in formats:
        why = why_not_modelled(found.backend, found.type)
        if why:
            raise DiffmeterError(f"--quantize {found.backend}:{found.type}: its time is not modelled ({why})")
        for name in [n for named in found.components for n in (denoisers if named == DENOISER else [named])]:
            dtype = DTYPES[settled.dtype_of(name)]
            layers = quantized_layers(meta_module(entry.components[name], dtype), found.backend, found.type, dtype)
            calls = [
                rewrite_call(call, found.backend, found.type, layers, dtype.itemsize)
                if call.component == name
                else call
                for call in calls
            ]
    return work.model_copy(update={"calls": calls})
