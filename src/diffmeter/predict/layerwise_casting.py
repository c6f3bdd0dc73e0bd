"""The work the fp8 text encoder adds (``--fp8-text-encoder``): diffusers' ``LayerwiseCastingHook`` casts each hooked
layer to the compute dtype before its forward and back to float8 after it (``module.to(dtype=...)`` in
``pre_forward`` and ``post_forward``, diffusers/hooks/layerwise_casting.py:66-72), so every call of the encoder
copies each hooked parameter twice. Which layers are hooked is diffusers' own rule (``apply_layerwise_casting`` with
bench's skip patterns, ``footprints.fp8_stored``), applied to the encoder built on meta; the two casts
of every hooked layer are run there under the operator tally, so their copies (a float8 operand charged at the
compute dtype's width per element, as ``quantized_time.narrow_bytes`` charges a narrow pass) and every operator the
host dispatches for them are counted, not assumed. Each hooked layer runs once per encoder call (T5's and UMT5's
blocks do; a layer called twice would cast twice and is counted once)."""

from __future__ import annotations

import json

import torch

from diffmeter.predict.schema import OperatorGroup, OperatorWork

#: (class, config, dtype) -> ``casts_per_call``'s answer: fit times every setting of a model with the same encoder
_COUNTED: dict[tuple, tuple[tuple[OperatorGroup, ...], int]] = {}


def cast_work(work: OperatorWork, spec, encoders: list[str]) -> OperatorWork:
    """``work`` (of ``spec``, a settled profile spec) with each call of the ``encoders`` stored in float8 charged its
    layers' casts to the call's dtype and back (module docstring)."""
    from diffmeter.predict.memory import DTYPES, settled_plan

    entry, settled, _ = settled_plan(spec)
    calls = []
    for call in work.calls:
        if call.component in encoders:
            dtype = DTYPES[call.dtype or settled.dtype_of(call.component)]
            groups, dispatched = casts_per_call(entry.components[call.component], dtype)
            call = call.model_copy(
                update={"operators": [*call.operators, *groups], "dispatched": call.dispatched + dispatched}
            )
        calls.append(call)
    return work.model_copy(update={"calls": calls})


def casts_per_call(component, dtype: torch.dtype) -> tuple[tuple[OperatorGroup, ...], int]:
    """The operators one call of ``component`` stored in float8 adds (each hooked layer to ``dtype`` and back), and
    the operators the host dispatches for them."""
    key = (component.class_name, json.dumps(component.config, sort_keys=True, default=str), dtype)
    if key not in _COUNTED:
        _COUNTED[key] = _counted(component, dtype)
    return _COUNTED[key]


def _counted(component, dtype: torch.dtype) -> tuple[tuple[OperatorGroup, ...], int]:
    from diffmeter.predict.footprints import FP8_STORAGE, fp8_stored
    from diffmeter.predict.quantized_time import DequantizeTally

    module = fp8_stored(component, dtype)
    hooked = [m for m in module.modules() if any(p.dtype == FP8_STORAGE for p in m.parameters(recurse=False))]
    with DequantizeTally(dtype) as tally:
        for layer in hooked:
            layer.to(dtype=dtype)  # pre_forward
            layer.to(dtype=FP8_STORAGE)  # post_forward
    return tuple(tally.operators()), tally.host_counts()["dispatched"]
