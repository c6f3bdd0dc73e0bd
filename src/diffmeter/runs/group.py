"""What a parallel group adds to a measured run's lifecycle (:class:`Group`), and the run alone (:data:`ALONE`),
which adds nothing. ``distributed.group.RankGroup`` is a rank's."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Protocol

from diffmeter.runs import storage
from diffmeter.runs.prepared import PreparedRun
from diffmeter.runs.results import BenchResult
from diffmeter.runs.run_directory import RunDirectory
from diffmeter.runs.spec import BenchSpec
from diffmeter.runs.workload import Workload


class Group(Protocol):
    """What a parallel group adds to the lifecycle; every method is a no-op (or the identity) alone."""

    def join(self, run: PreparedRun) -> None:
        """Join the group, once the run is checked."""

    def open(self, directory: RunDirectory, requests) -> tuple[Path, Path]:
        """The run's folder opened (by one process) and known to all: (where this process saves the run's
        images, where it keeps its log). ``requests(calls)`` lists the group's requests for the folder."""

    def workload(self, spec: BenchSpec, entry) -> Workload:
        """The batches this process generates."""

    def describe(self) -> str:
        """This process's place in the group, for its log."""

    def copy_log(self, log) -> None:
        """Where else this process's log is written (where the launcher keeps it if the run fails)."""

    def holds_back(self, run: PreparedRun) -> tuple[str, ...]:
        """Components loaded on the CPU, not the run's device: the group places them itself in ``apply``
        (tensor parallelism moves each rank's shard only)."""

    def apply(self, pipe) -> None:
        """Split the loaded pipeline's work over the group, after the techniques."""

    def barrier(self) -> None:
        """Wait for every process: before the measured loop and before each measured call."""

    def combine(self, result: BenchResult, run: PreparedRun, staging: Path) -> BenchResult | None:
        """The group's result from every process's (on the process that stores it; None on the others)."""

    def abandon(self, reason: str) -> None:
        """A process failed (``reason``): stop every process of the group (raises) or, alone, return."""

    def prediction_split(self) -> tuple[object | None, str | None]:
        """How the stored prediction takes the group (``predict.bench_prediction.GroupSplit``), or why it cannot:
        (None, None) alone, the whole run being one process's."""


class Alone:
    """A run in one process: it opens its own folder, generates every batch and stores what it measured."""

    def join(self, run: PreparedRun) -> None:
        pass

    def open(self, directory: RunDirectory, requests) -> tuple[Path, Path]:
        staging = directory.open()
        storage.write_json(staging / storage.REQUESTS, requests(None))
        return staging, staging

    def workload(self, spec: BenchSpec, entry) -> Workload:
        return Workload(spec, entry)

    def describe(self) -> str:
        return f"one process ({os.getpid()})"

    def copy_log(self, log) -> None:
        pass

    def holds_back(self, run: PreparedRun) -> tuple[str, ...]:
        return ()

    def apply(self, pipe) -> None:
        pass

    def barrier(self) -> None:
        pass

    def combine(self, result: BenchResult, run: PreparedRun, staging: Path) -> BenchResult:
        return result

    def abandon(self, reason: str) -> None:
        pass

    def prediction_split(self) -> tuple[object | None, str | None]:
        return None, None


ALONE = Alone()
