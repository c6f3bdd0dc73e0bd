"""The bytes of one ``nn.Linear`` weight (``out_features`` x ``in_features``) in each quantized format, read from the
installed backends (paths under site-packages); ``quantized_formats`` says which tensors take them. No backend is
imported: GGUF's block sizes are gguf 0.19's ``GGML_QUANT_SIZES`` (gguf/constants.py), copied and held to it by the
tests."""

from __future__ import annotations

import math

import torch

#: gguf/constants.py GGML_QUANT_SIZES: (weights per block, bytes per block)
GGUF_BLOCKS = {
    "Q4_0": (32, 18),
    "Q4_1": (32, 20),
    "Q5_0": (32, 22),
    "Q5_1": (32, 24),
    "Q8_0": (32, 34),
    "Q2_K": (256, 84),
    "Q3_K": (256, 110),
    "Q4_K": (256, 144),
    "Q5_K": (256, 176),
    "Q6_K": (256, 210),
    "BF16": (1, 2),
    "F16": (1, 2),  # a whole-F16 file (city96's F16 uploads): every weight at two bytes
}
#: stored as plain tensors (diffusers models/model_loading_utils.py:733-734)
GGUF_WHOLE = ("F32", "F16")
#: torchao 0.18 Int4WeightOnlyConfig.group_size (quantization/quant_api.py:548)
TORCHAO_INT4_GROUP = 128
#: bitsandbytes 0.50 Params4bit's default block (nn/modules.py:230-231) and the double quantization's second block
#: (functional.py quantize_4bit: ``quantize_blockwise(absmax, blocksize=256)``)
BNB_BLOCK, BNB_NESTED_BLOCK = 64, 256


def gguf_base(kind: str) -> str:
    """The tensor type a file named by ``kind`` holds most of (Q4_K for Q4_K_M or Q4_K_S)."""
    return kind.removesuffix("_S").removesuffix("_M")


def gguf_fits(in_features: int, kind: str) -> bool:
    """Whether rows of ``in_features`` split into whole blocks of ``kind`` (gguf.quants.quantize raises otherwise)."""
    return in_features % GGUF_BLOCKS[kind][0] == 0


def gguf_bytes(shape: torch.Size, kind: str) -> int:
    """A tensor stored as ``kind``: whole blocks along its last dimension (gguf/quants.py
    ``quant_shape_to_byte_shape``)."""
    block, size = GGUF_BLOCKS[kind]
    rows = math.prod(shape[:-1])
    return rows * (shape[-1] // block) * size


def torchao_bytes(kind: str, out_features: int, in_features: int, dtype: torch.dtype) -> int | None:
    """torchao 0.18's tensor for the type (None: its handler leaves the weight whole), under
    torchao/quantization/:

    * int8wo: ``Int8Tensor``, int8 data, a float32 scale and an int8 zero point per row
      (quantize_/workflows/int8/int8_tensor.py:199-220; PerRow by default, quant_api.py:749).
    * float8wo: ``Float8Tensor``, float8 data and a float32 scale per row (PerRow by default, quant_api.py:1083-1084;
      the scale made float32 at quant_primitives.py:2282).
    * float8dq-tensor / -row: the same data with one float32 scale, or one per row; a weight whose dimensions are not
      multiples of 16 stays whole (quant_api.py:1232-1235, utils.py:784-785); per row needs bfloat16 weights
      (quant_api.py:1240-1242).
    * int4wo: ``Int4Tensor``, two weights per byte and a scale and a zero point per group of 128 at the weight's
      dtype (quantize_/workflows/int4/int4_tensor.py:169-173); rows that do not split into groups stay whole
      (quant_api.py:575-578).
    """
    weights = out_features * in_features
    if kind == "int8wo":
        return weights + out_features * (4 + 1)
    if kind in ("float8wo", "float8dq-row"):
        if kind == "float8dq-row" and not _fp8_mm_compatible(out_features, in_features):
            return None
        return weights + out_features * 4
    if kind == "float8dq-tensor":
        return weights + 4 if _fp8_mm_compatible(out_features, in_features) else None
    if kind == "int4wo":
        if in_features % TORCHAO_INT4_GROUP:
            return None
        return weights // 2 + 2 * (weights // TORCHAO_INT4_GROUP) * dtype.itemsize
    raise ValueError(f"torchao:{kind}: no layout")


def _fp8_mm_compatible(out_features: int, in_features: int) -> bool:
    return out_features % 16 == 0 and in_features % 16 == 0


def quanto_group(in_features: int) -> int | None:
    """optimum-quanto's int4 group (nn/qmodule.py:122-129): 128, less 32 at a time while it does not divide the row,
    down to 32; None (one scale per row) for rows of 128 or fewer, or when none divides."""
    group = 128
    if in_features <= group:
        return None
    while in_features % group != 0 and group > 32:
        group -= 32
    return group if in_features % group == 0 else None


def quanto_bytes(kind: str, out_features: int, in_features: int, dtype: torch.dtype) -> int:
    """optimum-quanto 0.2.7's frozen weight, under optimum/quanto/: int8 and float8 ``WeightQBytesTensor``, a byte
    per weight and a scale per row at the weight's dtype (tensor/weights/qbytes.py, AbsmaxOptimizer on axis 0); int4
    ``WeightQBitsTensor``, the weights grouped into rows of the group (tensor/grouped.py:17-36) packed two per byte
    along them (tensor/packed.py:45-47, rounded up), with a scale and a shift per group at the weight's dtype
    (MaxOptimizer, tensor/optimizers/max_optimizer.py:35-37); bfloat16 groups of 128 take tinygemm's layout
    (tensor/weights/qbits.py:111-121), the same bytes without the rounding."""
    weights = out_features * in_features
    if kind in ("int8", "float8"):
        return weights + out_features * dtype.itemsize
    if kind != "int4":
        raise ValueError(f"quanto:{kind}: no layout")
    group = quanto_group(in_features)
    rows, columns = (out_features, in_features) if group is None else (weights // group, group)
    packed = (rows + 1) // 2 * columns
    if group == 128 and dtype == torch.bfloat16:
        packed = weights // 2
    return packed + 2 * rows * dtype.itemsize


def bnb_bytes(kind: str, out_features: int, in_features: int, double_quant: bool = False) -> int:
    """bitsandbytes 0.50's weight, under bitsandbytes/: LLM.int8(), int8 data and a float32 ``SCB`` per row
    (nn/modules.py ``Int8Params``); NF4 and FP4, two weights per byte (rounded up) and a float32 absmax per block of 64
    with its own 16-value float32 code (functional.py ``quantize_4bit``, ``get_4bit_type``), or with the double
    quantization: the absmax as a byte per block, a float32 absmax per 256 of those, and a float32 offset
    (diffusers' BitsAndBytesConfig leaves it off: quantizers/quantization_config.py:237)."""
    weights = out_features * in_features
    if kind == "int8":
        return weights + out_features * 4
    if kind not in ("nf4", "fp4"):
        raise ValueError(f"bnb:{kind}: no layout")
    blocks = -(-weights // BNB_BLOCK)
    absmax = blocks + -(-blocks // BNB_NESTED_BLOCK) * 4 + 4 if double_quant else blocks * 4
    return -(-weights // 2) + absmax + 16 * 4


def shared_bytes(backend: str, kind: str, double_quant: bool = False) -> int:
    """What every quantized tensor of the format shares once per device: the double quantization's 256-value float32
    map (bitsandbytes functional.py:655-656, cached in ``name2qmap``)."""
    return 256 * 4 if backend == "bnb" and kind != "int8" and double_quant else 0


#: diffusers 0.42.1 quantizers/bfl/utils.py:187 (``NVFP4_BLOCK``) and Nunchaku Lite's SVDQ groups, fixed per precision
#: (quantization_config.py ``NunchakuLiteQuantizationConfig.post_init``: 16 for nvfp4, 64 for int4; AWQ's 64)
NVFP4_BLOCK, SVDQ_INT4_GROUP, AWQ_GROUP = 16, 64, 64


def bfl_bytes(kind: str, out_features: int, in_features: int) -> int:
    """A BFL linear layer's weight and scales (diffusers 0.42.1 quantizers/bfl/utils.py; its bias is kept apart):

    * fp8: ``BFLFP8RLinear``, a float8_e4m3fn weight (a byte each) and a float32 ``weight_scale`` per row
      (utils.py:321-324).
    * nvfp4: ``BFLNVFP4Linear``, two E2M1 weights per uint8 byte, a float8_e4m3fn ``weight_scale`` per block of 16
      along each row, and float32 scalars ``weight_scale_2`` and ``input_scale`` (utils.py:359-367).
    """
    weights = out_features * in_features
    if kind == "fp8":
        return weights + out_features * 4
    if kind == "nvfp4":
        return weights // 2 + weights // NVFP4_BLOCK + 4 + 4
    raise ValueError(f"bfl:{kind}: no layout")


def nunchaku_bytes(kind: str, out_features: int, in_features: int, rank: int, dtype: torch.dtype) -> int:
    """A Nunchaku Lite linear layer at compute dtype ``dtype`` (diffusers 0.42.1 quantizers/nunchaku/utils.py; its
    bias, at ``dtype``, kept apart):

    * int4 / nvfp4: ``SVDQW4A4Linear`` (utils.py:223-257): ``qweight`` two 4-bit weights per int8 byte; ``wscales``
      one per group along each row (64 for int4, at ``dtype``; 16 for nvfp4, float8_e4m3fn); the low-rank branch of
      rank R at ``dtype``: ``proj_down`` (in x R) and ``proj_up`` (out x R); ``smooth_factor`` per input channel at
      ``dtype``; nvfp4 adds ``wcscales`` per output channel and one ``wtscale`` at ``dtype``.
    * awq-int4: ``AWQW4A16Linear`` (utils.py:321-334): ``qweight`` int32 (out/4 x in/2: eight weights per int32),
      ``wscales`` and ``wzeros`` per group of 64 along each row at ``dtype``.
    """
    weights, size = out_features * in_features, dtype.itemsize
    if kind == "awq-int4":
        return (out_features // 4) * (in_features // 2) * 4 + 2 * (in_features // AWQ_GROUP) * out_features * size
    if kind not in ("int4", "nvfp4"):
        raise ValueError(f"nunchaku:{kind}: no layout")
    branch = (in_features + out_features) * rank * size + in_features * size
    if kind == "int4":
        return weights // 2 + (in_features // SVDQ_INT4_GROUP) * out_features * size + branch
    return weights // 2 + (in_features // NVFP4_BLOCK) * out_features + branch + (out_features + 1) * size
