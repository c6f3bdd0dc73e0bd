"""``--quantize [NAME=]BACKEND:TYPE`` as data: the backends diffusers 0.42.1 applies at load time, the types each
takes, and the grammar resolved once into the techniques a run asks for. No torch, no backend imported: a bad name
is one line before anything loads.

A bare ``int8`` or ``fp8`` is today's technique, torchao weight-only applied after loading (``optimize/quantize.py``:
``Int8WeightOnlyConfig`` / ``Float8WeightOnlyConfig``), the one ``profile --gpu`` and ``fit`` predict. A bare ``fp8dq``
or ``fp8dq-row`` is short for torchao's float8 dynamic activations at load time (``torchao:float8dq-tensor|row``).
"""

from __future__ import annotations

from dataclasses import dataclass

from diffmeter.errors import DiffmeterError
from diffmeter.optimization_spec import OptimizationSpec

#: the names of the technique applied after loading (``optimize/quantize.py``)
LEGACY = ("int8", "fp8")
#: short names of a backend's type: torchao's float8 dynamic activations, per tensor and per row
SHORT = {"fp8dq": ("torchao", "float8dq-tensor"), "fp8dq-row": ("torchao", "float8dq-row")}
#: a component list's word for the pipeline's denoisers (Wan 2.2's two experts are both)
DENOISER = "denoiser"


@dataclass(frozen=True)
class Backend:
    """A quantization backend: the technique's name, its types, the module it imports and the extra installing it."""

    name: str
    types: tuple[str, ...]
    module: str
    extra: str
    summary: str
    #: types read from a pre-quantized single file (--weights FILE), not made at load time
    single_file: bool = False
    #: types read from a pre-quantized component folder whose config.json holds them (--weights DIR)
    folder: bool = False

    @property
    def pre_quantized(self) -> bool:
        return self.single_file or self.folder


BACKENDS = {
    backend.name: backend
    for backend in (
        Backend(
            "bnb",
            ("nf4", "fp4", "int8"),
            "bitsandbytes",
            "bnb",
            "bitsandbytes: 4-bit NF4/FP4 or LLM.int8() weights, quantized at load (BitsAndBytesConfig)",
        ),
        Backend(
            "gguf",
            (
                "Q2_K",
                "Q3_K",
                "Q3_K_S",
                "Q3_K_M",
                "Q4_0",
                "Q4_1",
                "Q4_K",
                "Q4_K_S",
                "Q4_K_M",
                "Q5_0",
                "Q5_1",
                "Q5_K",
                "Q5_K_S",
                "Q5_K_M",
                "Q6_K",
                "Q8_0",
                "BF16",
                "F16",
            ),
            "gguf",
            "gguf",
            "GGUF single files (llama.cpp block formats), dequantized in each matmul (GGUFQuantizationConfig)",
            single_file=True,
        ),
        Backend(
            "torchao",
            ("int8wo", "int4wo", "float8wo", "float8dq-tensor", "float8dq-row"),
            "torchao",
            "quant",
            "torchao at load (TorchAoConfig): int8/int4 or float8 weight-only, float8 dynamic activations",
        ),
        Backend(
            "quanto",
            ("int8", "int4", "float8"),
            "optimum.quanto",
            "quanto",
            "optimum-quanto weights at load (QuantoConfig)",
        ),
        Backend(
            "sdnq",
            ("int8", "uint8", "int6", "uint6", "int4", "uint4", "uint3", "uint2", "float8_e4m3fn", "float8_e5m2"),
            "sdnq",
            "sdnq",
            "SD.Next quantization at load (SDNQConfig); layers under 16384 weights stay unquantized (its default)",
        ),
        Backend(
            "nunchaku",
            ("int4", "nvfp4", "awq-int4"),
            "kernels",
            "nunchaku",
            "Nunchaku Lite folders (NunchakuLiteQuantizationConfig in config.json): SVDQuant W4A4 int4/nvfp4 with a "
            "low-rank branch, or AWQ W4A16; CUDA only",
            folder=True,
        ),
        Backend(
            "bfl",
            ("fp8", "nvfp4"),
            "accelerate",
            "bfl",
            "Black Forest Labs fp8 (per-row scales) or nvfp4 single files (BFLQuantizationConfig); dequantized in each "
            "matmul where no fused kernel runs",
            single_file=True,
        ),
        Backend(
            "autoround",
            ("int2", "int3", "int4", "int8"),
            "auto_round",
            "autoround",
            "Intel AutoRound folders (AutoRoundConfig in config.json): W2/W3/W4/W8A16 integer weights in groups, "
            "in auto-round's layers for the run's device (on a CPU its torch ones, dequantizing in each matmul); "
            "bfloat16 or float16 runs",
            folder=True,
        ),
        Backend(
            "modelopt",
            ("fp8", "int8", "int4", "nf4", "nvfp4"),
            "modelopt",
            "modelopt",
            "NVIDIA ModelOpt weights at load (NVIDIAModelOptConfig, weight-only); refused on every device: "
            "diffusers 0.42.1 leaves its layers unconverted",
        ),
    )
}


@dataclass(frozen=True)
class QuantizeRequest:
    """One ``--quantize`` value: which component (None: the denoisers), which backend (``quantize`` for a bare
    int8 or fp8) and type."""

    component: str | None
    backend: str
    type: str


def known() -> str:
    """Every backend with its types, as the refusals list them."""
    listed = "; ".join(f"{b.name}:{'|'.join(b.types)}" for b in BACKENDS.values())
    return f"{listed}; or int8|fp8 (torchao weight-only after loading), fp8dq|fp8dq-row (torchao:float8dq-tensor|row)"


def parse(text: str) -> QuantizeRequest:
    """``[NAME=]BACKEND:TYPE``, ``[NAME=]int8|fp8`` or ``[NAME=]fp8dq|fp8dq-row``, checked against the backends'
    types."""
    component, equals, rest = text.strip().rpartition("=")
    component = component.strip() or None
    if equals and component is None:
        raise DiffmeterError(f"--quantize '{text}': name the component before '=' (e.g. transformer=bnb:nf4)")
    backend, colon, kind = rest.strip().partition(":")
    if not colon:
        if short := SHORT.get(backend.strip().lower()):
            return QuantizeRequest(component, *short)
        if backend in LEGACY and component is None:
            return QuantizeRequest(None, "quantize", backend)  # optimize/quantize.py
        if backend in LEGACY:  # its prediction (profile --gpu, fit, bench's) counts the denoisers only
            raise DiffmeterError(
                f"--quantize '{text}': a bare {backend} quantizes the denoiser; for {component} write "
                f"{component}=torchao:{'int8wo' if backend == 'int8' else 'float8wo'}"
            )
        raise DiffmeterError(f"--quantize '{text}': write BACKEND:TYPE; known: {known()}")
    found = BACKENDS.get(backend.strip().lower())
    if found is None:
        raise DiffmeterError(f"--quantize '{text}': unknown backend '{backend}'; known: {known()}")
    match = {name.lower(): name for name in found.types}.get(kind.strip().lower())
    if match is None:
        raise DiffmeterError(
            f"--quantize '{text}': {found.name} has no type '{kind}'; its types: {', '.join(found.types)}"
        )
    return QuantizeRequest(component, found.name, match)


def optimization_specs(values: list[str], weights: str | None = None) -> list[OptimizationSpec]:
    """Every ``--quantize`` value (and ``--weights FILE``) as the techniques a run asks for: one per backend,
    holding its components. A backend asked at two types, or a component asked twice, is one line."""
    requests = [parse(value) for value in values]
    seen: dict[str | None, str] = {}
    for value, request in zip(values, requests, strict=True):
        if request.component in seen:
            what = request.component or "the denoiser"
            raise DiffmeterError(f"--quantize names {what} twice ({seen[request.component]}, {value}); keep one")
        seen[request.component] = value
    reading = [r for r in requests if r.backend in BACKENDS and BACKENDS[r.backend].pre_quantized]
    if weights is not None and not reading:
        raise DiffmeterError(
            f"--weights {weights}: a GGUF file is read with --quantize gguf:TYPE (its tensors' type), a BFL file with "
            "bfl:TYPE, a Nunchaku Lite folder with nunchaku:TYPE, an AutoRound folder with autoround:TYPE"
        )
    if len({r.backend for r in reading}) > 1:
        raise DiffmeterError(
            "--weights is one pre-quantized file or folder: one of gguf, bfl, nunchaku, autoround per run"
        )
    grouped: dict[str, tuple[dict, list[str]]] = {}
    for request in requests:
        name = request.backend
        params = {"weights": request.type} if name == "quantize" else {"type": request.type}
        if name in grouped and grouped[name][0] != params:
            raise DiffmeterError(
                f"--quantize asks {name} for two types; one type per backend in a run (another backend can take "
                "the other component)"
            )
        grouped.setdefault(name, (params, []))[1].append(request.component or DENOISER)
    specs = []
    for name, (params, components) in grouped.items():
        backend = BACKENDS.get(name)
        if backend is not None and backend.pre_quantized:
            # a folder's backend says first where it cannot run (CUDA only), then that the folder is missing
            if weights is None and backend.single_file:
                raise DiffmeterError(
                    f"--quantize {name}:{params['type']} loads a pre-quantized single file: add --weights FILE"
                )
            params = {**params, "file": weights} if weights is not None else params
        specs.append(OptimizationSpec(name=name, params=with_components(params, components)))
    return specs


def with_components(params: dict, components: list[str]) -> dict:
    """A backend's parameters with the components it quantizes: none named for the denoisers alone, its default."""
    return params if components == [DENOISER] else {**params, "components": components}
