"""The predicted time of a generation: a row per stage (its work, the roofline lower bound and the
calibrated expected range), then the whole generation."""

from __future__ import annotations

from rich.markup import escape

from diffmeter import units
from diffmeter.predict.schema import TimePrediction
from diffmeter.report.layout import Column, FittedTable
from diffmeter.stages import STAGE_NAMES

STAGE_LABELS = {**STAGE_NAMES, "denoising": "denoising (all steps)"}


def expected_range(expected: tuple[float, float] | None) -> str:
    return units.seconds_range(*expected) if expected else "not calibrated"


def optional_seconds(value: float | None) -> str:
    return units.seconds(value) if value is not None else "-"


def energy_line(prediction: TimePrediction, output: str = "image", fits: bool = True) -> str:
    """The predicted energy per output (``output``: "image" or "video"), with the board power it assumes and
    where that comes from; ``fits``: whether the run fits the card (else said: "if it fit")."""
    energy = prediction.energy
    if energy is None:
        return f"no energy prediction on {prediction.device}: {prediction.energy_left_out or 'not calibrated'}"
    low, high = energy.per_output_j
    each = output if energy.outputs == 1 else f"{output} ({energy.outputs} per generation)"
    return (
        f"predicted energy per {each} on {prediction.device}{'' if fits else ' if it fit'}: "
        f"{units.joules(low)} to {units.joules(high)} "
        f"({units.watt_hours(low)} to {units.watt_hours(high)}): the expected time's geometric midpoint at "
        f"{energy.power_w:,.0f} W{' while busy' if energy.waiting_unfitted else ''}, the share of its "
        f"{energy.tdp_w:,.0f} W TDP that turned predicted times into "
        "published energy"
        + (f" for a GPU busy {prediction.busy_share:.0%} of the time" if prediction.busy_share is not None else "")
        + (
            f"; {energy.waiting_unfitted}; "
            if energy.waiting_unfitted
            else f", times or divided by {(high / low) ** 0.5:.3g}, the spread the fit left; "
        )
        + energy.calibration
    )


def time_table(prediction: TimePrediction, short_bytes: int | None = None) -> FittedTable:
    """The stages' bounds and expected times; ``short_bytes``: the memory the card lacks for the run, said in the
    title (the time is of a run that cannot happen there as asked)."""
    fits = "" if short_bytes is None else f" if it fit (it does not: {units.gib(short_bytes)} short)"
    title = (
        f"predicted time on {prediction.device}{fits} ({prediction.dtype}"
        f"{', matmuls on TF32' if prediction.peak_precision == 'tf32' else ''}: "
        f"{units.significant(prediction.peak_tflops)} TFLOP/s peak, "
        f"{prediction.bandwidth_bytes_per_s / 1e9:,.4g} GB/s)"
    )
    hosted = any(stage.host_s for stage in prediction.stages)
    table = FittedTable(
        escape(title),
        [
            Column("stage", justify="left"),
            Column("operators", drop=2),
            Column("FLOPs", drop=1),
            Column("bytes moved", drop=0),
            Column("ideal bound", drop=3),
            Column("lower bound"),
            *([Column("host issues", drop=4)] if hosted else []),
            Column("expected"),
        ],
    )
    for stage in prediction.stages:
        table.add_row(
            STAGE_LABELS[stage.stage],
            f"{stage.operators:,}",
            units.flops(stage.flops),
            units.gib(stage.bytes),
            optional_seconds(stage.ideal_s),
            units.seconds(stage.lower_s),
            *([expected_range(stage.host_s)] if hosted else []),
            expected_range(stage.expected_s),
        )
    if prediction.outside_stages_s and prediction.outside_stages_s[1] > 0:
        call = expected_range(prediction.outside_stages_s)
        table.add_row("the call's own work", "", "", "", "-", "-", *([call] if hosted else []), call)
    if offload := prediction.offload:  # its host transfers: the lower bound at the datasheet rate, expected as fitted
        moved, fastest = units.gib(offload.moved_bytes), offload.moved_bytes / offload.link_bytes_per_s
        copies = "overlapped" if offload.overlapped else expected_range(offload.transfer_s)
        row = (f"{offload.technique} transfers", "", "", moved, "-", units.seconds(fastest))
        table.add_row(*row, *(["-"] if hosted else []), copies)
    elif (beyond := prediction.lower_s - sum(stage.lower_s for stage in prediction.stages)) > 1e-9:
        # an offload with no fitted rate: its transfers at the datasheet rate, in the whole bound alone (the note
        # below the table says how), a row so the column adds up
        table.add_row(
            "offload transfers beyond compute", "", "", "", "-", units.seconds(beyond), *(["-"] if hosted else []), "-"
        )
    table.add_row(
        "whole generation",
        "",
        "",
        "",
        optional_seconds(prediction.ideal_s),
        units.seconds(prediction.lower_s),
        *([""] if hosted else []),
        expected_range(prediction.expected_s),
        section=True,
    )
    l2 = f", bytes within its {units.gib(prediction.l2_bytes)} L2 not charged" if prediction.l2_bytes else ""
    table.caption = escape(
        "Ideal bound (no implementation of this run at its precisions is faster, compiled or fused): each call's FLOPs "
        "at the dense peak of the precision it runs at or its weights read once. Lower bound (of the eager operators): "
        f"each operator at max(FLOPs / peak, bytes / bandwidth){l2}, a call never under its ideal. Expected: "
        f"{prediction.calibration} (docs/memory-prediction.md)."
        + (
            " Each stage takes the longer of the GPU's time and the host's issuing its work (dispatched operators, "
            "module calls, steps), as CUDA's asynchronous launch overlaps them"
            + (f"; {prediction.host_bound}." if prediction.host_bound else ".")
            if hosted
            else ""
        )
        + (f" The expected range is {prediction.outside_calibration}." if prediction.outside_calibration else "")
        + (f" For the stack {prediction.stack} (attention_kernels.py)." if prediction.stack else "")
        + (f" On this card {prediction.power_limit}." if prediction.power_limit else "")
        + (
            f" Charged other peaks than the title's: {'; '.join(prediction.other_peaks)}."
            if prediction.other_peaks
            else ""
        )
    )
    return table
