"""Each rung of a ladder predicted before it runs: the prediction ``bench`` stores beside a run's measurements
(``predict.bench_prediction``), made from the rung's checked spec alone, nothing loaded, and its verdict against the
rung's measured median."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from diffmeter.predict.bench_prediction import predict_or_note
from diffmeter.predict.roofline import bench_fp32_math
from diffmeter.runs.prepared import applied, prepare


@dataclass(frozen=True)
class RungPrediction:
    """A rung's expected time per call (seconds, whole generation) and eager lower bound, or why it has none."""

    rung: str
    expected_s: tuple[float, float] | None = None
    lower_s: float | None = None
    #: why the rung has no range: no prediction, or a technique it runs is not in the expected time
    untimed: str | None = None
    #: the techniques the expected time leaves out, "label: why" (``RunPrediction.time_left_out``)
    left_out: tuple[str, ...] = ()
    #: where the range's achieved fractions come from (``Calibration.source``)
    calibration: str | None = None

    def verdict(self, measured_s: float | None) -> str:
        """ "inside", "outside: N% above/below the range", "not timed" or "not measured"."""
        if self.expected_s is None:
            return "not timed"
        if measured_s is None:
            return "not measured"
        return range_verdict(self.expected_s, measured_s)


def range_verdict(expected_s: tuple[float, float], measured_s: float) -> str:
    """ "inside" the expected range (seconds), or "outside: N% above/below the range"."""
    low, high = expected_s
    if low <= measured_s <= high:
        return "inside"
    above = measured_s > high
    off = measured_s / high - 1 if above else 1 - measured_s / low
    return f"outside: {off:.0%} {'above' if above else 'below'} the range"


def predict_rungs(rungs: list) -> list[RungPrediction]:
    """Every planned rung (``ladder.plan``) predicted as its bench run will store it; a skipped rung is left out.
    A rung whose expected time leaves out a technique it runs (its own or one from a rung above) is untimed: no
    range is shown that is a run without that technique in disguise."""
    found = []
    for rung in rungs:
        if rung.spec is None:
            continue
        run = prepare(rung.spec, check_memory=False)
        cuda = torch.device(run.spec.device).type == "cuda"
        fp32 = dict(bench_fp32_math(run.spec.tf32)) if cuda else None  # as bench's lifecycle records it
        prediction, note = predict_or_note(run.spec, applied(run.optimizations), fp32)
        time = prediction.time if prediction else None
        left_out = tuple(prediction.time_left_out) if prediction else ()
        timed = time is not None and time.expected_s is not None
        if left_out:  # the technique first: a rung it leaves out has no range on any machine
            why = f"the expected time leaves out {'; '.join(left_out)}"
        elif timed:
            why = None
        elif note or time is not None:
            why = note or time.calibration
        else:
            why = next((n for n in prediction.notes if n.startswith("no time")), "no time predicted")
        found.append(
            RungPrediction(
                rung.name,
                expected_s=time.expected_s if timed and not left_out else None,
                lower_s=time.lower_s if time else None,
                untimed=why,
                left_out=left_out,
                calibration=time.calibration if timed else None,
            )
        )
    return found
