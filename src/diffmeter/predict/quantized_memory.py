"""A memory prediction with ``--quantize [NAME=]BACKEND:TYPE`` formats: each named component's weights as the backend
stores them (``quantized_formats``) and, per layer shape, what a quantized layer allocates while it runs (its weight
dequantized, a second output), added where such a layer runs in that component's calls
(``techniques.stage_peaks_under``, ``layer_levels``). The technique is named ``quantize-BACKEND-TYPE``."""

from __future__ import annotations

from dataclasses import dataclass

from diffmeter.errors import DiffmeterError
from diffmeter.families import get_family
from diffmeter.predict.footprints import meta_module
from diffmeter.predict.kernel_kinds import CPU, SM80
from diffmeter.predict.memory import DTYPES, settled_plan
from diffmeter.predict.quantized_formats import checkpoint_types, footprint
from diffmeter.predict.schema import MemoryPrediction
from diffmeter.predict.technique_names import format_parts, technique
from diffmeter.quantization_spec import BACKENDS, DENOISER, parse

#: the backends whose stored layout is predicted: every one ``--quantize`` takes
PREDICTED = tuple(BACKENDS)


@dataclass(frozen=True)
class Format:
    """A backend's type on components (``denoiser``: the pipeline's denoisers); ``file``: a GGUF file's types;
    ``after_loading``: applied to the loaded components (torchao ``quantize_``, quanto ``quantize``), not at load
    (``quantized_formats``: no skip list then)."""

    backend: str
    type: str
    components: tuple[str, ...] = (DENOISER,)
    file: str | None = None
    after_loading: bool = False

    @property
    def technique(self) -> str:
        return technique(self.backend, self.type)

    @property
    def name(self) -> str:
        """Its name among ``fit``'s settings: the components it names after the type, none for the denoisers."""
        return technique(self.backend, self.type, () if self.components == (DENOISER,) else self.components)

    @classmethod
    def named(cls, name: str) -> Format:
        """The format a setting's technique ``name`` stands for (``quantize-bnb-nf4@text_encoder``)."""
        backend, kind, components = format_parts(name)
        return cls(backend, kind, components or (DENOISER,))


def split_values(values) -> tuple[list[str], list[Format]]:
    """``--quantize`` values as the legacy ``int8``/``fp8`` (bench's parser takes them) and the backend formats
    (predicted here without a file: a GGUF type as city96's tools make a file of it)."""
    values = [values] if isinstance(values, str) else list(values or [])
    legacy, found, seen = [], [], {}
    for value in values:
        request = parse(value)
        if request.component in seen:
            what = request.component or "the denoiser"
            raise DiffmeterError(f"--quantize names {what} twice ({seen[request.component]}, {value}); keep one")
        seen[request.component] = value
        if request.backend == "quantize":
            legacy.append(value)
        else:
            found.append(Format(request.backend, request.type, (request.component or DENOISER,)))
    return legacy, found


def with_formats(
    prediction: MemoryPrediction, spec, formats: list[Format], built: dict | None = None, kernels: str | None = None
) -> MemoryPrediction:
    """``prediction`` (of ``spec``) with each format's stored bytes and dequantized weight per component; ``built``:
    the components already built on meta, by name (filled here: one build for several formats); ``kernels``: the
    device the layers run on (``quantized_kernels``; None: this CPU for a CPU prediction, else a current NVIDIA GPU)."""
    if not formats:
        return prediction
    kernels = kernels or (SM80 if prediction.on_cuda else CPU)
    built = {} if built is None else built
    entry, settled, _ = settled_plan(spec)
    denoisers = [name for name in get_family(entry.family).denoisers(entry) if name in entry.components]
    stored, dequantized = dict(prediction.quantized_bytes), dict(prediction.dequantized_bytes)
    layers = dict(prediction.dequantized_layers)
    for found in formats:
        names = [n for name in found.components for n in (denoisers if name == DENOISER else [name])]
        unknown = [name for name in names if name not in entry.components]
        if unknown:
            raise DiffmeterError(
                f"--quantize {found.backend}:{found.type}: {entry.name} has no component {', '.join(unknown)}; its "
                f"components: {', '.join(entry.components)}"
            )
        types = checkpoint_types(found.backend, found.file) if found.file else None
        sizes, flights, copies = {}, {}, {}
        for name in names:
            dtype = DTYPES[settled.dtype_of(name)]
            module = (
                built[name] if name in built else built.setdefault(name, meta_module(entry.components[name], dtype))
            )
            if found.backend == "gguf" and types is not None and not types.keys() & module.state_dict().keys():
                types = None  # a file under the original checkpoint's names (city96's): its type per tensor as made
            try:
                sizes[name], flights[name], copies[name] = footprint(
                    module, found.backend, found.type, dtype, types, found.after_loading, kernels
                )
            except ValueError as error:
                raise DiffmeterError(
                    f"--quantize {found.backend}:{found.type} on {name}: {error}; measure it with bench"
                    + (" --weights DIR" if BACKENDS[found.backend].folder else "")
                ) from None
        stored[found.technique] = {**stored.get(found.technique, {}), **sizes}  # one type on several components
        dequantized[found.technique] = {**dequantized.get(found.technique, {}), **flights}
        layers[found.technique] = {**layers.get(found.technique, {}), **copies}
    update = {"quantized_bytes": stored, "dequantized_bytes": dequantized, "dequantized_layers": layers}
    return prediction.model_copy(update=update)
