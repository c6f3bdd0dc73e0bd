"""The quantized formats ``fit`` and the leaderboard offer on a pipeline's denoisers and on its large text encoders
(``--quantize [NAME=]BACKEND:TYPE`` as bench applies it), their stored bytes per component computed once (one meta
build per component) and remembered on disk; which of them need FP8 tensor cores; and the least quantization that
fits a card."""

from __future__ import annotations

from diffmeter import cache
from diffmeter.predict.schema import MemoryPrediction
from diffmeter.predict.technique_names import ON, format_parts, quantize_values, technique

#: (backend, type): the common files and configs people run (city96's GGUF files, diffusers' NF4 folders, torchao's
#: weight-only and fp8 dynamic-activation configs), in the order kept among settings whose times are equal
FIT_FORMATS = (
    ("torchao", "float8dq-row"),
    ("torchao", "int8wo"),
    ("torchao", "float8wo"),
    ("bnb", "int8"),
    ("gguf", "Q8_0"),
    ("gguf", "Q6_K"),
    ("gguf", "Q5_K_S"),
    ("gguf", "Q4_K_S"),
    ("bnb", "nf4"),
    ("quanto", "int8"),
    ("quanto", "int4"),
    ("sdnq", "uint4"),
)
#: (backend, type) on the large text encoders (``pipelines.large_text_encoders``: T5, UMT5, the language models of
#: FLUX.2, Qwen-Image, HiDream): bitsandbytes through transformers' own config, as diffusers' docs and the published
#: 4-bit folders (diffusers/FLUX.2-dev-bnb-4bit, diffusers/HiDream-I1-Full-nf4) store those encoders
ENCODER_FORMATS = (("bnb", "int8"), ("bnb", "nf4"))
#: float8 weights or matmuls: only on a card with FP8 tensor cores (an fp8 peak in the GPU table)
NEEDS_FP8 = ("quantize-torchao-float8dq-row", "quantize-torchao-float8wo")
#: matmuls at a faster tensor-core rate than the compute dtype's (float8 activations and weights: twice bf16's on an
#: H100): a setting adding one can be faster, not only smaller
FASTER_MATMULS = ("quantize-torchao-float8dq-row",)


def label(name: str) -> str:
    """``quantize-gguf-Q4_K_S`` as ``--quantize`` takes it: ``gguf:Q4_K_S``; one on named components as each value
    asking for it: ``text_encoder=bnb:nf4``."""
    return " + ".join(quantize_values(name))


def with_fit_formats(prediction: MemoryPrediction, spec, kernels: str | None = None) -> MemoryPrediction:
    """``prediction`` (of ``spec``) with every ``FIT_FORMATS`` format's stored bytes on the denoisers and every
    ``ENCODER_FORMATS`` one's on the large text encoders (one technique for all of them: ``technique``'s components);
    one the pipeline's layers cannot take (``quantized_formats`` raises: SDNQ on a transformers model) is left out;
    ``kernels``: the device they run on (``quantized_kernels``; None: ``with_formats``' default)."""
    from diffmeter.catalog import entry_of

    entry = entry_of(spec)
    key = {
        "entry": entry.model_dump(mode="json"),  # which encoders are large: its classes (text_encoders.py)
        "dtype": spec.dtype,
        "component_dtypes": sorted(spec.component_dtypes),  # (name, dtype) pairs (ProfileSpec)
        "formats": [technique(*found) for found in FIT_FORMATS],
        "encoder_formats": [technique(*found) for found in ENCODER_FORMATS],
        "on_cuda": prediction.on_cuda,
        "kernels": kernels,
    }
    stored = cache.load("fit-formats", key)
    if stored is None:  # the families, and with them torch, imported only here: a cached fit loads no library
        from diffmeter.families import get_family
        from diffmeter.text_encoders import QUANTIZABLE, text_encoders_of

        encoders = tuple(text_encoders_of(entry, get_family(entry.family), QUANTIZABLE))
        stored = _computed(prediction, spec, kernels, encoders)
        cache.store("fit-formats", key, stored)
    return prediction.model_copy(
        update={
            "quantized_bytes": {**prediction.quantized_bytes, **stored["quantized_bytes"]},
            "dequantized_bytes": {**prediction.dequantized_bytes, **stored["dequantized_bytes"]},
            "dequantized_layers": {**prediction.dequantized_layers, **stored["dequantized_layers"]},
        }
    )


def _computed(prediction: MemoryPrediction, spec, kernels: str | None, encoders: tuple[str, ...]) -> dict:
    from diffmeter.errors import DiffmeterError
    from diffmeter.predict.quantized_memory import Format, with_formats
    from diffmeter.quiet import quiet_import

    asked = [Format(backend, kind) for backend, kind in FIT_FORMATS]
    asked += [Format(backend, kind, encoders) for backend, kind in ENCODER_FORMATS if encoders]
    found, built = {"quantized_bytes": {}, "dequantized_bytes": {}, "dequantized_layers": {}}, {}
    with quiet_import():  # SDNQ and bitsandbytes say which kernels they lack at import
        for form in asked:
            try:
                made = with_formats(prediction, spec, [form], built, kernels)
            except DiffmeterError:
                continue
            found["quantized_bytes"][form.name] = made.quantized_bytes[form.technique]
            found["dequantized_bytes"][form.name] = made.dequantized_bytes[form.technique]
            found["dequantized_layers"][form.name] = made.dequantized_layers[form.technique]
    return found


def offered(prediction: MemoryPrediction, fp8: bool = True) -> tuple[str, ...]:
    """The ``FIT_FORMATS`` techniques ``prediction`` holds bytes for (``with_fit_formats``), in their order;
    ``fp8``: whether the card has FP8 tensor cores (the float8 ones need them)."""
    names = (technique(*found) for found in FIT_FORMATS)
    return tuple(n for n in names if n in prediction.quantized_bytes and (fp8 or n not in NEEDS_FP8))


def on_encoders(prediction: MemoryPrediction) -> tuple[str, ...]:
    """The ``ENCODER_FORMATS`` techniques ``prediction`` holds bytes for (``with_fit_formats``), in their order."""
    order = {found: index for index, found in enumerate(ENCODER_FORMATS)}
    names = [n for n in prediction.quantized_bytes if ON in n and format_parts(n)[:2] in order]
    return tuple(sorted(names, key=lambda name: order[format_parts(name)[:2]]))


def format_bytes(prediction: MemoryPrediction, name: str) -> int:
    """The stored bytes of the components the format ``name`` was predicted on."""
    return sum(prediction.quantized_bytes[name].values())


def kept_bytes(prediction: MemoryPrediction, chosen: tuple[str, ...]) -> int:
    """Every component's weight bytes under ``chosen``'s formats (one a format does not name at its own dtype)."""
    params = dict(prediction.component_param_bytes)
    for name in chosen:
        params.update(prediction.quantized_bytes.get(name, {}))
    return sum(params.values())


def least_quantization(prediction: MemoryPrediction, fits: list[tuple[tuple[str, ...], int]]) -> str | None:
    """The least quantized of ``fits`` (``techniques.fitting``'s rows) without layer offloading (model offload
    allowed), the one keeping the most weight bytes: the run's dtype (``bf16``) where a setting without a format fits,
    else its formats (``gguf:Q8_0``, ``bnb:nf4 + text_encoder=bnb:int8``); None where every fitting setting offloads
    layer by layer."""
    short = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}
    kept = [chosen for chosen, _ in fits if not {"offload-group", "offload-sequential"} & set(chosen)]
    if not kept:
        return None
    best = max(kept, key=lambda chosen: kept_bytes(prediction, chosen))
    used = [label(name) for name in best if name in prediction.quantized_bytes]
    return " + ".join(used) or short.get(prediction.dtype, prediction.dtype)
