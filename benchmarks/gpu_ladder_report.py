"""benchmarks/gpu_ladder.py's report: the journal's latest record of every rung and chunk as markdown, written beside
the .jsonl as results/gpu_ladder_<device>.md."""

from __future__ import annotations

from datetime import datetime, timezone

import diffusers
import torch
from gpu_ladder_rungs import LADDERS, RUNGS, SELF_TEST_STEPS, Journal

from diffmeter import units

STAGES = ("text_encoding", "denoising", "vae_decode")


def write_report(journal: Journal, device: str, self_test: bool):
    """The report of ``journal`` on ``device`` (its name), beside it as .md; returns its path."""
    path = journal.path.with_suffix(".md")
    path.write_text(markdown(journal, device, self_test))
    return path


def markdown(journal: Journal, device: str, self_test: bool) -> str:
    chunks = [line for line in journal.lines if line["kind"] == "chunk"]
    link = next((line["host_link"] for line in journal.lines if line.get("host_link")), None)
    lines = [
        f"# The ladder on {device}" + (" (self-test: tiny stand-ins on the CPU)" if self_test else ""),
        "",
        f"Written {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC by `python benchmarks/gpu_ladder.py"
        + (" --self-test" if self_test else "")
        + f"`: torch {torch.__version__}, diffusers {diffusers.__version__}. Each rung is the last one that ran plus "
        "one technique; its expected range was printed before it ran; times are medians per call (one image, or "
        "one video), seconds; memory in GiB; speed-up and images against the rung below (random weights: images "
        "are noise, so PSNR/SSIM say how far a rung moves the output, not how good it looks).",
        "",
        f"Host link: {link}" if link else "Host link: none measured (no CUDA run recorded).",
        "",
        "| chunk | status | length | limit | ended (UTC) |",
        "|---|---|---|---|---|",
        *(
            f"| {c['chunk']} | {c['status']} | {units.seconds(c['seconds'])} | {units.seconds(c['limit_s'])} | "
            f"{c['utc']} |"
            for c in chunks
        ),
    ]
    for ladder in LADDERS:
        rows = [journal.latest(kind="rung", ladder=ladder.key, rung=rung) for rung in RUNGS]
        rows = [row for row in rows if row is not None]
        if not rows:
            continue
        model = ladder.tiny if self_test else ladder.model
        settings = (
            f"{SELF_TEST_STEPS} steps, the tiny model's size"
            if self_test
            else ", ".join(f"{k} {v}" for k, v in ladder.settings.items())
        )
        lines += ["", f"## {model}: {settings}, batch 1", "", *table(rows), ""]
        lines += [f"- {row['rung']}: {row['status']}: {row['reason']}" for row in rows if row.get("reason")]
    return "\n".join(lines) + "\n"


def table(rows: list[dict]) -> list[str]:
    out = [
        "| rung | adds | expected s/call | measured s/call (interval, calls) | verdict | text / denoising / decode | "
        "MFU | peak memory | energy / output | vs the rung below | rung took |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        if row["status"] != "complete":
            out.append(f"| {row['rung']} | {row.get('adds', '-')} | | | {row['status']} | | | | | | |")
            continue
        expected = "-" if row["expected_s"] is None else "{:.3f}-{:.3f}".format(*row["expected_s"])
        low, high = row["interval_s"]
        stages = " / ".join(units.seconds(row["stages_s"][s]) if s in row["stages_s"] else "-" for s in STAGES)
        mfu = f"{row['mfu']:.1%}" if row["mfu"] is not None else "-"
        energy = units.joules(row["energy_j_per_image"]) if row["energy_j_per_image"] is not None else "-"
        out.append(
            f"| {row['rung']} | {row['adds']} | {expected} | {row['median_s']:.3f} ({low:.3f}-{high:.3f}, "
            f"{row['calls']}) | {row['verdict']} | {stages} | {mfu} | {units.gib(row['peak_memory_bytes'])} "
            f"({row['peak_memory_kind']}) | {energy} | {below(row)} | {units.seconds(row['seconds'])} |"
        )
    return out


def below(row: dict) -> str:
    if row.get("below") is None:
        return "-"
    parts = []
    if row.get("speedup_text"):
        parts.append(row["speedup_text"])
    if row.get("difference"):
        parts.append(row["difference"])
    elif row.get("identical") is not None and row["psnr_db"] is None:
        parts.append(f"images identical ({row['identical']})")
    elif row.get("identical") is not None:
        parts.append(f"PSNR {row['psnr_db']:.1f} dB, SSIM {row['ssim']:.4f}, {row['identical']} identical")
    return f"{row['below']}: " + "; ".join(parts)
