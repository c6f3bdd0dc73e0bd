"""Two stored runs (or two folders of runs, matched cell by cell) against each other: how many times
faster B is than A per stage, with an exact interval from every measured call of both, whether that
is within noise, and what B costs in memory, energy and image quality (``diffmeter compare``)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel

from diffmeter.errors import DiffmeterError
from diffmeter.measure.quality import Quality
from diffmeter.measure.stats import CONFIDENCE, speedup_interval
from diffmeter.runs import collect, storage
from diffmeter.runs.results import BenchResult

#: spec fields that say how a run was stored, not what it measured
_NOT_SETTINGS = ("compare_baseline",)


def _method(confidence: float) -> str:
    return (
        "Hodges-Lehmann estimate of the ratio of per-image times, with its exact Mann-Whitney interval "
        f"({confidence:.1%} asked; distribution-free, assuming B's times are A's scaled by one factor)"
    )


#: stages compared, as (name, how to read one call's seconds of it)
STAGES: dict[str, str] = {
    "call": "total_s",
    "text_encoding": "text_encoding_s",
    "denoising": "denoising_s",
    "vae_decode": "vae_decode_s",
    "other": "other_s",
}


class StageComparison(BaseModel):
    """One stage of A and B: medians in seconds per image, and B's speed-up over A."""

    stage: str
    a_s_per_image: float
    b_s_per_image: float
    #: A's time / B's time: above 1, B is faster
    speedup: float
    ci_low: float
    ci_high: float
    #: the probability the interval covers the true ratio (below the asked 95% with few calls)
    ci_level: float
    verdict: Literal["faster", "slower", "within noise"]


class RunComparison(BaseModel):
    """Run B against run A (folders relative to what was compared)."""

    a: str
    b: str
    model: str
    #: spec fields whose values differ, as "field: A -> B"
    differences: list[str]
    stages: list[StageComparison]
    #: bytes: peak CUDA allocation on GPU runs, else the process's peak resident memory
    a_peak_memory_bytes: int | None
    b_peak_memory_bytes: int | None
    memory_kind: str
    #: joules per image (GPU energy when measured, else CPU package energy)
    a_energy_j_per_image: float | None
    b_energy_j_per_image: float | None
    energy_kind: str | None
    #: B's images against A's at the same seed and prompt
    quality: Quality | None
    notes: list[str] = []


class Comparison(BaseModel):
    """Everything compared: matched pairs, and what only one side holds."""

    a: str
    b: str
    method: str
    pairs: list[RunComparison]
    only_a: list[str] = []
    only_b: list[str] = []


def compare_paths(a: str | Path, b: str | Path, images: bool = True, confidence: float = CONFIDENCE) -> Comparison:
    """Two run folders, or two folders of runs matched by their run folder's path."""
    if not 0.5 <= confidence < 1:
        raise DiffmeterError(f"--confidence {confidence}: give a coverage between 0.5 and 1, such as 0.95 or 0.99")
    a, b = Path(a).expanduser(), Path(b).expanduser()
    for path in (a, b):
        try:
            exists = path.exists()
        except OSError as error:  # a name too long, a path through a file
            raise DiffmeterError(f"{path}: {error.strerror}; point at a run folder or a folder of runs") from None
        if not exists:
            raise DiffmeterError(f"{path} does not exist; point at a run folder or the --out folder of a sweep")
    if _is_run(a) and _is_run(b):
        pairs = [compare_runs(storage.read_result(a), storage.read_result(b), a.name, b.name, images, confidence)]
        return Comparison(a=str(a), b=str(b), method=_method(confidence), pairs=pairs)
    if _is_run(a) or _is_run(b):
        raise DiffmeterError(f"compare two run folders or two folders of runs; {a} and {b} are one of each")
    runs_a, runs_b = _runs(a), _runs(b)
    matched = sorted(set(runs_a) & set(runs_b))
    if not matched:
        raise DiffmeterError(
            f"no run folder of {a} has a namesake in {b}; runs are matched by their folder names "
            "(the same sweep file run twice gives the same names)"
        )
    read = storage.read_result
    pairs = [compare_runs(read(runs_a[name]), read(runs_b[name]), name, name, images, confidence) for name in matched]
    return Comparison(
        a=str(a),
        b=str(b),
        method=_method(confidence),
        pairs=pairs,
        only_a=sorted(set(runs_a) - set(runs_b)),
        only_b=sorted(set(runs_b) - set(runs_a)),
    )


def compare_runs(
    a: BenchResult, b: BenchResult, a_name: str, b_name: str, images: bool = True, confidence: float = CONFIDENCE
) -> RunComparison:
    """B against A. Both must be complete runs of the same model."""
    for name, result in ((a_name, a), (b_name, b)):
        if result.status != "complete" or not result.iterations:
            raise DiffmeterError(f"{name} is a failed run ({result.error}); compare complete runs")
    if a.model.id != b.model.id:
        raise DiffmeterError(f"{a_name} ran {a.model.name} and {b_name} ran {b.model.name}; compare runs of one model")
    memory_kind = "cuda" if a.summary.peak_memory.cuda_max_allocated_bytes is not None else "rss"
    energy_kind = _energy_kind(a, b)
    notes = []
    quality = None
    if images:
        quality, why_not = _quality(a, b)
        if why_not:
            notes.append(f"images not compared: {why_not}")
    return RunComparison(
        a=a_name,
        b=b_name,
        model=a.model.name,
        differences=_differences(a, b),
        stages=[stage for name in STAGES if (stage := _stage(a, b, name, confidence)) is not None],
        a_peak_memory_bytes=_memory(a, memory_kind),
        b_peak_memory_bytes=_memory(b, memory_kind),
        memory_kind=memory_kind,
        a_energy_j_per_image=_energy(a, energy_kind),
        b_energy_j_per_image=_energy(b, energy_kind),
        energy_kind=energy_kind,
        quality=quality,
        notes=notes,
    )


def _is_run(path: Path) -> bool:
    return (path / storage.RESULTS).is_file() or (path.is_file() and path.name == storage.RESULTS)


def _runs(root: Path) -> dict[str, Path]:
    return {str(path.parent.relative_to(root)): path.parent for path in collect.find_results(root)}


def _per_image(result: BenchResult, field: str) -> list[float]:
    return [
        (iteration.total_s if field == "total_s" else getattr(iteration.stages, field)) / iteration.images
        for iteration in result.iterations
    ]


def _stage(a: BenchResult, b: BenchResult, name: str, confidence: float) -> StageComparison | None:
    a_times, b_times = _per_image(a, STAGES[name]), _per_image(b, STAGES[name])
    if min(a_times + b_times) <= 0:  # a stage one of them does not have (no text encoder)
        return None
    speedup, low, high, level = speedup_interval(a_times, b_times, confidence)
    verdict = "within noise" if low <= 1.0 <= high else "faster" if low > 1.0 else "slower"
    return StageComparison(
        stage=name,
        a_s_per_image=_median(a_times),
        b_s_per_image=_median(b_times),
        speedup=speedup,
        ci_low=low,
        ci_high=high,
        ci_level=level,
        verdict=verdict,
    )


def _median(values: list[float]) -> float:
    import statistics

    return statistics.median(values)


def _differences(a: BenchResult, b: BenchResult) -> list[str]:
    left, right = a.spec.model_dump(mode="json"), b.spec.model_dump(mode="json")
    keys = [key for key in left if key not in _NOT_SETTINGS]
    changed = [f"{key}: {left[key]} -> {right.get(key)}" for key in keys if left[key] != right.get(key)]
    labels = ["+".join(o.label for o in r.optimizations) or "none" for r in (a, b)]
    if labels[0] != labels[1]:
        changed = [line for line in changed if not line.startswith("optimizations:")]
        changed.insert(0, f"optimizations: {labels[0]} -> {labels[1]}")
    return changed


def _memory(result: BenchResult, kind: str) -> int | None:
    peak = result.summary.peak_memory
    return peak.cuda_max_allocated_bytes if kind == "cuda" else peak.process_peak_rss_bytes


def _energy_kind(a: BenchResult, b: BenchResult) -> str | None:
    for kind in ("gpu", "cpu"):
        if all(getattr(r.summary.energy, f"{kind}_j_per_image") is not None for r in (a, b)):
            return kind
    return None


def _energy(result: BenchResult, kind: str | None) -> float | None:
    return getattr(result.summary.energy, f"{kind}_j_per_image") if kind else None


def _quality(a: BenchResult, b: BenchResult) -> tuple[Quality | None, str | None]:
    """B's images against A's with the same seed, when both made the same images."""
    size = ("width", "height", "num_frames")
    if any(getattr(a.spec, key) != getattr(b.spec, key) for key in size):
        return None, "the sizes differ"
    if not a.images or not b.images:
        return None, "a run saved no images"
    reference = {image.seed: image for image in a.images}
    pairs = [image for image in b.images if image.seed in reference]
    if not pairs:
        return None, "no seed in common"
    if any((i.prompt, i.class_label) != (reference[i.seed].prompt, reference[i.seed].class_label) for i in pairs):
        return None, "the same seeds were given different prompts"
    from diffmeter.runs.runner import compare_with_baseline

    return compare_with_baseline(b, b.folder, a, a.folder), None
