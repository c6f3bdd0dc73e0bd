"""The quantized formats ``fit`` and the leaderboard offer on a pipeline's denoisers (``--quantize BACKEND:TYPE`` as
bench applies it), their stored bytes per component computed once (one meta build per denoiser) and remembered on
disk; which of them need FP8 tensor cores; and the least quantization that fits a card."""

from __future__ import annotations

from diffmeter import cache
from diffmeter.predict.schema import MemoryPrediction
from diffmeter.predict.technique_names import technique

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
#: float8 weights or matmuls: only on a card with FP8 tensor cores (an fp8 peak in the GPU table)
NEEDS_FP8 = ("quantize-torchao-float8dq-row", "quantize-torchao-float8wo")
#: matmuls at a faster tensor-core rate than the compute dtype's (float8 activations and weights: twice bf16's on an
#: H100): a setting adding one can be faster, not only smaller
FASTER_MATMULS = ("quantize-torchao-float8dq-row",)


def label(name: str) -> str:
    """``quantize-gguf-Q4_K_S`` as ``--quantize`` takes it: ``gguf:Q4_K_S``."""
    backend, _, kind = name.removeprefix("quantize-").partition("-")
    return f"{backend}:{kind}"


def with_fit_formats(prediction: MemoryPrediction, spec, kernels: str | None = None) -> MemoryPrediction:
    """``prediction`` (of ``spec``) with every ``FIT_FORMATS`` format's stored bytes on the denoisers; one the
    pipeline's layers cannot take (``quantized_formats`` raises: SDNQ on a transformers model) is left out;
    ``kernels``: the device they run on (``quantized_kernels``; None: ``with_formats``' default)."""
    from diffmeter.catalog import entry_of

    key = {
        "entry": entry_of(spec).model_dump(mode="json"),
        "dtype": spec.dtype,
        "component_dtypes": sorted(spec.component_dtypes),  # (name, dtype) pairs (ProfileSpec)
        "formats": [technique(*found) for found in FIT_FORMATS],
        "on_cuda": prediction.on_cuda,
        "kernels": kernels,
    }
    stored = cache.load("fit-formats", key)
    if stored is None:
        stored = _computed(prediction, spec, kernels)
        cache.store("fit-formats", key, stored)
    return prediction.model_copy(
        update={
            "quantized_bytes": {**prediction.quantized_bytes, **stored["quantized_bytes"]},
            "dequantized_bytes": {**prediction.dequantized_bytes, **stored["dequantized_bytes"]},
            "dequantized_layers": {**prediction.dequantized_layers, **stored["dequantized_layers"]},
        }
    )


def _computed(prediction: MemoryPrediction, spec, kernels: str | None) -> dict:
    from diffmeter.errors import DiffmeterError
    from diffmeter.predict.quantized_memory import Format, with_formats
    from diffmeter.quiet import quiet_import

    found, built = {"quantized_bytes": {}, "dequantized_bytes": {}, "dequantized_layers": {}}, {}
    with quiet_import():  # SDNQ and bitsandbytes say which kernels they lack at import
        for backend, kind in FIT_FORMATS:
            try:
                made = with_formats(prediction, spec, [Format(backend, kind)], built, kernels)
            except DiffmeterError:
                continue
            name = technique(backend, kind)
            found["quantized_bytes"][name] = made.quantized_bytes[name]
            found["dequantized_bytes"][name] = made.dequantized_bytes[name]
            found["dequantized_layers"][name] = made.dequantized_layers[name]
    return found


def offered(prediction: MemoryPrediction, fp8: bool = True) -> tuple[str, ...]:
    """The ``FIT_FORMATS`` techniques ``prediction`` holds bytes for (``with_fit_formats``), in their order;
    ``fp8``: whether the card has FP8 tensor cores (the float8 ones need them)."""
    names = (technique(*found) for found in FIT_FORMATS)
    return tuple(n for n in names if n in prediction.quantized_bytes and (fp8 or n not in NEEDS_FP8))


def format_bytes(prediction: MemoryPrediction, name: str) -> int:
    """The denoisers' stored bytes under the format ``name`` (every component it was predicted on)."""
    return sum(prediction.quantized_bytes[name].values())


def least_quantization(prediction: MemoryPrediction, fits: list[tuple[tuple[str, ...], int]]) -> str | None:
    """The format keeping the most bytes among ``fits`` (``techniques.fitting``'s rows) without layer offloading
    (model offload allowed): the run's dtype (``bf16``) where a setting without a format fits, None where every
    fitting setting offloads layer by layer."""
    short = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}
    kept = [chosen for chosen, _ in fits if not {"offload-group", "offload-sequential"} & set(chosen)]
    if any(not any(t.startswith("quantize-") for t in chosen) for chosen in kept):
        return short.get(prediction.dtype, prediction.dtype)
    used = {t for chosen in kept for t in chosen if t in prediction.quantized_bytes}
    return label(max(used, key=lambda name: format_bytes(prediction, name))) if used else None
