"""How well a parallel run scales: its seconds per image against the one-device run of the same
spec stored under the same ``--out`` (the run folder named like it without the parallel degrees).

speed-up = one-device median s/image / parallel median s/image (each call's seconds divided by the
images it made, medians over the measured calls); efficiency = speed-up / processes. For data
parallelism too it is a ratio of medians, not of the two runs' images/s (a mean over the measured calls' total
time, which one slow call moves); for context parallelism, how much of the ideal 1/N per image is reached.
"""

from __future__ import annotations

import statistics
from datetime import datetime
from pathlib import Path

from diffmeter.errors import DiffmeterError
from diffmeter.runs import storage
from diffmeter.runs.parallel_records import SUPERLINEAR, Scaling, ScalingRule, StageScaling, superlinear
from diffmeter.runs.results import BenchResult
from diffmeter.runs.spec import BenchSpec
from diffmeter.runs.speedups import between

#: a one-device run measured further apart than this ran under conditions that may differ
APART_S = 3600


def one_device_spec(spec: BenchSpec) -> BenchSpec:
    """The same run on one device: every parallel degree 1."""
    degrees = ("ulysses_degree", "ring_degree", "tp_degree", "cfg_degree", "data_parallel")
    return spec.model_copy(update=dict.fromkeys(degrees, 1))


def one_device_name(spec: BenchSpec, entry, labels: list[str]) -> str:
    """The run folder of ``spec`` on one device (``labels``: the techniques' labels, as in the run's name)."""
    return storage.run_name(one_device_spec(spec), entry, labels)


def median_s_per_image(result: BenchResult, stage: str | None = None) -> float:
    """The median over the measured calls of each call's seconds (``stage``: one stage's) per image made."""
    return statistics.median(
        (call.total_s if stage is None else getattr(call.stages, stage)) / call.images for call in result.iterations
    )


def against_one_device(result: BenchResult, out: str | Path, name: str) -> Scaling:
    """``result`` (a complete parallel run) against the run stored at ``out/name``, or why there is no number."""
    processes = result.parallel.world_size
    folder = Path(out).expanduser() / name
    if not (folder / storage.RESULTS).is_file():
        # the figure is found when the parallel run is stored: the one-device run first, at each rank's threads
        threads = f" with OMP_NUM_THREADS={result.environment.torch_threads}" if result.spec.device == "cpu" else ""
        return Scaling(
            processes=processes,
            reason=f"no one-device run of the same spec under {Path(out).expanduser()} (folder {name}); "
            f"run the same bench without the parallel degrees{threads} into the same --out, then this one again "
            "with --force",
        )
    try:
        single = storage.read_result(folder)
    except DiffmeterError as error:
        return Scaling(processes=processes, one_device_run=name, reason=str(error))
    if single.status != "complete" or not single.iterations:
        return Scaling(processes=processes, one_device_run=name, reason=f"the one-device run failed ({single.error})")
    elsewhere = _other_hardware(result, single)
    if elsewhere:
        return Scaling(processes=processes, one_device_run=name, reason=elsewhere)
    stages = {
        label: _stage(single, result, field, processes)
        for label, field in (("call", None), ("denoising", "denoising_s"))
    }
    apart = abs(datetime.fromisoformat(result.created_utc) - datetime.fromisoformat(single.created_utc))
    return Scaling(
        processes=processes,
        one_device_run=name,
        one_device_created_utc=single.created_utc,
        measured_apart=apart.total_seconds() > APART_S,
        **stages,
    )


def _stage(single: BenchResult, result: BenchResult, field: str | None, processes: int) -> StageScaling:
    one_device, parallel = median_s_per_image(single, field), median_s_per_image(result, field)
    speedup = one_device / parallel
    stage = "call" if field is None else field.removesuffix("_s")
    rule = between(single, result, stage, names=("one-device run", "this run"))
    return StageScaling(
        one_device_s_per_image=one_device,
        parallel_s_per_image=parallel,
        speedup=speedup,
        efficiency=speedup / processes,
        rule=ScalingRule(**rule.model_dump()) if rule is not None else None,
    )


def _other_hardware(result: BenchResult, single: BenchResult) -> str | None:
    """Why two runs' timings cannot be set side by side: measured on different hardware, or on a CPU with other
    thread counts."""
    from diffmeter.runs.collect import hardware

    if hardware(result) != hardware(single):
        return f"the one-device run was measured on {hardware(single)}, this one on {hardware(result)}"
    threads, each = single.environment.torch_threads, result.environment.torch_threads
    if result.spec.device == "cpu" and threads != each:  # on a CPU the ranks split the cores: a ratio of threads
        return (
            f"the one-device run used {threads} torch threads, each rank {each} (the ranks split this CPU's cores): "
            f"run the one-device bench with OMP_NUM_THREADS={each} for a like-for-like figure"
        )
    return None


def line(scaling: Scaling) -> str:
    """The run table's line."""
    if scaling.call is None:
        return f"scaling: no figure ({scaling.reason})"
    from diffmeter import units

    call, denoising = scaling.call, scaling.denoising
    text = (
        f"scaling against one device ({scaling.one_device_run}): whole call "
        f"{units.seconds(call.one_device_s_per_image)} -> {units.seconds(call.parallel_s_per_image)} per image, "
        f"{call.speedup:.2f}x = {call.efficiency:.0%} of "
        f"{scaling.processes} processes; denoising {denoising.speedup:.2f}x = {denoising.efficiency:.0%} (medians)"
    )
    if call.rule is not None and denoising.rule is not None:  # the factors' support, as every speed-up is shown
        text += f"; by the speed-up rule: whole call {call.rule.text()}, denoising {denoising.rule.text()}"
    if scaling.measured_apart:
        text += f"; the one-device run was measured {scaling.one_device_created_utc}, over an hour apart"
    if superlinear(call.efficiency) or superlinear(denoising.efficiency):
        text += f"; {SUPERLINEAR}"
    return text
