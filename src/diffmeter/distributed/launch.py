"""Start the processes of a parallel run, or join the launch this process is part of (torchrun).

diffmeter starts its ranks with torch.distributed's own launcher API (``elastic_launch``, what
torchrun runs): each worker gets the same RANK / LOCAL_RANK / WORLD_SIZE / MASTER_ADDR
environment as under torchrun, so one code path serves both, and the elastic agent watches the
workers: when one dies it stops the others, so a dead rank ends the run instead of leaving the
rest waiting in a collective (those also time out, ``rank_run.COLLECTIVE_TIMEOUT_S``).
"""

from __future__ import annotations

import os
import tempfile
import uuid
from datetime import datetime, timezone
from pathlib import Path

from diffmeter.errors import DiffmeterError
from diffmeter.runs import storage
from diffmeter.runs.spec import BenchSpec

#: lines of a failed rank's output kept in the failed result
TAIL_LINES = 20


def joined() -> bool:
    """Whether this process is a rank of an existing launch (torchrun sets these)."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def bench_parallel(spec: BenchSpec, out, force: bool = False, progress=None):
    """Run ``spec`` over ``spec.world_size`` processes; returns (BenchResult, run folder) where
    rank 0 wrote it. Under torchrun every rank calls this; the others return (None, None)."""
    from diffmeter.distributed import rank_run

    if joined():
        folder = rank_run.run(spec, out, force, "torchrun")
        return (None, None) if folder is None else _stored(folder)
    from diffmeter.runs.runner import prepare, store_failure

    # every refusal here, before any process starts; memory is checked by each rank on its own GPU, after placing
    # itself there (a check here would open a CUDA context on GPU 0 that stays for the whole run)
    prepared = prepare(spec, check_memory=False)
    storage.RunDirectory(out, prepared.name, force, prepared.spec).check()
    if progress is not None:
        progress(f"starting {spec.world_size} processes", 0, None)
    started = datetime.now(timezone.utc).replace(microsecond=0)
    with tempfile.TemporaryDirectory(prefix="diffmeter-ranks-") as logs:
        try:
            returned = _launch(spec, out, force, Path(logs))
        except Exception as error:  # the agent's ChildFailedError, or a failed rendezvous
            stored = Path(out).expanduser() / prepared.name
            if not _failed_since(stored, started):  # rank 0 could not record it itself
                stored = store_failure(prepared, out, _reason(error, Path(logs)))
            result = storage.read_result(stored)
            raise DiffmeterError(f"{result.error} (recorded as a failed result in {stored})") from None
    return _stored(returned[0])


def _launch(spec: BenchSpec, out, force: bool, logs: Path) -> dict:
    from diffmeter.distributed import rank_run

    return start(spec.world_size, rank_run.run, (spec, str(out), force, "diffmeter"), logs)


def start(processes: int, function, arguments: tuple, logs: Path) -> dict:
    """``function(*arguments)`` in ``processes`` new processes on this machine (spawned, each with
    torchrun's environment), watched by torch's elastic agent; returns {rank: what it returned}.
    Each process's output goes to files under ``logs``."""
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, Std
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    config = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=processes,
        run_id=f"diffmeter-{uuid.uuid4().hex[:8]}",
        rdzv_backend="c10d",
        rdzv_endpoint="localhost:0",  # a free port, on this machine only
        max_restarts=0,
        monitor_interval=0.5,
        start_method="spawn",
        logs_specs=DefaultLogsSpecs(log_dir=str(logs), redirects=Std.ALL),
    )
    return elastic_launch(config, function)(*arguments)


def _stored(folder: Path):
    result = storage.read_result(folder)
    if result.status == "failed":
        raise DiffmeterError(f"{result.error} (recorded as a failed result in {folder})")
    return result, folder


def _failed_since(folder: Path, started: datetime) -> bool:
    """Whether rank 0 stored a failed result in ``folder`` during this launch."""
    if not (folder / storage.RESULTS).exists():
        return False
    result = storage.read_result(folder)
    return result.status == "failed" and datetime.fromisoformat(result.created_utc) >= started


def _reason(error: Exception, logs: Path) -> str:
    """Which rank failed and how, with the end of its output."""
    failures = getattr(error, "failures", None)
    if not failures:
        return f"the parallel launch failed: {(str(error) or type(error).__name__).splitlines()[0]}"
    rank, failure = min(failures.items(), key=lambda item: item[1].timestamp)
    how = f"killed by signal {failure.signal_name()}" if failure.exitcode < 0 else f"exit code {failure.exitcode}"
    tail = _tail(logs, failure.local_rank)
    return f"rank {rank} died ({how}) and the run stopped" + (f"; its last output:\n{tail}" if tail else "")


def _tail(logs: Path, local_rank: int) -> str:
    lines = []
    for path in sorted(logs.rglob(f"attempt_0/{local_rank}/std*.log")):
        lines += path.read_text(encoding="utf-8", errors="replace").splitlines()
    return "\n".join(lines[-TAIL_LINES:])
