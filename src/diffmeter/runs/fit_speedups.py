"""The speed-ups ``fit`` and the leaderboard combine with each memory setting that fits, the way bench can:
torch.compile in its default mode and with CUDA graphs (reduce-overhead), a first-block cache at diffusers' default
threshold, compile with the cache, each named with its parameters (``optimization``). Each setting is timed as
``profile --gpu --opt`` times it: the setting's operator work (a timed quantized format's layers, a tiled or sliced
decode's operators) through ``timed_techniques.timed_work``, the calibrated range (``roofline.predict_time``) and
offloading's transfers at their fitted rates (``offload_time``); settings are ranked by that range's midpoint. A
setting with a technique whose time is not modelled has no range, says why, and is not ranked: it follows the ranked
ones, by its lower bound."""

from __future__ import annotations

import math
from dataclasses import dataclass

from diffmeter.predict.cache_threshold import DEFAULT_THRESHOLD
from diffmeter.predict.technique_names import format_parts, quantize_values
from diffmeter.predict.techniques import borderline
from diffmeter.quantization_spec import BACKENDS

#: the speed-ups offered, as a setting names them, and the optimization each is (bench's ``--opt NAME:PARAMS``),
#: its parameters as bench runs it by default (optimize/compile.py's and optimize/first_block_cache.py's Config)
SPEEDUPS = {
    "compile": ("compile", {"mode": "default"}),
    "compile-reduce-overhead": ("compile", {"mode": "reduce-overhead"}),
    "first-block-cache": ("first-block-cache", {"threshold": DEFAULT_THRESHOLD["first-block-cache"]}),
}
#: what each memory setting is offered with (bench refuses CUDA graphs with a cache: ``optimize.compile``)
COMBINATIONS = (
    (),
    ("compile",),
    ("compile-reduce-overhead",),
    ("first-block-cache",),
    ("compile", "first-block-cache"),
)


@dataclass
class Timed:
    """A setting's predicted time (``TimePrediction``) where every technique of it is timed, else why not."""

    time: object | None = None
    why: str | None = None
    #: a lower bound where there is no range: an offload with no fitted link rate, the setting's own work (its
    #: speed-ups in it) timed with the transfers at the datasheet rate
    lower: float | None = None

    @property
    def midpoint(self) -> float | None:
        expected = self.time.expected_s if self.time is not None else None
        return (expected[0] * expected[1]) ** 0.5 if expected else None


def with_speedups(fits: list[tuple[tuple[str, ...], int]]) -> list[tuple[tuple[str, ...], int]]:
    """Each fitting memory setting with every combination of speed-ups, at the memory setting's peak."""
    return [(chosen + extra, peak) for chosen, peak in fits for extra in COMBINATIONS]


def is_speedup(technique: str) -> bool:
    return technique in SPEEDUPS


def optimization(technique: str) -> str:
    """A speed-up as bench's ``--opt`` takes it, its parameters named: ``first-block-cache:threshold=0.05``."""
    name, params = SPEEDUPS[technique]
    return ":".join([name, ",".join(f"{key}={value}" for key, value in params.items())])


def setting_name(chosen: tuple[str, ...]) -> str:
    """A setting as ``fit`` names it, every technique with its parameters: a ``--quantize BACKEND:TYPE`` format as
    that value (``gguf:Q4_K_S``), a speed-up as bench's ``--opt`` takes it (``first-block-cache:threshold=0.05``),
    joined by " + "; "" for the plain pipeline."""
    from diffmeter.predict.fit_formats import label

    def named(technique: str) -> str:
        if is_speedup(technique):
            return optimization(technique)
        legacy = technique in ("quantize-int8", "quantize-fp8")
        return label(technique) if technique.startswith("quantize-") and not legacy else technique

    return " + ".join(map(named, chosen))


def bench_flags(chosen: tuple[str, ...]) -> str:
    """A setting as ``bench`` options that run it: ``--offload model --quantize gguf:Q4_K_S --weights FILE.gguf
    --vae-tiling --opt compile:mode=reduce-overhead`` (a GGUF format's published file for FILE); "" for the plain
    pipeline."""

    def flag(technique: str) -> str:
        if is_speedup(technique):
            return f"--opt {optimization(technique)}"
        if technique in ("quantize-int8", "quantize-fp8"):  # torchao after loading, --quantize's bare names
            return f"--quantize {technique.removeprefix('quantize-')}"
        if technique.startswith("quantize-"):
            backend = BACKENDS.get(format_parts(technique)[0])
            pre = backend is not None and backend.single_file  # GGUF: the published file, loaded as users load it
            values = " ".join(f"--quantize {value}" for value in quantize_values(technique))
            return values + (" --weights FILE.gguf" if pre else "")
        if technique.startswith("offload-"):
            return f"--offload {technique.removeprefix('offload-')}"
        return f"--{technique}"  # vae-tiling, vae-slicing, fp8-text-encoder: bench's flags of the same names

    return " ".join(map(flag, chosen))


def asked(chosen: tuple[str, ...]) -> list[tuple[str, dict]]:
    """The setting's speed-ups as (optimization name, params), as ``timed_work`` takes them."""
    return [SPEEDUPS[t] for t in chosen if t in SPEEDUPS]


class SettingWork:
    """Per setting, the operator work its time is predicted from, or why it has none; the counts shared by every
    GPU (a quantized format's layers, a decode mode's operators) computed once."""

    def __init__(self, work, prediction, spec, denoisers: tuple[str, ...]) -> None:
        self.work, self.prediction, self.spec, self.denoisers = work, prediction, spec, denoisers
        self.found: dict[tuple[str, ...], tuple[object | None, str | None]] = {}
        self.bases: dict[tuple[str, ...], tuple[object | None, str | None]] = {}
        self.decoded: dict[tuple[str, ...], object] = {}

    def of(self, chosen: tuple[str, ...]) -> tuple[object | None, str | None]:
        if chosen not in self.found:
            self.found[chosen] = self._made(chosen)
        return self.found[chosen]

    def _made(self, chosen: tuple[str, ...]) -> tuple[object | None, str | None]:
        from diffmeter.predict.timed_techniques import timed_work
        from diffmeter.predict.vae_decode import VAE_MODES

        if "fp8-text-encoder" in chosen:  # the setting's work without it, and its layers' casts in each encoder call
            from diffmeter.predict.layerwise_casting import cast_work

            work, why = self.of(tuple(t for t in chosen if t != "fp8-text-encoder"))
            if work is None:
                return None, why
            return cast_work(work, self.spec, self.prediction.large_text_encoders), None
        base = tuple(t for t in chosen if t in VAE_MODES or t.startswith("quantize-"))
        if base not in self.bases:  # the work without speed-ups, shared by every speed-up of the setting
            modes = tuple(t for t in base if t in VAE_MODES)
            self.bases[base] = self._base(modes, [t for t in base if t not in modes])
        work, why = self.bases[base]
        if work is None:
            return None, why
        work, _, untimed = timed_work(work, asked(chosen), self.denoisers, self.spec)
        return (None, "; ".join(untimed)) if untimed else (work, None)

    def _base(self, modes: tuple[str, ...], formats: list[str]) -> tuple[object | None, str | None]:
        """The work with its decode as ``modes`` runs it and each of ``formats``' quantized layers as its backend
        runs them (remembered on disk: a meta build of each component a format names), or why it has none."""
        from diffmeter import cache
        from diffmeter.predict.cached import cache_key
        from diffmeter.predict.schema import OperatorWork
        from diffmeter.runs.fitting import why_untimed_format

        for name in formats:
            if why := why_untimed_format(name):
                return None, f"{name}: {why}"
        if not formats:
            return self._decoded(modes) if modes else self.work, None
        key = {"spec": cache_key(self.spec), "modes": list(modes), "formats": formats}
        stored = cache.load("quantized-work", key)
        if stored is not None:
            return OperatorWork.model_validate(stored), None
        from diffmeter.predict.quantized_memory import Format
        from diffmeter.predict.quantized_work import quantized_work

        work = quantized_work(self._decoded(modes) if modes else self.work, self.spec, list(map(Format.named, formats)))
        cache.store("quantized-work", key, work.model_dump(mode="json"))
        return work, None

    def _decoded(self, modes: tuple[str, ...]):
        """The generation's work with its decode as ``modes`` runs it (a fake run, unless cached on disk)."""
        if modes not in self.decoded:
            from diffmeter.predict.cached import cached_work

            found = cached_work(self.spec, modes)
            if found is None:
                from diffmeter.predict.operators import operator_work

                found = operator_work(self.spec, modes)
            self.decoded[modes] = found
        return self.decoded[modes]


def timed(setting_work: SettingWork, chosen: tuple[str, ...], gpu, tf32: bool = True, outputs: int = 1) -> Timed:
    """``chosen``'s predicted time on ``gpu``, or why it has none."""
    from diffmeter.predict.offload_time import lower_s, offload_of, with_offload
    from diffmeter.predict.offload_time import why_untimed as offload_untimed
    from diffmeter.runs.fitting import plain_time

    work, why = setting_work.of(chosen)
    if work is None:
        return Timed(why=why)
    prediction = setting_work.prediction
    if why := offload_untimed(chosen, gpu.host_link_bytes_per_s):
        return Timed(why=why, lower=untimed_offload_lower(work, prediction, chosen, gpu, outputs, tf32))
    time = plain_time(work, prediction, gpu, outputs, tf32)
    if time is None or time.expected_s is None:  # the bound of the setting's own work and its transfers
        lower = None if time is None else lower_s(time.lower_s, prediction, chosen, gpu.host_link_bytes_per_s)
        return Timed(why=f"no calibrated range for the {gpu.name}", lower=lower)
    if offload_of(chosen):
        time = with_offload(time, prediction, chosen, gpu.host_link, gpu.host_link_bytes_per_s)
    return Timed(time=time)


def untimed_offload_lower(work, prediction, chosen: tuple[str, ...], gpu, outputs: int, tf32: bool) -> float | None:
    """The lower bound of a setting whose offload has no fitted link rate: its work's (a cache's skipped calls and
    compile's fusion in it), with the transfers at the datasheet rate where they bound it
    (``offload_time.untimed_lower_s``: a cache's skipped calls move none of their weights); None without the card's
    host link or figures."""
    from diffmeter.predict.offload_time import untimed_lower_s
    from diffmeter.runs.fitting import plain_time

    time = plain_time(work, prediction, gpu, outputs, tf32) if gpu.host_link_bytes_per_s else None
    if time is None:
        return None
    return untimed_lower_s(time, prediction, chosen, gpu.host_link_bytes_per_s)


def rank_key(peak: int, usable: int | None, midpoint: float | None, lower: float | None) -> tuple:
    """Where a setting that fits ranks: those with an expected range by its midpoint, then the rest by their lower
    bound (none last); in each, one with room to spare before one whose peak is within the memory prediction's
    checked error of ``usable`` (``borderline``: a real run may not fit)."""
    close = usable is not None and borderline(peak, usable)
    return (midpoint is None, close, midpoint if midpoint is not None else (lower if lower is not None else math.inf))


def ranked(rows: list, times: dict[tuple[str, ...], Timed], usable: int | None = None) -> list:
    """``rows`` ((setting, peak, lower bound) each) ranked by ``rank_key`` against ``usable`` bytes, each group
    keeping its order among equal times."""
    return sorted(
        rows, key=lambda row: rank_key(row[1], usable, times[row[0]].midpoint if row[0] in times else None, row[2])
    )


def quicker_borderline(hidden: list, first, times: dict[tuple[str, ...], Timed], usable: int) -> int:
    """How many of the ``hidden`` rows (past those shown) are borderline yet expected faster than ``first``, the
    first row shown: ranked after the settings with room to spare, they are not where a user looks."""
    best = times[first].midpoint if first in times else None
    return sum(
        1
        for chosen, peak, _ in hidden
        if borderline(peak, usable) and best and chosen in times and (times[chosen].midpoint or math.inf) < best
    )


def graphs_as_default(rows: list, times: dict[tuple[str, ...], Timed]) -> list[tuple[str, ...]]:
    """The settings with compile's CUDA graphs (reduce-overhead) predicted as the same setting in compile's default
    mode, to the same peak and times: the GPU's work already hides the host's launches the graphs remove, so the row
    says nothing its default-mode twin does not (and the graphs' memory pool is not counted)."""
    found = {row[0]: row for row in rows}
    same = []
    for chosen, peak, lower in rows:
        if "compile-reduce-overhead" not in chosen:
            continue
        twin = tuple("compile" if t == "compile-reduce-overhead" else t for t in chosen)
        expected = [times[c].time.expected_s if c in times and times[c].time else None for c in (chosen, twin)]
        if twin in found and found[twin][1:] == (peak, lower) and expected[0] == expected[1]:
            same.append(chosen)
    return same


def no_faster(rows: list, times: dict[tuple[str, ...], Timed], usable: int) -> set[tuple[str, ...]]:
    """The settings among ``rows`` ((setting, peak, lower bound) each) that add memory techniques to another row's
    setting, its speed-ups the same, and are not predicted faster than it (by the expected midpoint where the other
    has one, else by the lower bound; one without the figure is not shown faster): they only cost time. Kept where
    the other's peak is within the memory prediction's checked error of ``usable`` (``borderline``) and theirs is
    lower."""
    dropped = set()
    for chosen, peak, lower in rows:
        for kept, kept_peak, kept_lower in rows:
            added = set(chosen) - set(kept)
            if not set(kept) < set(chosen) or any(is_speedup(t) for t in added):
                continue
            if borderline(kept_peak, usable) and peak < kept_peak:
                continue
            mine, theirs = (times[c].midpoint if c in times else None for c in (chosen, kept))
            if theirs is not None:  # a range to beat: without one of its own it is not shown faster
                slower = mine is None or mine >= theirs
            elif mine is not None:
                slower = False
            else:  # neither has a range: by the lower bounds, and without one it is not shown faster
                slower = lower is None or (kept_lower is not None and lower >= kept_lower)
            if slower:
                dropped.add(chosen)
                break
    return dropped
