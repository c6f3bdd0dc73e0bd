"""The average board power of eager runs, as a share of the card's TDP, fitted on published runs' energy
(``benchmarks/calibrate_published.py``: the ML.ENERGY rows of benchmarks/published_figures.yaml store joules per
image or video beside their latency).

Model, per architecture: energy per output = fraction x TDP x the run's predicted time (the time fit's midpoint)
/ outputs; the fraction fitted by least squares on relative errors, so a fit that gets the time wrong gets the
energy wrong with it, as a user's prediction would. The range: the midpoint times [1 / w, w], w the smallest
factor that holds ``fit_published.COVERAGE`` of the fitted runs. Validation leaves one model out at a time: its
runs' energy against the time and power fitted without them.
"""

from __future__ import annotations

from dataclasses import dataclass

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
    """The average board power as a share of TDP, and the range's factor w."""

    fraction: float
    width: float

    def midpoint(self, run: EnergyRun, time_s: float) -> float:
        return self.fraction * run.tdp_w * time_s / run.outputs


def fit_power(runs: list[EnergyRun], times: list[float]) -> PowerFit:
    """The fraction minimizing the relative errors of ``runs`` at the predicted ``times`` (seconds per call)."""
    x = [run.tdp_w * time / run.outputs / run.published_j for run, time in zip(runs, times, strict=True)]
    fraction = sum(x) / sum(value * value for value in x)
    return PowerFit(fraction, covering([fraction * value for value in x]))


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
    (``timed``: every run of the architecture with a published time, the energy runs among them)."""
    found = []
    for model in sorted({e.run.model for e in energy}):
        time_fit = fit([run for run in timed if run.model != model])
        others = [e for e in energy if e.run.model != model]
        if not others:
            continue
        power = fit_power(others, [time_fit.midpoint(e.run) for e in others])
        for e in energy:
            if e.run.model == model:
                middle = power.midpoint(e, time_fit.midpoint(e.run))
                found.append(HeldOutEnergy(e, middle, middle / power.width, middle * power.width))
    return found
