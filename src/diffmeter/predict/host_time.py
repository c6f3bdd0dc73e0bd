"""The host's share of a generation on a GPU: the time the CPU takes to issue the work, which CUDA's asynchronous
launch overlaps with the GPU's, so a stage takes the longer of the two (``roofline.predict_time``).

What the host issues is counted by the same fake-tensor run that counts the FLOPs (``operators``): every ATen
operator dispatched (views included), every ``nn.Module`` call, and a step per denoiser call (the scheduler's step,
the loop's own work); a pipeline call adds its own work outside the components once (latents, timesteps,
postprocessing). The cost of each is a property of the host, fitted on published runs and diffmeter's own H200
runs (``fit_published``, ``data/efficiency.json``'s "host")."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping

from pydantic import BaseModel

from diffmeter.predict.schema import OperatorWork

DENOISING = "denoising"
#: each per-count cost of the host and the count it is paid on (``host_counts``' keys, ``StageWork``'s fields)
ISSUED = {"op_s": "dispatched", "module_s": "modules", "step_s": "steps"}


class HostCalibration(BaseModel):
    """Seconds per dispatched operator, per module call, per denoiser call and per pipeline call, each a range
    ([lowest, highest]) as the GPU's fractions are."""

    op_s: tuple[float, float]
    module_s: tuple[float, float]
    step_s: tuple[float, float]
    call_s: tuple[float, float]


def host_counts(work: OperatorWork) -> dict[str, dict[str, int]]:
    """Per stage, what the host issues over one generation: dispatched operators, module calls, denoiser calls."""
    found: dict[str, dict[str, int]] = defaultdict(lambda: dict.fromkeys(ISSUED.values(), 0))
    for call in work.calls:
        counts = found[call.stage]
        counts["dispatched"] += call.dispatched * call.count
        counts["modules"] += call.modules * call.count
        counts["steps"] += call.count if call.stage == DENOISING else 0
    return dict(found)


def issue_s(counts: Mapping[str, int], host: HostCalibration) -> tuple[float, float]:
    """The (low, high) seconds the host takes to issue ``counts`` (``host_counts``' of a stage)."""
    return tuple(sum(counts[count] * getattr(host, term)[end] for term, count in ISSUED.items()) for end in (0, 1))


def host_stage_s(work: OperatorWork, host: HostCalibration) -> dict[str, tuple[float, float]]:
    """Per stage, the (low, high) seconds the host takes to issue one generation's work."""
    return {stage: issue_s(counts, host) for stage, counts in host_counts(work).items()}
