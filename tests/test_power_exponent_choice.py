"""The power limit's exponent chosen by the eager fit (``fit_holdout.chosen_fit``) and chosen again inside each held-out
fold for the claims (``fit_holdout.nested_leave_one_out``), on runs made with known parameters."""

import dataclasses

import pytest
from test_fit_published import MADE, made

from diffmeter.predict.fit_holdout import chosen_fit, leave_one_out, nested_leave_one_out


def off(run, factor):
    """``run`` as a wrongly built exponent sees it: its published time no longer what its bounds make it."""
    return dataclasses.replace(run, published_s=run.published_s * factor)


def exact_and_off(sources_off_at_exact=(), source=lambda i: f"s{i % 3}"):
    """The same 48 runs built at two exponents: 0.5 reproduces them exactly, 0 puts every second one 30% off; a
    source in ``sources_off_at_exact`` the other way round."""
    runs = [made(MADE, source(i), i) for i in range(48)]
    exact = [off(r, 1.3) if r.source in sources_off_at_exact and i % 2 else r for i, r in enumerate(runs)]
    wrong = [off(r, 1.3) if r.source not in sources_off_at_exact and i % 2 else r for i, r in enumerate(runs)]
    return {0.0: wrong, 0.5: exact}


def test_the_fit_chooses_the_exponent_its_runs_are_made_at():
    by_exponent = exact_and_off()
    exponent, found = chosen_fit(by_exponent)
    assert exponent == 0.5 and found.gpus["hopper"].multipliers == pytest.approx(MADE, rel=1e-3)


def test_each_fold_chooses_without_its_held_out_runs():
    """Two sources: "big" (two runs in three) is exact at exponent 0, "small" at 0.5. All runs choose 0 (the big
    source's); holding "small" out, the rest choose 0, holding "big" out, 0.5: each source is predicted at the
    exponent the other's runs chose, never its own."""
    by_exponent = exact_and_off({"big"}, source=lambda i: "small" if i % 3 == 0 else "big")
    assert chosen_fit(by_exponent)[0] == 0.0
    test = nested_leave_one_out(by_exponent)
    assert test.picks == {0.0: 1, 0.5: 1}
    nested = {h.run.id: h.midpoint for h in test.nested}
    for source, exponent in (("small", 0.0), ("big", 0.5)):
        fixed = {h.run.id: h.midpoint for h in test.fixed[exponent] if h.run.source == source}
        assert fixed and all(nested[i] == midpoint for i, midpoint in fixed.items()), source
    assert [h.midpoint for h in test.fixed[0.5]] == pytest.approx([h.midpoint for h in leave_one_out(by_exponent[0.5])])


def test_a_technique_sources_exponent_is_chosen_by_the_other_sources_eager_runs():
    """calibrate_techniques' per-source choice: the big source's technique runs are predicted at the exponent the
    small source's eager runs choose, and the other way round."""
    from calibrate_techniques import chosen_without

    by_exponent = exact_and_off({"big"}, source=lambda i: "small" if i % 3 == 0 else "big")
    chosen = chosen_without(by_exponent, ["big", "small", "big"])
    assert {source: exponent for source, (exponent, _) in chosen.items()} == {"big": 0.5, "small": 0.0}


def test_runs_sharing_an_id_are_refused():
    """A fold keeps its held-out runs out of the fit by id: two runs with one id would let one back in."""
    runs = exact_and_off()[0.5]
    twin = dataclasses.replace(runs[1], source="s0")
    with pytest.raises(ValueError, match="share an id"):
        leave_one_out([*runs, twin])
