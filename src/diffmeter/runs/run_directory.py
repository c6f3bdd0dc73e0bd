"""A run's folder, built in a hidden staging folder and moved into place only when results.json is final, so an
interrupted run never leaves a result that looks complete and an existing result is replaced only with ``force``."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import psutil
from pydantic import ValidationError

from diffmeter.errors import DiffmeterError
from diffmeter.measure.environment import Environment, speed_differences, speed_settings
from diffmeter.runs.results import BenchResult
from diffmeter.runs.spec import BenchSpec
from diffmeter.runs.storage import IMAGES, RESULTS, writable_folder, write_json


class RunDirectory:
    """A run's folder: ``open()`` checks and stages, ``commit()`` moves it into place."""

    def __init__(
        self,
        out: str | Path,
        name: str,
        force: bool = False,
        spec: BenchSpec | None = None,
        speed: dict[str, str] | None = None,
    ) -> None:
        """``speed``: the new run's ``measure.environment.speed_settings`` (its threads, device, versions), which the
        folder's name does not hold, said where they differ from a stored run's."""
        self.final = Path(out).expanduser() / name
        self.force = force
        self.spec = spec
        self.speed = speed
        self.staging = self.final.parent / f".{name}.partial-{os.getpid()}"
        #: the outermost folder ``check`` made for the results (None: it made none), removed again if left empty
        self.made: Path | None = None

    def check(self) -> None:
        """Refuse before any work: an existing result (without force) or an unwritable folder."""
        existing = self.final / RESULTS
        if existing.exists() and not self.force:
            raise DiffmeterError(
                f"a result for this spec already exists at {self.final}{self._difference(existing)}; "
                "pass --force to replace it, or --out DIR to write elsewhere"
            )
        missing = [folder for folder in (self.final.parent, *self.final.parent.parents) if not folder.exists()]
        self.made = self.made or (missing[-1] if missing else None)
        writable_folder(self.final.parent)

    def _difference(self, existing: Path) -> str:
        """What the stored run and the new one share (the folder name) and where they differ."""
        if self.spec is None:
            return ""
        try:
            result = json.loads(existing.read_text(encoding="utf-8"))
            stored = result["spec"]
        except (OSError, ValueError, KeyError):
            return ""
        new = self.spec.model_dump(mode="json")
        changed = [f"{key} {stored.get(key)!r} -> {value!r}" for key, value in new.items() if stored.get(key) != value]
        changed += [line.replace(":", "", 1) for line in self._speed_differences(result)]
        if not changed:
            return " (the same settings)"
        return (
            f" (same model, size, steps, seed, dtype, device, prompts and techniques; different {', '.join(changed)})"
        )

    def _speed_differences(self, stored: dict) -> list[str]:
        """Where the stored run's threads, device name or versions differ from this one's ("torch threads: 2 -> 1")."""
        if self.speed is None:
            return []
        try:
            environment = Environment.model_validate(stored["environment"])
        except (KeyError, ValidationError):  # a result stored before a field was added: nothing to say
            return []
        return speed_differences(speed_settings(environment, stored["spec"].get("device") or "cpu"), self.speed)

    def open(self) -> Path:
        self.check()
        self.clear_staged()
        (self.staging / IMAGES).mkdir(parents=True)
        return self.staging

    def clear_staged(self) -> None:
        """Remove this run's staged folders that interrupted runs left (a parallel run's rank 0 stopped mid-run); one
        whose process still runs is another run of the same settings into the same folder, and stays."""
        for stale in self.final.parent.glob(f".{self.final.name}.partial-*"):
            owner = stale.name.rpartition("-")[2]
            if owner.isdigit() and int(owner) != os.getpid() and psutil.pid_exists(int(owner)):
                continue
            shutil.rmtree(stale, ignore_errors=True)

    def commit(self, result: BenchResult) -> Path:
        """Write results.json, then swap the staged folder in for any previous one: with ``force``, or none was
        there when ``check`` looked (another run of the same settings may have stored one since)."""
        if not self.force and (self.final / RESULTS).exists():
            raise DiffmeterError(
                f"another run of the same settings stored a result at {self.final} while this one ran, and this one "
                "does not replace it: pass --force to replace it, or --out DIR to write elsewhere"
            )
        write_json(self.staging / RESULTS, result.to_json_dict())
        previous = self.final.parent / f".{self.final.name}.replaced-{os.getpid()}"
        if self.final.exists():
            self.final.rename(previous)
        self.staging.rename(self.final)
        shutil.rmtree(previous, ignore_errors=True)
        return self.final

    def discard(self) -> None:
        """Remove the staged folder, and the folders ``check`` made for the results where nothing else is in them."""
        shutil.rmtree(self.staging, ignore_errors=True)
        if self.made is None:
            return
        for folder in (self.final.parent, *self.final.parent.parents):
            try:
                folder.rmdir()  # only an empty one: another run's results stay
            except OSError:
                return
            if folder == self.made:
                return
