"""The average board power of eager runs, as shares of the card's TDP, fitted on published runs' energy
(``benchmarks/calibrate_published.py``: the ML.ENERGY rows of benchmarks/published_figures.yaml store joules per
image or video beside their latency; diffmeter's own H200 runs store Zeus's).

Model, per architecture: energy per output = TDP x (idle + (busy - idle) x b) x the run's predicted time (the time
fit's midpoint) / outputs, b the share of that time the GPU is busy (``fit_published.Fit.busy_share``): a GPU
waiting for its host draws less. busy and idle fitted by least squares on relative errors, neither negative, so a
fit that gets the time wrong gets the energy wrong with it, as a user's prediction would; idle only where some runs
wait for their host (else one share for all). The range: the midpoint times [1 / w, w], w the smallest factor that holds
``fit_published.COVERAGE`` of the fitted runs. Validation leaves one model out at a time: its runs' energy against
the time and the power fitted without them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.optimize import lsq_linear

from diffmeter.predict.energy import LEAST_IDLE_SHARE
from diffmeter.predict.fit_published import PublishedRun, covering, fit


@dataclass(frozen=True)
class EnergyRun:
    """A published run's energy (joules per output) beside its time figures and its card's TDP (watts)."""

    run: PublishedRun
    published_j: float
    outputs: int
    tdp_w: float


@dataclass(frozen=True)
class PowerFit:
    """The board power's share of TDP while the GPU is busy and while it waits (None: not fitted), and the range's
    factor w."""

    fraction: float
    idle: float | None
    width: float

    def midpoint(self, run: EnergyRun, time_s: float, busy_share: float = 1.0) -> float:
        share = self.fraction if self.idle is None else self.idle + (self.fraction - self.idle) * busy_share
        return share * run.tdp_w * time_s / run.outputs


def fit_power(runs: list[EnergyRun], times: list[float], busy: list[float] | None = None) -> PowerFit:
    """The shares minimizing the relative errors of ``runs`` at the predicted ``times`` (seconds per call) and
    ``busy`` shares of them (None: busy throughout)."""
    busy = busy or [1.0] * len(runs)
    scale = np.array([run.tdp_w * time / run.outputs / run.published_j for run, time in zip(runs, times, strict=True)])
    shares = np.array(busy)
    fraction, idle = float(scale.sum() / (scale * scale).sum()), None  # one share, busy or waiting
    if max(1 - shares) >= LEAST_IDLE_SHARE:  # both shares, neither negative (bounded least squares, not a clamp)
        matrix = np.column_stack([scale * shares, scale * (1 - shares)])
        busy_share, idle_share = lsq_linear(matrix, np.ones(len(runs)), bounds=(0.0, np.inf)).x
        if idle_share <= busy_share:  # a GPU waiting draws no more than a busy one; else the one share stands
            fraction, idle = float(busy_share), float(idle_share)
    found = PowerFit(float(fraction), idle, 1.0)
    ratios = [found.midpoint(run, t, b) / run.published_j for run, t, b in zip(runs, times, busy, strict=True)]
    return PowerFit(found.fraction, found.idle, covering(ratios))


@dataclass(frozen=True)
class HeldOutEnergy:
    run: EnergyRun
    midpoint: float
    low: float
    high: float

    @property
    def inside(self) -> bool:
        return self.low <= self.run.published_j <= self.high

    @property
    def error(self) -> float:
        return self.midpoint / self.run.published_j - 1


def leave_one_model_out(energy: list[EnergyRun], timed: list[PublishedRun]) -> list[HeldOutEnergy]:
    """Each model's energy runs against the time and the power fitted on the other models' runs alone
    (``timed``: every run with a published time, the energy runs among them)."""
    found = []
    for model in sorted({e.run.model for e in energy}):
        time_fit = fit([run for run in timed if run.model != model])
        others = [e for e in energy if e.run.model != model]
        if not others:
            continue
        power = fit_power(
            others, [time_fit.midpoint(e.run) for e in others], [time_fit.busy_share(e.run) for e in others]
        )
        for e in energy:
            if e.run.model == model:
                middle = power.midpoint(e, time_fit.midpoint(e.run), time_fit.busy_share(e.run))
                found.append(HeldOutEnergy(e, middle, middle / power.width, middle * power.width))
    return found
