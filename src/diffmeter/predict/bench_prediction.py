"""The prediction ``bench`` stores beside its measurements: the run's settings on the device it ran on.

Memory takes the run's memory techniques into account where ``techniques`` models them (offload,
VAE tiling and slicing, the fp8 text encoder, weight-only quantization); time is the pipeline's at the peak the
run could use (TF32 for float32 matmuls when it was on), with the VAE decode's operators as a tiled or sliced
decode runs them, compile and the attention kernel as ``timed_techniques`` models them, and an offload's host
transfers where ``offload_time`` has the mode's achieved link rate. Whatever the
prediction leaves out of the run is named in its notes, so a gap between the two is explained, not
hidden.
"""

from __future__ import annotations

from typing import Protocol

import torch

from diffmeter.errors import DiffmeterError
from diffmeter.predict.attention_kernels import asked_kernel
from diffmeter.predict.devices import Device, of_row, this_cpu
from diffmeter.predict.layerwise_casting import cast_work
from diffmeter.predict.offload_time import offload_of, with_offload
from diffmeter.predict.offload_time import why_untimed as why_offload_untimed
from diffmeter.predict.operators import operator_work, predict_memory_and_work
from diffmeter.predict.peaks import find_device
from diffmeter.predict.quantized_kernels import of_device
from diffmeter.predict.quantized_memory import PREDICTED, Format, with_formats
from diffmeter.predict.roofline import BENCH_FP32, missing_figures, predict_time
from diffmeter.predict.schema import (
    MemoryPrediction,
    OperatorWork,
    ParallelPrediction,
    RunPrediction,
    TimePrediction,
)
from diffmeter.predict.technique_names import memory_technique
from diffmeter.predict.techniques import stage_peaks_under, stored_params
from diffmeter.predict.timed_techniques import TIME_ONLY, timed_work
from diffmeter.predict.vae_decode import VAE_MODES
from diffmeter.quantization_spec import DENOISER

#: optimizations whose time is predicted: through the peak the roofline uses (TF32), the decode's operators
#: as the tiled or sliced decode runs them, or the steps (every sampler ``optimize/scheduler.py`` offers calls the
#: denoiser once a step, as the plan counts; no sampler's own step is counted)
TIME_MODELLED = {"tf32", "scheduler", "fp8-text-encoder", *VAE_MODES}


def applied_format(optimization) -> Format:
    """An applied ``--quantize BACKEND:TYPE`` technique as the prediction takes it (a GGUF run's file included)."""
    params = optimization.params
    components = tuple(params.get("components") or [DENOISER])
    return Format(optimization.name, params["type"], components, params.get("file"))


def run_device(device: torch.device, *dtypes: str) -> Device | None:
    """The device's figures: this CPU measured (at ``dtypes``), or the CUDA GPU's row of the datasheet table."""
    if device.type == "cpu":
        return this_cpu(*dtypes)
    row = find_device(torch.cuda.get_device_name(device)) if device.type == "cuda" else None
    return of_row(row) if row is not None else None


class GroupSplit(Protocol):
    """One GPU of a parallel run's group, as the prediction takes it (``distributed.group_prediction``)."""

    def split(self, memory: MemoryPrediction, work: OperatorWork) -> tuple[MemoryPrediction, OperatorWork]:
        """One GPU's memory and work: each denoiser call replaced by the rank's."""

    def communicate(
        self, time: TimePrediction | None, device: Device, peaks: tuple[int, int]
    ) -> tuple[TimePrediction | None, ParallelPrediction, list[str]]:
        """The time with the group's communication, the group's figures (``peaks``: one GPU's alone, each GPU's of
        the group) and what the time leaves out."""


def predict_run(
    spec, optimizations: list, fp32_precision: dict | None, group: GroupSplit | None = None, profiled=None
) -> RunPrediction:
    """``spec``: the settled BenchSpec; ``optimizations``: the applied ones (``AppliedOptimization``); ``group``: a
    parallel run's (its memory and time one GPU's, with the communication); ``profiled``: the ProfileSpec the run's
    stored profile counted (its prompts' token counts, for families whose compute depends on them), else the
    spec's."""
    device = torch.device(spec.device)
    notes = []
    profile_spec = profiled or spec.profile_spec()
    techniques = [t for o in optimizations if (t := memory_technique(o.name, o.params))]
    modes = tuple(t for t in techniques if t in VAE_MODES)
    memory, work = predict_memory_and_work(profile_spec, on_cuda=device.type == "cuda", vae_modes=modes)
    if modes:
        work = operator_work(profile_spec, modes)
    if "fp8-text-encoder" in techniques:  # each encoder call's layers cast to the compute dtype and back
        work = cast_work(work, profile_spec, memory.large_text_encoders)
    applied = [applied_format(o) for o in optimizations if o.name in PREDICTED]
    one_gpu = with_formats(memory, profile_spec, applied, kernels=of_device(device))  # quanto's kernel: the device's
    if group is not None:
        memory, work = group.split(memory, work)
    memory = with_formats(memory, profile_spec, applied, kernels=of_device(device)) if group else one_gpu
    work, _, time_untimed = timed_work(
        work, [(o.name, o.params) for o in optimizations], tuple(memory.denoisers), profile_spec, device.type == "cpu"
    )
    figures = run_device(device, *work.dtypes())  # a CPU's peaks measured at every dtype a call runs at
    name = figures.name if figures else (torch.cuda.get_device_name(device) if device.type == "cuda" else spec.device)
    unmodelled = [o.label for o in optimizations if memory_technique(o.name, o.params) is None]
    if unmodelled:
        notes.append(f"memory is predicted without {', '.join(unmodelled)}")
    if memory.checked and not memory.checked.startswith("checked"):
        notes.append(f"memory: {memory.checked}")
    time, untimed = None, []
    fp32_math = fp32_precision or BENCH_FP32  # as the run had float32 matmuls and convolutions (CUDA only)
    if figures is None:
        notes.append(f"no time: {name} is not in the table of peaks (predict/peaks.py)")
    elif lacking := missing_figures(figures, work, fp32_math):
        notes.append(f"no time: {lacking}")
    else:
        time = predict_time(
            work,
            figures,
            weights=memory.weight_read_bytes,
            outputs=spec.batch_size,
            fp32_math=fp32_math,
            attention=asked_kernel([(o.name, o.params) for o in optimizations]),
        )
        untimed = [o.label for o in optimizations if o.name not in (*TIME_MODELLED, *TIME_ONLY)] + time_untimed
        held = tuple(techniques)
        if offload_of(held) and not why_offload_untimed(held, figures.host_link_bytes_per_s):  # inside the range
            time = with_offload(time, memory, held, figures.host_link, figures.host_link_bytes_per_s)
            offloads = {o.label for o in optimizations if o.name == "offload"}
            untimed = [label for label in untimed if label not in offloads]
    stages = stage_peaks_under(memory, tuple(techniques))  # the whole peak is the largest stage's (peak_under)
    parallel = None
    if group is not None and figures is not None:
        alone = max(stage_peaks_under(one_gpu, tuple(techniques)).values(), default=0)
        time, parallel, left_out = group.communicate(time, figures, (alone, max(stages.values(), default=0)))
        untimed += left_out if time is not None else []
    return RunPrediction(
        device=name,
        peak_memory_bytes=max(stages.values(), default=0),
        stage_peak_memory_bytes=stages,
        memory_techniques=techniques,
        weights_bytes=stored_params(memory, tuple(techniques)),
        time=time,
        time_left_out=untimed if time is not None else [],
        notes=notes,
        parallel=parallel,
    )


def predict_or_note(
    spec, optimizations: list, fp32_precision: dict | None, group: GroupSplit | None = None, profiled=None
) -> tuple[RunPrediction | None, str | None]:
    """The prediction (``predict_run``), or None and why it could not be made: a measured run is never lost to its
    prediction, whatever goes wrong in it."""
    try:
        return predict_run(spec, optimizations, fp32_precision, group, profiled), None
    except Exception as error:  # noqa: BLE001 - an unforeseen failure is recorded, the measurements kept
        return None, no_prediction(error)


def no_prediction(error: Exception) -> str:
    """Why a run stores no prediction: a DiffmeterError's own line, else the error's type and first line."""
    if isinstance(error, DiffmeterError):
        return f"no prediction: {error}"
    first = (str(error).strip().splitlines() or [""])[0]
    return f"no prediction: {type(error).__name__}: {first}"
