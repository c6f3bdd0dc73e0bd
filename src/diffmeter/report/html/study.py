"""What a report is built from: every run folder, stored ladder and profile JSON under a folder."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from diffmeter.errors import DiffmeterError
from diffmeter.flops.schema import Profile
from diffmeter.report import outputs
from diffmeter.runs import collect
from diffmeter.runs.ladder_record import Ladder
from diffmeter.runs.ladder_rungs import ladder_rungs
from diffmeter.runs.results import BenchResult

#: how each kind of weights is named on every plot that shows it
WEIGHTS_LABELS = {
    "pretrained": "pretrained weights",
    "random": "random real-size weights",
    "tiny-random": "tiny random-weight test pipeline",
}


#: the settings that tell apart runs of one short label, as a legend adds them ("bfloat16", "4 steps")
DISTINGUISHING = {
    "dtype": str,
    "steps": lambda steps: f"{steps} steps",
    "guidance": lambda scale: f"guidance {scale:g}" if scale is not None else "no guidance scale",
    "seed": lambda seed: f"seed {seed}",
    "hardware": str,
    "weights": lambda weights: f"{weights} weights",
    "settings": lambda settings: settings.replace("+", ", ") or "no other settings",
    "parallel": lambda parallel: parallel.replace("+", ", ") or "one process",
}


def told_apart(labels: list[str], rows: list[dict[str, Any]]) -> list[str]:
    """Each label with the settings (``DISTINGUISHING``) that differ among the rows sharing it, so no two plotted
    runs read alike: "tiny-flux 32x32 unoptimized" twice becomes "... float32, 2 steps" and "... bfloat16, 4 steps"."""
    told = []
    for label, row in zip(labels, rows, strict=True):
        alike = [other for name, other in zip(labels, rows, strict=True) if name == label]
        differing = [key for key in DISTINGUISHING if len({str(other.get(key)) for other in alike}) > 1]
        told.append(label + (" " + ", ".join(DISTINGUISHING[k](row.get(k)) for k in differing) if differing else ""))
    return told


@dataclass
class Run:
    """A stored run, its row of ``diffmeter table`` and a short label for plots (``read_study`` adds what tells
    it from the study's other runs of the same label)."""

    result: BenchResult
    folder: Path
    row: dict[str, Any]
    label: str = ""

    @property
    def weights(self) -> str:
        return self.row["weights"]


@dataclass
class Study:
    root: Path
    runs: list[Run] = field(default_factory=list)
    ladders: list[tuple[Path, Ladder]] = field(default_factory=list)
    profiles: list[Profile] = field(default_factory=list)
    #: one line per results.json that could not be read, left out of the study
    skipped: list[str] = field(default_factory=list)

    @property
    def complete(self) -> list[Run]:
        return [run for run in self.runs if run.result.status == "complete" and run.result.summary is not None]

    def run_at(self, folder: str | Path, near: Path | None = None) -> Run | None:
        """The run stored at ``folder``; or, the study having moved, the run with its folder's name
        (beside ``near`` first: two machines' sweeps in one study hold the same names)."""
        path = Path(folder)
        named = [run for run in self.runs if run.folder == path] or [
            run for run in self.runs if run.folder.name == path.name
        ]
        beside = [run for run in named if near is not None and run.folder.parent == near]
        return (beside or named or [None])[0]


def read_study(directory: str | Path) -> Study:
    """Everything under ``directory``; one clear line when there is nothing to report."""
    root = Path(directory).expanduser()
    if not root.is_dir():
        raise DiffmeterError(f"{root} is not a folder; point at the --out folder of bench, ladder or sweep")
    study = Study(root=root)
    results = collect.find_results(root)
    for folder, result in collect.readable_results(results, study.skipped):
        study.runs.append(Run(result, folder, collect.row(result, str(folder.relative_to(root)))))
    collect.add_speedups([run.row for run in study.runs], [run.result for run in study.runs], ladder_rungs(root))
    rows = [run.row for run in study.runs]
    short = [f"{r['model']} {outputs.size(r)} b{r['batch']} {r['optimizations'] or 'unoptimized'}" for r in rows]
    for run, label in zip(study.runs, told_apart(short, rows), strict=True):
        run.label = label
    seen = set()
    run_folders = {path.parent for path in results}
    for path in sorted(root.rglob("*.json")):
        inside_a_run = not run_folders.isdisjoint(path.parents)  # requests.json, ops.json: not ladders or profiles
        if inside_a_run or any(part.startswith(".") for part in path.relative_to(root).parts):
            continue
        if path.name.startswith("ladder-") or path.name.startswith("ladder_"):
            ladder = _read(path, Ladder)
            if ladder is not None:
                study.ladders.append((path, ladder))
            continue
        for profile in _profiles(path):
            seen.add(_profile_key(profile))
            study.profiles.append(profile)
    for run in study.runs:  # every run carries its offline profile
        profile = run.result.profile
        if profile is not None and _profile_key(profile) not in seen:
            seen.add(_profile_key(profile))
            study.profiles.append(profile)
    if not study.runs and not study.ladders and not study.profiles:
        if study.skipped:  # run folders whose results cannot be read: what is wrong with them, not "none"
            more = f" (and {len(study.skipped) - 1} more)" if len(study.skipped) > 1 else ""
            raise DiffmeterError(f"nothing to report under {root}: {study.skipped[0].removeprefix('skipped: ')}{more}")
        raise DiffmeterError(
            f"nothing to report under {root}: no run folder (results.json), ladder-*.json or profile JSON; "
            "point at the --out folder of bench, ladder or sweep"
        )
    return study


def _read(path: Path, model):
    try:
        return model.model_validate_json(path.read_text())
    except (ValidationError, ValueError, OSError):
        return None


def _profiles(path: Path) -> list[Profile]:
    """Profiles in a `diffmeter profile --json` file (one, or several under "profiles")."""
    try:
        data = json.loads(path.read_text())
    except (ValueError, OSError):
        return []
    items = data.get("profiles", [data]) if isinstance(data, dict) else []
    found = []
    for item in items:
        try:
            found.append(Profile.model_validate(item))
        except ValidationError:
            return []
    return found


def _profile_key(profile: Profile) -> tuple:
    return (
        profile.model,
        profile.height,
        profile.width,
        profile.num_frames,
        profile.steps,
        profile.batch_size,
        profile.cfg,
        profile.total_macs,
    )
