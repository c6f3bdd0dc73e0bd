"""The fit of the expected range on published runs (``predict/fit_published.py``) on runs made from known
parameters, and the range it ships as a calibration."""

from __future__ import annotations

import pytest

from diffmeter.predict.devices import named_gpu
from diffmeter.predict.fit_published import (
    PublishedRun,
    as_calibration,
    fit,
    leave_one_out,
    summary,
)
from diffmeter.predict.roofline import calibration_for, expected_s

SCORE_S = 0.8e-12  # seconds per attention score


def made(a_compute, a_memory, overhead_s, source, index, noise=1.0, a_attention=None, score_s=SCORE_S):
    """A run of made-up work (its bounds in seconds, scores, operators), published at the time the parameters
    give it; runs of 5 models, each with its own mix of kinds."""
    compute, memory, operators = 1.0 + index, 0.2 + 0.3 * (index % 3), 1000 * (1 + index % 4)
    attention, scores = 0.1 + 0.4 * (index % 5), int(2e11 * (1 + (index * 7) % 5))
    a_attention = a_compute if a_attention is None else a_attention
    published = a_compute * compute + a_attention * attention + score_s * scores + a_memory * memory
    published = (published + overhead_s * operators) * noise
    return PublishedRun(
        f"{source}-{index}", source, "hopper", f"model{index % 5}", published, compute, attention, memory, scores,
        operators,
    )  # fmt: skip


def test_the_fit_recovers_the_parameters_runs_were_made_with():
    runs = [made(2.0, 5.0, 1e-5, f"s{i % 3}", i, a_attention=3.0) for i in range(10)]
    found = fit(runs)
    recovered = (found.a_compute, found.a_attention, found.score_s, found.a_memory, found.overhead_s)
    assert recovered == pytest.approx((2.0, 3.0, SCORE_S, 5.0, 1e-5), rel=1e-6)
    assert found.width == pytest.approx(1.0)


def test_no_kind_is_fitted_faster_than_its_roofline():
    """Runs faster than their eager bound (impossible for an eager run) pull the multipliers to 1, not below."""
    runs = [made(0.5, 0.5, 0.0, f"s{i % 3}", i, score_s=0) for i in range(10)]
    found = fit(runs)
    assert min(found.a_compute, found.a_attention, found.a_memory) >= 1 and found.overhead_s >= 0
    assert found.score_s >= 0


def test_few_runs_fit_one_multiplier_and_the_range_holds_the_stated_share():
    noises = {"a": 1.1, "b": 0.9, "c": 1.0}
    runs = [made(3.0, 3.0, 0.0, source, i, noise, score_s=0) for i, (source, noise) in enumerate(noises.items())]
    found = fit(runs)
    assert found.a_compute == found.a_attention == found.a_memory and found.overhead_s == found.score_s == 0
    inside = [found.range(run)[0] <= run.published_s <= found.range(run)[1] for run in runs]
    assert sum(inside) / len(inside) >= 0.95 - 1e-9


def test_a_held_out_source_is_predicted_by_the_others_alone():
    """A source whose runs are 3x slower than the rest is outside the range the others give it."""
    runs = [made(2.0, 5.0, 1e-5, f"s{i % 3}", i) for i in range(10)]
    runs += [made(6.0, 15.0, 3e-5, "slow", i, score_s=3 * SCORE_S) for i in range(3)]
    held = leave_one_out(runs)
    slow = [h for h in held if h.run.source == "slow"]
    assert len(held) == len(runs) and not any(h.inside for h in slow)
    assert all(h.error == pytest.approx(-2 / 3, rel=0.05) for h in slow)
    assert summary(held)["coverage"] < 1


def test_one_sources_runs_are_held_out_a_model_at_a_time():
    runs = [made(2.0, 2.0, 0.0, "only", i, score_s=0) for i in range(8)]  # 8 runs of 5 models: the full model
    assert not leave_one_out(runs)  # one source: nothing to hold out by source
    held = leave_one_out(runs, by="model")
    assert len(held) == 8 and all(h.error == pytest.approx(0, abs=1e-6) for h in held)


def test_the_shipped_calibration_gives_the_fits_range():
    runs = [made(2.0, 5.0, 1e-5, f"s{i % 3}", i, 1 + 0.05 * (i % 2), a_attention=3.0) for i in range(10)]
    found = fit(runs)
    calibration = as_calibration(found, "test", runs)
    bound = [(r.compute_s + r.attention_s + r.memory_s) / r.operators for r in runs]
    assert calibration.least_bound_per_operator_s == min(bound)
    run = runs[4]
    kinds = {"matmul": [run.compute_s, 1], "attention": [run.attention_s, 1], "elementwise": [run.memory_s, 1]}
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
    (14 us and up), and its measured time was twice the range's midpoint. Larger runs carry no such note."""
    from diffmeter.predict.operators import operator_work
    from diffmeter.predict.roofline import predict_time
    from diffmeter.spec import ProfileSpec

    h200 = named_gpu("H200 SXM")
    short = predict_time(operator_work(ProfileSpec(model="sd15", height=512, width=512, steps=8, dtype="bf16")), h200)
    assert "outside the fitted runs" in short.outside_calibration
    full = predict_time(operator_work(ProfileSpec(model="flux-dev", steps=28, dtype="bf16")), h200)
    assert full.outside_calibration is None
