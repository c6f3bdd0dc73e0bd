"""The names the memory techniques (``predict.techniques``) know an applied optimization by, torch-free: what bench
stores, ``profile --gpu`` predicts under and ``show`` reads back without importing torch."""

from __future__ import annotations

from diffmeter.quantization_spec import BACKENDS

#: bench's ``--quantize int8|fp8`` (torchao's ``quantize_`` after loading, optimize/quantize.py:67) as the torchao
#: weight-only types they are, timed as those
AS_TORCHAO = {"quantize-int8": "int8wo", "quantize-fp8": "float8wo"}


def technique(backend: str, kind: str) -> str:
    """A ``--quantize BACKEND:TYPE`` format's name: ``quantize-gguf-Q4_K_S``."""
    return f"quantize-{backend}-{kind}"


def memory_technique(name: str, params: dict) -> str | None:
    """The name of an applied optimization (``optimize/``'s name and params), or None if no technique models it."""
    if name == "offload":
        return f"offload-{params.get('mode', 'model')}"
    if name == "quantize":
        return f"quantize-{params.get('weights', 'int8')}"
    if name in BACKENDS:  # --quantize BACKEND:TYPE (quantized_memory)
        return technique(name, params["type"])
    return name if name in ("vae-tiling", "vae-slicing", "fp8-text-encoder") else None
