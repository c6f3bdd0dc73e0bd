"""`profile --gpu` with a technique left out of the time: no expected range and no energy (they would be the
pipeline's without it), the bounds only where the technique can only slow the run, and each one's reason."""

from __future__ import annotations

import json

import pytest

from diffmeter.predict.offload_time import moved_bytes
from diffmeter.predict.operators import predict_memory_and_work
from diffmeter.spec import ProfileSpec

INT4 = "its packed int4 kernels run far from any bound in eager mode"


@pytest.mark.parametrize(("quantize", "why"), [("quanto:int4", INT4), ("sdnq:uint4", "no published quantized latency")])
def test_an_untimed_quantization_gets_no_range_no_energy_and_no_bound(cli, quantize, why):
    """It can make the run faster than the unquantized lower bound: neither the range nor the bounds are given."""
    asked = ("profile", "tiny-flux", "--gpu", "RTX 4070", "--steps", "3", "--quantize", quantize)
    code, out, err = cli(*asked, "--json")
    assert code == 0, err
    found = json.loads(out)
    technique = f"quantize-{quantize.replace(':', '-')}"
    assert found["time"] is None and len(found["time_left_out"]) == 1
    assert found["time_left_out"][0].startswith(f"{technique}: ")
    assert why in found["time_left_out"][0] and "do not bound this run" in found["no_time"]
    code, out, _ = cli(*asked)
    said = " ".join(out.split())
    assert code == 0 and f"no time prediction: {technique}: " in said and "do not bound this run" in said
    assert "expected" not in said.split("no time prediction")[1] and " J per " not in said


def test_a_timed_quantization_keeps_its_range(cli):
    code, out, _ = cli(
        "profile", "tiny-flux", "--gpu", "RTX 4070", "--steps", "3", "--quantize", "quanto:int8", "--json"
    )
    found = json.loads(out)
    assert code == 0 and found["time"]["expected_s"] and found["time_left_out"] == [] and found["no_time"] is None


def test_an_untimed_offload_keeps_the_bounds_and_drops_the_range_and_energy(cli):
    """Offloading without a host link: its transfers can only slow the run, so the lower bound still holds."""
    asked = ("profile", "tiny-flux", "--steps", "3", "--offload", "model", "--gpu-spec", "24GB,100TFLOPS,1TB/s")
    code, out, err = cli(*asked, "--json")
    assert code == 0, err
    found = json.loads(out)
    time = found["time"]
    assert time["lower_s"] > 0 and time["expected_s"] is None and time["energy"] is None
    assert all(stage["expected_s"] is None for stage in time["stages"])
    assert found["time_left_out"][0].startswith("offload-model: ") and "no host link" in found["time_left_out"][0]
    assert "it can only slow the run" in time["calibration"] and found["no_time"] is None
    code, out, _ = cli(*asked)
    said = " ".join(out.split())
    assert code == 0 and "no expected range without offload-model: " in said and " J per " not in said


@pytest.mark.parametrize("mode", ["sequential", "group"])
def test_an_untimed_offload_bounds_the_time_by_its_transfers_as_fit_does(cli, mode):
    """No achieved link rate fitted for the mode: no range, but its transfers at the datasheet rate still bound the
    generation, as `fit` bounds the same setting (offload_time.lower_s); the lower bound ignored them before."""
    asked = ("profile", "tiny-flux", "--gpu", "RTX 4070", "--steps", "3", "--json")
    plain, offloaded = (json.loads(cli(*asked, *extra)[1]) for extra in ((), ("--offload", mode)))
    technique = f"offload-{mode}"
    assert offloaded["time"]["expected_s"] is None and offloaded["time_left_out"][0].startswith(f"{technique}: ")
    memory, _ = predict_memory_and_work(ProfileSpec(model="tiny-flux", steps=3), True, ())
    transfers = moved_bytes(memory, (technique,)) / 32e9  # the RTX 4070's PCIe Gen4 x16, per direction
    compute = plain["time"]["lower_s"]
    bound = max(compute, transfers) if mode == "group" else compute + transfers
    assert transfers > compute > 0 and offloaded["time"]["lower_s"] == pytest.approx(bound, rel=1e-9)
    assert f"{technique}'s " in offloaded["time"]["calibration"]


def test_an_untimed_offload_with_a_cache_is_bounded_by_the_transfers_of_the_calls_that_compute(cli):
    """A skipped call onloads only what it runs, so every call's transfers would overstate the bound, and none
    understate it: sequential offload's bound holds the weights of the calls that compute in full at the most
    skipped share (8 of 28 skip at diffusers' default threshold) and every other component's, as fit bounds it."""

    def lower(*extra):
        code, out, err = cli("profile", "tiny-flux", "--gpu", "RTX 4070", "--steps", "28", "--json", *extra)
        assert code == 0, err
        return json.loads(out)["time"]

    plain, cached = lower(), lower("--opt", "first-block-cache")
    every_call = lower("--offload", "sequential")["lower_s"] - plain["lower_s"]  # the transfers of every call
    sequential = lower("--opt", "first-block-cache", "--offload", "sequential")
    assert sequential["expected_s"] is None
    assert "of the 71% of its calls that compute in full alone" in sequential["calibration"]
    assert cached["lower_s"] < sequential["lower_s"] < cached["lower_s"] + every_call
