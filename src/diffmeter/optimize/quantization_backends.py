"""Every ``--quantize`` backend as ``diffmeter optimizations`` lists it: its types, which of them run on this
machine's CPU (each technique's own ``cannot_run``, asked on a tiny pipeline), and the extra that installs it."""

from __future__ import annotations

import torch
from pydantic import BaseModel

from diffmeter.catalog import resolve
from diffmeter.families import get_family
from diffmeter.optimize.base import Target, importable
from diffmeter.optimize.registry import REGISTRY
from diffmeter.quantization_spec import BACKENDS


class BackendRow(BaseModel):
    """A backend: its types, why a type cannot run on this CPU (absent: it runs), its extra, whether installed."""

    name: str
    summary: str
    types: list[str]
    not_on_cpu: dict[str, str]
    extra: str
    installed: bool
    single_file: bool
    folder: bool


def backend_rows() -> list[BackendRow]:
    entry = resolve("tiny-flux")
    target = Target(entry, get_family(entry.family), torch.device("cpu"), "float32", entry.defaults.steps)
    rows = []
    for backend in BACKENDS.values():
        technique = REGISTRY[backend.name]
        reasons = {kind: technique(technique.Config(type=kind)).cannot_run(target) for kind in backend.types}
        rows.append(
            BackendRow(
                name=backend.name,
                summary=backend.summary,
                types=list(backend.types),
                not_on_cpu={kind: reason for kind, reason in reasons.items() if reason},
                extra=backend.extra,
                installed=importable(backend.module),
                single_file=backend.single_file,
                folder=backend.folder,
            )
        )
    return rows
