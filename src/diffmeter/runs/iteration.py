"""One measured pipeline call, as results.json stores it (seconds; joules in its energy reading)."""

from __future__ import annotations

from pydantic import BaseModel

from diffmeter.measure.energy import EnergyReading
from diffmeter.measure.stages import Stages


class Iteration(BaseModel):
    """One pipeline call producing ``images`` images."""

    index: int
    images: int
    #: device-timed (CUDA events on GPU): first mark to last
    total_s: float
    #: host clock around the call, device synchronized: the check on ``total_s``
    wall_s: float
    denoiser_calls: int
    stages: Stages
    energy: EnergyReading | None = None
