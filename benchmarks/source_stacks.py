"""What a published figure's own (older) libraries or code did differently from the installed stack, read from their
code at the version the source's date or its own words fix: the bytes they held resident beyond the installed
prediction (benchmarks/compare_quantized_memory.py adds them, shown apart as 'installed')."""

from __future__ import annotations

import re

from diffmeter.predict import quantized_layouts as layouts
from diffmeter.predict.footprints import meta_module
from diffmeter.predict.memory import DTYPES, settled_plan
from diffmeter.predict.quantized_formats import stored_tensors
from diffmeter.predict.quantized_memory import Format
from diffmeter.spec import ProfileSpec

#: sources run on transformers 4.x, as their date says (no version stated): "Exploring Quantization Backends" is of
#: 2025-05-21 (huggingface/blog PR #2852), before transformers 5.0; its T5 is read under 4.51.3's rules (``legacy_t5``)
TRANSFORMERS_4 = ("Exploring Quantization Backends",)
#: "We always default to using the PyTorch nightly, updated diffusers and torchao codebases" (the diffusers-torchao
#: README's Environment section); its CogVideoX table was added 2024-09-04 (commit 18855c8): the mains of then
SEPTEMBER_2024 = "diffusers-torchao README"
#: a source whose code passes ``weights_dtype`` to transformers' QuantoConfig as to diffusers' (its settings_from)
WEIGHTS_DTYPE = "QuantoConfig(weights_dtype="
#: transformers' QuantoConfig default (utils/quantization_config.py:1036-1044 installed, 5.24; the same signature from
#: 4.39.3 on: ``weights="int8"``, other keywords taken by ``**kwargs`` and dropped)
TRANSFORMERS_QUANTO_DEFAULT = "int8"


def legacy_t5(module, backend: str, kind: str, dtype) -> int:
    """The bytes a transformers model quantized at load held under transformers 4.51.3, less what the installed one
    stores: 4.51.3 put its ``_keep_in_fp32_modules`` (T5's ``wo``) in every quantizer's ``modules_to_not_convert``
    (quantizers/base.py:261-277, called by quantizer_bnb_4bit.py:298-300, quantizer_bnb_8bit.py:255-257,
    quantizer_torchao.py:185-187 and its ``key + "."`` skip at :203, quantizer_quanto.py:184-186), so they stay whole,
    and upcast them to float32 under a quantizer with ``use_keep_in_fp32_modules`` (bitsandbytes':
    quantizer_bnb_4bit.py:58, quantizer_bnb_8bit.py:55; modeling_utils.py:4360-4366 builds the pattern, :698 casts);
    the installed 5.x upcasts only at float16 (modeling_utils.py:3851-3852) and its torchao quantizes ``wo``."""
    keep = module._keep_in_fp32_modules or ()
    if not keep:
        return 0
    pattern = re.compile("|".join(rf"((^|\.){name}($|\.))" for name in keep))  # modeling_utils.py:4364-4366
    installed = {t.name: t.bytes for t in stored_tensors(module, backend, kind, dtype)}
    size = 4 if backend == "bnb" else dtype.itemsize
    return sum(
        tensor.numel() * size - installed[name] for name, tensor in module.named_parameters() if pattern.search(name)
    )


def tiled_int4(module, dtype) -> int:
    """torchao of September 2024's int4 weights (v0.5.0, tagged 2024-09-09, as main of 2024-09-04) less the installed
    ``Int4Tensor``'s: ``int4_weight_only``'s ``TensorCoreTiledLayoutType`` padded each weight to in_features a
    multiple of 1024 and out_features of 8 (torchao/dtypes/affine_quantized_tensor.py:477-488) before choosing its
    scales and zero points (``from_hp_to_intx``, :257-279), so the packed weight and the bfloat16 scale and zero per
    128 (quantization/quant_api.py:509-553) are of the padded shape; 0.18's Int4Tensor pads nothing."""
    extra = 0
    for stored in stored_tensors(module, "torchao", "int4wo", dtype, after_loading=True):
        if stored.quantized:
            out_features, in_features = module.get_parameter(stored.name).shape
            padded = layouts.torchao_bytes("int4wo", -(-out_features // 8) * 8, -(-in_features // 1024) * 1024, dtype)
            extra += padded - stored.bytes
    return extra


def stack_difference(figure: dict, found: Format, spec: ProfileSpec) -> tuple[int, str]:
    """Bytes the source's own (older) libraries or code held resident beyond the installed ones', and which rules."""
    import transformers

    older = figure["source"].startswith(TRANSFORMERS_4) and not found.after_loading
    tiled = figure["source"].startswith(SEPTEMBER_2024) and (found.backend, found.type) == ("torchao", "int4wo")
    kinds = source_kinds(figure, found, spec)
    retyped = {name for name, kind in kinds.items() if kind != found.type}
    if not (older or tiled or retyped):
        return 0, ""
    entry, settled, _ = settled_plan(spec)
    totals = {"transformers 4.51.3: T5's wo whole": 0, "torchao 0.5: int4 padded": 0}
    for name in found.components:
        dtype = DTYPES[settled.dtype_of(name)]
        module = meta_module(entry.components[name], dtype)
        if older and isinstance(module, transformers.PreTrainedModel):
            totals["transformers 4.51.3: T5's wo whole"] += legacy_t5(module, found.backend, found.type, dtype)
        if tiled:
            totals["torchao 0.5: int4 padded"] += tiled_int4(module, dtype)
        if name in retyped:
            rule = f"transformers' QuantoConfig(weights_dtype=...): {name} {kinds[name]}"
            totals[rule] = kind_difference(module, found, kinds[name], dtype)
    return sum(totals.values()), "; ".join(rule for rule, total in totals.items() if total)


def source_kinds(figure: dict, found: Format, spec: ProfileSpec) -> dict[str, str]:
    """Each quantized component's type as the source's code set it. diffusers' QuantoConfig reads ``weights_dtype``
    (quantizers/quantization_config.py:698), transformers' reads ``weights`` and drops any other keyword
    (``TRANSFORMERS_QUANTO_DEFAULT``): ``TransformersQuantoConfig(weights_dtype="int4")``, as the post's example
    writes it (its INT8 diff: ``TransformersQuantoConfig(weights_dtype="int8")``), quantizes T5 to int8."""
    import transformers

    kinds = dict.fromkeys(found.components, found.type)
    if found.backend != "quanto" or found.after_loading or WEIGHTS_DTYPE not in figure["settings_from"]:
        return kinds
    entry, settled, _ = settled_plan(spec)
    for name in found.components:
        module = meta_module(entry.components[name], DTYPES[settled.dtype_of(name)])
        if isinstance(module, transformers.PreTrainedModel):
            kinds[name] = TRANSFORMERS_QUANTO_DEFAULT
    return kinds


def kind_difference(module, found: Format, kind: str, dtype) -> int:
    """The bytes ``module`` stores as ``kind`` less as the figure's own type."""
    return sum(t.bytes for t in stored_tensors(module, found.backend, kind, dtype)) - sum(
        t.bytes for t in stored_tensors(module, found.backend, found.type, dtype)
    )
