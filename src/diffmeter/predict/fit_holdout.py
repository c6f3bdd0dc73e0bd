"""The held-out test of the published fit (``fit_published``): each source's runs, or an architecture's model where
one source measured it alone, predicted by the fit of every other run; and the summary every claim quotes."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from diffmeter.predict.fit_published import PublishedRun, fit


@dataclass(frozen=True)
class HeldOut:
    run: PublishedRun
    midpoint: float
    low: float
    high: float

    @property
    def inside(self) -> bool:
        return self.low <= self.run.published_s <= self.high

    @property
    def error(self) -> float:
        """The midpoint's error, a fraction of the published time."""
        return self.midpoint / self.run.published_s - 1


def held_groups(runs: list[PublishedRun]) -> list[tuple[str, str]]:
    """What is held out in turn: each source; and, for an architecture one source measured alone, each of its
    models (holding out the source would leave the architecture nothing to fit)."""
    groups = [("source", source) for source in sorted({run.source for run in runs})]
    for architecture in sorted({run.architecture for run in runs}):
        mine = [run for run in runs if run.architecture == architecture]
        if len({run.source for run in mine}) == 1:
            groups += [("model", f"{architecture}/{model}") for model in sorted({run.model for run in mine})]
    return groups


def in_group(run: PublishedRun, by: str, name: str) -> bool:
    return run.source == name if by == "source" else f"{run.architecture}/{run.model}" == name


def leave_one_out(runs: list[PublishedRun], eras: bool = False) -> list[HeldOut]:
    """Each held group's runs (``held_groups``) against the fit of every other run, where the fit without them still
    has the run's architecture; each run held out once (by model where its architecture has one source)."""
    found = []
    sources = {a: {r.source for r in runs if r.architecture == a} for a in {run.architecture for run in runs}}
    several = {architecture for architecture, found in sources.items() if len(found) > 1}
    for by, name in held_groups(runs):
        held = [run for run in runs if in_group(run, by, name) and (by == "model" or run.architecture in several)]
        others = [run for run in runs if not in_group(run, by, name)]
        if not held:
            continue
        fitted = fit(others, eras)  # an architecture one source measured in one model alone: nothing left to fit
        found += [
            HeldOut(run, fitted.midpoint(run), *fitted.range(run)) for run in held if run.architecture in fitted.gpus
        ]
    return found


def summary(held: list) -> dict[str, float]:
    """Coverage (fraction inside), the midpoint's median absolute error, and the median width hi / lo, of held-out
    predictions (``HeldOut``, ``fit_energy.HeldOutEnergy``)."""
    return {
        "coverage": sum(h.inside for h in held) / len(held),
        "median_error": statistics.median(abs(h.error) for h in held),
        "median_width": statistics.median(h.high / h.low for h in held),
    }
