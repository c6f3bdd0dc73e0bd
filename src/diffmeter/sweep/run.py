"""Run a sweep: plan every cell, run the baselines other cells compare against first, then the
rest through an executor (local processes or Ray tasks), store a failed result for every cell
that died without one, and keep the sweep's record current after each cell."""

from __future__ import annotations

import signal
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from diffmeter import units
from diffmeter.distributed import scaling
from diffmeter.errors import DiffmeterError, DoesNotFit
from diffmeter.runs.lifecycle import CALL_STARTS
from diffmeter.runs.prepared import PreparedRun, prepare, store_failure
from diffmeter.runs.storage import LOG, RESULTS, writable_folder
from diffmeter.sweep import record as rec
from diffmeter.sweep.file import Cell, SweepFile, expand
from diffmeter.sweep.local import Job, Outcome, clear_left_specs, tail
from diffmeter.sweep.plan import (
    CHANGED,
    DONE,
    FAILED,
    REFUSED,
    TO_RUN,
    PlannedCell,
    measured_otherwise,
    plan,
    stored_result,
)

#: the exit code of a cell stopped by Ctrl-C
INTERRUPTED = 130


@dataclass
class Callbacks:
    """What the command shows: a cell starts (its label), a cell ends (its record)."""

    started: Callable[[str], None] = lambda label: None
    finished: Callable[[rec.CellRecord], None] = lambda cell: None


@dataclass
class _Work:
    job: Job
    run: PreparedRun
    records: list[rec.CellRecord] = field(default_factory=list)


def run_sweep(
    sweep: SweepFile,
    out: Path,
    executor,
    retry_failed: bool = False,
    here: bool = True,
    callbacks: Callbacks | None = None,
    remeasure: bool = False,
) -> rec.SweepRecord:
    """Every cell of ``sweep`` run or accounted for; returns the record also written to ``out``. A cell or baseline
    stored complete but measured otherwise (``storage.MEASURED_BY``) is refused before anything runs, or, with
    ``remeasure``, measured again."""
    callbacks = callbacks or Callbacks()
    writable_folder(out)
    with rec.exclusive(out):
        clear_left_specs(out)
        planned = plan(expand(sweep), out, retry_failed, here, remeasure)
        # prepared once (a profile each): with ``remeasure`` there are no CHANGED cells, without it none pass
        baselines = _baselines(planned, here, (TO_RUN, CHANGED))
        _refuse_measured_otherwise(planned, baselines, out, remeasure)
        times = rec.earlier_times(out, sweep.name or "sweep")  # a skipped cell keeps its time and machine
        record = rec.SweepRecord(
            name=sweep.name or "sweep",
            created_utc=rec.now(),
            updated_utc=rec.now(),
            executor=executor.describe(),
            definition=sweep,
            cells=[_initial(cell) for cell in planned],
        )
        for cell in record.cells:
            if cell.status == rec.SKIPPED and cell.folder in times:
                cell.seconds, cell.where = times[cell.folder]
        rec.save(record, out)
        for cell in record.cells:
            if cell.status != rec.PENDING:
                callbacks.finished(cell)
        first, rest = _phases(planned, baselines, record, out, remeasure)
        _run_phase(first, executor, out, record, callbacks)
        _run_phase(_with_baseline(rest, out, record, callbacks), executor, out, record, callbacks)
        for index, cell in enumerate(planned):
            if cell.status == TO_RUN and cell.cell.batch_auto:
                _search_batch(cell.cell, record.cells[index], executor, out, record, callbacks, here, retry_failed)
        return record


def _initial(cell: PlannedCell) -> rec.CellRecord:
    status = {TO_RUN: rec.PENDING, DONE: rec.SKIPPED, FAILED: rec.FAILED, REFUSED: rec.REFUSED}[cell.status]
    return rec.CellRecord(
        label=cell.cell.label,
        values=cell.cell.values,
        status=status,
        folder=cell.run.name if cell.run else None,
        reason=cell.reason,
        tflops_per_call=cell.tflops,
    )


def _refuse_measured_otherwise(
    planned: list[PlannedCell], baselines: list[PreparedRun], out: Path, remeasure: bool
) -> None:
    """One line naming the stored cells and baselines measured otherwise than the sweep asks, and the two fixes."""
    if remeasure:
        return
    changed = [cell for cell in planned if cell.status == CHANGED]
    found = [(cell.cell.label, cell.reason) for cell in changed]
    named = {cell.run.name for cell in changed}  # a baseline that is a cell of the sweep is said once
    for baseline in {run.name: run for run in baselines}.values():
        if baseline.name not in named and (changes := measured_otherwise(out / baseline.name, baseline.spec)):
            found.append((f"the baseline of {baseline.spec.model}", f"stored measured otherwise: {', '.join(changes)}"))
    if found:
        label, reason = found[0]
        more = f"; and {len(found) - 1} more" if len(found) > 1 else ""
        verb = "was" if len(found) == 1 else "were"
        raise DiffmeterError(
            f"{units.counted(len(found), 'stored run')} in {out} {verb} measured otherwise than this sweep asks "
            f"({label}: {reason}{more}): "
            "pass --remeasure to measure them again, replacing their results, or --out DIR for a new study"
        )


def _baselines(planned: list[PlannedCell], here: bool, statuses: tuple[str, ...]) -> list[PreparedRun]:
    """The unoptimized runs the cells of ``statuses`` with ``--compare-baseline`` compare against."""
    found = []
    for cell in planned:
        spec = cell.run.spec if cell.run else None
        if cell.status not in statuses or spec is None or not spec.compare_baseline:
            continue
        try:
            found.append(prepare(spec.baseline(), here=here))
        except DiffmeterError:
            continue  # the cell itself reports it when it runs
    return found


def _phases(
    planned: list[PlannedCell], baselines: list[PreparedRun], record: rec.SweepRecord, out: Path, remeasure: bool
):
    """Jobs in two phases: the baselines that cells with --compare-baseline need (so two cells
    never measure the same baseline at once) and the cells that are another cell's one-device run (so a parallel
    cell finds it stored and states its scaling), then every other cell."""
    work: dict[str, _Work] = {}
    for cell, cell_record in zip(planned, record.cells, strict=True):
        if cell.status == TO_RUN and not cell.cell.batch_auto:
            work.setdefault(cell.run.name, _Work(job_of(cell.run), cell.run)).records.append(cell_record)
    first: dict[str, _Work] = {}
    for baseline in baselines:
        if baseline.name in work:
            first[baseline.name] = work.pop(baseline.name)
        elif stored_result(out / baseline.name)[0] != "complete" or (
            remeasure and measured_otherwise(out / baseline.name, baseline.spec)
        ):
            first.setdefault(baseline.name, _Work(job_of(baseline), baseline))
    for one_device in {queued.job.one_device for queued in work.values()} & set(work):
        first[one_device] = work.pop(one_device)
    return list(first.values()), list(work.values())


def _with_baseline(phase: list[_Work], out: Path, record: rec.SweepRecord, callbacks: Callbacks) -> list[_Work]:
    """The work whose baseline (``--compare-baseline``) is stored complete, or that needs none; a cell whose
    baseline failed is failed with the baseline's reason, stored, not run (it would measure that baseline again
    inside its own cell); ``--retry-failed`` reruns both."""
    ready = []
    for work in phase:
        status, error = stored_result(out / work.job.baseline) if work.job.baseline else ("complete", None)
        if status == "complete":
            ready.append(work)
            continue
        first = (error or "no result stored").splitlines()[0]
        reason = f"its baseline {work.job.baseline} did not complete ({first}): rerun with --retry-failed"
        store_failure(work.run, out, reason)
        for cell in work.records:
            cell.status, cell.reason = rec.FAILED, reason
            callbacks.finished(cell)
    rec.save(record, out)
    return ready


def job_of(run: PreparedRun) -> Job:
    """The job that runs ``run``: the GPUs it needs, the baseline it compares with and, for a parallel run, the
    one-device run its scaling is against."""
    baseline = None
    if run.spec.compare_baseline:
        try:
            baseline = prepare(run.spec.baseline(), here=False).name
        except DiffmeterError:
            pass  # the cell reports it when it runs
    gpus = run.spec.world_size if run.spec.device.startswith("cuda") else 0  # a parallel run: a GPU per process
    one_device = None
    if run.spec.world_size > 1:
        one_device = scaling.one_device_name(run.spec, run.entry, [o.label() for o in run.optimizations])
    return Job(run.spec, run.name, gpus=gpus, baseline=baseline, one_device=one_device)


def _run_phase(phase: list[_Work], executor, out: Path, record: rec.SweepRecord, callbacks: Callbacks) -> None:
    by_name = {work.job.name: work for work in phase}
    previous = {name: _stamp(out / name) for name in by_name}  # results a rerun replaces (--retry-failed)

    def started(job: Job) -> None:
        callbacks.started(" | ".join(r.label for r in by_name[job.name].records) or f"baseline {job.spec.model}")

    def finished(job: Job, outcome: Outcome) -> None:
        work = by_name[job.name]
        status, reason = settle_outcome(work.run, out, outcome, previous[job.name])
        for cell in work.records:
            cell.status, cell.reason, cell.seconds, cell.where = status, reason, outcome.seconds, outcome.where
            callbacks.finished(cell)
        rec.save(record, out)

    try:
        executor.map([work.job for work in phase], started, finished)
    finally:  # stopped (Ctrl-C): a cell that stored its result before its process was told of it is not pending
        for work in phase:
            stored, error = _stored_since(out / work.job.name, previous[work.job.name])
            for cell in work.records:
                if cell.status == rec.PENDING and stored in ("complete", "failed"):
                    cell.status, cell.reason = (rec.DONE, None) if stored == "complete" else (rec.FAILED, error)
        rec.save(record, out)


def _stamp(folder: Path) -> int | None:
    """When the folder's result was written (None: it has none)."""
    try:
        return (folder / RESULTS).stat().st_mtime_ns
    except OSError:
        return None


def _stored_since(folder: Path, previous: int | None) -> tuple[str | None, str | None]:
    """The (status, error) of a result stored in ``folder`` since ``previous`` (``_stamp``); (None, None) if none."""
    return stored_result(folder) if _stamp(folder) != previous else (None, None)


def settle_outcome(
    run: PreparedRun, out: Path, outcome: Outcome, previous: int | None = None
) -> tuple[str, str | None]:
    """The cell's status after its process ended; a cell that died without storing a new result
    (``previous``: the one it was to replace) gets a failed one stored, with the reason and its
    output's last lines."""
    stored, error = _stored_since(out / run.name, previous)
    if stored == "complete":
        return rec.DONE, None
    if stored == "failed":
        return rec.FAILED, error
    if outcome.code == INTERRUPTED:
        raise KeyboardInterrupt
    if outcome.reason:  # no process of the cell ended: nothing it printed or logged
        store_failure(run, out, outcome.reason)
        return rec.FAILED, outcome.reason
    if outcome.timed_out:
        why = "stopped at the sweep's per-cell timeout"
    elif outcome.code is not None and outcome.code < 0:
        why = f"the cell's process was killed by {_signal_name(-outcome.code)}"
    else:
        why = f"the cell's process exited with code {outcome.code} without a result"
    staged = _staged_log(out, run.name)
    logged = staged.read_text(encoding="utf-8", errors="replace") if staged is not None else ""  # read once
    why += _last_call(logged)
    said = [f"its last output:\n{outcome.tail}"] if outcome.tail.strip() else []
    if staged is not None and (last_lines := tail(staged)):
        said.append(f"the last lines of its {LOG}:\n{last_lines}")
    error = f"{why} after {outcome.seconds:.1f} s on {outcome.where}; " + ("\n".join(said) or "it printed nothing")
    logs = {LOG: logged} if staged is not None else None
    store_failure(run, out, error, logs)
    return rec.FAILED, error


def _staged_log(out: Path, name: str) -> Path | None:
    """The log a cell that died was writing in its staged run folder (``run_directory.RunDirectory``), which storing
    its failure removes; the newest, should an earlier death have left one too."""
    logs = sorted(Path(out).glob(f".{name}.partial-*/{LOG}"), key=lambda path: path.stat().st_mtime_ns)
    return logs[-1] if logs else None


def _last_call(logged: str) -> str:
    """ " in warm-up call 1 of 1 (torch.compile compiles on it)": the pipeline call the run's log (its text) says it
    started last (``lifecycle.CALL_STARTS``), or "" where it started none (loading, or no log)."""
    started = [line.split(CALL_STARTS, 1)[1] for line in logged.splitlines() if CALL_STARTS in line]
    return f" in {started[-1].strip()}" if started else ""


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _search_batch(cell: Cell, cell_record, executor, out: Path, record, callbacks, here: bool, retry: bool) -> None:
    """``batch_size: auto``: double the batch from 1 until a run does not fit (refused by the
    memory check, or out of memory); record the largest that fit. Every batch tried is its own
    run folder, so a resumed search reuses what it already measured."""
    batch, largest, tried, limit = 1, None, [], cell.batch_limit
    while batch <= limit:
        tried.append(batch)
        try:
            run = prepare(cell.spec.model_copy(update={"batch_size": batch}), here=here)
        except DoesNotFit:
            break
        except DiffmeterError as error:
            cell_record.status, cell_record.reason = rec.FAILED, str(error)
            break
        status, error = stored_result(out / run.name)
        if status is None or (status == "failed" and retry and not _out_of_memory(error)):
            quiet = Callbacks(started=callbacks.started)  # the cell is finished once, when the search ends
            _run_phase([_Work(job_of(run), run, [cell_record])], executor, out, record, quiet)
            status, error = stored_result(out / run.name)
        if status != "complete":
            if not _out_of_memory(error):
                cell_record.status, cell_record.reason = rec.FAILED, error
                largest = None
            break
        largest, cell_record.folder = batch, run.name
        batch *= 2
    cell_record.largest_batch, cell_record.batches_tried = largest, tried
    if largest is not None:
        cell_record.status = rec.DONE
        cell_record.reason = f"largest batch that fit: {largest}" + (
            f" (the search stops at {limit}: raise batch_limit)" if batch > limit else ""
        )
    elif cell_record.status != rec.FAILED:
        cell_record.status, cell_record.reason = rec.FAILED, "even batch 1 does not fit"
    callbacks.finished(cell_record)
    rec.save(record, out)


def _out_of_memory(error: str | None) -> bool:
    return error is not None and "out of memory" in error
