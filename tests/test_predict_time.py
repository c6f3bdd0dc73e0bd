"""Roofline time: every operator's FLOPs and bytes counted on fake tensors, the lower bound and the
calibrated range computed from them (what bench stores of them: test_bench_prediction.py)."""

from __future__ import annotations

import json

import pytest
import torch

from diffmeter import units
from diffmeter.catalog import resolve
from diffmeter.flops.profile import profile_spec
from diffmeter.predict.calibration import Calibration, calibrations
from diffmeter.predict.devices import Device, named_gpu
from diffmeter.predict.gpu_spec import spec_gpu
from diffmeter.predict.operators import OperatorTally, operator_work
from diffmeter.predict.roofline import TORCH_FP32, predict_time
from diffmeter.predict.schema import CallWork, OperatorGroup, OperatorWork
from diffmeter.runs.spec import BenchSpec
from diffmeter.spec import ProfileSpec

ROLE_STAGE = {"text_encoder": "text_encoding", "denoiser": "denoising", "vae_decoder": "vae_decode"}


def tally(module, *inputs) -> dict[str, list[tuple[int, int, int]]]:
    with torch.no_grad(), OperatorTally() as counted:
        module(*inputs)
    found: dict[str, list[tuple[int, int, int]]] = {}
    for group in counted.operators():
        found.setdefault(group.kind, []).append((group.flops, group.bytes, group.calls))
    return found


def test_the_host_issues_every_dispatched_operator_views_too_and_every_module_call():
    """F.linear dispatches a transpose of the weight (a view, no traffic) and an addmm: two for the host, one for
    the GPU; a Sequential of two linears is three module calls; a query returning no tensor is not dispatched work
    in an eager run (an attribute read)."""
    x, linear = torch.randn(8, 64), torch.nn.Linear(64, 32)
    stacked = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.Linear(32, 8))
    with torch.no_grad(), OperatorTally() as counted:
        linear(x)
    assert counted.host_counts() == {"dispatched": 2, "modules": 1, "fused_chains": 0, "fused_bytes": 0}  # no chain
    assert sum(g.calls for g in counted.operators()) == 1
    with torch.no_grad(), OperatorTally() as counted:
        stacked(x)
    assert counted.host_counts() == {"dispatched": 4, "modules": 3, "fused_chains": 0, "fused_bytes": 0}
    with OperatorTally() as counted:
        torch.ops.prim.device(x)
    assert counted.host_counts() == {"dispatched": 0, "modules": 0, "fused_chains": 0, "fused_bytes": 0}


def test_an_operator_moves_its_inputs_and_outputs_and_views_move_nothing():
    linear = torch.nn.Linear(64, 32)
    x = torch.randn(8, 64)
    found = tally(linear, x)
    # F.linear dispatches a transpose of the weight (a view: left out) and one addmm
    assert found == {"matmul": [(2 * 8 * 64 * 32, 4 * (8 * 64 + 64 * 32 + 32 + 8 * 32), 1)]}
    expanded = torch.randn(1, 16).expand(1000, 16)  # reads its 16 elements, not 16,000
    found = tally(torch.nn.SiLU(), expanded)
    assert found == {"elementwise": [(0, 4 * 16 + 4 * 16_000, 1)]}
    # a lookup reads its indices and the rows it returns, not the whole table
    found = tally(torch.nn.Embedding(1000, 16), torch.tensor([3, 5, 7, 9]))
    assert found == {"other": [(0, 8 * 4 + 2 * 4 * 4 * 16, 1)]}
    # a query returning no tensor (a tensor's device, its sizes) moves nothing
    with OperatorTally() as counted:
        torch.ops.prim.device(x)
    assert not counted.operators()


@pytest.mark.parametrize("name", ["tiny-sd", "tiny-flux", "tiny-wan"])
def test_every_stages_flops_equal_the_offline_profile(name):
    spec = ProfileSpec(model=name)
    work = operator_work(spec)
    profile = profile_spec(spec)
    counted: dict[str, int] = {}
    for call in work.calls:
        counted[call.stage] = counted.get(call.stage, 0) + call.count * sum(g.flops * g.calls for g in call.operators)
    expected: dict[str, int] = {}
    for component in profile.components:
        stage = ROLE_STAGE[component.role]
        expected[stage] = expected.get(stage, 0) + component.flops
    assert counted == expected


def work_of(*groups: tuple[str, int, int, int], count: int = 1) -> OperatorWork:
    operators = [OperatorGroup(kind=k, flops=f, bytes=b, calls=c) for k, f, b, c in groups]
    return OperatorWork(
        dtype="float32",
        calls=[CallWork(stage="denoising", component="x", count=count, operators=operators, dispatched=0, modules=0)],
    )


def test_lower_bound_takes_each_operators_slower_roof_and_the_range_its_calibration():
    device = Device(
        name="d", kind="cuda", memory_bytes=None, bandwidth_bytes_per_s=1e9, tflops={"fp32": 1.0}, source=""
    )
    # a matmul bound by compute (2e12 FLOPs: 2 s; 1e9 bytes: 1 s), a copy bound by memory (3 s), twice each
    work = work_of(("matmul", 2 * 10**12, 10**9, 1), ("other", 0, 3 * 10**9, 1), count=2)
    calibration = Calibration(
        source="test", fractions={"matmul": (0.5, 0.8), "other": (0.25, 1.0)}, overhead_s=(0.1, 0.2)
    )
    predicted = predict_time(work, device, calibration=calibration)
    assert predicted.lower_s == pytest.approx(2 * (2 + 3))
    assert predicted.stages[0].operators == 4
    low, high = predicted.expected_s
    assert low == pytest.approx(4 / 0.8 + 6 / 1.0 + 4 * 0.1)
    assert high == pytest.approx(4 / 0.5 + 6 / 0.25 + 4 * 0.2)
    assert predict_time(work, device.model_copy(update={"kind": "elsewhere"})).expected_s is None


def test_attention_scores_are_counted_per_kernel_and_priced_by_the_calibration():
    """Each scaled-dot-product attention computes batch x heads x queries x keys scores (a mask or grouped keys
    change none of it); the expected range adds their calibrated cost to the kinds' and operators'."""
    query, key = torch.randn(2, 4, 10, 8), torch.randn(2, 4, 6, 8)
    mask = torch.ones(2, 1, 10, 6, dtype=torch.bool)
    with torch.no_grad(), OperatorTally() as counted:
        torch.nn.functional.scaled_dot_product_attention(query, key, key)
        torch.nn.functional.scaled_dot_product_attention(query, key, key, attn_mask=mask)
        query @ key.transpose(-1, -2)  # a matmul: no scores
    attention = [group for group in counted.operators() if group.kind == "attention"]
    assert sum(group.calls for group in attention) == 2 and all(group.scores == 2 * 4 * 10 * 6 for group in attention)
    assert all(group.scores == 0 for group in counted.operators() if group.kind != "attention")

    device = Device(
        name="d", kind="cuda", memory_bytes=None, bandwidth_bytes_per_s=1e9, tflops={"fp32": 1.0}, source=""
    )
    work = work_of(("attention", 10**12, 1, 1), count=3)
    work.calls[0].operators[0].scores = 10**12
    priced = Calibration(source="t", fractions={"other": (0.5, 0.5)}, overhead_s=(0, 0), score_s=(1e-12, 2e-12))
    unpriced = priced.model_copy(update={"score_s": None})
    low, high = predict_time(work, device, calibration=priced).expected_s
    assert (low, high) == pytest.approx((3 * (2 + 1), 3 * (2 + 2)))
    assert predict_time(work, device, calibration=unpriced).expected_s == pytest.approx((6, 6))


def test_float32_work_takes_tf32s_peak_where_it_runs_on_tf32_and_missing_figures_are_named():
    matmul, convolution = work_of(("matmul", 10**12, 1, 1)), work_of(("convolution", 10**12, 1, 1))
    h100 = named_gpu("h100")
    assert predict_time(matmul, h100).lower_s == pytest.approx(1 / h100.tflops["tf32"])  # a bench's default
    assert predict_time(matmul, h100).peak_tflops == h100.tflops["tf32"]
    # PyTorch's own defaults: matmuls in IEEE float32, cuDNN convolutions in TF32
    assert predict_time(matmul, h100, fp32_math=TORCH_FP32).lower_s == pytest.approx(1 / h100.tflops["fp32"])
    assert predict_time(convolution, h100, fp32_math=TORCH_FP32).lower_s == pytest.approx(1 / h100.tflops["tf32"])
    strict = {"matmul": "ieee", "convolution": "ieee"}  # bench --no-tf32
    assert predict_time(convolution, h100, fp32_math=strict).lower_s == pytest.approx(1 / h100.tflops["fp32"])
    assert predict_time(matmul, named_gpu("v100")).lower_s == pytest.approx(1 / named_gpu("v100").tflops["fp32"])
    with pytest.raises(Exception, match="--gpu-spec gives no TFLOPS and no bandwidth: add them"):
        predict_time(matmul, spec_gpu("24GB"))


def test_a_call_at_another_dtype_is_charged_that_dtypes_peak_and_named_where_the_card_lacks_it():
    """A bfloat16 run whose VAE runs in float32 (Wan's model cards, SDXL's float16 decode): the VAE's convolutions
    at TF32, its attention at float32, the denoiser at bfloat16; a card without a float32 peak names the VAE."""
    group = [OperatorGroup(kind=kind, flops=10**12, bytes=1, calls=1) for kind in ("convolution", "attention")]
    work = OperatorWork(
        dtype="bfloat16",
        calls=[
            CallWork(
                stage="denoising",
                component="transformer",
                count=2,
                operators=group[:1],
                dtype="bfloat16",
                dispatched=0,
                modules=0,
            ),
            CallWork(
                stage="vae_decode", component="vae", count=1, operators=group, dtype="float32", dispatched=0, modules=0
            ),
        ],
    )
    card = Device(
        name="card",
        memory_bytes=None,
        bandwidth_bytes_per_s=1e30,
        tflops={"bf16": 100, "tf32": 10, "fp32": 1},
        source="",
    )
    time = predict_time(work, card)
    lower = {stage.stage: stage.lower_s for stage in time.stages}
    assert lower == pytest.approx({"denoising": 2 / 100, "vae_decode": 1 / 10 + 1 / 1})
    assert time.peak_tflops == 100
    assert time.other_peaks == ["vae in float32: attention at 1 TFLOP/s, convolution at 10 TFLOP/s (TF32)"]
    without = card.model_copy(update={"tflops": {"bf16": 100}})
    with pytest.raises(Exception, match=r"no float32 peak \(its vae runs in float32\)"):
        predict_time(work, without)
    assert predict_time(work.model_copy(update={"calls": work.calls[:1]}), without).lower_s == pytest.approx(0.02)


def test_a_cpus_convolutions_are_charged_the_rate_measured_on_convolutions():
    """A CPU runs float32 convolutions on oneDNN and float32 matmuls on MKL's SGEMM, at different rates (SD 1.5's
    VAE decode measured under its bound at the matmul peak): each kind is charged its own measured rate, and the
    prediction names it; a device without a convolution rate charges its dtype's peak."""
    work = work_of(("convolution", 3 * 10**11, 1, 1), ("matmul", 2 * 10**11, 1, 1))
    cpu = Device(
        name="cpu",
        kind="cpu",
        memory_bytes=None,
        bandwidth_bytes_per_s=1e30,
        tflops={"fp32": 0.2, "conv-fp32": 0.3},
        source="",
    )
    time = predict_time(work, cpu)
    assert time.lower_s == pytest.approx(3e11 / 0.3e12 + 2e11 / 0.2e12)
    assert time.peak_tflops == 0.2
    assert time.other_peaks == ["x in float32: convolution at 0.3 TFLOP/s (measured on convolutions)"]
    without = cpu.model_copy(update={"tflops": {"fp32": 0.2}})
    assert predict_time(work, without).lower_s == pytest.approx(5e11 / 0.2e12)
    assert predict_time(work, without).other_peaks == []
    # the expected range applies each fraction to the peak it was fitted on: a fit without a convolution rate
    # charged convolutions the matmul peak, so its range does too (the bound keeps the convolution rate)
    fit = Calibration(source="t", fractions={"other": (0.5, 1.0)}, overhead_s=(0, 0), fitted_tflops={"fp32": 0.1})
    assert predict_time(work, cpu, calibration=fit).expected_s == pytest.approx((5e11 / 0.2e12, 2 * 5e11 / 0.2e12))
    fit.fitted_tflops = {"fp32": 0.1, "conv-fp32": 0.1}
    assert predict_time(work, cpu, calibration=fit).expected_s == pytest.approx((time.lower_s, 2 * time.lower_s))
    # peaks stored before convolutions were measured: no range from fractions of a rate they lack
    unfitted = predict_time(work, without, calibration=fit)
    assert unfitted.expected_s is None and "doctor --remeasure-cpu" in unfitted.calibration


def test_an_operator_kept_in_float32_in_a_float16_run_is_charged_float32s_peak():
    """T5 keeps its feed-forward output ``wo`` in float32 when loaded in float16 (transformers'
    ``_keep_in_fp32_modules``, not in bfloat16): those matmuls are named float32 and charged its peak, the rest of the
    encoder float16's; a bfloat16 run has none."""
    work = operator_work(ProfileSpec(model="tiny-pixart", dtype="float16"))
    kept = [(c.component, g.kind, g.flops * g.calls) for c in work.calls for g in c.operators if g.dtype]
    t5 = resolve("tiny-pixart").components["text_encoder"].config
    tokens = 120  # PixArt-alpha's max_sequence_length, one prompt per call
    assert kept == [("text_encoder", "matmul", 2 * tokens * t5["d_ff"] * t5["d_model"] * t5["num_layers"])]
    assert work.dtypes() == ("float16", "float32")
    bf16 = operator_work(ProfileSpec(model="tiny-pixart", dtype="bfloat16"))
    assert not any(g.dtype for c in bf16.calls for g in c.operators) and bf16.dtypes() == ("bfloat16",)
    card = Device(
        name="card", memory_bytes=None, bandwidth_bytes_per_s=1e30, tflops={"fp16": 1e-3, "fp32": 1e-6}, source=""
    )
    peak = {"float16": 1e9, "float32": 1e6}  # FLOP/s
    encoder = [c for c in work.calls if c.component == "text_encoder"]
    charged = sum(c.count * g.flops * g.calls / peak[g.dtype or c.dtype] for c in encoder for g in c.operators)
    text = {s.stage: s.lower_s for s in predict_time(work, card).stages}["text_encoding"]
    assert text == pytest.approx(charged)
    assert any(line.startswith("text_encoder in float32: matmul at") for line in predict_time(work, card).other_peaks)


def test_the_shipped_cpu_calibration_quotes_its_held_out_figure_as_committed():
    """A CPU's expected range printed no held-out figure at all: the committed leave-one-run-out table's verdicts."""
    from pathlib import Path

    report = Path(__file__).parents[1] / "benchmarks" / "results" / "roofline_cpu.md"
    rows = [line.split(" | ") for line in report.read_text().splitlines() if line.endswith(("| yes |", "| NO |"))]
    wholes = [row[-1] == "yes |" for row in rows if "**three stages**" in row]
    stages = [row[-1] == "yes |" for row in rows if "**three stages**" not in row]
    said = f"{sum(wholes)} of {len(wholes)} generations inside their range ({sum(stages)} of {len(stages)} stages)"
    assert len(wholes) == 4 and f"held out a run at a time: {said}" in calibrations()["cpu"].source


def test_a_tiny_pipeline_on_the_cpu_is_said_to_be_outside_the_cpu_fits_runs():
    """The CPU fit saw real-size runs only (1.7 ms of eager bound per operator at least): tiny FLUX's 2 us operators,
    whose host cost dominates, were priced by it with no word that nothing like them was fitted (predicted 73 to
    228 ms where bench measured 24 ms); the committed table's least bound is the shipped one."""
    from pathlib import Path

    shipped = calibrations()["cpu"]
    report = (Path(__file__).parents[1] / "benchmarks" / "results" / "roofline_cpu.md").read_text()
    assert f"per operator of any run: {shipped.least_bound_per_operator_s * 1e6:,.1f} µs" in report
    cpu = Device(
        name="cpu",
        kind="cpu",
        memory_bytes=None,
        bandwidth_bytes_per_s=155.8e9,
        tflops=shipped.fitted_tflops,
        source="",
    )
    tiny = predict_time(operator_work(ProfileSpec(model="tiny-flux", steps=2)), cpu, calibration=shipped)
    assert "outside the fitted runs" in tiny.outside_calibration and tiny.expected_s is not None


def test_the_shipped_cpu_calibration_names_its_source():
    shipped = calibrations()["cpu"]
    assert "benchmarks/roofline_cpu.py" in shipped.source
    assert {"matmul", "convolution", "other"} <= set(shipped.fractions)
    assert all(0 < low <= high for low, high in shipped.fractions.values())


def test_profile_gpu_adds_time_and_says_when_it_cannot(cli):
    code, out, _ = cli("profile", "tiny-sd", "--gpu", "h100", "--json")
    assert code == 0
    time = json.loads(out)["time"]
    assert [s["stage"] for s in time["stages"]] == ["text_encoding", "denoising", "vae_decode"]
    assert time["lower_s"] == pytest.approx(sum(s["lower_s"] for s in time["stages"]))
    code, out, _ = cli("profile", "tiny-sd", "--gpu-spec", "24GB")
    assert code == 0 and "no time prediction: --gpu-spec gives no TFLOPS and no bandwidth" in " ".join(out.split())
    code, out, _ = cli("profile", "tiny-sd", "--gpu", "cpu")
    assert code == 0 and "predicted time on CPU" in out and "whole generation" in out


def test_profile_on_this_cpu_predicts_the_dtype_bench_runs_there(cli):
    """SD 1.5's card says float16, but bench on a CPU runs float32: --gpu cpu predicts that run, unless told."""
    settings = ("--gpu", "cpu", "--height", "64", "--width", "64", "--steps", "1", "--json")
    code, out, _ = cli("profile", "sd15", *settings)
    assert code == 0 and json.loads(out)["memory"]["dtype"] == "float32"
    code, out, _ = cli("profile", "sd15", *settings, "--dtype", "float16")
    assert code == 0 and json.loads(out)["memory"]["dtype"] == "float16"


def test_long_times_read_in_minutes_and_hours():

    assert units.seconds(29_858) == "8.29 h" and units.seconds(424) == "7.07 min"
    assert units.seconds(119.5) == "119.500 s" and units.seconds(0.5) == "500.00 ms"
    # a range in one unit, its larger end's: "97.816 s to 2.59 min" read as two scales (a new user's finding)
    assert units.seconds_range(97.816, 155.4) == "1.63 min to 2.59 min"
    assert (
        units.seconds_range(0.5, 12.25) == "0.500 s to 12.250 s"
        and units.seconds_range(0.5, 0.9) == "500.00 ms to 900.00 ms"
    )
    # energy: a kWh and up with its prefix (an absurd size read "15,147,726.91 Wh"), small figures kept readable
    assert units.watt_hours(15_147_726.91 * 3600) == "15.15 MWh" and units.watt_hours(2_500 * 3600) == "2.50 kWh"
    assert units.watt_hours(12.7 * 3600) == "12.70 Wh" and units.watt_hours(0.0089 * 3600) == "0.00890 Wh"


def test_a_stored_prediction_names_a_family_whose_memory_is_not_yet_checked():
    """bench stores the family's verdict beside its prediction (for the settled spec), as profile and fit show it."""
    from diffmeter.predict.bench_prediction import predict_or_note

    flagged, why = predict_or_note(BenchSpec(model="tiny-lumina2", device="cpu", dtype="float32"), [], None)
    assert why is None and any(note.startswith("memory: NOT within 2%") for note in flagged.notes), flagged.notes
    checked, _ = predict_or_note(BenchSpec(model="tiny-sd", device="cpu", dtype="float32"), [], None)
    assert not any(note.startswith("memory:") for note in checked.notes)
