"""``diffmeter table``: stored runs, one row each, with units; tiny and random-weight runs marked."""

from __future__ import annotations

import math

from rich.markup import escape

from diffmeter import units
from diffmeter.report import outputs
from diffmeter.report.layout import Column, FittedTable
from diffmeter.report.speedup_text import coverage_line, noise_lines, scaling_cell, speedup_cell
from diffmeter.runs.parallel_records import SUPERLINEAR, superlinear


def _present(value) -> bool:
    return value is not None and not (isinstance(value, float) and math.isnan(value))


def _or_dash(value, render) -> str:
    return render(value) if _present(value) else "-"


def _psnr(row) -> str:
    if _present(row["psnr_db"]):
        return f"{row['psnr_db']:.2f} dB"
    return "identical" if _present(row["identical_images"]) and row["identical_images"] else "-"


def reason_line(reason: str | None) -> str:
    """A stored failure on one line: its first line, and where that line only introduces the output quoted under
    it ("...; its last output:"), that output's last error line (else its last line): the real reason."""
    lines = [line.strip() for line in (reason or "").splitlines() if line.strip()]
    if len(lines) < 2 or not lines[0].endswith(":"):
        return lines[0] if lines else ""
    errors = [line for line in lines[1:] if line.lower().startswith(("error:", "diffmeter: error"))]
    return f"{lines[0]} {(errors or lines[1:])[-1]}"


LADDER_NOTE = " ((ladder): a ladder rung's, and its PSNR/SSIM, against its ladder's baseline, named below)"


def _ladder_rung(row) -> bool:
    return row.get("speedup_against") == "ladder baseline"


def ladder_lines(rows: list[dict]) -> list[str]:
    """Each ladder baseline the (ladder) rows are against: its steps, dtype and techniques, and its folder."""
    by_folder = {row["folder"]: row for row in rows}
    lines = []
    for folder in dict.fromkeys(row["speedup_baseline"] for row in rows if _ladder_rung(row)):
        base = by_folder.get(folder)
        techniques = base["optimizations"] or "no techniques" if base else ""
        settings = f"{base['steps']} steps, {base['dtype']}, {techniques}: " if base else ""
        lines.append(f"(ladder): against the ladder's baseline, {settings}{folder}")
    return lines


def _others(row) -> str:
    """The parallel degrees and the other settings, as the run folder names them ("ulysses-2, true-cfg-4")."""
    return ", ".join(filter(None, [*(row["parallel"] or "").split("+"), *(row["settings"] or "").split("+")]))


def results_table(frame, title: str) -> FittedTable:
    """The key columns of a ``load_results`` frame; per image, per video, or per output where it has both."""
    records = frame.to_dict(orient="records")
    word = outputs.noun(records)
    settings = any(_others(row) for row in records)  # what tells apart runs the other columns show alike
    table = FittedTable(
        escape(title),
        [
            Column("model", justify="left"),
            Column("size", drop=6),
            Column("batch", drop=5),
            Column("steps", drop=3),
            Column("dtype", justify="left", drop=2),
            Column("optimizations", justify="left", drop=7),
            *([Column("other settings", justify="left", drop=7)] if settings else []),
            Column("status", justify="left"),
            Column(f"s / {word} (median)"),
            Column("p90", drop=1),
            Column(f"{word}s / s (mean)", drop=4),
            Column("denoise share", drop=1),
            Column("peak memory", drop=4),
            Column(f"J / {word}", drop=2),
            Column("MFU", drop=2),
            Column("PSNR", drop=5),  # quality before p90, shares, energy and MFU
            Column("SSIM", drop=4),
            Column("speed-up", drop=6),
            Column("scaling", drop=5),
        ],
    )
    marked = False
    for row in records:
        weights = {"tiny-random": " (tiny)", "random": " (random weights)"}.get(row["weights"], "")
        marked |= bool(weights)
        memory = row["peak_cuda_bytes"] if _present(row["peak_cuda_bytes"]) else row["peak_rss_bytes"]
        status = row["status"] if row["status"] == "complete" else f"[red]{row['status']}[/]"
        rate = row["images_per_s"]
        rate = outputs.rate(rate, outputs.is_video(row), word == "output") if _present(rate) else "-"
        table.add_row(
            escape(f"{row['model']}{weights}"),
            outputs.size(row),
            str(row["batch"]),
            str(row["steps"]),
            row["dtype"],
            escape(row["optimizations"] or "none"),
            *([escape(_others(row) or "-")] if settings else []),
            status,
            _or_dash(row["s_per_image"], units.seconds) + (" (noisy)" if noise_lines([row]) else ""),
            _or_dash(row["s_per_image_p90"], units.seconds),
            rate,
            _or_dash(row["denoise_share"], lambda v: f"{v:.0%}"),
            _or_dash(memory, units.gib),
            _or_dash(row["gpu_j_per_image"], units.joules),
            _or_dash(row["mfu"], lambda v: f"{v:.1%}"),
            _psnr(row),
            _or_dash(row["ssim"], lambda v: f"{v:.4f}"),
            escape(speedup_cell(row) + (" (ladder)" if _ladder_rung(row) else "")),
            scaling_cell(row),
        )
    ladder = LADDER_NOTE if any(map(_ladder_rung, records)) else ""
    other = "other settings: parallel degrees and what else changes the generation, as the run folder names them; "
    other = other if settings else ""
    captions = [
        f"{other}s / {word}: median call latency / {word}s per call (p90 likewise); peak memory: CUDA max "
        f"allocated, else process peak RSS; J / {word}: GPU energy (Zeus); MFU: the denoising loop's; denoise "
        "share: of the mean call, as show's; PSNR/SSIM: against the unoptimized outputs at the same seeds; "
        f"speed-up: per {word} against the unoptimized run of the same settings (every one, the seed aside; on CUDA "
        f"the --no-tf32 run where one was measured, else TF32 alone){ladder}, "
        "the Hodges-Lehmann estimate over every pair of calls with its exact Mann-Whitney interval, within noise "
        "when that holds 1x or the estimate is within 5% of it; (noisy): the run's (or its baseline's) timings were "
        f"noisy, as noted below; scaling: a parallel run's s / {word} speed-up over the one-device run of the same "
        "spec (ratio of medians) and its share of the processes (scaling efficiency), "
        "(within noise) when the speed-up rule's interval on the same two runs holds 1x"
    ]
    failed = [f"failed, {row['folder']}: {reason_line(row['error'])}" for row in records if row["status"] == "failed"]
    below = [outputs.explained(word), coverage_line(records), *ladder_lines(records), *noise_lines(records), *failed]
    captions += [escape(line) for line in below if line]
    if any(_present(row["scaling_efficiency"]) and superlinear(row["scaling_efficiency"]) for row in records):
        captions.append(escape(SUPERLINEAR))
    if marked:
        captions.append(
            "(tiny) and (random weights): timings and PSNR/SSIM of test or random-weight pipelines, not of the model "
            "(their images are noise)"
        )
    table.caption = "\n".join(captions)
    return table


def sweep_plan_table(planned, out) -> FittedTable:
    """``sweep --dry-run``: every cell, its status and its offline compute."""
    table = FittedTable(
        escape(f"sweep plan: {units.counted(len(planned), 'cell')}, results under {out}"),
        [
            Column("#"),
            Column("cell", justify="left"),
            Column("status", justify="left"),
            Column("compute / call", drop=2),
            Column("reason", justify="left"),
        ],
    )
    for index, cell in enumerate(planned, 1):
        detail = reason_line(cell.reason)  # the whole reason: --json, the record
        status = cell.status + (" (batch search)" if cell.cell.batch_auto and cell.status == "to run" else "")
        table.add_row(
            str(index),
            escape(cell.cell.label),
            status,
            units.flops(cell.tflops * 1e12) if cell.tflops is not None else "-",
            escape(detail or ""),
        )
    table.caption = (
        "compute / call: the offline profile of one pipeline call (the whole batch), in FLOPs; done: a complete "
        "result is stored (skipped); failed: a failed result is stored (rerun it with --retry-failed); measured "
        "otherwise: a complete result is stored, measured with other settings than these (--remeasure replaces it); "
        "reason: its "
        "first line, with the error its quoted output ends on (--json: the whole)"
    )
    return table


def sweep_summary_table(record) -> FittedTable:
    """After a sweep: every cell's status, time and folder (or why it has none)."""
    counts = record.counts()
    title = ", ".join(f"{count} {status}" for status, count in counts.items() if count)
    table = FittedTable(
        escape(f"sweep '{record.name}', {units.counted(len(record.cells), 'cell')}: {title}"),
        [
            Column("cell", justify="left"),
            Column("status", justify="left"),
            Column("time"),
            Column("reason", justify="left"),
        ],
    )
    for cell in record.cells:
        status = cell.status if cell.status in ("done", "skipped") else f"[red]{cell.status}[/]"
        detail = reason_line(cell.reason)
        table.add_row(
            escape(cell.label),
            status,
            units.seconds(cell.seconds) if cell.seconds is not None else "-",
            escape(detail),
        )
    table.caption = (
        "time: the cell's process, loading included; skipped: stored by an earlier run; the run folders and "
        "why each cell has none are in the sweep's record"
    )
    return table
