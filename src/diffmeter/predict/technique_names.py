"""The names the memory techniques (``predict.techniques``) know an applied optimization by, torch-free: what bench
stores, ``profile --gpu`` predicts under and ``show`` reads back without importing torch."""

from __future__ import annotations

from diffmeter.quantization_spec import BACKENDS

#: bench's ``--quantize int8|fp8`` (torchao's ``quantize_`` after loading, optimize/quantize.py:67) as the torchao
#: weight-only types they are, timed as those
AS_TORCHAO = {"quantize-int8": "int8wo", "quantize-fp8": "float8wo"}


#: what joins the components a format is put on to its name (none named: the denoisers), and them to each other
ON, AND = "@", ","


def technique(backend: str, kind: str, components: tuple[str, ...] = ()) -> str:
    """A ``--quantize BACKEND:TYPE`` format's name: ``quantize-gguf-Q4_K_S`` on the denoisers,
    ``quantize-bnb-nf4@text_encoder`` on named components (``fit``'s formats on the large text encoders)."""
    name = f"quantize-{backend}-{kind}"
    return f"{name}{ON}{AND.join(components)}" if components else name


def format_parts(name: str) -> tuple[str, str, tuple[str, ...]]:
    """A format's name (``technique``) as (backend, type, the components it names: () for the denoisers)."""
    base, _, named = name.removeprefix("quantize-").partition(ON)
    backend, _, kind = base.partition("-")
    return backend, kind, tuple(named.split(AND)) if named else ()


def quantize_values(name: str) -> list[str]:
    """A format's name as the ``--quantize`` values that ask for it: ``["gguf:Q4_K_S"]``,
    ``["text_encoder_3=bnb:nf4", "text_encoder_4=bnb:nf4"]``."""
    backend, kind, components = format_parts(name)
    return [f"{component}={backend}:{kind}" for component in components] or [f"{backend}:{kind}"]


def memory_technique(name: str, params: dict) -> str | None:
    """The name of an applied optimization (``optimize/``'s name and params), or None if no technique models it."""
    if name == "offload":
        return f"offload-{params.get('mode', 'model')}"
    if name == "quantize":
        return f"quantize-{params.get('weights', 'int8')}"
    if name in BACKENDS:  # --quantize BACKEND:TYPE (quantized_memory)
        return technique(name, params["type"])
    return name if name in ("vae-tiling", "vae-slicing", "fp8-text-encoder") else None
