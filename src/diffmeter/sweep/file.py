"""The sweep file: axes, fixed options, include/exclude rules; expanded into cells.

```yaml
name: resolution-study          # optional; names the sweep's record (default: the file's name)
axes:                           # every combination of these values is a cell
  model: [sd15, sdxl]
  batch_size: [1, 2, 4]         # or "auto": double until out of memory
  size: [512, 1024]             # or "768x512" (width x height); also height / width alone
  optimizations: ["", compile, "compile+deep-cache:cache_interval=3"]
fixed:                          # the same for every cell: any other bench option
  iterations: 5
  compare_baseline: true
exclude:                        # cells matching every key given are dropped
  - {model: sd15, size: 1024}
include:                        # extends the cells it matches on the axes it names, else adds one
  - {model: flux-dev, size: 1024, optimizations: ""}
timeout_s: 1800                 # per cell; a cell over it is stopped and stored as failed
```
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, field_validator

from diffmeter.errors import DiffmeterError, validation_problem
from diffmeter.optimize import build
from diffmeter.optimize.base import OptimizationSpec
from diffmeter.optimize.options import parse_opt, read_yaml_or_json
from diffmeter.runs.spec import BenchSpec

#: axes that are not BenchSpec fields, and what they set
SPECIAL_AXES = {"size": "height and width (512, or WIDTHxHEIGHT)", "optimizations": "techniques joined by +"}
#: BenchSpec fields a sweep sets itself
_NOT_OPTIONS = {"model", "optimizations"}
AUTO = "auto"


def bench_options() -> set[str]:
    return set(BenchSpec.model_fields)


class SweepFile(BaseModel):
    """A study: every combination of ``axes``, with ``fixed`` options, filtered by ``exclude``,
    extended by ``include``."""

    model_config = ConfigDict(extra="forbid")

    name: str | None = None
    axes: dict[str, list[Any]] = Field(description="option name -> the values it takes; every combination is a cell")
    fixed: dict[str, Any] = Field(default={}, description="bench options shared by every cell")
    include: list[dict[str, Any]] = Field(default=[], description="cells to extend or add, as option -> value")
    exclude: list[dict[str, Any]] = Field(default=[], description="cells to drop: those matching every key given")
    timeout_s: float | None = Field(default=None, gt=0, description="seconds a cell may run before it is stopped")
    batch_limit: int = Field(default=256, ge=1, description="batch_size auto: the largest batch tried")

    @field_validator("axes")
    @classmethod
    def _axes_have_values(cls, axes: dict[str, list[Any]]) -> dict[str, list[Any]]:
        for name, values in axes.items():
            if not values:
                raise ValueError(f"axis '{name}' has no values")
        return axes


def read_sweep_file(path: str | Path) -> SweepFile:
    """A YAML or JSON sweep file; one clear line naming what is wrong in it."""
    path = Path(path).expanduser()
    data = read_yaml_or_json(path, "sweep file")
    if not isinstance(data, dict):
        raise DiffmeterError(f"sweep file {path}: expected a mapping with 'axes' (and 'fixed', 'include', 'exclude')")
    try:
        sweep = SweepFile.model_validate(data)
    except ValidationError as error:
        problems = error.errors()  # an unknown key first: 'axis:' for 'axes:' is also a missing 'axes'
        problem = next((p for p in problems if p["type"] == "extra_forbidden"), problems[0])
        where = ".".join(str(part) for part in problem["loc"])
        if problem["type"] == "extra_forbidden":
            known = ", ".join(SweepFile.model_fields)
            raise DiffmeterError(f"sweep file {path}: unknown key '{where}' (the keys are {known})") from None
        raise DiffmeterError(f"sweep file {path}: {validation_problem(error, 'the file as a whole')}") from None
    check_options(sweep, str(path))
    return sweep.model_copy(update={"name": sweep.name or path.stem})


def check_options(sweep: SweepFile, where: str) -> None:
    """Every axis, fixed option and rule key is a bench option (or size/optimizations)."""
    known = bench_options() | set(SPECIAL_AXES)
    places = [("axes", sweep.axes), ("fixed", sweep.fixed)]
    places += [(f"include[{i}]", rule) for i, rule in enumerate(sweep.include)]
    places += [(f"exclude[{i}]", rule) for i, rule in enumerate(sweep.exclude)]
    for place, options in places:
        for key in options:
            if key not in known:
                raise DiffmeterError(
                    f"{where}: unknown option '{key}' in {place}; use bench option names "
                    f"(model, batch_size, height, width, steps, guidance_scale, dtype, ...), size or optimizations"
                )
    for key in set(sweep.axes) & set(sweep.fixed):
        raise DiffmeterError(f"{where}: '{key}' is both an axis and fixed; keep it in one place")
    if "model" not in sweep.axes and "model" not in sweep.fixed:
        raise DiffmeterError(f"{where}: no model; add an axis 'model: [...]' or 'fixed: {{model: ...}}'")
    for place, options in places:  # a misspelt technique or parameter is the file's error, not a refused cell
        if "optimizations" not in options:
            continue
        values = options["optimizations"]
        for value in values if place == "axes" else [values]:
            try:
                build(parse_optimizations(value))
            except DiffmeterError as error:
                raise DiffmeterError(f"{where}: optimizations {_show(value)} in {place}: {error}") from None
    for place, options in places:  # a value of the wrong type is the file's error, named where it is written
        for key, value in options.items():
            for one in value if place == "axes" else [value]:
                _check_value(where, place, key, one)


#: bench options whose own validator turns what a file writes into their type (image sizes as "40x24")
_CONVERTED = {
    name for found in BenchSpec.__pydantic_decorators__.field_validators.values() for name in found.info.fields
}


def _check_value(where: str, place: str, key: str, value: Any) -> None:
    """``value`` has the type of bench's option ``key`` (a sweep's own keys, size and optimizations, apart)."""
    if key in SPECIAL_AXES or key in _CONVERTED or (key == "batch_size" and value == AUTO):
        return  # a field its own validator reads ("40x24" image sizes): checked as the cell's spec is built
    try:
        TypeAdapter(BenchSpec.model_fields[key].annotation).validate_python(value)
    except ValidationError as error:
        raise DiffmeterError(f"{where}: {key} {_show(value)} in {place}: {error.errors()[0]['msg']}") from None


class Cell(BaseModel):
    """One combination: the values of the axes (as written) and the bench spec they make."""

    model_config = ConfigDict(frozen=True)

    values: dict[str, Any]
    spec: BenchSpec
    #: batch_size "auto": the batch doubles from 1 until out of memory, up to ``batch_limit``
    batch_auto: bool = False
    batch_limit: int = 256

    @property
    def label(self) -> str:
        return " ".join(f"{key}={_show(value)}" for key, value in self.values.items())


def _show(value: Any) -> str:
    return '""' if value == "" else str(value)


def expand(sweep: SweepFile) -> list[Cell]:
    """Every combination of the axes, minus ``exclude``, extended or added to by ``include``."""
    names = list(sweep.axes)
    combinations = [dict(zip(names, values, strict=True)) for values in itertools.product(*sweep.axes.values())]
    combinations = [c for c in combinations if not any(_matches(c, rule) for rule in sweep.exclude)]
    for rule in sweep.include:
        on_axes = {key: value for key, value in rule.items() if key in names}
        matched = [combination for combination in combinations if _matches(combination, on_axes)]
        for combination in matched:
            combination.update({key: value for key, value in rule.items() if key not in names})
        if not matched:
            combinations.append(dict(rule))
    cells, seen = [], set()
    for values in combinations:
        cell = make_cell(values, sweep.fixed, sweep.batch_limit)
        key = cell.spec.model_dump_json() + str(cell.batch_auto)
        if key not in seen:  # two rules producing the same run: one cell
            seen.add(key)
            cells.append(cell)
    return cells


def _matches(combination: dict[str, Any], rule: dict[str, Any]) -> bool:
    return all(key in combination and _same(combination[key], value) for key, value in rule.items())


def _same(a: Any, b: Any) -> bool:
    return a == b or str(a) == str(b)


def make_cell(values: dict[str, Any], fixed: dict[str, Any], batch_limit: int = 256) -> Cell:
    """The bench spec of ``fixed`` options plus one combination's ``values``."""
    settings = {**fixed, **values}
    options: dict[str, Any] = {}
    batch_auto = settings.get("batch_size") == AUTO
    for key, value in settings.items():
        if key == "size":
            options.update(_size(value))
        elif key == "optimizations":
            options["optimizations"] = parse_optimizations(value)
        elif key == "batch_size" and batch_auto:
            options["batch_size"] = 1
        else:
            options[key] = value
    try:
        spec = BenchSpec(**options)
    except ValidationError as error:
        raise DiffmeterError(f"cell {_describe(values)}: {validation_problem(error, 'its options')}") from None
    return Cell(values=values, spec=spec, batch_auto=batch_auto, batch_limit=batch_limit)


def _describe(values: dict[str, Any]) -> str:
    return " ".join(f"{key}={_show(value)}" for key, value in values.items()) or "(fixed options only)"


def _size(value: Any) -> dict[str, int]:
    text = str(value).lower().replace(" ", "")
    try:
        if "x" in text:
            width, height = (int(part) for part in text.split("x"))
            return {"width": width, "height": height}
        return {"height": int(text), "width": int(text)}
    except ValueError:
        raise DiffmeterError(f"size '{value}': write 512 (square) or WIDTHxHEIGHT such as 768x512") from None


def parse_optimizations(value: Any) -> list[OptimizationSpec]:
    """``""`` (none), ``"compile+deep-cache:cache_interval=3"``, or a list of such names."""
    if value is None:
        return []
    if isinstance(value, list):
        return [spec for item in value for spec in parse_optimizations(item)]
    return [parse_opt(part) for part in str(value).split("+") if part.strip()]


def json_schema() -> dict:
    """The sweep file's JSON Schema (shipped as docs/sweep.schema.json)."""
    schema = SweepFile.model_json_schema()
    option = {"description": "a bench option (see `diffmeter bench --help`, names with _), size or optimizations"}
    names = sorted((bench_options() - _NOT_OPTIONS) | set(SPECIAL_AXES) | {"model"})
    schema["properties"]["axes"]["propertyNames"] = {"enum": names}
    schema["properties"]["fixed"]["propertyNames"] = {"enum": names}
    for rule in ("include", "exclude"):
        schema["properties"][rule]["items"]["propertyNames"] = {"enum": names}
    schema["properties"]["axes"]["additionalProperties"] = {"type": "array", "minItems": 1, **option}
    schema["title"] = "diffmeter sweep file"
    return schema
