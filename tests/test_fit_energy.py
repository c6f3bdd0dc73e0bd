"""The board power fitted on published runs' energy (``predict/fit_energy.py``), on runs made from known
parameters, and the energy per output a prediction carries (``predict/energy.py``)."""

from __future__ import annotations

import dataclasses

import pytest

from diffmeter.predict.calibration import Calibration, calibration_for
from diffmeter.predict.devices import named_gpu
from diffmeter.predict.energy import predict_energy
from diffmeter.predict.fit_energy import EnergyRun, fit_power, leave_one_model_out
from diffmeter.predict.fit_holdout import summary
from diffmeter.predict.fit_published import PublishedRun, StageWork


def made(index: int, fraction: float, tdp_w: float = 700.0, outputs: int = 2, slow: float = 1.0) -> EnergyRun:
    """A run of model ``index % 3`` that took 2.0 x its eager bound (``slow`` times that: its model's own speed),
    drawing ``fraction`` of its card's TDP; 3 models: the time fit is one multiplier, and the host issues nothing."""
    matmul, memory = 1.0 + index, 0.2 + 0.1 * index
    seconds = 2.0 * (matmul + memory) * slow
    stages = {"denoising": StageWork({"matmul": matmul, "elementwise": memory}, kernels=1000)}
    run = PublishedRun(f"r{index}", f"s{index % 3}", "hopper", f"m{index % 3}", seconds, stages)
    return EnergyRun(run, fraction * tdp_w * seconds / outputs, outputs, tdp_w)


def test_the_fit_recovers_the_share_of_tdp_runs_were_made_with():
    runs = [made(i, 0.85) for i in range(9)]
    found = fit_power(runs, [run.run.published_s for run in runs])
    assert found.fraction == pytest.approx(0.85) and found.width == pytest.approx(1.0) and found.idle is None


def test_the_fit_recovers_the_power_busy_and_waiting_for_the_host():
    """Runs whose GPU is busy 30-100% of their time, drawing 0.9 x TDP busy and 0.25 x TDP waiting."""
    runs, busy = [], [0.3, 0.5, 0.7, 1.0, 1.0, 0.4, 0.9, 1.0, 0.6]
    for index, share in enumerate(busy):
        run = made(index, 0.25 + (0.9 - 0.25) * share)
        runs.append(run)
    found = fit_power(runs, [run.run.published_s for run in runs], busy)
    assert (found.fraction, found.idle) == pytest.approx((0.9, 0.25)) and found.width == pytest.approx(1.0)
    assert found.midpoint(runs[0], runs[0].run.published_s, 0.3) == pytest.approx(runs[0].published_j)


def test_an_idle_power_the_data_put_below_zero_is_fitted_at_zero_with_the_busy_share_refitted():
    """Runs drawing 0.9 x TDP x busy share squared: unbounded least squares puts the waiting share below zero. The fit
    is the least-squares answer with it at zero (the busy share refitted alone), not the unbounded busy share with
    the waiting one clamped: no busy share gives these runs smaller squared relative errors."""
    busy = [0.3, 0.5, 0.7, 1.0, 1.0, 0.4, 0.9, 1.0, 0.6]
    runs = [made(index, 0.9 * share**2) for index, share in enumerate(busy)]
    times = [run.run.published_s for run in runs]
    found = fit_power(runs, times, busy)

    def squared(fraction: float) -> float:
        trial = dataclasses.replace(found, fraction=fraction)
        rows = zip(runs, times, busy, strict=True)
        return sum((trial.midpoint(r, t, b) / r.published_j - 1) ** 2 for r, t, b in rows)

    assert found.idle == pytest.approx(0.0, abs=1e-12) and 0 < found.fraction < 0.9
    assert squared(found.fraction) <= min(squared(found.fraction * (1 + d)) for d in (-0.01, 0.01))


def test_a_time_predicted_too_short_gives_too_little_energy_as_a_user_would_see():
    runs = [made(i, 0.85) for i in range(9)]
    found = fit_power(runs, [run.run.published_s for run in runs])
    assert found.midpoint(runs[0], runs[0].run.published_s / 2) == pytest.approx(runs[0].published_j / 2)


def test_a_held_out_model_is_predicted_by_the_others_time_and_power_alone():
    """Model m0 runs 1.5x slower than the others and draws half their power: held out, its time is the others'
    (2/3 of its own) and its power theirs (twice its own), so its energy is predicted 4/3 of what it drew, exactly;
    had its runs leaked into the time fit or the power fit, the error would be smaller."""
    runs = [made(i, 0.85) for i in range(6) if i % 3] + [made(i, 0.425, slow=1.5) for i in (0, 3, 6, 9)]
    timed = [run.run for run in runs]
    held = leave_one_model_out(runs, timed)
    assert len(held) == len(runs)
    low = [h for h in held if h.run.run.model == "m0"]
    assert len(low) == 4 and all(h.error == pytest.approx(4 / 3 - 1) and not h.inside for h in low)
    others = [h for h in held if h.run.run.model != "m0"]
    assert max(abs(h.error) for h in others) < min(h.error for h in low)
    assert summary(held)["coverage"] < 1


def test_a_prediction_carries_energy_per_output_at_the_calibrated_share_of_the_cards_tdp():
    h100 = named_gpu("H100 SXM")
    assert h100.tdp_w == 700
    calibration = Calibration(
        source="test", fractions={"other": (0.5, 0.5)}, overhead_s=(0.0, 0.0), power_fraction=0.8, energy_width=1.2
    )
    energy = predict_energy((4.0, 9.0), h100, 2, calibration)  # geometric midpoint 6 s, 2 images
    assert energy.power_w == pytest.approx(560)
    assert energy.per_output_j == pytest.approx((560 * 6 / 2 / 1.2, 560 * 6 / 2 * 1.2))
    assert predict_energy((4.0, 9.0), h100, 2, calibration.model_copy(update={"power_fraction": None})) is None


def test_the_rtx_4090_and_other_common_cards_get_energy_from_their_vendors_tdp():
    """They had no TDP, so no energy prediction ("no cited TDP"); each figure now cites the page it was read on."""
    from diffmeter.predict.devices import board_power

    watts = {"RTX 4090": 450, "RTX 3090": 350, "L4": 72, "A40": 300}
    for name, tdp in watts.items():
        row = board_power()[name]
        assert named_gpu(name).tdp_w == tdp and row["url"].startswith("http") and f"{tdp}" in row["source"]
    rtx = named_gpu("RTX 4090")
    calibration = calibration_for(rtx)
    energy = predict_energy((4.0, 9.0), rtx, 1, calibration)
    assert energy is not None and energy.power_w == pytest.approx(calibration.power_fraction * 450)


def test_the_shipped_hopper_and_blackwell_calibrations_predict_energy():
    for card in ("H100 SXM", "B200"):
        calibration = calibration_for(named_gpu(card))
        assert 0.5 < calibration.power_fraction <= 1 and calibration.energy_width >= 1
        assert "board power" in calibration.energy_source


@pytest.mark.slow
def test_a_host_bound_run_draws_less_power_than_a_long_one():
    """SD 1.5 at 512 px, 8 steps, on an H200 drew 217-313 W (Zeus): its GPU waits for the host most of the time, so
    its predicted board power is under a long FLUX.1-dev run's."""
    from diffmeter.predict.operators import operator_work
    from diffmeter.predict.roofline import predict_time
    from diffmeter.spec import ProfileSpec

    h200 = named_gpu("H200 SXM")
    short = predict_time(operator_work(ProfileSpec(model="sd15", height=512, width=512, steps=8, dtype="bf16")), h200)
    full = predict_time(operator_work(ProfileSpec(model="flux-dev", steps=28, dtype="bf16")), h200)
    assert short.busy_share < 0.6 < 0.9 < full.busy_share
    assert short.energy.power_w < 0.7 * full.energy.power_w


@pytest.mark.slow
def test_a_host_bound_run_on_a_card_whose_fitted_runs_never_waited_spans_the_waiting_power():
    """The B200's power was fitted on runs that kept it busy (no waiting share): SD 1.5 at 8 steps waits for the host
    most of its time, and was predicted at the busy share throughout (0.20-0.33 kJ, three times an H100's). Its
    range now takes that wait at no board power to the busy share's, and says why; a GPU-bound run is as before."""
    import math

    from diffmeter.predict.operators import operator_work
    from diffmeter.predict.roofline import predict_time
    from diffmeter.spec import ProfileSpec

    b200 = named_gpu("B200")
    calibration = calibration_for(b200)
    assert calibration.idle_power_fraction is None
    short = predict_time(operator_work(ProfileSpec(model="sd15", height=512, width=512, steps=8, dtype="bf16")), b200)
    seconds = math.sqrt(short.expected_s[0] * short.expected_s[1])
    power = calibration.power_fraction * b200.tdp_w
    assert short.busy_share < 0.8 and "waits for the host" in short.energy.waiting_unfitted
    low, high = short.energy.per_output_j
    assert high == pytest.approx(power * seconds * calibration.energy_width)
    assert low == pytest.approx(power * short.busy_share * seconds / calibration.energy_width)
    full = predict_time(operator_work(ProfileSpec(model="flux-dev", steps=28, dtype="bf16")), b200)
    assert full.busy_share > 0.8 and full.energy.waiting_unfitted is None
