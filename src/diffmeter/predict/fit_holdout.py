"""The held-out test of the published fit (``fit_published``): each source's runs, or an architecture's model where
one source measured it alone, predicted by the fit of every other run; an architecture's runs predicted by its
neighbour's fit, fitted without it, as borrowed and widened (``calibration.borrowed``); and the summary every claim
quotes."""

from __future__ import annotations

import statistics
from collections.abc import Iterator
from dataclasses import dataclass

from diffmeter.predict.calibration import Calibration, borrowed
from diffmeter.predict.expected_range import expected_s, stage_range, whole_range
from diffmeter.predict.fit_published import (
    LEAST_INSIDE,
    Fit,
    PublishedRun,
    as_calibration,
    covering,
    fit,
    lender_of,
)
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


def folds(runs: list[PublishedRun]) -> Iterator[tuple[set[str], set[str]]]:
    """Each held group's run ids (``held_groups``) and the ids of every other run, the fit's; a run held out once (by
    model where its architecture has one source)."""
    if len({run.id for run in runs}) != len(runs):
        raise ValueError("two published runs share an id: a held-out run would stay in its fold's fit")
    sources = {a: {r.source for r in runs if r.architecture == a} for a in {run.architecture for run in runs}}
    several = {architecture for architecture, found in sources.items() if len(found) > 1}
    for by, name in held_groups(runs):
        held = {run.id for run in runs if in_group(run, by, name) and (by == "model" or run.architecture in several)}
        if held:
            yield held, {run.id for run in runs if not in_group(run, by, name)}


def predicted(fitted: Fit, runs: list[PublishedRun], ids: set[str]) -> list[HeldOut]:
    """``fitted``'s range of each of ``runs`` in ``ids`` whose architecture it fitted (an architecture one source
    measured in one model alone has nothing left to fit without it)."""
    return [
        HeldOut(run, fitted.midpoint(run), *fitted.range(run))
        for run in runs
        if run.id in ids and run.architecture in fitted.gpus
    ]


def leave_one_out(runs: list[PublishedRun], eras: bool = False) -> list[HeldOut]:
    """Each held group's runs against the fit of every other run (``folds``)."""
    found = []
    for held, others in folds(runs):
        found += predicted(fit([run for run in runs if run.id in others], eras), runs, held)
    return found


def misfit(fitted: Fit, runs: list[PublishedRun]) -> float:
    """The sum of the squared relative errors of ``fitted``'s midpoints on ``runs``: what the exponent is chosen by."""
    return sum((fitted.midpoint(run) / run.published_s - 1) ** 2 for run in runs)


def fits_by_exponent(by_exponent: dict[float, list[PublishedRun]], keep=lambda run: True) -> dict[float, tuple]:
    """Per power limit exponent (``by_exponent``: the same runs built at each), the fit of the runs ``keep`` passes and
    its ``misfit`` on them: (misfit, fit)."""
    found = {}
    for exponent, runs in by_exponent.items():
        mine = [run for run in runs if keep(run)]
        fitted = fit(mine)
        found[exponent] = (misfit(fitted, mine), fitted)
    return found


def chosen_fit(by_exponent: dict[float, list[PublishedRun]], keep=lambda run: True) -> tuple[float, Fit]:
    """The power limit's exponent whose runs (those ``keep`` passes) the fit fits best (``misfit``), with that fit."""
    fits = fits_by_exponent(by_exponent, keep)
    best = min(fits, key=lambda exponent: fits[exponent][0])
    return best, fits[best][1]


@dataclass(frozen=True)
class NestedTest:
    """The held-out test with the power limit's exponent chosen inside each fold (``nested``: each group predicted
    at the exponent the other runs chose, as ``chosen_fit`` chooses), beside each exponent's own test (``fixed``)."""

    nested: list[HeldOut]
    fixed: dict[float, list[HeldOut]]
    #: how many folds chose each exponent
    picks: dict[float, int]


def nested_leave_one_out(by_exponent: dict[float, list[PublishedRun]]) -> NestedTest:
    """``leave_one_out`` with the exponent chosen again in each fold on its other runs alone."""
    nested, fixed, picks = [], {exponent: [] for exponent in by_exponent}, dict.fromkeys(by_exponent, 0)
    for held, others in folds(next(iter(by_exponent.values()))):
        fits = fits_by_exponent(by_exponent, lambda run, others=others: run.id in others)
        for exponent, (_, fitted) in fits.items():
            fixed[exponent] += predicted(fitted, by_exponent[exponent], held)
        best = min(fits, key=lambda exponent: fits[exponent][0])
        nested += predicted(fits[best][1], by_exponent[best], held)
        picks[best] += 1
    return NestedTest(nested, fixed, picks)


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


def width_without(runs: list[PublishedRun], shipped: set[str], architecture: str, found: Fit) -> tuple[str, float]:
    """The lender a card of ``architecture`` borrows from among ``shipped`` and the factor its range is widened by,
    measured on ``runs`` without the architecture's (``borrowed_test`` of the others); ``found``: the lender's fit."""
    lender = lender_of(architecture, shipped - {architecture})
    test = borrowed_test(runs, shipped, frozenset({architecture}))
    return lender, borrowed_width(test, found.gpus[lender].width)


def borrowed_held_out(run: PublishedRun, found: Fit, runs: list[PublishedRun], lender: str, width: float) -> HeldOut:
    """``run`` as a card of its architecture is predicted: ``lender``'s calibration from ``found`` (fitted on
    ``runs``) widened by ``width`` (``width_without``) through ``calibration.borrowed``; the midpoint is the range's
    geometric middle."""
    lent = as_calibration(found, lender, "", runs).model_copy(update={"borrowed_width": width})
    low, high = calibrated_range(run, borrowed(lent, lender, run.architecture))
    return HeldOut(run, (low * high) ** 0.5, low, high)


def widened_test(runs: list[PublishedRun], shipped: set[str]) -> list[HeldOut]:
    """What a card that borrows sees, held out: each architecture with a neighbour in ``shipped``, its runs under
    that neighbour's calibration fitted without them, widened by ``calibration.borrowed`` by a factor measured
    without them too (``width_without``, each other architecture fitted without both)."""
    held = []
    for architecture in sorted({run.architecture for run in runs}):
        if lender_of(architecture, shipped - {architecture}) is None:
            continue
        others = [run for run in runs if run.architecture != architecture]
        found = fit(others)
        lender, width = width_without(runs, shipped, architecture, found)
        held += [borrowed_held_out(r, found, others, lender, width) for r in runs if r.architecture == architecture]
    return held
