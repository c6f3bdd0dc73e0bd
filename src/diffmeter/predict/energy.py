"""Energy per output (image, or video) predicted on a GPU: its average board power, a share of the card's TDP that
follows the share of the time the GPU is busy (between the share it draws waiting for the host and the share it
draws busy, both fitted per architecture on published runs' energy: ``fit_energy``), times the predicted time."""

from __future__ import annotations

from diffmeter.predict.devices import Device, uncalibrated
from diffmeter.predict.schema import EnergyPrediction

#: the least share of a run's time some fitted runs must wait for their host before an idle power is fitted
#: (``fit_energy``); a prediction waiting longer on an architecture without one is outside its fitted runs' power
LEAST_IDLE_SHARE = 0.2


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


def board_power_w(calibration, tdp_w: float, busy_share: float | None) -> float:
    """The average board power (watts) of a run whose GPU is busy ``busy_share`` of its time (None: all of it):
    the busy share of TDP while busy, the idle share while it waits for the host."""
    busy = 1.0 if busy_share is None else busy_share
    idle = calibration.idle_power_fraction
    fraction = calibration.power_fraction if idle is None else idle + (calibration.power_fraction - idle) * busy
    return fraction * tdp_w


def predict_energy(
    expected_s: tuple[float, float], device: Device, outputs: int, calibration, busy_share: float | None = None
) -> EnergyPrediction | None:
    """The range for a generation whose expected time is ``expected_s`` (seconds), or None where the card has no
    TDP or the calibration no fitted power (``why_no_energy`` says which). ``calibration``: a
    ``roofline.Calibration``; ``busy_share``: the share of the time the GPU is busy (``TimePrediction.busy_share``)."""
    if why_no_energy(device, calibration) is not None:
        return None
    power = board_power_w(calibration, device.tdp_w, busy_share)
    seconds = (expected_s[0] * expected_s[1]) ** 0.5 / outputs  # the time range's geometric midpoint, per output
    width = calibration.energy_width
    low, high, waiting = power * seconds / width, power * seconds * width, None
    if calibration.idle_power_fraction is None and busy_share is not None and 1 - busy_share >= LEAST_IDLE_SHARE:
        # no fitted run waited this long: the waiting time's power is unknown, between none and the busy share's
        low = power * busy_share * seconds / width
        waiting = (
            f"the GPU waits for the host {1 - busy_share:.0%} of this run's time, longer than any run the "
            f"{device.architecture} power was fitted on waited: the range takes that time at no board power to the "
            "busy share's"
        )
    return EnergyPrediction(
        tdp_w=device.tdp_w,
        power_w=power,
        outputs=outputs,
        per_output_j=(low, high),
        calibration=calibration.energy_source or calibration.source,
        waiting_unfitted=waiting,
    )
