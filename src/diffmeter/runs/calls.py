"""The calls of a measured run: warm-up calls, then measured calls under the stage timer and the energy
meter until the iteration count, the minimum duration and any target precision are reached."""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable
from pathlib import Path

from diffmeter.measure.energy import EnergyMeter
from diffmeter.measure.stages import StageTimer
from diffmeter.measure.stats import CONFIDENCE, Stats
from diffmeter.measure.trace import TraceSummary, trace_call
from diffmeter.runs import storage
from diffmeter.runs.results import ImageRecord, Iteration
from diffmeter.runs.spec import BenchSpec
from diffmeter.runs.workload import save_output


def timed_call(pipe, timer: StageTimer, arguments: dict, index: int, meter: EnergyMeter | None, contexts=()):
    """One timed pipeline call, inside an energy window when a meter is given, and inside
    the per-call contexts of the optimizations (``contexts``: callables returning one)."""
    window = meter.begin() if meter is not None else None
    start = time.perf_counter()
    timer.begin()
    with contextlib.ExitStack() as stack:
        for context in contexts:
            stack.enter_context(context())
        output = pipe(**arguments)
    times = timer.end()
    wall = time.perf_counter() - start
    reading = meter.end(window) if meter is not None else None
    iteration = Iteration(
        index=index,
        # the outputs: one per prompt or class (a generator list may be replaced by its noise, Family.seeded_call)
        images=len(arguments.get("prompt") or arguments["class_labels"]),
        total_s=times.total_s,
        wall_s=wall,
        denoiser_calls=times.denoiser_calls,
        stages=times.stages,
        energy=reading,
    )
    return iteration, output


#: warm-up calls a CUDA-graph compile mode needs: cudagraph trees run a function's first call as a warm-up and
#: record its graph on the second (torch/_inductor/cudagraph_trees.py, CUDAGraphTreeManager: "We run graph
#: warmups ... and return the result on the first invocation of a function"), so a component called once per
#: generation (VAE decode, a text encoder) would record in the first measured call after one warm-up call
CUDA_GRAPH_WARMUPS = 2


def warm_up_indices(spec: BenchSpec, pipe, workload, compiling: bool, graphs: bool = False) -> tuple[list[int], int]:
    """The batches the warm-up calls run: ``spec.warmup`` of them (at least ``CUDA_GRAPH_WARMUPS`` when a
    technique records CUDA graphs), plus, when compiling, one per prompt-dependent input shape the measured
    calls use that those have not run (a compiled model recompiles, or records a new CUDA graph, on a new
    shape, which must not happen in a measured call). Returns (indices, how many were added for shapes)."""
    warmups = list(range(max(spec.warmup, CUDA_GRAPH_WARMUPS if graphs else 0)))
    shapes = _unseen_shapes(spec, pipe, workload, len(warmups)) if compiling else []
    return warmups + shapes, len(shapes)


def keep_measuring(spec: BenchSpec, iterations: list[Iteration], elapsed: float) -> bool:
    """Until the iteration count and the minimum duration are reached, and, with a target
    precision, until the median's 95% interval is that narrow (or the call budget is spent)."""
    if len(iterations) < spec.iterations or elapsed < spec.min_duration_s:
        return True
    if spec.target_precision is None or len(iterations) >= spec.max_iterations:
        return False
    latency = Stats.of([iteration.total_s for iteration in iterations])
    return latency.ci_level < CONFIDENCE or latency.relative_ci > spec.target_precision


def _unseen_shapes(spec, pipe, workload, warmed: int) -> list[int]:
    if workload.class_conditional:
        return []
    family = workload.family

    def shape(index: int) -> tuple:
        return tuple(sorted(family.prompt_settings(pipe, workload.batch(index).prompts).items()))

    seen = {shape(index) for index in range(warmed)}
    period = len(workload.pool) // math.gcd(len(workload.pool), spec.batch_size)  # batches repeat after this
    unseen = []
    for index in range(max(spec.iterations, period)):
        key = shape(index)
        if key not in seen:
            seen.add(key)
            unseen.append(index)
    return unseen


def save_images(produced: list, batch, index: int, folder: Path) -> list[ImageRecord]:
    """One call's outputs saved under ``folder``, one record per image."""
    records = []
    for k, output in enumerate(produced):
        label = batch.prompts[k] if batch.prompts else f"class-{batch.class_labels[k]}"
        path = save_output(output, folder / storage.IMAGES, batch.seeds[k], label)
        records.append(
            ImageRecord(
                path=str(path.relative_to(folder)),
                iteration=index,
                seed=batch.seeds[k],
                prompt=batch.prompts[k] if batch.prompts else None,
                class_label=batch.class_labels[k] if batch.class_labels else None,
            )
        )
    return records


def traced_call(pipe, timer, workload, folder: Path, contexts, device) -> TraceSummary:
    """``--trace``: one more call of the first batch under torch.profiler, never a measured one."""
    arguments = workload.call_arguments(pipe, workload.batch(0))

    def call():
        with contextlib.ExitStack() as stack:
            for context in contexts:
                stack.enter_context(context())
            pipe(**arguments)

    return trace_call(timer, call, folder, device)


#: progress callback: (what is happening, calls done, calls planned or None)
Progress = Callable[[str, int, int | None], None]


def call_failure(error: Exception, device, spec: BenchSpec) -> str:
    """A pipeline call that raised, as the run's stored failure: the error's type and first line, and the
    components asked at other dtypes where the error is one of mixed dtypes (a pipeline that does not cast its
    latents for a VAE at another dtype)."""
    first = (str(error) or type(error).__name__).splitlines()[0]
    message = f"the pipeline's call raised {type(error).__name__} on {device}: {first}"
    mixed = "dtype" in first or ("type" in first and "same" in first)
    if spec.component_dtypes and mixed:
        asked = ", ".join(f"{name}={dtype}" for name, dtype in sorted(spec.component_dtypes.items()))
        message += (
            f" (--component-dtype {asked}: this pipeline does not cast between its components' dtypes; drop it to "
            f"run every component at {spec.dtype})"
        )
    return message + "; its traceback is in the run's bench.log"


def call_line(iteration) -> str:
    """A measured call as the run's log has it: its seconds, whole and per stage."""
    stages = iteration.stages
    return (
        f"iteration {iteration.index}: {iteration.total_s:.4f} s (text {stages.text_encoding_s:.4f}, "
        f"{len(stages.steps_s)} steps {stages.denoising_s:.4f}, decode {stages.vae_decode_s:.4f}, "
        f"other {stages.other_s:.4f})"
    )
