"""The registry of techniques, and the checks run before anything is loaded."""

from __future__ import annotations

from pydantic import ValidationError

from diffmeter.errors import DiffmeterError, MissingPackage
from diffmeter.optimize.base import Optimization, OptimizationSpec, Target

REGISTRY: dict[str, type[Optimization]] = {}
#: the order techniques are applied in: samplers and weights first, caches on the final
#: modules, compilation in place before offloading wraps the compiled methods in its hooks
ORDER = ("scheduler", "precision", "fusion", "quantization", "attention", "cache", "compile", "memory")


def register(cls: type[Optimization]) -> type[Optimization]:
    REGISTRY[cls.name] = cls
    return cls


def build(specs: list[OptimizationSpec]) -> list[Optimization]:
    """Instantiate techniques by name; unknown names and parameters are one clear line."""
    built = []
    for spec in specs:
        cls = REGISTRY.get(spec.name)
        if cls is None:
            import difflib

            close = difflib.get_close_matches(spec.name, REGISTRY, n=3)
            hint = f" Did you mean {', '.join(close)}?" if close else ""
            raise DiffmeterError(
                f"unknown optimization '{spec.name}'.{hint} Run `diffmeter optimizations` for the list"
            )
        try:
            built.append(cls(cls.Config(**spec.params)))
        except ValidationError as error:
            raise DiffmeterError(f"{spec.name}: {bad_parameter(error, spec.params, cls.Config)}") from None
    return sorted(built, key=lambda optimization: ORDER.index(optimization.kind))


def bad_parameter(error: ValidationError, params: dict, config) -> str:
    """What is wrong with a technique's parameters, as a user reads it: the value given and what it should be;
    its parameters listed where a name is wrong or missing."""
    problem = error.errors()[0]
    where = ".".join(map(str, problem["loc"])) or "parameters"
    said = str(problem["ctx"]["error"]) if problem["type"] == "value_error" else problem["msg"]
    said = said[0].lower() + said[1:]
    fields = f" (its parameters: {', '.join(config.model_fields) or 'none'})"
    if problem["type"] in ("extra_forbidden", "missing") or where not in params:
        return f"bad parameter {where}: {said}{fields}"
    return f"bad parameter {where} {params[where]!r}: {said}"


def check(optimizations: list[Optimization], target: Target, missing_ok: bool = False) -> None:
    """Refuse a missing package, an unsupported model or a clashing pair, with the reason; ``missing_ok``: a package
    missing here is not refused (a run predicted for a machine that may have it)."""
    seen: dict[str, str] = {}
    for optimization in optimizations:
        if optimization.name in seen.values():
            raise DiffmeterError(f"{optimization.name} is asked for twice")
        if optimization.exclusive and optimization.kind in seen:
            raise DiffmeterError(
                f"{seen[optimization.kind]} and {optimization.name} are both {optimization.kind} techniques; pick one"
            )
        seen[optimization.kind if optimization.exclusive else optimization.name] = optimization.name
        reason, missing = optimization.refusal(target)
        if missing and missing_ok:
            continue
        if missing:
            raise MissingPackage(f"{optimization.name} would apply to {target.entry.name}, but {reason}")
        if reason:
            raise DiffmeterError(f"{optimization.name} cannot be used with {target.entry.name}: {reason}")
    quantized: dict[str, str] = {}
    for optimization in optimizations:
        for name in optimization.quantized_components(target):
            if name in quantized:
                raise DiffmeterError(f"{quantized[name]} and {optimization.label()} both quantize {name}: keep one")
            quantized[name] = optimization.label()
    for optimization in optimizations:
        clash = optimization.clashes([other for other in optimizations if other is not optimization])
        if clash:
            raise DiffmeterError(clash)
