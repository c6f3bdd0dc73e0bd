"""From command-line flags, a config file or DIFFMETER_* variables to OptimizationSpecs.

The flags are shorthands for the registry's parameters; ``--opt NAME:key=value,...``
reaches any technique and parameter directly.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from diffmeter.errors import DiffmeterError
from diffmeter.optimize.base import OptimizationSpec
from diffmeter.optimize.registry import REGISTRY
from diffmeter.predict.technique_names import format_parts
from diffmeter.quantization_spec import BACKENDS, DENOISER, with_components
from diffmeter.quantization_spec import optimization_specs as quantization_specs

#: which parameter --cache-threshold and --cache-interval set, per cache
CACHE_THRESHOLD = {
    "first-block-cache": "threshold",
    "mag-cache": "threshold",
    "cache-dit": "threshold",
    "sea-cache": "threshold",
}
CACHE_INTERVAL = {
    "taylorseer": "cache_interval",
    "deep-cache": "cache_interval",
    "pab": "block_skip_range",
    "faster-cache": "block_skip_range",
}


def from_flags(
    *,
    compile: str | None = None,
    compile_fullgraph: bool = False,
    compile_regional: bool = False,
    compile_components: str | None = None,
    compile_inductor_flags: bool = False,
    channels_last: bool = False,
    attention: str | None = None,
    sdpa_kernel: str | None = None,
    fuse_qkv: bool = False,
    cache: str | None = None,
    cache_threshold: float | None = None,
    cache_interval: int | None = None,
    scheduler: str | None = None,
    offload: str | None = None,
    vae_tiling: bool = False,
    vae_slicing: bool = False,
    quantize: str | list[str] | None = None,
    weights: str | None = None,
    fp8_text_encoder: bool = False,
    opt: list[str] | None = None,
) -> list[OptimizationSpec]:
    specs: list[OptimizationSpec] = []
    compile_extras = compile_fullgraph or compile_regional or compile_components or compile_inductor_flags
    if compile is None and (compile_extras or channels_last):
        raise DiffmeterError("--compile-* and --channels-last options need --compile MODE (e.g. --compile default)")
    if compile is not None:
        params: dict[str, Any] = {"mode": compile}
        if compile_fullgraph:
            params["fullgraph"] = True
        if compile_regional:
            params["regional"] = True
        if compile_components:
            params["components"] = [part.strip() for part in compile_components.split(",") if part.strip()]
        if compile_inductor_flags:
            params["inductor_flags"] = True
        if channels_last:
            params["channels_last"] = True
        specs.append(OptimizationSpec(name="compile", params=params))
    if attention is not None:
        specs.append(OptimizationSpec(name="attention", params={"backend": attention}))
    if sdpa_kernel is not None:
        specs.append(OptimizationSpec(name="sdpa-kernel", params={"kernel": sdpa_kernel}))
    if fuse_qkv:
        specs.append(OptimizationSpec(name="fuse-qkv"))
    if cache is not None:
        refuse_unknown_cache(cache)
        specs.append(OptimizationSpec(name=cache, params=_cache_params(cache, cache_threshold, cache_interval)))
    elif cache_threshold is not None or cache_interval is not None:
        raise DiffmeterError("--cache-threshold and --cache-interval need --cache NAME")
    if scheduler is not None:
        specs.append(OptimizationSpec(name="scheduler", params={"name": scheduler}))
    if offload is not None:
        specs.append(OptimizationSpec(name="offload", params={"mode": offload}))
    if vae_tiling:
        specs.append(OptimizationSpec(name="vae-tiling"))
    if vae_slicing:
        specs.append(OptimizationSpec(name="vae-slicing"))
    if quantize or weights:  # [NAME=]BACKEND:TYPE, repeatable; a bare int8 or fp8 as before
        specs += quantization_specs([quantize] if isinstance(quantize, str) else list(quantize or []), weights)
    if fp8_text_encoder:
        specs.append(OptimizationSpec(name="fp8-text-encoder"))
    specs += [parse_opt(text) for text in opt or []]
    return specs


def caches() -> list[str]:
    """The registry's caches (techniques of kind "cache"), by name: what ``--cache`` takes."""
    return sorted(name for name, cls in REGISTRY.items() if cls.kind == "cache")


def refuse_unknown_cache(name: str) -> None:
    if name not in caches():
        raise DiffmeterError(
            f"--cache {name}: not a cache; the caches: {', '.join(caches())} (any technique: --opt NAME)"
        )


def _cache_params(cache: str, threshold: float | None, interval: int | None) -> dict[str, Any]:
    params: dict[str, Any] = {}
    for value, table, flag in (
        (threshold, CACHE_THRESHOLD, "--cache-threshold"),
        (interval, CACHE_INTERVAL, "--cache-interval"),
    ):
        if value is None:
            continue
        if cache not in table:
            takers = ", ".join(table)
            raise DiffmeterError(
                f"{flag} does not apply to {cache} (it applies to {takers}); use --opt {cache}:key=value"
            )
        params[table[cache]] = value
    return params


def parse_opt(text: str) -> OptimizationSpec:
    """``name`` or ``name:key=value,key=value`` (values parsed as JSON when they can be; a bracketed value keeps its
    commas: ``pab:timestep_skip_range=[100,800]``)."""
    name, _, rest = text.partition(":")
    params: dict[str, Any] = {}
    for item in filter(None, (part.strip() for part in _top_level(rest))):
        key, equals, value = item.partition("=")
        if not equals:
            quantize = (
                f"; a quantization type: --quantize {text}, or --opt {name}:type={item}" if name in BACKENDS else ""
            )
            raise DiffmeterError(f"--opt {text}: write parameters as key=value, got '{item}'{quantize}")
        key = key.strip().replace("-", "_")
        if key in params:  # the last one would win unseen
            raise DiffmeterError(f"--opt {text}: {key} is given twice; give it once")
        params[key] = _value(value.strip())
    return OptimizationSpec(name=name.strip(), params=params)


def _top_level(text: str) -> list[str]:
    """``text`` split at the commas outside brackets."""
    parts, depth, start = [], 0, 0
    for index, char in enumerate(text):
        depth += {"[": 1, "(": 1, "]": -1, ")": -1}.get(char, 0)
        if char == "," and depth == 0:
            parts.append(text[start:index])
            start = index + 1
    return [*parts, text[start:]]


def _value(text: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def from_config(raw: Any) -> list[OptimizationSpec]:
    """The ``optimizations`` entry of a config file: a list of names or {name, params}, or a
    mapping name -> params."""
    if isinstance(raw, dict):
        raw = [{"name": name, "params": params or {}} for name, params in raw.items()]
    if not isinstance(raw, list):
        raise DiffmeterError("'optimizations' in a config file is a list or a mapping of name -> parameters")
    specs = []
    for item in raw:
        if isinstance(item, str):
            specs.append(parse_opt(item))
        elif isinstance(item, dict) and "name" in item:
            params = item.get("params", {k: v for k, v in item.items() if k != "name"})
            specs.append(OptimizationSpec(name=item["name"], params=params))
        else:
            raise DiffmeterError(f"cannot read optimization {item!r}: use a name or {{name: ..., params: {{...}}}}")
    return specs


def read_yaml_or_json(path: str | Path, what: str) -> Any:
    """The data in a .json file, or in YAML for any other suffix; ``what`` names the file in the
    one line that says it cannot be read or parsed."""
    path = Path(path).expanduser()
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise DiffmeterError(f"cannot read {what} {path}: {error.strerror or error}") from None
    json_file = path.suffix.lower() == ".json"
    try:
        if json_file:
            return json.loads(text)
        import yaml

        return yaml.safe_load(text)
    except Exception as error:  # yaml and json raise their own error types
        reason = " ".join(str(error).split())
        raise DiffmeterError(f"{what} {path} is not valid {'JSON' if json_file else 'YAML'}: {reason}") from None


def read_config_file(path: str | Path) -> dict[str, Any]:
    """A YAML or JSON file of bench options (names as on the command line, - or _)."""
    path = Path(path).expanduser()
    data = read_yaml_or_json(path, "config file")
    if not isinstance(data, dict):
        raise DiffmeterError(f"config file {path} must hold a mapping of option: value")
    return {key.replace("-", "_"): value for key, value in data.items()}


def memory_setting_specs(setting: tuple[str, ...]) -> list[OptimizationSpec]:
    """The techniques of a memory setting as ``predict.techniques`` names them ("offload-model",
    "quantize-fp8", "vae-tiling" ...), as ``bench`` is asked for them: formats of one backend and type on several
    components as one technique holding them, as ``--quantize`` groups its values."""
    specs: list[OptimizationSpec | tuple[str, str, list[str]]] = []
    for label in setting:
        if label.startswith("offload-"):
            specs.append(OptimizationSpec(name="offload", params={"mode": label.removeprefix("offload-")}))
        elif label in ("quantize-int8", "quantize-fp8"):
            specs.append(OptimizationSpec(name="quantize", params={"weights": label.removeprefix("quantize-")}))
        elif label.startswith("compile-"):  # a compile mode fit offers (runs.fit_speedups): compile-reduce-overhead
            specs.append(OptimizationSpec(name="compile", params={"mode": label.removeprefix("compile-")}))
        elif label.startswith("quantize-"):  # a --quantize [NAME=]BACKEND:TYPE format (fit_formats)
            backend, kind, components = format_parts(label)
            same = next((s for s in specs if isinstance(s, tuple) and s[:2] == (backend, kind)), None)
            if same is None:
                specs.append((backend, kind, list(components) or [DENOISER]))
            else:
                same[2].extend(components or [DENOISER])
        else:
            specs.append(OptimizationSpec(name=label))
    return [spec if isinstance(spec, OptimizationSpec) else format_spec(*spec) for spec in specs]


def format_spec(backend: str, kind: str, components: list[str]) -> OptimizationSpec:
    """A backend's type on ``components`` as bench stores it (``--quantize``'s grouping)."""
    return OptimizationSpec(name=backend, params=with_components({"type": kind}, components))
