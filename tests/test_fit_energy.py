"""The board power fitted on published runs' energy (``predict/fit_energy.py``), on runs made from known
parameters, and the energy per output a prediction carries (``predict/energy.py``)."""

from __future__ import annotations

import pytest

from diffmeter.predict.devices import named_gpu
from diffmeter.predict.energy import predict_energy
from diffmeter.predict.fit_energy import EnergyRun, fit_power, leave_one_model_out
from diffmeter.predict.fit_published import PublishedRun, fit, summary
from diffmeter.predict.roofline import Calibration, calibration_for


def made(index: int, fraction: float, tdp_w: float = 700.0, outputs: int = 2, slow: float = 1.0) -> EnergyRun:
    """A run of model ``index % 3`` that took 2.0 x its eager bound, drawing ``fraction`` of its card's TDP
    (``slow``: how much longer than that it really took); 3 models: the time fit is one multiplier."""
    compute, memory, operators = 1.0 + index, 0.2 + 0.1 * index, 1000
    seconds = 2.0 * (compute + memory) * slow
    bounds = {"compute": compute, "elementwise": memory}
    run = PublishedRun(f"r{index}", f"s{index % 3}", "hopper", f"m{index % 3}", seconds, bounds, 0, operators)
    return EnergyRun(run, fraction * tdp_w * seconds / outputs, outputs, tdp_w)


def test_the_fit_recovers_the_share_of_tdp_runs_were_made_with():
    runs = [made(i, 0.85) for i in range(9)]
    found = fit_power(runs, [run.run.published_s for run in runs])
    assert found.fraction == pytest.approx(0.85) and found.width == pytest.approx(1.0)


def test_a_time_predicted_too_short_gives_too_little_energy_as_a_user_would_see():
    runs = [made(i, 0.85) for i in range(9)]
    found = fit_power(runs, [run.run.published_s for run in runs])
    assert found.midpoint(runs[0], runs[0].run.published_s / 2) == pytest.approx(runs[0].published_j / 2)


def test_a_held_out_model_is_predicted_by_the_others_time_and_power_alone():
    """A model drawing half the others' power is outside the range the others give it."""
    runs = [made(i, 0.85) for i in range(6)] + [made(i, 0.425) for i in (6, 9)]  # m0: r0, r3, r6, r9
    timed = [run.run for run in runs]
    held = leave_one_model_out(runs, timed)
    assert len(held) == len(runs)
    low = [h for h in held if h.run.run.id in ("r6", "r9")]
    assert all(not h.inside and h.error > 0.5 for h in low)
    others = [h for h in held if h.run.run.model != "m0"]
    assert max(abs(h.error) for h in others) < min(h.error for h in low)
    assert summary(held)["coverage"] < 1
    assert fit(timed).midpoint(runs[1].run) == pytest.approx(runs[1].run.published_s)


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
def test_a_launch_bound_runs_energy_says_it_is_likely_high():
    """SD 1.5 at 512 px, 8 steps, on an H200 drew 217-313 W (Zeus), not the fit's 98% of 700 W."""
    from diffmeter.predict.operators import operator_work
    from diffmeter.predict.roofline import predict_time
    from diffmeter.spec import ProfileSpec

    h200 = named_gpu("H200 SXM")
    short = predict_time(operator_work(ProfileSpec(model="sd15", height=512, width=512, steps=8, dtype="bf16")), h200)
    assert "likely high" in short.energy.calibration
    full = predict_time(operator_work(ProfileSpec(model="flux-dev", steps=28, dtype="bf16")), h200)
    assert "likely high" not in full.energy.calibration
