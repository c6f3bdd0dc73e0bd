"""The attention kernel a run picks (``--opt sdpa-kernel:kernel=...``, ``--opt attention:backend=...``) as a change
of the attention operators' work, where published runs separate the kernels.

The eager calibration's runs went through SDPA's own choice (flash, memory-efficient or cuDNN by torch version and
dtype), the flash-attn package or xformers: the same FLOPs, and no published pair of runs separates their times,
so those kernels are timed as the calibration's attention (``SAME_AS_SDPA``). PyTorch's math path materializes the
score matrix: its two matmuls and the softmax between them write it and read it back, four passes of
batch x heads x queries x keys values (``MATH_PASSES``) beyond the fused kernels' bytes. Any other kernel (sage,
flex, FlashAttention-3, ...) is not modelled: ``kernel_of`` returns None and the prediction names it as left out.
"""

from __future__ import annotations

from diffmeter.predict.schema import OperatorWork

#: the score matrix's passes on PyTorch's math path: Q K^T written, read and written by the softmax, read by P V
MATH_PASSES = 4
#: bytes per value of the dtypes attention runs at
ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2}
#: kernels timed as the calibration's attention: SDPA's fused kernels, and the packages the eager runs used
SAME_AS_SDPA = ("flash", "efficient", "cudnn", "sdpa", "xformers", "flash-attn")
#: diffusers' attention backends (``--opt attention:backend=NAME``) as the kernel they run
BACKENDS = {
    "native": "sdpa",
    "_native_flash": "flash",
    "_native_efficient": "efficient",
    "_native_cudnn": "cudnn",
    "_native_math": "math",
    "flash": "flash-attn",
    "xformers": "xformers",
}


def kernel_of(name: str, params: dict) -> str | None:
    """The attention kernel an optimization runs (``sdpa-kernel`` or ``attention``), None where its time is not
    modelled."""
    kernel = params.get("kernel", "flash") if name == "sdpa-kernel" else BACKENDS.get(params.get("backend", ""))
    return kernel if kernel == "math" or kernel in SAME_AS_SDPA else None


def with_kernel(work: OperatorWork, kernel: str, components: tuple[str, ...] | None = None) -> OperatorWork:
    """``work`` with the attention of ``components`` (None: every component) run by ``kernel``: the math path's
    materialized scores added to each attention operator's bytes; the fused kernels' work unchanged."""
    if kernel != "math":
        return work
    calls = []
    for call in work.calls:
        if components is not None and call.component not in components:
            calls.append(call)
            continue
        operators = [
            group.model_copy(
                update={
                    "bytes": group.bytes
                    + MATH_PASSES * group.scores * ITEMSIZE[group.dtype or call.dtype or work.dtype]
                }
            )
            if group.kind == "attention"
            else group
            for group in call.operators
        ]
        calls.append(call.model_copy(update={"operators": operators}))
    return work.model_copy(update={"calls": calls})
