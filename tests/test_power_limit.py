"""The compute a card's TDP sustains (``predict.power_limit``): the expected time reads it, the lower bound does not."""

import json

import pytest

from diffmeter.predict.calibration import calibrations, shipped_power_exponent
from diffmeter.predict.devices import named_gpu
from diffmeter.predict.gpu_spec import spec_gpu
from diffmeter.predict.peaks import PEAKS
from diffmeter.predict.power_limit import EXPONENTS, dies, power_limit, sustained


def test_every_die_lists_table_cards_with_its_reference_among_them_and_a_source():
    names = {row.name for row in PEAKS}
    for die, entry in dies().items():
        assert entry["reference"] in entry["cards"] and set(entry["cards"]) <= names, die
        assert entry["source"], die
    everywhere = [card for entry in dies().values() for card in entry["cards"]]
    assert len(everywhere) == len(set(everywhere))  # a card is on one die


def test_the_a100_pcie_at_250_w_sustains_its_share_of_the_sxm_power_to_the_exponent():
    """GA100 at 250 W (40 GB PCIe) against 400 W (SXM), the same datasheet peaks: (250 / 400)^(1/3) = 0.855 of each
    under the cube law, (250 / 400)^(1/2) = 0.791 at 1/2."""
    limit = power_limit(named_gpu("A100 40GB PCIe"), 1 / 3)
    assert limit.die == "GA100" and limit.reference == "A100 80GB SXM"
    assert set(limit.factors) == {"fp32", "tf32", "bf16", "fp16"}
    assert all(factor == pytest.approx((250 / 400) ** (1 / 3)) for factor in limit.factors.values())
    pcie, sxm = sustained(named_gpu("A100 40GB PCIe"), 1 / 3), named_gpu("A100 40GB SXM")
    assert pcie.tflops["bf16"] == pytest.approx(312.0 * 0.855, rel=1e-3)
    assert sustained(named_gpu("A100 40GB PCIe"), 0.5).tflops["bf16"] == pytest.approx(312.0 * 0.791, rel=1e-3)
    assert pcie.bandwidth_bytes_per_s == sxm.bandwidth_bytes_per_s  # memory is not power-limited here


@pytest.mark.parametrize("name", ["A100 40GB SXM", "A100 80GB SXM", "RTX 4090", "H100 SXM", "T4", "RTX 5090"])
def test_a_reference_a_card_at_its_power_or_one_of_no_listed_die_runs_at_its_peaks(name):
    device = named_gpu(name)
    assert power_limit(device, 0.5) is None and sustained(device, 0.5) is device


@pytest.mark.parametrize("exponent", [0.0, None])
def test_no_exponent_is_no_power_term(exponent):
    device = named_gpu("L4")
    assert power_limit(device, exponent) is None and sustained(device, exponent) is device


def test_the_shipped_calibrations_carry_one_exponent_of_the_candidates():
    """Fitted together (``benchmarks/calibrate_published.py``): every CUDA calibration has the same exponent, a CPU's
    none."""
    found = {name: c.power_exponent for name, c in calibrations().items()}
    assert found["cpu"] is None
    assert {e for name, e in found.items() if name.startswith("cuda:")} == {shipped_power_exponent()}
    assert shipped_power_exponent() in EXPONENTS


def test_a_card_with_more_power_per_tflop_than_its_reference_is_not_sped_up():
    """The H20 (GH100, export-limited to 148 TFLOP/s bf16 at 400 W) has more power per TFLOP than the H100 SXM:
    its tensor peaks stay as they are (factor 1, never above)."""
    limit = power_limit(named_gpu("H20"), 1 / 3)
    assert limit.factors["bf16"] == limit.factors["fp8"] == 1.0 and limit.factors["fp32"] < 1.0


def test_the_workstation_ada_cards_run_full_rate_tensor_cores_on_less_power_than_the_4090():
    """The L40S runs fp32-accumulate bf16 at twice the RTX 4090's rate per clock on 350 W against 450 W: about 0.71
    of its datasheet peak; its fp32 (CUDA cores, about the 4090's rate) loses less."""
    limit = power_limit(named_gpu("L40S"), 1 / 3)
    assert limit.die == "AD102" and limit.factors["bf16"] == pytest.approx(0.708, abs=0.002)
    assert limit.factors["bf16"] < limit.factors["fp32"] < 1.0
    assert "RTX 4090" in limit.describe() and "0.71 (tf32/bf16/fp16/fp8)" in limit.describe()
    assert "to the 1/3 power" in limit.describe()


def test_figures_given_with_gpu_spec_have_no_die():
    given = '{"memory_gib": 40, "tflops": 312, "bandwidth_gb_s": 1555, "tdp_w": 250, "architecture": "ampere"}'
    device = spec_gpu(given)
    assert power_limit(device, 0.5) is None


@pytest.mark.slow
def test_the_expected_time_on_a_power_limited_card_is_slower_while_its_lower_bound_is_the_datasheet_one():
    """The A100 40GB PCIe and SXM share peaks and bandwidth: the same lower bound per stage, and the PCIe card's
    GPU time longer where the stage computes (SD 1.5's denoising at batch 1 is host-bound on both: the GPU's side
    of its range is compared), as its power note says."""
    from diffmeter.predict.operators import operator_work
    from diffmeter.predict.roofline import predict_time
    from diffmeter.spec import ProfileSpec

    work = operator_work(ProfileSpec(model="sd15", dtype="fp16"))
    pcie, sxm = predict_time(work, named_gpu("A100 40GB PCIe")), predict_time(work, named_gpu("A100 40GB SXM"))
    assert [s.lower_s for s in pcie.stages] == [s.lower_s for s in sxm.stages]
    denoise = {s.stage: s for s in pcie.stages}["denoising"], {s.stage: s for s in sxm.stages}["denoising"]
    slower = denoise[0].gpu_s[0] / denoise[1].gpu_s[0]
    # the compute slower by (400 / 250) to the shipped exponent, the memory-bound share not
    assert 1.0 < slower < (400 / 250) ** shipped_power_exponent()
    assert "A100 80GB SXM" in pcie.power_limit and sxm.power_limit is None


def test_profile_and_fit_say_a_power_limited_cards_compute_runs_under_its_peaks(cli):
    """On the L4 (AD104 at 72 W against the RTX 4070 Ti's 285 W) the expected range is at its share of the bf16
    peak (0.55 under the cube law, to the shipped exponent here): profile --gpu says so in its caption and its
    JSON, fit beside its table and in its JSON; on the H100 SXM, the GH100's reference, neither says anything."""
    code, out, err = cli("profile", "tiny-flux", "--gpu", "L4", "--steps", "2", "--json")
    assert code == 0, err
    said = json.loads(out)["time"]["power_limit"]
    assert said == power_limit(named_gpu("L4"), shipped_power_exponent()).describe()
    assert "(tf32/bf16/fp16/fp8)" in said and "RTX 4070 Ti's (the same AD104 die)" in said
    code, out, err = cli("profile", "tiny-flux", "--gpu", "L4", "--steps", "2")
    assert code == 0 and f"On this card {said}." in " ".join(out.split())
    code, out, err = cli("fit", "tiny-flux", "--gpu", "L4", "--steps", "2", "--json")
    assert code == 0 and json.loads(out)["power_limit"] == said
    code, out, err = cli("fit", "tiny-flux", "--gpu", "L4", "--steps", "2")
    assert code == 0 and f"On the L4, {said}." in " ".join(out.split())
    code, out, err = cli("fit", "tiny-flux", "--gpu", "h100", "--steps", "2", "--json")
    assert code == 0 and json.loads(out)["power_limit"] is None


def test_the_expected_time_reads_the_calibrations_exponent():
    """The same work on the L4 (power-limited) under its shipped calibration with the exponent set to none, 1/3 and
    2/3: no power note and the fastest GPU time without one, slower the steeper the exponent; the lower bound the
    same throughout."""
    from diffmeter.predict.calibration import calibration_for
    from diffmeter.predict.operators import operator_work
    from diffmeter.predict.roofline import predict_time
    from diffmeter.spec import ProfileSpec

    work = operator_work(ProfileSpec(model="tiny-flux", steps=2, height=512, width=512))
    l4 = named_gpu("L4")
    shipped = calibration_for(l4)
    times = {
        exponent: predict_time(work, l4, shipped.model_copy(update={"power_exponent": exponent}))
        for exponent in (None, 1 / 3, 2 / 3)
    }
    assert times[None].power_limit is None and "to the 2/3 power" in times[2 / 3].power_limit
    gpu = {exponent: sum(s.gpu_s[0] if s.gpu_s else s.expected_s[0] for s in t.stages) for exponent, t in times.items()}
    assert gpu[None] < gpu[1 / 3] < gpu[2 / 3]
    assert times[None].lower_s == times[1 / 3].lower_s == times[2 / 3].lower_s
