"""A run's offline prediction beside what it measured, as lines of text (``show``, ``bench``)."""

from __future__ import annotations

from diffmeter import units
from diffmeter.report.time_table import expected_range
from diffmeter.runs.results import BenchResult


def measured_memory(result: BenchResult) -> tuple[int, str] | None:
    """The measured peak to hold the prediction against, and what it is."""
    memory = result.summary.peak_memory
    if memory.cuda_max_allocated_bytes is not None:
        return memory.cuda_max_allocated_bytes, "CUDA max allocated"
    return None


def stage_memory(result: BenchResult) -> list[str]:
    """Each stage's predicted peak against CUDA's measured one, where the run measured stages."""
    measured = result.summary.peak_memory.cuda_stage_max_allocated_bytes or {}
    predicted = result.prediction.stage_peak_memory_bytes
    return [
        f"{stage} {units.gib(bytes_)} vs {units.gib(measured[stage])} ({100 * (bytes_ / measured[stage] - 1):+.1f}%)"
        for stage, bytes_ in predicted.items()
        if measured.get(stage)
    ]


def weights_check(result: BenchResult) -> str | None:
    """The predicted weights as stored against those measured after loading, component by component."""
    predicted, measured = result.prediction.weights_bytes, result.summary.peak_memory.weights_bytes
    if not predicted or not measured:
        return None
    total, found = sum(predicted.values()), sum(measured.values())
    off = [
        f"{name} {units.gib(bytes_)} vs {units.gib(measured[name])}"
        for name, bytes_ in predicted.items()
        if name in measured and bytes_ != measured[name]
    ]
    verdict = f"{100 * (total / found - 1):+.2f}%: {'; '.join(off)}" if off or total != found else "exact"
    return f"predicted weights as stored: {units.gib(total)} vs {units.gib(found)} measured after loading ({verdict})"


def group_line(group) -> str:
    """What a parallel run's prediction is of: one GPU of the group, and what it receives."""
    degrees = group.degrees_text()
    over = (
        f"{group.communication_s:.3g} s over {group.link.name}"
        if group.communication_s is not None and group.link
        else "not timed (no link figure)"
    )
    return (
        f"predicted for one GPU of {group.gpus} ({degrees}): peak {units.gib(group.per_gpu_peak_memory_bytes)} "
        f"(one GPU alone {units.gib(group.one_gpu_peak_memory_bytes)}); it receives "
        f"{units.gib(group.bytes_received_per_gpu)} per generation in {group.collectives_per_generation:,} "
        f"collectives, communication {over}"
    )


def memory_technique_labels(result: BenchResult) -> list[str]:
    """The memory prediction's techniques as the run's optimizations line names them ("torchao-int8wo", not the
    prediction's own "quantize-torchao-int8wo"); one no applied optimization stands for keeps its own name."""
    from diffmeter.predict.technique_names import memory_technique

    modelled = result.prediction.memory_techniques
    labels = {memory_technique(o.name, o.params): o.label for o in result.optimizations}
    return [labels.get(name, name) for name in modelled]


def prediction_lines(result: BenchResult) -> list[str]:
    prediction = result.prediction
    if prediction is None or result.summary is None:
        return []
    lines = []
    if prediction.peak_memory_bytes is not None:
        named = memory_technique_labels(result)
        techniques = f" with {', '.join(named)}" if named else ""
        line = f"predicted peak memory{techniques}: {units.gib(prediction.peak_memory_bytes)} of tensors"
        found = measured_memory(result)
        if found:
            measured, what = found
            line += f" vs {units.gib(measured)} {what} ({100 * (prediction.peak_memory_bytes / measured - 1):+.1f}%)"
        else:
            line += " (a CPU run measures RSS, which also holds the interpreter and libraries)"
        lines.append(line)
        stages = stage_memory(result)
        if stages:
            lines.append("predicted vs CUDA max allocated per stage: " + "; ".join(stages))
    if (weights := weights_check(result)) is not None:
        lines.append(weights)
    if (group := prediction.parallel) is not None:
        lines.append(group_line(group))
    time = prediction.time
    if time is not None:
        measured = result.summary.latency_s.median
        what = "predicted time per call"
        if prediction.time_left_out:  # the eager pipeline's time: what ran may be anywhere, faster or slower
            what += f" of the pipeline without {', '.join(prediction.time_left_out)} (not what ran; no check of it)"
        parts = [
            f"{what} on {time.device}: lower bound {units.seconds(time.lower_s)}, "
            f"expected {expected_range(time.expected_s)}; measured median {units.seconds(measured)}"
        ]
        for stage in time.stages:
            stats = result.summary.stages_s.get(stage.stage)
            if stats is not None:
                parts.append(
                    f"{stage.stage.replace('_', ' ')} {units.seconds(stage.lower_s)} / "
                    f"{expected_range(stage.expected_s)} / {units.seconds(stats.median)}"
                )
        verdict = "" if prediction.time_left_out else against_expected(result, time.expected_s)
        lines.append(parts[0] + verdict + " (per stage, bound / expected / measured: " + "; ".join(parts[1:]) + ")")
        under = [] if prediction.time_left_out else under_bounds(result)
        if under:
            lines.append(
                f"measured under the roofline lower bound: {'; '.join(under)}; no run can beat a right bound, so the "
                "device's peaks are too low (measured while it was busy?) or the work is overcounted"
            )
        if time.outside_calibration:
            lines.append(f"prediction: the expected range is {time.outside_calibration}")
        if time.cache:  # the range spans the cache's skipped share, which may be extrapolated
            extrapolated = f" ({time.cache.extrapolated})" if time.cache.extrapolated else ""
            lines.append(f"prediction: {time.cache.technique} {time.cache.skips_text(extrapolated)}")
        if time.energy is not None:
            low, high = time.energy.per_output_j
            measured_j = result.summary.energy.gpu_j_per_image
            lines.append(
                f"predicted GPU energy per image: {units.joules(low)} to {units.joules(high)} at "
                f"{time.energy.power_w:.0f} W"
                + (f"; measured {units.joules(measured_j)} (Zeus)" if measured_j is not None else "")
            )
    lines += [f"prediction: {note}" for note in prediction.notes]
    return lines


def against_expected(result: BenchResult, expected_s: tuple[float, float] | None) -> str:
    """Where the measured median lies against the expected range (inside, or above or below it by how much),
    then, separately, where the median's interval lies (overlapping the range, or wholly above or below it);
    nothing without a range."""
    if expected_s is None:
        return ""
    latency = result.summary.latency_s
    low, high = expected_s
    if latency.median > high:
        place = f", outside the expected range (above it by {100 * (latency.median / high - 1):.0f}%)"
    elif latency.median < low:
        place = f", outside the expected range (below it by {100 * (1 - latency.median / low):.0f}%)"
    else:
        place = ", inside the expected range"
    if latency.ci_level == 0:
        return f"{place}; one measured call: no interval"
    if latency.ci_low > high:
        lies = "lies wholly above the range"
    elif latency.ci_high < low:
        lies = "lies wholly below the range"
    else:
        lies = "overlaps the range"
    bounds = units.seconds_range(latency.ci_low, latency.ci_high)
    return f"{place}; its {100 * latency.ci_level:.0f}% interval ({bounds}) {lies}"


def under_bounds(result: BenchResult) -> list[str]:
    """The whole call and each stage whose measured median is under the prediction's roofline lower bound,
    as "vae decode 19.30 s against 20.90 s (8% under)"; empty when none is (or nothing was predicted)."""
    time = result.prediction.time if result.prediction is not None else None
    if time is None or result.summary is None:
        return []
    measured = [("whole call", time.lower_s, result.summary.latency_s.median)]
    for stage in time.stages:
        stats = result.summary.stages_s.get(stage.stage)
        if stats is not None:
            measured.append((stage.stage.replace("_", " "), stage.lower_s, stats.median))
    return [
        f"{name} {units.seconds(median)} against {units.seconds(bound)} ({100 * (1 - median / bound):.0f}% under)"
        for name, bound, median in measured
        if median < bound
    ]
