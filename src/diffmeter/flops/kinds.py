"""An operator's kind from its name: attention, matmul, convolution, normalization, elementwise or other, as the
``--trace`` tables (``measure.ops``) and the time prediction's operator tally (``predict.operators``) both name
them."""

from __future__ import annotations

import re

#: the kinds, in the order tables show them
KINDS = ("attention", "matmul", "convolution", "normalization", "elementwise", "other")
#: the words of an operator's name that make its kind
KIND_WORDS = {
    "attention": ("attention", "attn", "flash"),
    "matmul": ("mm", "matmul", "linear", "addmm", "bmm", "baddbmm", "gemm"),
    "convolution": ("conv", "convolution"),  # and any word starting with conv: conv2d, conv_transpose2d
    "normalization": ("norm",),
    "elementwise": (
        "add", "sub", "mul", "div", "silu", "gelu", "sigmoid", "tanh", "exp", "pow", "neg", "rsqrt", "sqrt",
        "clamp", "where", "relu", "sin", "cos", "erf", "softmax", "fill", "lerp", "abs", "reciprocal",
    ),
}  # fmt: skip


def kind_of(name: str) -> str:
    """attention, matmul, convolution, normalization, elementwise or other, from the words of the operator's
    name (``aten::native_layer_norm``: norm; ``aten::normal_``, the initial noise, is none of them)."""
    words = set(re.split(r"[^a-z0-9]+", name.removeprefix("aten::").lower())) - {""}
    kinds = [kind for kind, known in KIND_WORDS.items() if words & set(known)]
    if not kinds and any(word.startswith("conv") for word in words):  # conv_transpose2d, _slow_conv2d_forward
        return "convolution"
    return kinds[0] if kinds else "other"
