"""A generation's operator work (``operators``) with a ``--quantize BACKEND:TYPE`` format's quantized ``nn.Linear``
layers as the backend runs them: each matmul group that is such a layer's replaced by ``quantized_time``'s operators
for it, so the roofline and its calibrated range (``roofline.predict_time``) time it like any other operator."""

from __future__ import annotations

import functools
from collections import defaultdict

import torch

from diffmeter.errors import DiffmeterError
from diffmeter.families import get_family
from diffmeter.predict.quantized_modelled import why_not_modelled
from diffmeter.predict.quantized_time import Layer, added_dispatches, fused_dequantize, layer_ops
from diffmeter.predict.schema import CallWork, OperatorGroup, OperatorWork
from diffmeter.quantization_spec import DENOISER


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


@functools.lru_cache(maxsize=64)
def layers_of(component: str, backend: str, kind: str, dtype: str) -> dict[tuple, list]:
    """``quantized_layers`` of a component given as its catalog entry's JSON, built on meta once a process (``fit``
    times a format beside each of the encoders' formats)."""
    from diffmeter.catalog.entry import ComponentEntry
    from diffmeter.predict.footprints import meta_module

    compute = getattr(torch, dtype)
    return quantized_layers(meta_module(ComponentEntry.model_validate_json(component), compute), backend, kind, compute)


def quantized_work(work: OperatorWork, spec, formats) -> OperatorWork:
    """``work`` (of ``spec``) with every modelled format's quantized linear layers as the backend runs them; a format
    whose time is not modelled raises (``why_not_modelled``)."""
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
            component = entry.components[name].model_dump_json(by_alias=True)
            layers = layers_of(component, found.backend, found.type, str(dtype).removeprefix("torch."))
            calls = [
                rewrite_call(call, found.backend, found.type, layers, dtype.itemsize)
                if call.component == name
                else call
                for call in calls
            ]
    return work.model_copy(update={"calls": calls})
