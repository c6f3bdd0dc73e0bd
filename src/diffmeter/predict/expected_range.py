"""Expected ranges from achieved fractions (``roofline``'s "Expected"): a stage's from each operator kind's lower
bound, its attention scores and its operators (``expected_s``), overlapped with the host's issue time and never under
the eager bound (``stage_range``), a generation's (``whole_range``), how busy the GPU is and whether the run is
host-bound (``host_share``), and whether a run lies outside the fitted ones (``outside``)."""

from __future__ import annotations

from diffmeter.predict.calibration import Calibration
from diffmeter.predict.schema import StageTime


def stage_range(gpu: tuple[float, float], host: tuple[float, float] | None, lower: float) -> tuple[float, float]:
    """A stage's expected range: the longer of the GPU's range ``gpu`` (``expected_s``) and the host's issue time
    ``host`` at each end (``overlapped``), never under the stage's eager bound ``lower`` (``at_least``)."""
    return at_least(overlapped(gpu, host), lower)


def whole_range(stages: list[tuple[float, float]], calibration: Calibration, whole: bool = True) -> tuple[float, float]:
    """A generation's expected range: its stages' summed, plus the pipeline call's own host work where the calibration
    has it and the time covers the ``whole`` call (a published figure of the denoising alone does not)."""
    low, high = sum(stage[0] for stage in stages), sum(stage[1] for stage in stages)
    if calibration.host and whole:
        low, high = low + calibration.host.call_s[0], high + calibration.host.call_s[1]
    return low, high


def overlapped(gpu: tuple[float, float], host: tuple[float, float] | None) -> tuple[float, float]:
    """A stage's range: the longer of the GPU's and the host's time at each end (CUDA's launch is asynchronous)."""
    return gpu if host is None else (max(gpu[0], host[0]), max(gpu[1], host[1]))


def host_share(stages: list[StageTime], whole: tuple[float, float] | None) -> tuple[float | None, str | None]:
    """The share of the expected time the GPU is busy (midpoints), and why the run is host-bound where the host's
    issue time is the longer in the stages that make most of it; (None, None) without a host term."""
    timed = [stage for stage in stages if stage.gpu_s and stage.host_s]
    if not timed or not whole:
        return None, None
    middle = (whole[0] * whole[1]) ** 0.5
    gpu = sum((stage.gpu_s[0] * stage.gpu_s[1]) ** 0.5 for stage in timed)
    host = sum((stage.host_s[0] * stage.host_s[1]) ** 0.5 for stage in timed)
    busy = min(1.0, gpu / middle)
    if host <= gpu:
        return busy, None
    return busy, (
        f"host-bound: the host takes {host:.3g} s to issue the work (dispatched operators, module calls, steps) "
        f"against the GPU's {gpu:.3g} s, so the GPU is busy about {busy:.0%} of the time; a faster host, CUDA graphs "
        "or torch.compile shorten it, a faster GPU does not"
    )


def outside(calibration: Calibration, bound_per_operator_s: float) -> str | None:
    """Why the expected range may not hold for a run whose operators are smaller than any the fit saw, or None."""
    least = calibration.least_bound_per_operator_s
    if least is None or bound_per_operator_s >= least:
        return None
    return (
        f"outside the fitted runs: {bound_per_operator_s * 1e6:.1f} us of eager bound per operator, under the "
        f"{least * 1e6:,.1f} us of every run the range was fitted on: no fitted run had operators so small, so what "
        "each costs beyond its bound (launches, the host's dispatch) may be more or less than the fit says"
    )


def at_least(expected: tuple[float, float], lower: float) -> tuple[float, float]:
    """An expected range never under the eager bound (no eager run is faster)."""
    return max(expected[0], lower), max(expected[1], lower)


def expected_s(
    kinds: dict[str, list[float]], operators: int, calibration: Calibration, scores: int = 0
) -> tuple[float, float]:
    """A stage's expected range: each kind's lower bound over its highest and lowest achieved fraction
    (a kind not calibrated takes "other"'s), plus the cost of its attention ``scores`` and the overhead per
    operator."""
    low, high = (scores * calibration.score_s[0], scores * calibration.score_s[1]) if calibration.score_s else (0, 0)
    for kind, (seconds, _) in kinds.items():
        fractions = calibration.fractions.get(kind, calibration.fractions["other"])
        low += seconds / fractions[1]
        high += seconds / fractions[0]
    return low + operators * calibration.overhead_s[0], high + operators * calibration.overhead_s[1]
