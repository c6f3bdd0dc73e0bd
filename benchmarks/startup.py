"""How long a user waits: wall time of common commands, now and at an earlier commit.

Each command runs in a fresh process (what a user types), three times (--runs), and the median is
reported. "Now" is measured twice: with an empty cache (the first time anyone asks that
question on this machine: torch and diffusers must be imported and the model counted) and with
the answer cached (every later time). The earlier commit (default: 97e3a1c, before the read-only
commands stopped importing torch; 42e9c96 is before the cache and the lazy imports) is run from a git worktree
with the same virtual environment. The read-only commands (show, table, compare, report) read two runs stored
by tiny bench runs made first. A command that takes minutes cold (`fit --all`) is run cold once, and not at the
earlier commit (its time there is the one issue 49 reports).

Run from the repo root:  python benchmarks/startup.py [--before REF] [--runs N] [--only COMMAND ...]
(about 25 minutes on 2 cores, most of it `fit --all` cold). Writes benchmarks/results/startup.md after each command.
Other processes editing src/ change the cache's key between the empty and the cached runs: run it on a quiet tree.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "startup.md"
#: (command, the target the issue set, runs with an empty cache, rerun at the earlier commit); {run}, {other}: two
#: stored runs of one model at different sizes (so `compare` has no images to compare), {runs}: their folder,
#: {html}: a scratch page
COMMANDS = [
    ("--help", "0.5 s", None, True),
    ("--version", "0.5 s", None, True),
    ("profile sd15", "3 s", None, True),
    ("models", "1 s cached", None, True),
    ("profile --all", "(a progress bar past 2 s)", None, True),
    ("show {run}", "1 s", None, True),
    ("table {runs}", "1 s", None, True),
    ("compare {run} {other}", "1 s", None, True),
    ("report {runs} -o {html} --force", "1 s", None, True),
    ("fit flux-dev --gpu rtx-4090", "1 s cached", None, True),
    ("doctor", "3 s cached", None, True),
    ("fit --all --gpu rtx-4090 --html {html}", "60 s cached", 1, False),
]
#: what the issue measured for the commands not rerun at the earlier commit
NOT_RERUN = {"fit --all --gpu rtx-4090 --html {html}": "9 min 50 s (issue 49)"}
RUNS = 3


def launcher(source: Path) -> str:
    """``python -c`` code running the command line of ``source``'s package."""
    return f"import sys; sys.path.insert(0, {str(source / 'src')!r}); from diffmeter.cli import main; main()"


def timed(arguments: list[str], source: Path, cache, runs: int) -> float:
    """Median wall seconds of ``diffmeter ARGUMENTS`` run from ``source``'s package, ``runs`` times; ``cache(run)``
    names the cache folder of each run ("off" for none)."""
    times = []
    for run in range(runs):
        environment = {**os.environ, "DIFFMETER_CACHE_DIR": cache(run), "PYTHONWARNINGS": "ignore"}
        start = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-c", launcher(source), *arguments], env=environment, capture_output=True, text=True
        )
        times.append(time.perf_counter() - start)
        if done.returncode != 0:
            raise RuntimeError(f"diffmeter {' '.join(arguments)} failed: {done.stderr[-500:]}")
    return statistics.median(times)


def stored_runs(scratch: Path) -> dict[str, str]:
    """Two tiny-sd runs at different sizes stored in one folder (by this tree's code), and a scratch page's path."""
    out = scratch / "runs"
    for size in ("32", "64"):
        subprocess.run(
            [sys.executable, "-c", launcher(ROOT), "bench", "tiny-sd", "--steps", "1", "--iterations", "2",
             "--height", size, "--width", size, "--out", str(out)],
            check=True, capture_output=True, env={**os.environ, "DIFFMETER_CACHE_DIR": "off"},
        )  # fmt: skip
    run, other = sorted(str(folder) for folder in out.iterdir() if folder.is_dir())
    return {"run": run, "other": other, "runs": str(out), "html": str(scratch / "page.html")}


def arguments_of(command: str, paths: dict[str, str]) -> list[str]:
    """The command's arguments, paths filled in and "rtx-4090" given as the user types it ("rtx 4090")."""
    return [word.format(**paths).replace("rtx-4090", "rtx 4090") for word in command.split()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", default="97e3a1c", help="the earlier commit to compare with")
    parser.add_argument("--runs", type=int, default=RUNS, help="runs per figure (the median is reported)")
    parser.add_argument(
        "--slow-runs", type=int, help="runs at the earlier commit and with an empty cache (default: --runs)"
    )
    parser.add_argument("--only", nargs="*", help="measure only these commands (as listed in COMMANDS)")
    options = parser.parse_args()
    before_ref, runs, slow_runs = options.before, options.runs, options.slow_runs or options.runs
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        paths = stored_runs(Path(scratch))
        before = Path(scratch) / "before"
        subprocess.run(["git", "worktree", "add", "--detach", str(before), before_ref], cwd=ROOT, check=True)
        try:
            for command, target, cold_runs, rerun in COMMANDS:
                if options.only and command not in options.only:
                    continue
                arguments = arguments_of(command, paths)
                old = timed(arguments, before, lambda run: "off", slow_runs) if rerun else None
                fresh = Path(scratch) / f"cache-{len(rows)}"
                empty_runs = min(cold_runs or slow_runs, slow_runs)
                empty = timed(arguments, ROOT, lambda run, fresh=fresh: str(fresh / f"empty-{run}"), empty_runs)
                cached = timed(arguments, ROOT, lambda run, fresh=fresh: str(fresh / "empty-0"), runs)  # filled above
                rows.append((command, old, empty, empty_runs, cached, target))
                shown = f"{old:6.2f} s" if old is not None else NOT_RERUN[command]
                print(f"{command:40s} before {shown}   now, empty cache {empty:6.2f} s   cached {cached:6.2f} s")
                write(rows, before_ref, runs, slow_runs)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(before)], cwd=ROOT, check=False)
    print(f"written to {RESULTS}")


def write(rows, before_ref: str, runs: int, slow_runs: int) -> None:
    lines = [
        "# Startup and answer times of common commands",
        "",
        f"Measured {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC by `python benchmarks/startup.py` on "
        f"{platform.processor() or platform.machine()} ({os.cpu_count()} cores), Python {platform.python_version()}: "
        f"wall time of a fresh process, median of {runs} (before and with an empty cache: of {slow_runs}, the",
        f"machine being shared). *Before*: commit `{before_ref}`.",
        "*Empty cache*: the first time this machine is asked (torch and diffusers imported, the model counted).",
        "*Cached*: every later time (the answer read from the disk cache). `show`, `table`, `compare` and `report`",
        "read two runs stored by tiny bench runs (of different sizes: `compare` has no images to compare).",
        "",
        "| command | before | now, empty cache | now, cached | target |",
        "|---|---|---|---|---|",
    ]
    for command, old, empty, empty_runs, cached, target in rows:
        shown = command.replace("{run}", "RUN").replace("{other}", "OTHER").replace("{runs}", "DIR")
        shown = shown.replace("{html}", "FILE").replace("rtx-4090", '"rtx 4090"')
        was = f"{old:.2f} s" if old is not None else NOT_RERUN[command] + ", not rerun"
        cold = f"{empty:.2f} s" + ("" if empty_runs == slow_runs else f" ({empty_runs} run)")
        lines.append(f"| `diffmeter {shown}` | {was} | {cold} | {cached:.2f} s | {target} |")
    lines += [
        "",
        "Importing torch and diffusers alone takes most of the empty-cache time on this machine (diffusers imports",
        "torch._dynamo at import), so a question never asked before cannot be answered in 3 s here; every repeated one",
        "is. `--help`, `--version`, `show`, `table`, `compare` (without images to compare), `report`, and a cached",
        "`fit`, `fit --all`, `profile`, `profile --all` or `models` import neither library",
        "(tests/test_read_only_imports.py, tests/test_cache.py); a",
        "cached `doctor` imports torch (the CUDA devices, the build) but not diffusers, and probes the attention",
        "kernels and energy counters again only when the machine or its packages changed.",
    ]
    RESULTS.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
