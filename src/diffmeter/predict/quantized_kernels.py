"""The weight copies a quantized layer holds while it runs, per device: whether its backend multiplies the stored
weight in a kernel of its own or dequantizes it first, and what that dequantization allocates. optimum-quanto 0.2.7
(installed; paths under site-packages/optimum/quanto) chooses its kernel when a weight is built on, or moved to, its
device (``WeightQBitsTensor.create``, ``WeightQBytesTensor.create``), so the choice is the device's and the dtype's.

A CPU's elementwise operators promote an input of another dtype into a temporary of the common one first (torch
aten/src/ATen/TensorIterator.cpp, ``TensorIteratorBase::compute_types``: "Creates temporaries for CPU operations"
under ``common_device == kCPU``); a GPU's cast it inside the kernel. So ``scale * int8_data`` holds two copies of the
weight at the scale's dtype on a CPU and one on a GPU."""

from __future__ import annotations

import math

import torch

from diffmeter.predict.kernel_kinds import CPU, OTHER_GPU, SM80
from diffmeter.predict.quantized_layouts import quanto_group


def of_device(device: torch.device) -> str:
    """The kernels a real device gets, asked as quanto asks it (tensor/weights/qbits.py:104-105, :112-116)."""
    if device.type == "cpu":
        return CPU
    if device.type != "cuda" or not torch.version.cuda:
        return OTHER_GPU
    cuda = tuple(int(part) for part in torch.version.cuda.split(".")[:2])
    return SM80 if cuda >= (12, 1) and torch.cuda.get_device_capability(device)[0] >= 8 else OTHER_GPU


def quanto_in_flight(kind: str, shape: torch.Size, dtype: torch.dtype, kernels: str) -> int:
    """Bytes a quanto layer of weight ``shape`` (built at ``dtype``, its scales') allocates for its weight while it
    runs on ``kernels``, beyond its output; 0 where a kernel multiplies the stored weight.

    int4 (tensor/weights/qbits.py:97-123): a 2-D weight in groups of 128 takes tinygemm's layout at bfloat16 on a CPU
    or an sm_80 GPU (:111-121; ``_weight_int4pack_mm``/``_for_cpu``, tinygemm/qbits.py:51-58) and AWQ's at float16
    with 128 rows or more on an sm_80 GPU (:97-110; the CUDA extension is registered on Linux with CUDA,
    library/extensions/__init__.py); any other is dequantized (tensor/qbits.py:27-49): unpacked to a byte per weight,
    then ``scale * data`` at the scale's dtype, the shift taken off in place.
    int8: ``quanto::qbytes_mm`` (library/qbytes_mm.py): on a CPU, bfloat16 activations and rows a multiple of 4 take
    ``_weight_int8pack_mm`` (:91-105); otherwise ``output_scales * weights`` (:25-33; on a GPU too, :73-88: its
    activations are not int8).
    float8: an sm_80 GPU takes Marlin's fp8 GEMM for a 2-D float16 or bfloat16 weight of 64 or more rows and columns,
    one dimension a multiple of 64 and the other of 128 (tensor/weights/qbytes.py:122-141, marlin/fp8/qbits.py:37-46);
    otherwise ``weights.to(dtype)`` and then ``output_scales * weights`` (qbytes_mm.py:26-32): two copies.
    A convolution's weight (4-D) is dequantized through quanto's fallback (tensor/qtensor.py:21-29 ``qfallback``)
    the same ways (tensor/qbits.py:27-49, tensor/qbytes.py:23-31)."""
    out_features, in_features = shape[0], math.prod(shape[1:])
    weights = out_features * in_features
    copy = weights * dtype.itemsize
    promoted = 2 if kernels == CPU else 1  # the integer data promoted first on a CPU (module docstring)
    linear = len(shape) == 2
    if kind == "int4":
        grouped = linear and quanto_group(in_features) == 128
        if grouped and dtype == torch.bfloat16 and kernels in (CPU, SM80):
            return 0
        if grouped and dtype == torch.float16 and kernels == SM80 and out_features >= 128:
            return 0
        return weights + promoted * copy
    if kind == "int8":
        if kernels == CPU and linear and dtype == torch.bfloat16 and in_features % 4 == 0:
            return 0
        return promoted * copy
    if kind == "float8":
        if kernels == SM80 and linear and dtype in (torch.float16, torch.bfloat16) and marlin_fp8(*shape):
            return 0
        return 2 * copy
    raise ValueError(f"quanto:{kind}: no kernel known")


def torchao_in_flight(kind: str, weights: int, dtype: torch.dtype) -> int:
    """Bytes a torchao 0.18 weight-only layer of ``weights`` weights allocates for its weight while it runs eagerly
    at ``dtype``, on any device (explicit casts, no promotion; paths under site-packages/torchao/quantization):
    int8wo (per row, quant_api.py:749) casts the int8 weight to the activations' dtype for ``torch.mm``
    (quantize_/workflows/int8/int8_tensor.py:347-353); float8wo dequantizes (float8/float8_tensor.py:465) through
    float32, the data cast and then scaled, both alive when the product is cast to the activations' dtype
    (quant_primitives.py:2368-2374); int4wo (mslk's ``bf16i4bf16_rowwise``) and the float8 dynamic-activation types
    multiply the stored weight."""
    if kind == "int8wo":
        return weights * dtype.itemsize
    if kind == "float8wo":
        return weights * (2 * 4 + (dtype.itemsize if dtype != torch.float32 else 0))
    return 0


def marlin_fp8(out_features: int, in_features: int) -> bool:
    """Whether Marlin's fp8 GEMM takes a weight of this shape (tensor/weights/qbytes.py:132-141)."""
    return (
        in_features >= 64
        and out_features >= 64
        and ((in_features % 64 == 0 and out_features % 128 == 0) or (in_features % 128 == 0 and out_features % 64 == 0))
    )


def quanto_outputs(kind: str, shape: torch.Size, dtype: torch.dtype, kernels: str, bias: bool) -> int:
    """Output-sized tensors a quanto layer holds at once: 2 for a linear layer with a bias, which each of quanto's
    linear functions adds out of place after its matmul (``output = output + bias``: tensor/function.py:44-46,
    tensor/weights/qbytes.py:80-81, tinygemm/qbits.py:60-61, awq/qbits.py:68-69, marlin/int4/qbits.py:67-68), but
    Marlin's fp8 one, which adds none (marlin/fp8/qbits.py:30-51); 1 for a convolution (``qfallback``'s
    ``F.conv2d`` with the bias)."""
    if len(shape) != 2 or not bias:
        return 1
    marlin = kind == "float8" and kernels == SM80 and dtype in (torch.float16, torch.bfloat16) and marlin_fp8(*shape)
    return 1 if marlin else 2


def torchao_outputs(kind: str, rows: int, dtype: torch.dtype, bias: bool) -> tuple[int, int]:
    """Output-sized tensors a torchao weight-only layer of ``rows`` output rows holds at once, and the bytes beside
    them: int8wo scales its matmul's output out of place (``y = m * scale``, quantize_/workflows/int8/int8_tensor.py:
    351-353; the bias added in place, :356-357) with its float32 scales cast to the output's dtype beside them (:353);
    float8wo adds its bias out of place (``out + bias``, float8/float8_tensor.py:465-467); 1 otherwise (not read)."""
    if kind == "int8wo":
        return 2, rows * dtype.itemsize if dtype != torch.float32 else 0
    return (2 if kind == "float8wo" and bias else 1), 0
