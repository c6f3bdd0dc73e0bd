"""How long `diffmeter profile MODEL --gpu h100` (cold) and `diffmeter fit MODEL --gpu h100` (warm) take for every
catalog model, and `diffmeter profile --all` (cold): the real CLI in fresh processes, wall seconds.

- profile --gpu, cold: a fresh process with the disk cache off (``DIFFMETER_CACHE_DIR=off``): the FLOPs profile,
  the memory prediction and the operator pass all run. Target: under 15 s for every model.
- fit, warm: a second ``fit`` with the disk cache of the first (a fresh process each time, so imports count).
  Target: under 5 s. The first (cold) ``fit`` is shown too: it tracks the tiled and sliced decodes as well.
- profile --all --json, cold, cache off. Target: under 30 s.
- Figures: each model's FLOPs, peak memory (per stage and per call) and time bounds from ``profile --gpu
  --json``, compared with benchmarks/results/profile_gpu_figures.json (the last run's, with its commit), then
  written there: a speed-up must not change a figure.

Run from the repo root:  python benchmarks/profile_gpu_speed.py   (about 25 minutes on 2 cores).
Writes benchmarks/results/profile_gpu_speed.md; with model names, times those again and appends them;
with ``--figures``, only writes the figures file (the baseline, run at the commit before a change).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

from diffmeter.catalog import all_entries

TARGETS = {"profile": 15.0, "fit": 5.0, "all": 30.0}
OUT = Path(__file__).parent / "results" / "profile_gpu_speed.md"
FIGURES = Path(__file__).parent / "results" / "profile_gpu_figures.json"


def timed(arguments: list[str], cache: str) -> tuple[float, int, str]:
    """Wall seconds, exit code and output of ``diffmeter ARGUMENTS`` in a fresh process with
    ``DIFFMETER_CACHE_DIR=cache``."""
    environment = {**os.environ, "DIFFMETER_CACHE_DIR": cache}
    started = time.perf_counter()
    done = subprocess.run(["diffmeter", *arguments], env=environment, capture_output=True, text=True)
    return time.perf_counter() - started, done.returncode, done.stdout


def figures_of(output: str, returncode: int) -> dict:
    """What ``profile --gpu --json`` predicts: FLOPs, parameter bytes, peak memory per stage and per call, and the
    time's lower bound per stage (bytes and seconds as printed); a refusal as its exit code."""
    if returncode:
        return {"exit": returncode}
    found = json.loads(output)
    found = found[0] if isinstance(found, list) else found
    memory = found["memory"]
    return {
        "total_flops": found["total_flops"],
        "param_bytes": found["param_bytes"],
        "peak_memory_bytes": found["peak_memory_bytes"],
        "stage_peak_bytes": {stage["stage"]: stage["peak_bytes"] for stage in memory["stages"]},
        "call_peak_bytes": [[call["component"], call["batch"], call["peak_bytes"]] for call in memory["calls"]],
        "lower_s": found["time"]["lower_s"],
        "stage_lower_s": {stage["stage"]: stage["lower_s"] for stage in found["time"]["stages"]},
    }


def profiled(model: str) -> tuple[float, int, dict]:
    """``profile MODEL --gpu h100 --json``, cold: seconds, exit code, figures."""
    seconds, returncode, output = timed(["profile", model, "--gpu", "h100", "--json"], "off")
    return seconds, returncode, figures_of(output, returncode)


def measure(model: str) -> tuple[str, float, int, float, float, int, dict]:
    profile_s, profile_rc, figures = profiled(model)
    with tempfile.TemporaryDirectory() as cache:
        cold_s, fit_rc, _ = timed(["fit", model, "--gpu", "h100", "--json"], cache)
        warm_s, _, _ = timed(["fit", model, "--gpu", "h100", "--json"], cache)
    print(f"{model}: profile {profile_s:.1f} s (rc {profile_rc}), fit {cold_s:.1f} s cold, {warm_s:.1f} s warm")
    return model, profile_s, profile_rc, cold_s, warm_s, fit_rc, figures


def commit() -> str:
    done = subprocess.run(["git", "describe", "--always", "--dirty"], capture_output=True, text=True)
    return done.stdout.strip() or "unknown"


def write_figures(figures: dict[str, dict]) -> None:
    when = f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC"
    FIGURES.write_text(json.dumps({"commit": commit(), "date": when, "models": figures}, indent=1) + "\n")


def compared(figures: dict[str, dict]) -> str:
    """These figures against the last run's: unchanged, or per changed model which figures changed."""
    if not FIGURES.exists():
        return "**figures**: no earlier run to compare with"
    before = json.loads(FIGURES.read_text())
    changed = []
    for model, found in sorted(figures.items()):
        earlier = before["models"].get(model)
        if earlier == found:
            continue
        if earlier is None or "exit" in earlier or "exit" in found:
            was = "new" if earlier is None else f"exit {earlier['exit']}" if "exit" in earlier else "predicted"
            now = f"exit {found['exit']}" if "exit" in found else "predicted"
            changed.append(f"{model} ({was} -> {now})")
        else:
            changed.append(f"{model} ({', '.join(key for key in found if found[key] != earlier.get(key))})")
    verdict = "**UNCHANGED**" if not changed else f"**CHANGED**: {'; '.join(changed)}"
    return (
        f"**figures** (FLOPs, parameter bytes, peak memory per stage and per call, time bounds per stage) against "
        f"the last run's (commit {before['commit']}, {before['date']}), {len(figures)} models: {verdict}"
    )


def rerun(models: list[str]) -> int:
    """Time ``models`` again and append them to the results as a section of their own (after a change that
    concerns them; the whole catalog's table above stays as it was measured)."""
    load = os.getloadavg()[0]
    rows = [measure(model) for model in models]
    lines = [
        "",
        f"## Rerun of {len(models)} models, {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC (load average "
        f"{load:.2f} at start, {os.getloadavg()[0]:.2f} at end)",
        "",
        "| model | profile --gpu h100, cold (s) | fit, cold (s) | fit, warm (s) | exit codes (profile, fit) |",
        "|---|---|---|---|---|",
        *(f"| {m} | {p:.1f} | {c:.1f} | {w:.1f} | {prc}, {frc} |" for m, p, prc, c, w, frc, _ in rows),
    ]
    with open(OUT, "a") as results:
        results.write("\n".join(lines) + "\n")
    return 0


def main() -> int:
    models = sorted(entry.name for entry in all_entries() if not entry.name.startswith("tiny-"))
    if sys.argv[1:] == ["--figures"]:  # the baseline, at the commit before a change
        write_figures({model: profiled(model)[2] for model in models})
        print(f"written to {FIGURES}")
        return 0
    if len(sys.argv) > 1:  # python benchmarks/profile_gpu_speed.py MODEL ...: a rerun of those models
        return rerun(sys.argv[1:])
    load = os.getloadavg()[0]
    rows = [measure(model) for model in models]
    figures = {row[0]: row[6] for row in rows}
    all_s, all_rc, _ = timed(["profile", "--all", "--json"], "off")
    end_load = os.getloadavg()[0]
    answered = [row for row in rows if row[2] == 0 and row[5] == 0]  # the rest are refused in one line
    refused = ", ".join(row[0] for row in rows if row not in answered)
    worst_profile = max(answered, key=lambda row: row[1])
    worst_fit = max(answered, key=lambda row: row[4])
    over = ", ".join(f"{row[0]} {row[1]:.1f} s" for row in answered if row[1] >= TARGETS["profile"])
    lines = [
        "# `profile --gpu` and `fit` speed over the whole catalog",
        "",
        f"- date: {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC; machine: {os.cpu_count()} CPUs; "
        f"Python {sys.version.split()[0]}",
        f"- 1-minute load average: {load:.2f} at start, {end_load:.2f} at end (above ~0.1, other processes shared "
        "the CPUs and inflated wall times)",
        f"- {len(models)} catalog models; every figure is wall seconds of the real CLI in a fresh process. "
        f"{len(answered)} are predicted; the targets are over those. Refused in one line (exit 2: the memory "
        f"prediction cannot run them on fake tensors, docs/memory-prediction.md): {refused or 'none'}",
        "",
        f"**profile --gpu h100, cold** (cache off): median {statistics.median(r[1] for r in answered):.1f} s, "
        f"slowest {worst_profile[1]:.1f} s ({worst_profile[0]}); target < {TARGETS['profile']:g} s: "
        + ("**PASS**" if not over else f"**FAIL** ({over})"),
        "",
        f"**fit --gpu h100, warm** (disk cache of a first fit): median "
        f"{statistics.median(r[4] for r in answered):.1f} s, slowest {worst_fit[4]:.1f} s ({worst_fit[0]}); "
        f"target < {TARGETS['fit']:g} s: " + ("**PASS**" if worst_fit[4] < TARGETS["fit"] else "**FAIL**"),
        "",
        f"**profile --all --json, cold** (cache off): {all_s:.1f} s (exit {all_rc}); target < {TARGETS['all']:g} s: "
        + ("**PASS**" if all_s < TARGETS["all"] else "**FAIL**"),
        "",
        compared(figures),
        "",
        "| model | profile --gpu h100, cold (s) | fit, cold (s) | fit, warm (s) | exit codes (profile, fit) |",
        "|---|---|---|---|---|",
    ]
    for model, profile_s, profile_rc, cold_s, warm_s, fit_rc, _ in rows:
        lines.append(f"| {model} | {profile_s:.1f} | {cold_s:.1f} | {warm_s:.1f} | {profile_rc}, {fit_rc} |")
    OUT.write_text("\n".join(lines) + "\n")
    write_figures(figures)
    print(f"written to {OUT} and {FIGURES}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
