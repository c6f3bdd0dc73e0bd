"""`profile --gpu` with a technique left out of the time: no expected range and no energy (they would be the
pipeline's without it), the bounds only where the technique can only slow the run, and each one's reason."""

from __future__ import annotations

import json

import pytest

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
    assert why in found["time_left_out"][0] and "can make the run faster" in found["no_time"]
    code, out, _ = cli(*asked)
    said = " ".join(out.split())
    assert code == 0 and f"no time prediction: {technique}: " in said and "can make the run faster" in said
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
    assert code == 0 and "time bounds without offload-model: " in said and " J per " not in said
