"""The summarize phase of a measured run: its calls' statistics, FLOPs, achieved rates and MFU, and the
notes a reader needs to trust them (noise, load on the machine, compilation, extra warm-up calls)."""

from __future__ import annotations

import statistics

import torch

from diffmeter import units
from diffmeter.flops.profile import Profile
from diffmeter.measure.energy import Energy
from diffmeter.measure.stats import CONFIDENCE, Stats
from diffmeter.predict.peaks import device_peak
from diffmeter.runs.results import Iteration, Summary
from diffmeter.stages import STAGE_OF_ROLE, STAGES

#: the median latency's interval half-width, as a fraction of it, above which a run is flagged noisy
NOISY = 0.05


def summarize_run(
    spec,
    iterations: list[Iteration],
    memory,
    energy: Energy,
    profile: Profile,
    first_call_s,
    compilation,
    conditions,
    first_call_compilation=None,
):
    totals = [it.total_s for it in iterations]
    images = sum(it.images for it in iterations)
    stages = {name: Stats.of([getattr(it.stages, f"{name}_s") for it in iterations]) for name in (*STAGES, "other")}
    # one figure per call, each call's median step: a call's steps share its state (where its memory landed, the
    # machine's load), so pooled they would give an interval as if they were independent samples
    step = Stats.of([statistics.median(it.stages.steps_s) for it in iterations if it.stages.steps_s] or [0.0])
    flops = {stage: _flops(profile, role) for role, stage in STAGE_OF_ROLE.items()}
    flops.update(step=flops["denoising"] // (profile.denoiser_steps or spec.steps), total=profile.total_flops)
    seconds = {name: stats.median for name, stats in stages.items()}
    seconds.update(step=step.median, total=statistics.median(totals))
    achieved = {name: flops[name] / seconds[name] / 1e12 for name in flops if seconds[name] > 0 and flops[name]}
    device_name = torch.cuda.get_device_name(torch.device(spec.device)) if spec.device.startswith("cuda") else "cpu"
    peak = (
        device_peak(device_name, spec.dtype, tf32=spec.tf32, override_tflops=spec.peak_tflops)
        if device_name != "cpu" or spec.peak_tflops
        else None
    )
    note = None
    if peak is None:
        precision = "tf32" if spec.tf32 and spec.dtype == "float32" else spec.dtype
        note = f"no peak TFLOP/s known for {device_name} at {precision}; pass --peak-tflops to get MFU"
    return Summary(
        iterations=len(iterations),
        images=images,
        latency_s=Stats.of(totals),
        stages_s=stages,
        step_s=step,
        images_per_s=images / sum(totals),
        s_per_image=sum(totals) / images,
        cold_start_overhead_s=max(0.0, first_call_s - statistics.median(totals)),
        peak_memory=memory,
        energy=energy,
        flops=flops,
        achieved_tflops=achieved,
        peak=peak,
        mfu={name: value / peak.tflops for name, value in achieved.items()} if peak else {},
        mfu_note=note,
        compilation=compilation,
        first_call_compilation=first_call_compilation,
        conditions=conditions,
        target_precision=spec.target_precision,
    )


def _flops(profile: Profile, role: str) -> int:
    return sum(component.flops for component in profile.components if component.role == role)


def _per_call(summary: Summary, video: bool) -> str:
    """The median call latency, and per output where a call makes several ("33.93 ms (2 images per call: 16.96 ms
    per image)"), so it is not read against a per-image column."""
    median, per_call = summary.latency_s.median, round(summary.images / summary.iterations)
    if per_call <= 1:
        return units.seconds(median)
    word = "video" if video else "image"
    return f"{units.seconds(median)} ({per_call} {word}s per call: {units.seconds(median / per_call)} per {word})"


def measurement_notes(summary: Summary, shape_warmups: int, video: bool = False) -> list[str]:
    """What a reader must know to trust the figures: noise, other load on the machine,
    recompilation inside measured calls, MFU above 100%, extra warm-up calls (``video``: outputs are videos)."""
    notes = []
    latency = summary.latency_s
    if latency.ci_level == 0:  # one call: its "interval" is the call itself, which covers the median with probability 0
        notes.append(
            f"noisy: one measured call ({units.seconds(latency.median)}): its median has no interval, so how well it "
            "is known is unknown; do not compare it: measure at least 6 calls (--iterations 6) for a 95% interval"
        )
    target = summary.target_precision
    if latency.ci_level != 0 and latency.relative_ci > NOISY:
        interval = f"{units.seconds(latency.ci_low)} - {units.seconds(latency.ci_high)}"
        # a target already asked and not reached: more calls (--max-iterations), not the same advice again
        longer = "more calls (--max-iterations)" if target else "--target-precision 0.02"
        notes.append(
            f"noisy: the median call latency {_per_call(summary, video)} is only known to within {interval} "
            f"({100 * latency.ci_level:.0f}% interval, {latency.n} calls); do not compare it closely: "
            f"measure longer with {longer} on a quieter machine"
        )
    if target and (latency.ci_level < CONFIDENCE or latency.relative_ci > target):
        notes.append(
            f"--target-precision {target:g} not reached: +-{100 * latency.relative_ci:.1f}% after "
            f"{units.counted(latency.n, 'call')} (--max-iterations)"
        )
    if summary.conditions is not None and summary.conditions.disturbed():
        notes.append(summary.conditions.disturbed())
    compilation = summary.compilation
    if not compilation.clean:
        notes.append(f"compilation inside the measured calls ({compilation.text()}): their time is in the figures")
    if any(value > 1.0 for value in summary.mfu.values()):
        notes.append("MFU above 100%: the peak used is below what ran (see --peak-tflops), or a cache skipped work")
    if shape_warmups:
        notes.append(
            f"{shape_warmups} extra warm-up call(s), one per prompt-dependent input shape the measured calls use"
        )
    return notes
