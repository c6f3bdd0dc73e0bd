"""The predicted peak memory of a generation: a row per stage, then the whole generation and
whether it fits the chosen GPU."""

from __future__ import annotations

from rich.markup import escape

from diffmeter.predict.devices import Device
from diffmeter.predict.schema import MemoryPrediction
from diffmeter.report.layout import Column, FittedTable


def gib(value: float) -> str:
    return f"{value / 2**30:,.2f} GiB"


def memory_table(prediction: MemoryPrediction, gpu: Device | None, techniques: tuple[str, ...] = ()) -> FittedTable:
    """A row per stage with every component loaded; then the whole generation (under ``techniques``, the names
    ``predict.techniques`` models them by) and whether it fits ``gpu``."""
    from diffmeter.predict.techniques import peak_under

    title = f"predicted peak memory ({prediction.dtype}, every component loaded)"
    table = FittedTable(
        escape(title),
        [
            Column("stage", justify="left"),
            Column("call", justify="left", drop=3),
            Column("parameters resident", drop=1),
            Column("carried", drop=2),
            Column("activations", drop=0),
            Column("peak"),
        ],
    )
    for stage in prediction.stages:
        table.add_row(
            stage.stage,
            escape(f"{stage.component} (batch {stage.batch})"),
            gib(stage.resident_param_bytes),
            gib(stage.carried_bytes),
            gib(stage.activation_bytes),
            gib(stage.peak_bytes),
        )
    table.add_row(
        "whole generation", f"at {prediction.peak_stage}", "", "", "", gib(prediction.peak_bytes), section=True
    )
    peak = peak_under(prediction, techniques)
    if techniques:
        table.add_row(escape(f"under {', '.join(techniques)}"), "whole generation", "", "", "", gib(peak))
    if gpu is not None and gpu.memory_bytes:
        fits = peak <= gpu.memory_bytes
        verdict = "fits" if fits else "does not fit"
        table.add_row(
            escape(f"{gpu.name} ({gib(gpu.memory_bytes)})"),
            verdict,
            "",
            "",
            "",
            gib(gpu.memory_bytes - peak) + " left" if fits else "",
            style=None if fits else "red",
        )
    return table


def fit_table(model: str, prediction: MemoryPrediction, gpu: Device, fits: list[tuple[tuple[str, ...], int]]):
    """The settings that fit, likely fastest first (by mechanism: no time is predicted); a line if none does."""
    table = FittedTable(
        escape(
            f"{model} on {gpu.name} ({gib(gpu.memory_bytes)}): "
            f"predicted peak without techniques {gib(prediction.peak_bytes)}"
        ),
        [Column("setting (likely fastest first)", justify="left"), Column("predicted peak"), Column("left", drop=0)],
    )
    for chosen, peak in fits:
        table.add_row(escape(" + ".join(chosen) or "as is"), gib(peak), gib(gpu.memory_bytes - peak))
    if not fits:
        table.add_row("nothing fits, even with sequential offload", "", "", style="red")
    table.caption = (
        "Peaks count tensors; CUDA adds its context and the caching allocator's rounding (docs/memory-prediction.md)."
    )
    return table
