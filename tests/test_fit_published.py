"""The fit of the expected range on published runs (``predict/fit_published.py``) on runs made from known
parameters, and the range it ships as a calibration."""

from __future__ import annotations

import dataclasses

import pytest

from diffmeter.predict.devices import named_gpu
from diffmeter.predict.fit_published import (
    BARE_MATMUL_FRACTION,
    LEAST_INSIDE,
    RANGE_FACTOR,
    PublishedRun,
    as_calibration,
    fit,
    leave_one_out,
    summary,
)
from diffmeter.predict.roofline import calibration_for, expected_s

SCORE_S = 0.8e-12  # seconds per attention score


def made(a: dict, overhead_s, source, index, noise=1.0, score_s=SCORE_S):
    """A run of made-up work (its bounds per group in seconds, scores, operators), published at the time the
    multipliers ``a`` (per group; a missing group: the compute's) give it; runs of 5 models, each with its own mix
    of kinds."""
    bounds = {
        "compute": 1.0 + index,
        "attention": 0.1 + 0.4 * (index % 5),
        "normalization": 0.05 + 0.1 * (index % 4),
        "elementwise": 0.2 + 0.3 * (index % 3),
        "other": 0.1 + 0.05 * (index % 6),
    }
    scores, operators = int(2e11 * (1 + (index * 7) % 5)), 1000 * (1 + index % 4)
    published = sum(a.get(group, a["compute"]) * seconds for group, seconds in bounds.items())
    published = (published + score_s * scores + overhead_s * operators) * noise
    model = f"model{index % 5}"
    return PublishedRun(f"{source}-{index}", source, "hopper", model, published, bounds, scores, operators)


MADE = {"compute": 2.0, "attention": 3.0, "normalization": 6.0, "elementwise": 4.0, "other": 1.5}


def test_the_fit_recovers_the_parameters_runs_were_made_with():
    runs = [made(MADE, 1e-5, f"s{i % 3}", i) for i in range(12)]
    found = fit(runs)
    assert found.multipliers == pytest.approx(MADE, rel=1e-6)
    assert (found.score_s, found.overhead_s) == pytest.approx((SCORE_S, 1e-5), rel=1e-6)
    assert found.width**2 == pytest.approx(1.5)  # runs the fit meets exactly: the range is hi/lo 1.5 all the same


def test_no_kind_is_fitted_faster_than_its_roofline():
    """Runs faster than their eager bound (impossible for an eager run) pull the multipliers to 1, not below."""
    runs = [made({"compute": 0.5}, 0.0, f"s{i % 3}", i, score_s=0) for i in range(10)]
    found = fit(runs)
    assert min(found.multipliers.values()) >= 1 and found.overhead_s >= 0 and found.score_s >= 0


def test_compute_is_never_fitted_faster_than_a_bare_matmul_measured_on_its_architecture():
    """Runs made with the compute at 95% of its roofline: on Hopper, where a bare matmul reached 81% (measured), the
    compute's multiplier stops at 1 / 0.81; on an architecture without such a measurement it is fitted as made."""
    made_with = {**MADE, "compute": 1 / 0.95}
    hopper = [made(made_with, 1e-5, f"s{i % 3}", i) for i in range(12)]
    assert fit(hopper).multipliers["compute"] == pytest.approx(1 / BARE_MATMUL_FRACTION["hopper"])
    assert 0.75 < BARE_MATMUL_FRACTION["hopper"] < 0.85
    blackwell = [dataclasses.replace(run, architecture="blackwell") for run in hopper]
    assert "blackwell" not in BARE_MATMUL_FRACTION
    assert fit(blackwell).multipliers["compute"] == pytest.approx(1 / 0.95, rel=1e-6)


def test_few_runs_fit_one_multiplier_and_the_range_holds_the_stated_share():
    noises = {"a": 1.1, "b": 0.9, "c": 1.0}
    runs = [made({"compute": 3.0}, 0.0, s, i, noise, score_s=0) for i, (s, noise) in enumerate(noises.items())]
    found = fit(runs)
    assert len(set(found.multipliers.values())) == 1 and found.overhead_s == found.score_s == 0
    assert found.width == pytest.approx(RANGE_FACTOR)
    assert all(found.range(run)[0] <= run.published_s <= found.range(run)[1] for run in runs)


def test_the_range_is_widened_to_hold_four_in_five_of_runs_that_spread_wider_than_it():
    """Runs 1.6x apart either way: hi/lo 1.5 would hold none of the noisy ones, so the range widens until 80% of the
    fitted runs are inside it, and no further."""
    noises = [1.6, 1 / 1.6, 1.3, 1 / 1.3, 1.0] * 3
    runs = [made({"compute": 3.0}, 0.0, f"s{i % 3}", i, noise, score_s=0) for i, noise in enumerate(noises)]
    found = fit(runs)
    inside = [found.range(run)[0] <= run.published_s <= found.range(run)[1] for run in runs]
    assert found.width > RANGE_FACTOR and LEAST_INSIDE <= sum(inside) / len(inside) < 1


def test_a_held_out_source_is_predicted_by_the_others_alone():
    """A source whose runs are 3x slower than the rest is outside the range the others give it."""
    runs = [made(MADE, 1e-5, f"s{i % 3}", i) for i in range(12)]
    runs += [made({g: 3 * a for g, a in MADE.items()}, 3e-5, "slow", i, score_s=3 * SCORE_S) for i in range(3)]
    held = leave_one_out(runs)
    slow = [h for h in held if h.run.source == "slow"]
    assert len(held) == len(runs) and not any(h.inside for h in slow)
    assert all(h.error == pytest.approx(-2 / 3, rel=0.05) for h in slow)
    assert summary(held)["coverage"] < 1


def test_one_sources_runs_are_held_out_a_model_at_a_time():
    runs = [made({"compute": 2.0}, 0.0, "only", i, score_s=0) for i in range(8)]  # 8 runs of 5 models: the full model
    assert not leave_one_out(runs)  # one source: nothing to hold out by source
    held = leave_one_out(runs, by="model")
    assert len(held) == 8 and all(h.error == pytest.approx(0, abs=1e-6) for h in held)


def test_the_shipped_calibration_gives_the_fits_range():
    runs = [made(MADE, 1e-5, f"s{i % 3}", i, 1 + 0.05 * (i % 2)) for i in range(12)]
    found = fit(runs)
    calibration = as_calibration(found, "test", runs)
    assert calibration.least_bound_per_operator_s == min(r.eager_s / r.operators for r in runs)
    run = runs[4]
    kinds = {
        "matmul": [run.bounds["compute"] * 0.75, 1],
        "convolution": [run.bounds["compute"] * 0.25, 1],
        "attention": [run.bounds["attention"], 1],
        "normalization": [run.bounds["normalization"], 1],
        "elementwise": [run.bounds["elementwise"], 1],
        "other": [run.bounds["other"], 1],
    }
    low, high = expected_s(kinds, run.operators, calibration, run.scores)
    assert (low, high) == pytest.approx(found.range(run), rel=1e-6)


def test_a_card_takes_its_architectures_calibration_or_a_neighbours_and_says_so():
    hopper = calibration_for(named_gpu("H100 SXM"))
    assert "published eager runs on hopper GPUs" in hopper.source
    assert calibration_for(named_gpu("H200 SXM")).source == hopper.source
    blackwell = calibration_for(named_gpu("B200"))  # its own fit: Hopper's runs B200's published times 40% fast
    assert "on blackwell GPUs" in blackwell.source and blackwell.fractions != hopper.fractions
    ada = calibration_for(named_gpu("RTX 4090"))  # ada -> ampere (none shipped) -> hopper
    assert ada.fractions == hopper.fractions and "borrowed for ada (RTX 4090) from hopper" in ada.source


@pytest.mark.slow
def test_a_run_with_smaller_operators_than_any_fitted_run_says_its_range_may_not_hold():
    """SD 1.5 at 512 px, 8 steps, on an H200: 4.1 us of eager bound per operator, under every published Hopper run
    (SANA 1.5 at batch 1 has the least, 4.8 us; the others 14 us and up), and its measured time was twice the range's
    midpoint. Larger runs carry no such note."""
    from diffmeter.predict.operators import operator_work
    from diffmeter.predict.roofline import predict_time
    from diffmeter.spec import ProfileSpec

    h200 = named_gpu("H200 SXM")
    short = predict_time(operator_work(ProfileSpec(model="sd15", height=512, width=512, steps=8, dtype="bf16")), h200)
    assert "outside the fitted runs" in short.outside_calibration
    full = predict_time(operator_work(ProfileSpec(model="flux-dev", steps=28, dtype="bf16")), h200)
    assert full.outside_calibration is None
