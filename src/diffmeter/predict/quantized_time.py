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
from dataclasses import dataclass

import torch
from torch.utils._pytree import tree_leaves

from diffmeter.flops.kinds import kind_of
from diffmeter.predict.operators import NO_TRAFFIC_KEY, OperatorTally, moves_nothing, tensor_bytes

FP8 = "float8_e4m3fn"
#: bitsandbytes' stored NF4/FP4 code table (``quantized_layouts.bnb_bytes``), which ``dequantize_4bit`` does not read
BNB_CODE = 16 * 4


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
