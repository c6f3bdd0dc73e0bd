"""The local executor: each cell in its own process, one worker per visible GPU (pinned with
CUDA_VISIBLE_DEVICES), or one on CPU. A cell that crashes, is killed or runs past its timeout
ends as an outcome with its output's last lines; the sweep goes on."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path

from diffmeter.runs.spec import BenchSpec

#: lines of a cell's output kept with a failure
TAIL_LINES = 20


@dataclass
class Job:
    spec: BenchSpec
    name: str
    #: GPUs the cell needs (0 on CPU; a parallel run's processes on CUDA)
    gpus: int = 0
    #: the run folder of the unoptimized run it compares with (--compare-baseline)
    baseline: str | None = None
    #: a parallel run's: the run folder of the same run on one device, its scaling's reference
    one_device: str | None = None

    @property
    def reads(self) -> list[str]:
        """The stored runs the cell reads beside its own."""
        return [name for name in (self.baseline, self.one_device) if name]


@dataclass
class Outcome:
    #: the cell process's exit code; None when it was stopped at its timeout
    code: int | None
    tail: str
    seconds: float
    where: str = "this machine"
    #: why the cell did not run, where no process of it ended (a Ray task that failed, a cell no node can hold)
    reason: str | None = None

    @property
    def timed_out(self) -> bool:
        return self.code is None


def gpu_slots() -> list[str | None]:
    """One slot per visible GPU (its index, as CUDA_VISIBLE_DEVICES names it), or one CPU slot."""
    import torch

    if not torch.cuda.is_available():
        return [None]
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    names = [name.strip() for name in visible.split(",") if name.strip()] if visible else None
    return names or [str(index) for index in range(torch.cuda.device_count())]


class LocalExecutor:
    """Runs jobs as ``python -m diffmeter.sweep.cell`` processes, one per slot at a time."""

    def __init__(self, out: Path, slots: list[str | None] | None = None, timeout_s: float | None = None) -> None:
        self.out = out
        self.slots = slots if slots is not None else gpu_slots()
        self.timeout_s = timeout_s
        self._live: dict[int, subprocess.Popen] = {}
        self._lock = threading.Lock()

    def describe(self) -> str:
        gpus = [slot for slot in self.slots if slot is not None]
        return f"{len(gpus)} local GPU worker(s) ({', '.join(gpus)})" if gpus else "1 local CPU worker"

    def map(
        self, jobs: Iterable[Job], started: Callable[[Job], None], finished: Callable[[Job, Outcome], None]
    ) -> None:
        """Run every job, in order; ``started`` and ``finished`` are called in this thread. A job is started here,
        when as many slots are free as it needs GPUs (a parallel run: one per process; at most every slot), never by
        a worker: after an interrupt (Ctrl-C, whatever ``finished`` raises) no further cell starts, and the running
        ones are stopped."""
        pending = list(jobs)
        free = list(self.slots)
        running: dict[Future, tuple[Job, list[str | None]]] = {}
        with ThreadPoolExecutor(max_workers=len(self.slots)) as pool:

            def start_while_free() -> None:
                while pending and len(free) >= (need := min(max(pending[0].gpus, 1), len(self.slots))):
                    job, taken = pending.pop(0), [free.pop(0) for _ in range(need)]
                    started(job)
                    running[pool.submit(self.run_cell, job, taken)] = (job, taken)

            try:
                start_while_free()
                while running:
                    done, _ = wait(running, return_when=FIRST_COMPLETED)
                    for future in done:
                        job, taken = running.pop(future)
                        free.extend(taken)
                        finished(job, future.result())
                    start_while_free()
            except BaseException:
                self.stop()
                raise

    def run_cell(self, job: Job, slots: list[str | None]) -> Outcome:
        """The cell's process, pinned to the GPUs of ``slots`` (CPU slots: None); its output goes to a log beside
        the results."""
        logs = self.out / ".sweep" / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        log_path = logs / f"{job.name[:200]}.log"
        env = dict(os.environ)
        if gpus := [slot for slot in slots if slot is not None]:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)
        env.setdefault("PYTHONUNBUFFERED", "1")
        # named by the cell: a sweep killed before removing it leaves one its rerun overwrites, not a new one each time
        spec_path = logs / f"{job.name[:200]}.spec.json"
        spec_path.write_text(job.spec.model_dump_json(), encoding="utf-8")
        start = time.perf_counter()
        try:
            with open(log_path, "w", encoding="utf-8") as log:
                command = [sys.executable, "-m", "diffmeter.sweep.cell", str(spec_path), str(self.out)]
                command.append(str(os.getpid()))
                process = subprocess.Popen(
                    command,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    env=env,
                    start_new_session=True,  # Ctrl-C reaches the sweep, which stops its cells itself
                )
                with self._lock:
                    self._live[process.pid] = process
                try:
                    code = process.wait(timeout=self.timeout_s)
                except subprocess.TimeoutExpired:
                    _kill_group(process, signal.SIGKILL)
                    process.wait()
                    code = None
                finally:
                    with self._lock:
                        self._live.pop(process.pid, None)
        finally:
            spec_path.unlink(missing_ok=True)
        return Outcome(code, tail(log_path), time.perf_counter() - start)

    def stop(self, grace_s: float = 20.0) -> None:
        """Interrupt every running cell (each discards its unfinished run), then kill what remains."""
        with self._lock:
            live = list(self._live.values())
        for process in live:
            _kill_group(process, signal.SIGINT)
        deadline = time.monotonic() + grace_s
        for process in live:
            try:
                process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _kill_group(process, signal.SIGKILL)


def clear_left_specs(out: Path) -> None:
    """Remove the cell spec files a sweep killed outright (SIGKILL, power loss) left in ``out``'s logs: called with
    the folder held (``record.exclusive``), when no cell of it runs; ``tmp*.json``: those named before cells named
    them."""
    logs = out / ".sweep" / "logs"
    for left in [*logs.glob("*.spec.json"), *logs.glob("tmp*.json")]:
        left.unlink(missing_ok=True)


def _kill_group(process: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(process.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def tail(path: Path, lines: int = TAIL_LINES) -> str:
    """The last non-empty lines of a cell's output."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    return "\n".join([line for line in text.splitlines() if line.strip()][-lines:])
