"""How long a user waits: wall time of common commands, now and at an earlier commit.

Each command runs in a fresh process (what a user types), three times, and the median is
reported. "Now" is measured twice: with an empty cache (the first time anyone asks that
question on this machine: torch and diffusers must be imported and the model counted) and with
the answer cached (every later time). The earlier commit (default: 42e9c96, before the cache and
the lazy imports) is run from a git worktree with the same virtual environment.

Run from the repo root:  python benchmarks/startup.py [--before REF]   (about six minutes on 2 cores)
Writes benchmarks/results/startup.md.
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
#: (command, the target the issue set)
COMMANDS = [
    ("--help", "0.5 s"),
    ("--version", "0.5 s"),
    ("profile sd15", "3 s"),
    ("models", "2 s"),
    ("profile --all", "(a progress bar past 2 s)"),
]
RUNS = 3


def timed(arguments: list[str], source: Path, cache) -> float:
    """Median wall seconds of ``diffmeter ARGUMENTS`` run from ``source``'s package; ``cache(run)``
    names the cache folder of each run ("off" for none)."""
    script = f"import sys; sys.path.insert(0, {str(source / 'src')!r}); from diffmeter.cli import main; main()"
    times = []
    for run in range(RUNS):
        environment = {**os.environ, "DIFFMETER_CACHE_DIR": cache(run), "PYTHONWARNINGS": "ignore"}
        start = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-c", script, *arguments], env=environment, capture_output=True, text=True
        )
        times.append(time.perf_counter() - start)
        if done.returncode != 0:
            raise RuntimeError(f"diffmeter {' '.join(arguments)} failed: {done.stderr[-500:]}")
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", default="42e9c96", help="the earlier commit to compare with")
    before_ref = parser.parse_args().before
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        before = Path(scratch) / "before"
        subprocess.run(["git", "worktree", "add", "--detach", str(before), before_ref], cwd=ROOT, check=True)
        try:
            for command, target in COMMANDS:
                arguments = command.split()
                old = timed(arguments, before, lambda run: "off")
                fresh = Path(scratch) / command.replace(" ", "_")
                empty = timed(arguments, ROOT, lambda run, fresh=fresh: str(fresh / f"empty-{run}"))  # none cached
                cached = timed(arguments, ROOT, lambda run, fresh=fresh: str(fresh / "empty-0"))  # filled above
                rows.append((command, old, empty, cached, target))
                print(f"{command:16s} before {old:6.2f} s   now, empty cache {empty:6.2f} s   cached {cached:6.2f} s")
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(before)], cwd=ROOT, check=False)
    lines = [
        "# Startup and answer times of common commands",
        "",
        f"Measured {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC by `python benchmarks/startup.py` on "
        f"{platform.processor() or platform.machine()} ({os.cpu_count()} cores), Python {platform.python_version()}: "
        f"wall time of a fresh process, median of {RUNS}. *Before*: commit `{before_ref}`.",
        "*Empty cache*: the first time this machine is asked (torch and diffusers imported, the model counted).",
        "*Cached*: every later time (the answer read from the disk cache, no library imported).",
        "",
        "| command | before | now, empty cache | now, cached | target |",
        "|---|---|---|---|---|",
    ]
    for command, old, empty, cached, target in rows:
        lines.append(f"| `diffmeter {command}` | {old:.2f} s | {empty:.2f} s | {cached:.2f} s | {target} |")
    lines += [
        "",
        "Importing torch and diffusers alone takes most of the empty-cache time on this machine (diffusers imports",
        "torch._dynamo at import), so a question never asked before cannot be answered in 3 s here; every repeated one",
        "is. `--help` and `--version` import neither library.",
    ]
    RESULTS.write_text("\n".join(lines) + "\n")
    print(f"written to {RESULTS}")


if __name__ == "__main__":
    main()
