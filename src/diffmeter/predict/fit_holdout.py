"""The held-out test of the published fit (``fit_published``): each source's runs, or an architecture's model where
one source measured it alone, predicted by the fit of every other run; an architecture's runs predicted by its
neighbour's fit, fitted without it, as borrowed and widened (``calibration.borrowed``); and the summary every claim
quotes."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from diffmeter.predict.calibration import Calibration, borrowed
from diffmeter.predict.expected_range import expected_s, stage_range, whole_range
from diffmeter.predict.fit_published import LEAST_INSIDE, PublishedRun, as_calibration, covering, fit, lender_of
from diffmeter.predict.host_time import ISSUED, issue_s


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


def borrowed_test(runs: list[PublishedRun], shipped: set[str], without: frozenset[str] = frozenset()) -> list[HeldOut]:
    """Each architecture (but those ``without``) with a neighbour in ``shipped`` to borrow, its runs predicted by that
    neighbour's GPU fit, unwidened, fitted without the architecture's runs (and ``without``'s): the error a card
    without a fit of its own sees."""
    held = []
    for architecture in sorted({run.architecture for run in runs} - without):
        lender = lender_of(architecture, shipped - without - {architecture})
        if lender is None:
            continue
        others = fit([run for run in runs if run.architecture not in without | {architecture}])
        gpu = others.gpus[lender]
        held += [
            HeldOut(run, others.midpoint(run, gpu), *others.range(run, gpu))
            for run in runs
            if run.architecture == architecture
        ]
    return held


def borrowed_width(held: list[HeldOut], width: float) -> float:
    """The factor a borrowed range (the lender's factor ``width``) is widened by: to hold ``LEAST_INSIDE`` of the
    ``borrowed_test`` runs ``held``, never narrowed."""
    return max(1.0, covering([h.midpoint / h.run.published_s for h in held], LEAST_INSIDE) / width)


def calibrated_range(run: PublishedRun, calibration: Calibration) -> tuple[float, float]:
    """``run``'s expected range under ``calibration`` by ``roofline.predict_time``'s own rule (``stage_range``,
    ``whole_range``), from the run's stages as the fit sees them."""
    ranges = []
    for stage in run.stages.values():
        kinds = {kind: [seconds, 1] for kind, seconds in stage.bounds.items()}
        counts = {count: getattr(stage, count) for count in ISSUED.values()}
        host = issue_s(counts, calibration.host) if calibration.host else None
        gpu = expected_s(kinds, stage.kernels, calibration, stage.scores)
        ranges.append(stage_range(gpu, host, sum(stage.bounds.values())))
    return whole_range(ranges, calibration, run.whole_call)


def widened_test(runs: list[PublishedRun], shipped: set[str]) -> list[HeldOut]:
    """What a card that borrows sees, held out: each architecture with a neighbour in ``shipped``, its runs under
    that neighbour's calibration fitted without them, widened by ``calibration.borrowed`` by a factor measured
    without them too (``borrowed_test`` of the other architectures, each fitted without both); the midpoint is the
    range's geometric middle."""
    held = []
    for architecture in sorted({run.architecture for run in runs}):
        lender = lender_of(architecture, shipped - {architecture})
        if lender is None:
            continue
        others = [run for run in runs if run.architecture != architecture]
        found = fit(others)
        width = borrowed_width(borrowed_test(runs, shipped, frozenset({architecture})), found.gpus[lender].width)
        lent = as_calibration(found, lender, "", others).model_copy(update={"borrowed_width": width})
        calibration = borrowed(lent, lender, architecture)
        for run in runs:
            if run.architecture == architecture:
                low, high = calibrated_range(run, calibration)
                held.append(HeldOut(run, (low * high) ** 0.5, low, high))
    return held
