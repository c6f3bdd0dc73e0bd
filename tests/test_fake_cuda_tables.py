"""The table's baselines for runs measured on CUDA (the fake CUDA device, tests/fake_cuda): bench applies TF32 there
unasked, so a plain run is the baseline of its techniques, and one measured --no-tf32 the baseline of both."""

from __future__ import annotations

import pytest
from fake_cuda import unavailable_reason
from test_fake_cuda import fake_bench

from diffmeter.optimization_spec import OptimizationSpec
from diffmeter.runs import collect

REASON = unavailable_reason()
pytestmark = [pytest.mark.fake_cuda, pytest.mark.skipif(REASON is not None, reason=REASON or "")]


def test_a_plain_cuda_run_is_the_baseline_of_its_techniques_and_a_strict_one_of_both(tmp_path):
    plain, _, _ = fake_bench(tmp_path / "default", "tiny-sd")
    fake_bench(tmp_path / "default", "tiny-sd", optimizations=[OptimizationSpec(name="vae-slicing")])
    assert [o.name for o in plain.optimizations] == ["tf32"]
    by_techniques = {row["optimizations"]: row for row in collect.rows(tmp_path)}
    assert by_techniques["tf32"]["speedup_verdict"] == "baseline"
    sliced = by_techniques["tf32+vae-slicing"]
    assert sliced["speedup"] is not None and sliced["speedup_baseline"] == by_techniques["tf32"]["folder"]

    fake_bench(tmp_path / "default", "tiny-sd", tf32=False)
    by_techniques = {row["optimizations"]: row for row in collect.rows(tmp_path)}
    strict = by_techniques[""]
    assert strict["speedup_verdict"] == "baseline"
    for techniques in ("tf32", "tf32+vae-slicing"):  # bench's own baseline (--compare-baseline's) where measured
        assert by_techniques[techniques]["speedup_baseline"] == strict["folder"]
        assert by_techniques[techniques]["speedup_verdict"] != "baseline"
