"""The check phase of a measured run: every refusal that needs no weights, made before a folder is
created or a weight is loaded, and what every result of the checked run records, measured or not."""

from __future__ import annotations

import dataclasses
from datetime import datetime, timezone
from pathlib import Path

import torch

from diffmeter.catalog import PipelineEntry, entry_of
from diffmeter.families import get_family
from diffmeter.flops.profile import Profile, profile_spec
from diffmeter.measure.environment import collect
from diffmeter.optimize import Target, build, check
from diffmeter.runs import storage
from diffmeter.runs.memory_check import check_fits
from diffmeter.runs.parallel_support import check as check_parallel
from diffmeter.runs.prompts import read_prompts
from diffmeter.runs.results import AppliedOptimization, BenchResult, ModelInfo
from diffmeter.runs.run_directory import RunDirectory
from diffmeter.runs.spec import BenchSpec
from diffmeter.spec import paired_size
from diffmeter.weights import WeightsSource, locate_weights


@dataclasses.dataclass
class PreparedRun:
    """A run checked before anything loads: settled spec, offline profile, techniques, weights, folder name."""

    spec: BenchSpec
    entry: PipelineEntry
    profile: Profile
    target: Target
    optimizations: list
    source: WeightsSource
    name: str
    #: what the settling changed of the request, said in the result (``--compare-baseline`` with nothing to compare)
    settled: list[str] = dataclasses.field(default_factory=list)


def prepare(
    spec: BenchSpec, here: bool = True, device: torch.device | None = None, check_memory: bool = True
) -> PreparedRun:
    """Every refusal that needs no weights: defaults and values, sizes (the offline profile),
    techniques against the model and device, weights on disk and, ``here`` (on this machine's
    devices), the memory lower bound on ``device`` (the run's own, placed device; else the spec's), unless
    ``check_memory`` is False (a launcher: each rank checks its own GPU). Raises DiffmeterError with the reason."""
    entry = entry_of(spec)
    compared, asked = spec.compare_baseline, paired_size(spec.height, spec.width)
    spec = spec.settle(entry, here=here)
    settled = [note] if (note := size_note(entry, asked, spec)) else []
    if compared and not spec.compare_baseline:
        settled.append(
            "--compare-baseline: nothing compared, the run applies no technique and is its own baseline (a LoRA, a "
            "ControlNet, a size or a dtype is part of the generation, not a technique)"
        )
    optimizations = build(spec.optimizations)  # each technique's parameters first: a sampler's name sets the count
    profile = profile_spec(spec.profile_spec())  # also checks sizes against the model
    target = Target(
        entry,
        get_family(entry.family),
        torch.device(spec.device),
        spec.dtype,
        spec.steps,
        images=bool(spec.image_sizes),
        fused_lora=spec.fuse_lora,
    )
    check(optimizations, target)
    if here and spec.prompts_file is not None:
        read_prompts(spec.prompts_file)  # unreadable or empty: refused now, not once the weights are loaded
    if spec.world_size > 1 or spec.engine != "diffusers" or spec.pipefusion_degree > 1:
        check_parallel(spec, target, optimizations, here)
    if here or entry.is_tiny or spec.random_weights:
        source = locate_weights(entry, spec.random_weights)
    else:  # the weights are looked for where the run happens
        source = WeightsSource("pretrained")
    if spec.memory_check and here and check_memory:
        one_byte = {name for o in optimizations for name in o.one_byte_components(target)}
        check_fits(spec, entry, target.family.decoder, profile, device or torch.device(spec.device), one_byte)
    name = run_name(spec, entry, optimizations)
    return PreparedRun(spec, entry, profile, target, optimizations, source, name, settled)


def size_note(entry: PipelineEntry, asked: tuple[int | None, int | None], spec: BenchSpec) -> str | None:
    """Why the images come out at another size than ``asked`` (--height, --width paired; None: not given), or None: a
    pipeline that rounds a side to its multiple only warns (a new user's trial: --height 33 ran at 32, said nowhere)."""
    height, width = (given or made for given, made in zip(asked, (spec.height, spec.width), strict=True))
    if (height, width) == (spec.height, spec.width):
        return None
    why = get_family(entry.family).pipeline_size(entry, height, width)[2]
    return why or (
        f"{entry.pipeline_class} generates {width}x{height} (WxH) at {spec.width}x{spec.height}: its own size rule"
    )


def run_name(spec: BenchSpec, entry, optimizations) -> str:
    return storage.run_name(spec, entry, [optimization.label() for optimization in optimizations])


def result_fields(run: PreparedRun) -> dict:
    """What every result of ``run`` records, measured or not."""
    spec, entry = run.spec, run.entry
    return dict(
        created_utc=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        spec=spec,
        model=ModelInfo(
            id=entry.id, name=entry.name, family=entry.family, pipeline_class=entry.pipeline_class, origin=entry.origin
        ),
        weights=run.source.describe(),
        weights_random=run.source.random,
        environment=collect(),
        profile=run.profile,
        notes=run.settled
        + _notes(spec, entry, run.optimizations)
        + [n for o in run.optimizations if (n := o.note(run.target))],
        optimizations=applied(run.optimizations),
    )


def applied(optimizations: list) -> list[AppliedOptimization]:
    """Built techniques as a result records them (and its stored prediction reads them), every parameter value
    that runs included."""
    return [
        AppliedOptimization(
            name=o.name, label=o.label(), kind=o.kind, lossless=o.lossless, params=o.config.model_dump(mode="json")
        )
        for o in optimizations
    ]


def store_failure(run: PreparedRun, out: str | Path, error: str, logs: dict[str, str] | None = None) -> Path:
    """A failed result for a run that died before it could store one itself (killed, crashed, timed out);
    ``logs`` (path in the run folder: text) keeps what its processes logged."""
    folder = RunDirectory(out, run.name, force=True, spec=run.spec)
    staging = folder.open()
    for relative, text in (logs or {}).items():
        (staging / relative).parent.mkdir(parents=True, exist_ok=True)
        storage.write_text(staging / relative, text)
    return folder.commit(BenchResult(status="failed", error=error, **result_fields(run)))


def _notes(spec: BenchSpec, entry, optimizations) -> list[str]:
    notes = []
    if any(o.kind == "cache" for o in optimizations):
        notes.append(
            "a cache skips work: achieved FLOP/s and MFU divide the full (uncached) profile by the time, "
            "so they are effective rates, not executed ones"
        )
    if spec.device == "cpu" and spec.dtype == "float32" and entry.defaults.dtype != "float32":
        notes.append(f"ran in float32 on CPU; the model's default is {entry.defaults.dtype} on GPU (--dtype)")
    return notes
