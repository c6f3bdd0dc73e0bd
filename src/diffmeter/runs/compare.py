"""Two stored runs (or two folders of runs, matched cell by cell) against each other: how many times
faster B is than A per stage, with an exact interval from every measured call of both, whether that
is within noise, and what B costs in memory, energy and image quality (``diffmeter compare``)."""

from __future__ import annotations

import statistics
from pathlib import Path

from pydantic import BaseModel

from diffmeter.errors import DiffmeterError
from diffmeter.measure.environment import speed_differences, speed_settings
from diffmeter.measure.quality_schema import Quality
from diffmeter.measure.speedup import Criteria, Verdict
from diffmeter.quiet import quiet_import
from diffmeter.runs import collect, speedups, storage
from diffmeter.runs.results import BenchResult

#: spec fields that say how a run was stored, not what it measured
_NOT_SETTINGS = ("compare_baseline",)


#: stages compared (the speed-up's rule in runs.speedups names them)
STAGES = speedups.STAGES


class StageComparison(BaseModel):
    """One stage of A and B: medians in seconds per image, and B's speed-up over A (``runs.speedups``: the
    Hodges-Lehmann estimate over every pair of calls, which is not the ratio of the two medians)."""

    stage: str
    a_s_per_image: float
    b_s_per_image: float
    #: A's time / B's time: above 1, B is faster
    speedup: float
    ci_low: float
    ci_high: float
    #: the probability the interval covers the true ratio (below the asked 95% with few calls)
    ci_level: float
    verdict: Verdict
    #: the coverage asked (--confidence): below it no verdict, "within noise: too few calls"
    ci_asked: float | None = None


class RunComparison(BaseModel):
    """Run B against run A (folders relative to what was compared)."""

    a: str
    b: str
    model: str
    #: where each side's weights came from (results.json's ``weights``): tiny or random ones say their timings are
    #: not the real model's
    a_weights: str = ""
    b_weights: str = ""
    a_weights_random: bool = False
    b_weights_random: bool = False
    #: spec fields whose values differ, as "field: A -> B", then what else changes speed ("torch threads: 2 -> 1",
    #: the device's name, library versions: ``measure.environment.speed_settings``)
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
    #: A's and B's own notes on noise in their timings ("A: noisy: ..."), which every speed-up here carries
    noise: list[str] = []


class Comparison(BaseModel):
    """Everything compared: matched pairs, and what only one side holds."""

    a: str
    b: str
    method: str
    criteria: Criteria
    pairs: list[RunComparison]
    only_a: list[str] = []
    only_b: list[str] = []
    #: a line per results.json of a matched pair that could not be read, its pair left out
    skipped: list[str] = []


def compare_paths(a: str | Path, b: str | Path, images: bool = True, criteria: Criteria | None = None) -> Comparison:
    """Two run folders, or two folders of runs matched by their run folder's path."""
    criteria = criteria or Criteria()
    if not 0.5 <= criteria.confidence < 1:
        raise DiffmeterError(
            f"--confidence {criteria.confidence}: give a coverage between 0.5 and 1, such as 0.95 or 0.99"
        )
    if not 0 <= criteria.min_effect < 10:
        raise DiffmeterError(f"--min-effect {criteria.min_effect}: give a fraction such as 0.05 (5%) or 0 (none)")
    a, b = Path(a).expanduser(), Path(b).expanduser()
    for path in (a, b):
        try:
            exists = path.exists()
        except OSError as error:  # a name too long, a path through a file
            raise DiffmeterError(f"{path}: {error.strerror}; point at a run folder or a folder of runs") from None
        if not exists:
            raise DiffmeterError(f"{path} does not exist; point at a run folder or the --out folder of a sweep")
    if a.resolve() == b.resolve():
        raise DiffmeterError(f"A and B are both {a}: a run against itself is 1x by construction; name two runs")
    if _is_run(a) and _is_run(b):
        pairs = [compare_runs(storage.read_result(a), storage.read_result(b), a.name, b.name, images, criteria)]
        return Comparison(a=str(a), b=str(b), method=criteria.method, criteria=criteria, pairs=pairs)
    if _is_run(a) or _is_run(b):
        raise DiffmeterError(f"compare two run folders or two folders of runs; {a} and {b} are one of each")
    runs_a, runs_b = _runs(a), _runs(b)
    for path, found in ((a, runs_a), (b, runs_b)):
        if not found:
            raise DiffmeterError(f"{path} holds no stored run; point at a run folder or the --out folder of a sweep")
    matched = sorted(set(runs_a) & set(runs_b))
    if not matched:
        raise DiffmeterError(
            f"no run folder of {a} has a namesake in {b}; runs are matched by their folder names "
            "(the same sweep file run twice gives the same names)"
        )
    pairs, skipped = [], []
    for name in matched:  # one unreadable results.json does not hide the other pairs
        read = collect.readable_results([runs_a[name] / storage.RESULTS, runs_b[name] / storage.RESULTS], skipped)
        if len(read) == 2:
            pairs.append(compare_runs(read[0][1], read[1][1], name, name, images, criteria))
    return Comparison(
        a=str(a),
        b=str(b),
        method=criteria.method,
        criteria=criteria,
        pairs=pairs,
        only_a=sorted(set(runs_a) - set(runs_b)),
        only_b=sorted(set(runs_b) - set(runs_a)),
        skipped=skipped,
    )


def compare_runs(
    a: BenchResult, b: BenchResult, a_name: str, b_name: str, images: bool = True, criteria: Criteria | None = None
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
    criteria = criteria or Criteria()
    stages = [stage for name in STAGES if (stage := _stage(a, b, name, criteria)) is not None]
    return RunComparison(
        a=a_name,
        b=b_name,
        model=a.model.name,
        a_weights=a.weights,
        b_weights=b.weights,
        a_weights_random=a.weights_random,
        b_weights_random=b.weights_random,
        differences=_differences(a, b),
        stages=stages,
        a_peak_memory_bytes=_memory(a, memory_kind),
        b_peak_memory_bytes=_memory(b, memory_kind),
        memory_kind=memory_kind,
        a_energy_j_per_image=_energy(a, energy_kind),
        b_energy_j_per_image=_energy(b, energy_kind),
        energy_kind=energy_kind,
        quality=quality,
        notes=notes,
        noise=[f"A: {note}" for note in speedups.noise_notes(a)]
        + [f"B: {note}" for note in speedups.noise_notes(b)]
        + ([drift.note] if (drift := speedups.machine_drift(a, b)) else []),  # it widened every interval above
    )


def _is_run(path: Path) -> bool:
    return (path / storage.RESULTS).is_file() or (path.is_file() and path.name == storage.RESULTS)


def _runs(root: Path) -> dict[str, Path]:
    return {str(path.parent.relative_to(root)): path.parent for path in collect.find_results(root)}


def _stage(a: BenchResult, b: BenchResult, name: str, criteria: Criteria) -> StageComparison | None:
    found = speedups.between(a, b, name, criteria, names=("A", "B"))
    if found is None:  # a stage one of them does not have (no text encoder)
        return None
    return StageComparison(
        stage=name,
        a_s_per_image=statistics.median(speedups.per_image(a, name)),
        b_s_per_image=statistics.median(speedups.per_image(b, name)),
        speedup=found.estimate,
        ci_low=found.low,
        ci_high=found.high,
        ci_level=found.coverage,
        verdict=found.verdict,
        ci_asked=found.asked,
    )


def _differences(a: BenchResult, b: BenchResult) -> list[str]:
    left, right = a.spec.model_dump(mode="json"), b.spec.model_dump(mode="json")
    keys = [key for key in left if key not in _NOT_SETTINGS]
    changed = [f"{key}: {left[key]} -> {right.get(key)}" for key in keys if left[key] != right.get(key)]
    changed += speed_differences(*(speed_settings(r.environment, r.spec.device) for r in (a, b)))
    if a.fp32_precision != b.fp32_precision:  # TF32 or IEEE float32 on CUDA
        changed.append(f"fp32_precision: {a.fp32_precision} -> {b.fp32_precision}")
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
    for folder, image in [(b.folder, i) for i in pairs] + [(a.folder, reference[i.seed]) for i in pairs]:
        if not (folder / image.path).is_file():
            return None, f"{folder / image.path} is missing"
    if b.quality is not None and Path(b.quality.baseline).resolve() == Path(a.folder).resolve():
        return b.quality, None  # B was measured against A itself (--compare-baseline): its comparison is stored
    with quiet_import():  # torch and torchmetrics, only when images are compared
        from diffmeter.runs.baseline import compare_with_baseline

    try:
        return compare_with_baseline(b, b.folder, a, a.folder), None
    except (OSError, ValueError) as error:  # an image file that cannot be read (truncated, not an image)
        return None, f"an image could not be read ({error})"
