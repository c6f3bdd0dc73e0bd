"""Start the processes of a parallel run, or join the launch this process is part of (torchrun).

diffmeter starts its ranks with torch.distributed's own launcher API (``elastic_launch``, what
torchrun runs): each worker gets the same RANK / LOCAL_RANK / WORLD_SIZE / MASTER_ADDR
environment as under torchrun, so one code path serves both, and the elastic agent watches the
workers: when one dies it stops the others, so a dead rank ends the run instead of leaving the
rest waiting in a collective (those also time out, ``group.COLLECTIVE_TIMEOUT_S``). A rank that fails on its
own (out of memory, an exception) writes why into the launch's failures folder before ending its process, and
the stored failed result quotes it, with every rank's log.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import tempfile
import uuid
from datetime import datetime, timezone
from pathlib import Path

from diffmeter.distributed.group_result import RANKS
from diffmeter.errors import DiffmeterError
from diffmeter.runs import storage
from diffmeter.runs.run_directory import RunDirectory
from diffmeter.runs.spec import BenchSpec

#: lines of a failed rank's output kept in the failed result
TAIL_LINES = 20
#: the folder (in the launch's logs) where a failing rank writes why: rank-N.error, rank-N.log
FAILURES = "failures"
#: the first line of a Python warning as ``warnings`` prints it ("path:line: FutureWarning: text"); the source line
#: it quotes follows, indented
WARNING = re.compile(r"^\S.*:\d+: \w*Warning: ")
#: a Python warning in a rank's bench.log (its warnings are logged there: "... WARNING FutureWarning: text (path)")
LOGGED_WARNING = re.compile(r" WARNING \w*Warning: ")


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
    from diffmeter.runs.prepared import prepare, store_failure

    # every refusal here, before any process starts; memory is checked by each rank on its own GPU, after placing
    # itself there (a check here would open a CUDA context on GPU 0 that stays for the whole run)
    prepared = prepare(spec, check_memory=False)
    RunDirectory(out, prepared.name, force, prepared.spec).check()
    if progress is not None:
        progress(f"starting {spec.world_size} processes", 0, None)
    started = datetime.now(timezone.utc).replace(microsecond=0)
    with tempfile.TemporaryDirectory(prefix="diffmeter-ranks-") as logs:
        try:
            returned = _launch(spec, out, force, Path(logs))
        except Exception as error:  # the agent's ChildFailedError, or a failed rendezvous
            # Ctrl-C, as the agent's SignalException says it, raised once it has shut its workers down (torch 2.13
            # torch/distributed/elastic/agent/server/api.py:752-756, launcher/api.py:391-397)
            if getattr(error, "sigval", None) == signal.SIGINT:
                RunDirectory(out, prepared.name, force, prepared.spec).clear_staged()  # rank 0's, stopped
                raise KeyboardInterrupt from None  # by the user, not failed: nothing stored (exit 130)
            stored = Path(out).expanduser() / prepared.name
            if not _failed_since(stored, started):  # rank 0 could not record it itself
                kept = _rank_logs(stored, Path(logs))
                reason = _reason(error, Path(logs), kept)
                stored = store_failure(prepared, out, reason, kept)
            result = storage.read_result(stored)
            raise DiffmeterError(f"{result.error} (recorded as a failed result in {stored})") from None
    return _stored(returned[0])


def _launch(spec: BenchSpec, out, force: bool, logs: Path) -> dict:
    from diffmeter.distributed import rank_run

    failures = str(logs / FAILURES)
    return start(spec.world_size, rank_run.run, (spec, str(out), force, "diffmeter", failures), logs)


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
    with _agent_quiet():
        _start_tracker_quiet()
        return elastic_launch(config, function)(*arguments)


def _start_tracker_quiet() -> None:
    """Start multiprocessing's resource tracker (the spawned ranks' semaphores are registered with it) with its own
    leak warning off: a killed rank leaves its semaphores to the tracker, which cleans them up at exit and warns
    "There appear to be N leaked semaphore objects" on the terminal (Lib/multiprocessing/resource_tracker.py),
    below the failure it has nothing to add to. The tracker is its own interpreter and reads ``PYTHONWARNINGS`` as
    it starts; a tracker already running is left as it is."""
    from multiprocessing import resource_tracker

    before = os.environ.get("PYTHONWARNINGS")
    quiet = "ignore::UserWarning:multiprocessing.resource_tracker"
    os.environ["PYTHONWARNINGS"] = f"{before},{quiet}" if before else quiet
    try:
        resource_tracker.ensure_running()
    finally:
        if before is None:
            del os.environ["PYTHONWARNINGS"]
        else:
            os.environ["PYTHONWARNINGS"] = before


@contextlib.contextmanager
def _agent_quiet():
    """The elastic agent logs a failed worker's traceback to the terminal (its loggers set their own level:
    torch/distributed/elastic/utils/logging.py, ``get_logger``); the failed result quotes the rank's reason and
    keeps its log instead, so the agent's loggers stay quiet while it runs."""
    loggers = [
        logging.getLogger(name)
        for name in list(logging.root.manager.loggerDict)
        if name.startswith("torch.distributed.elastic") or name.startswith("torch.distributed.launcher")
    ]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.CRITICAL + 1)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


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


def _reason(error: Exception, logs: Path, kept: dict[str, str]) -> str:
    """Which rank failed and why. A rank that died without saying why (killed, crashed) is the cause: its peers'
    own errors ("connection closed by peer") follow from it. Otherwise the first rank that said why in the
    failures folder (the others were stopped after it); else the one the elastic agent saw die first. ``kept``:
    the ranks' logs (``_rank_logs``)."""
    said = {int(path.stem.split("-")[1]): path for path in (logs / FAILURES).glob("rank-*.error")}
    failures = getattr(error, "failures", None) or {}
    silent = {
        rank: failure
        for rank, failure in failures.items()
        if rank not in said and not (failure.exitcode < 0 and failure.signal_name() == "SIGTERM")  # the agent's stop
    }
    if silent:
        return _died(logs, kept, *min(silent.items(), key=lambda item: item[1].timestamp))
    if said:
        return min(said.values(), key=lambda path: path.stat().st_mtime).read_text(encoding="utf-8")
    if not failures:
        return f"the parallel launch failed: {(str(error) or type(error).__name__).splitlines()[0]}"
    return _died(logs, kept, *min(failures.items(), key=lambda item: item[1].timestamp))


def _died(logs: Path, kept: dict[str, str], rank: int, failure) -> str:
    """A rank that ended without saying why: how it ended, the last line of its own log (what it had done) and its
    last output, the libraries' warnings left out (they say nothing of why it stopped)."""
    how = f"killed by signal {failure.signal_name()}" if failure.exitcode < 0 else f"exit code {failure.exitcode}"
    log = kept.get(storage.LOG if rank == 0 else f"{RANKS}/rank-{rank}/{storage.LOG}", "")
    logged = [line for line in log.strip().splitlines() if not LOGGED_WARNING.search(line)]
    tail = _tail(logs, failure.local_rank)
    return (
        f"rank {rank} died ({how}) and the run stopped"
        + (f"; its log ends: {logged[-1]}" if logged else "")
        + (f"; its last output:\n{tail}" if tail else "")
    )


def _rank_logs(stored: Path, logs: Path) -> dict[str, str]:
    """Every rank's bench.log (path in the run folder: text): the copies the ranks wrote in the failures folder,
    else what rank 0's staged folder still holds."""
    kept = {}
    for staged in stored.parent.glob(f".{stored.name}.partial-*"):
        for log in staged.rglob(storage.LOG):
            kept[str(log.relative_to(staged))] = log.read_text(encoding="utf-8", errors="replace")
    for log in (logs / FAILURES).glob("rank-*.log"):
        rank = int(log.stem.split("-")[1])
        where = storage.LOG if rank == 0 else f"{RANKS}/rank-{rank}/{storage.LOG}"
        kept[where] = log.read_text(encoding="utf-8", errors="replace")
    return kept


def _tail(logs: Path, local_rank: int) -> str:
    """The last lines a rank's process printed, without the libraries' warnings."""
    lines = []
    for path in sorted(logs.rglob(f"attempt_0/{local_rank}/std*.log")):
        lines += without_warnings(path.read_text(encoding="utf-8", errors="replace").splitlines())
    return "\n".join(lines[-TAIL_LINES:])


def without_warnings(lines: list[str]) -> list[str]:
    """``lines`` without the Python warnings printed among them (each warning's line and the source line it
    quotes)."""
    kept, quoting = [], False
    for line in lines:
        if WARNING.match(line):
            quoting = True
        elif not (quoting and line.startswith("  ")):
            quoting = False
            kept.append(line)
    return kept
