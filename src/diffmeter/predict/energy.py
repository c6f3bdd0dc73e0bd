"""Energy per output (image, or video) predicted on a GPU: its calibrated average board power, a share of the
card's TDP fitted per architecture on published runs' energy (``fit_energy``), times the predicted time."""

from __future__ import annotations

from diffmeter.predict.devices import Device, uncalibrated
from diffmeter.predict.schema import EnergyPrediction

#: what a launch-bound run draws, measured (benchmarks/results/gpu_runs_nvidia-h200.jsonl, Zeus)
LAUNCH_BOUND_POWER = (
    "outside the fitted runs, like their time: launch-bound runs draw less, on an H200 SD 1.5 and PixArt-Sigma at "
    "512 px 217-313 W and FLUX.1-schnell 430-477 W against the fit's share, so this range is likely high"
)


def why_no_energy(device: Device, calibration) -> str | None:
    """Why ``predict_energy`` gives nothing on ``device`` with ``calibration`` (a ``roofline.Calibration`` or None),
    naming what is missing; None where it gives a range."""
    if device.kind == "cpu":
        return "diffmeter has no energy model for CPUs"
    if calibration is None:
        return f"no expected time to turn into energy: {uncalibrated(device)}"
    if device.tdp_w is None and device.given:
        return "--gpu-spec gives no TDP: add the card's board power, e.g. 700W"
    if device.tdp_w is None:
        return f"the table has no cited TDP for the {device.name} (data/gpu_power.json)"
    if calibration.power_fraction is None or calibration.energy_width is None:
        return f"no board power fitted for {device.architecture or 'this'} GPUs"
    return None


def predict_energy(
    expected_s: tuple[float, float], device: Device, outputs: int, calibration, launch_bound: str | None = None
) -> EnergyPrediction | None:
    """The range for a generation whose expected time is ``expected_s`` (seconds), or None where the card has no
    TDP or the calibration no fitted power (``why_no_energy`` says which). ``calibration``: a
    ``roofline.Calibration``; ``launch_bound``: why the time range may not hold (its operators smaller than any
    fitted run's), said in the energy's calibration too."""
    if why_no_energy(device, calibration) is not None:
        return None
    power = calibration.power_fraction * device.tdp_w
    middle = power * (expected_s[0] * expected_s[1]) ** 0.5 / outputs  # the time range's geometric midpoint
    width = calibration.energy_width
    return EnergyPrediction(
        tdp_w=device.tdp_w,
        power_w=power,
        outputs=outputs,
        per_output_j=(middle / width, middle * width),
        calibration=(calibration.energy_source or calibration.source)
        + (f"; {LAUNCH_BOUND_POWER}" if launch_bound else ""),
    )
