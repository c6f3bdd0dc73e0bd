"""The two time bounds hold: no published, measured time in benchmarks/published_figures.yaml lies under its
ideal bound, and no eager run's under the eager-operator bound; each bound's rules on the CPU."""

from __future__ import annotations

import functools
import hashlib
import sys
from pathlib import Path

import pytest
import yaml

from diffmeter.predict.devices import Device, named_gpu
from diffmeter.predict.gpu_spec import chosen_gpu
from diffmeter.predict.memory import weight_reads
from diffmeter.predict.operators import modes_that_change_the_decode, operator_work, predict_memory_and_work
from diffmeter.predict.roofline import TORCH_FP32, FlopRates, lower_bounds, missing_figures, predict_time, stage_bounds
from diffmeter.predict.schema import CallWork, OperatorGroup, OperatorWork
from diffmeter.predict.vae_decode import VAE_MODES
from diffmeter.spec import ProfileSpec

sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks"))
from published_comparison import settings  # noqa: E402

FIGURES = Path(__file__).parents[1] / "benchmarks" / "published_figures.yaml"
#: techniques that change the operators a run dispatches: the eager bound is of the plain eager operators
NOT_EAGER = {"compile"}


def latency_figures() -> list[dict]:
    """Every usable latency; of the runs with a tiled or sliced decode (ML.ENERGY's videos), the smallest batch of
    each model on each GPU: its fake-tensor count takes minutes on 2 cores, and a larger batch of the same video
    differs only in the denoiser's batch, whose bound grows with it as the published time does."""
    figures = [f for f in yaml.safe_load(FIGURES.read_text())["figures"] if f["kind"] == "latency"]
    figures = [f for f in figures if f.get("usable", True)]
    smallest: dict[tuple, int] = {}
    for f in figures:
        if set(f["techniques"]) & set(VAE_MODES):
            key = (f["model"], f["gpu"])
            smallest[key] = min(smallest.get(key, f["batch_size"]), f["batch_size"])
    return [f for f in figures if smallest.get((f["model"], f["gpu"]), f["batch_size"]) == f["batch_size"]]


def spec_of(figure: dict) -> ProfileSpec:
    """The run as the calibrations count it (``published_comparison.settings``: its sampler, sequence length and CFG
    truncation where it ran with its own)."""
    chosen, _ = settings(figure)
    return ProfileSpec(model=figure["model"], **{k: v for k, v in chosen.items() if v is not None})


def decode_modes(figure: dict) -> tuple[str, ...]:
    """The figure's tiled or sliced decode, as counted (slicing at batch 1 is the plain decode), so the runs of one
    setting with and without it are counted once."""
    return modes_that_change_the_decode(spec_of(figure), tuple(t for t in figure["techniques"] if t in VAE_MODES))


def run_of(figure: dict) -> tuple[ProfileSpec, tuple[str, ...]]:
    """What a figure's count depends on: its run and decode, not its GPU (many rows share one run)."""
    return spec_of(figure), decode_modes(figure)


@functools.cache
def counted(spec: ProfileSpec, modes: tuple[str, ...]) -> tuple[OperatorWork, dict]:
    """The run's operators and weight reads, counted once per run in a process."""
    if modes:  # the decode as the tiled or sliced decode runs it (the plain one may not run at that batch)
        return operator_work(spec, modes), weight_reads(spec)
    memory, work = predict_memory_and_work(spec, vae_modes=())
    return work, memory.weight_read_bytes


def group_of(figure: dict) -> str:
    return "time-bounds-" + hashlib.sha256(repr(run_of(figure)).encode()).hexdigest()[:12]


def figure_params() -> list:
    """One parameter per figure; the figures of one run go to one xdist worker, which counts that run once."""
    return [
        pytest.param(figure, id=figure["id"], marks=pytest.mark.xdist_group(group_of(figure)))
        for figure in latency_figures()
    ]


@pytest.mark.slow
@pytest.mark.parametrize("figure", figure_params())
def test_no_published_time_is_under_its_bounds(figure):
    spec = figure.get("gpu_spec")  # the datasheet figures of the card's exact variant, where the row covers several
    device = chosen_gpu(None if spec else figure["gpu"], spec)
    work, weights = counted(*run_of(figure))
    fp32 = figure["source"].get("fp32", TORCH_FP32)  # PyTorch's float32 defaults, unless the source says
    if missing_figures(device, work, fp32):
        pytest.skip(missing_figures(device, work, fp32))
    time = predict_time(work, device, weights=weights, fp32_math=fp32)
    published = figure["published"]["value"]
    assert time.ideal_s <= time.lower_s
    assert published >= time.ideal_s, f"{published} s published, ideal bound {time.ideal_s:.3f} s"
    if not NOT_EAGER & set(figure["techniques"]):
        assert published >= time.lower_s, f"{published} s published, eager bound {time.lower_s:.3f} s"


def one_call(flops: int, moved: int, component: str = "transformer") -> OperatorWork:
    group = OperatorGroup(kind="matmul", flops=flops, bytes=moved, calls=10)
    return OperatorWork(
        dtype="bfloat16",
        calls=[
            CallWork(
                stage="denoising", component=component, count=4, operators=[group], dispatched=group.calls, modules=0
            )
        ],
    )


def test_bytes_that_fit_in_l2_cost_no_memory_time():
    small, large = one_call(flops=10**6, moved=2**20), one_call(flops=10**6, moved=2**30)
    bandwidth, peak, l2 = 1e12, 1e15, 50 * 2**20
    rates = FlopRates(peak)
    assert lower_bounds(small, rates, bandwidth, l2)["denoising"]["matmul"][0] == pytest.approx(40 * 10**6 / peak)
    assert lower_bounds(small, rates, bandwidth)["denoising"]["matmul"][0] == pytest.approx(40 * 2**20 / bandwidth)
    assert lower_bounds(large, rates, bandwidth, l2)["denoising"]["matmul"][0] == pytest.approx(40 * 2**30 / bandwidth)


def test_the_ideal_bound_reads_each_calls_weights_once_and_runs_its_flops_at_the_peak():
    work = one_call(flops=10**12, moved=2**20)
    peak, bandwidth, l2 = 1e15, 1e12, 50 * 2**20
    rates = FlopRates(peak)
    # compute-bound: 4 calls x 10 operators x 10^12 FLOPs at 10^15 FLOP/s
    assert stage_bounds(work, {"transformer": 10**9}, rates, bandwidth)["denoising"][1] == pytest.approx(0.04)
    # weight-bound: 4 calls x 10^11 bytes at 10^12 B/s; weights within L2 cost nothing
    assert stage_bounds(work, {"transformer": 10**11}, rates, bandwidth)["denoising"][1] == pytest.approx(0.4)
    assert stage_bounds(work, {"transformer": 10**7}, rates, bandwidth, l2)["denoising"][1] == pytest.approx(0.04)
    # every operator's bytes fit in L2 but the call's weights do not: the eager bound is never under the ideal
    assert stage_bounds(work, {"transformer": 10**11}, rates, bandwidth, l2)["denoising"] == pytest.approx((0.4, 0.4))


def test_a_cards_l2_comes_from_its_whitepaper_and_an_unstated_one_is_left_out():
    assert named_gpu("H100 SXM").l2_bytes == 50 * 2**20 and named_gpu("RTX 4090").l2_bytes == 72 * 2**20
    assert named_gpu("H200 SXM").l2_bytes == 50 * 2**20  # a third party's table, as the H100's (gpu_cache.json)
    assert named_gpu("B200").l2_bytes is None  # no document states it: every byte goes to DRAM
    assert Device(name="x", memory_bytes=None, bandwidth_bytes_per_s=1.0, tflops={}, source="").l2_bytes is None


def test_the_ideal_bound_is_below_the_eager_bound_for_a_real_size_model():
    memory, work = predict_memory_and_work(ProfileSpec(model="sd15", steps=2, height=512, width=512), vae_modes=())
    time = predict_time(work, named_gpu("H100 SXM"), weights=memory.weight_read_bytes)
    assert 0 < time.ideal_s < time.lower_s
    assert all(0 < stage.ideal_s <= stage.lower_s for stage in time.stages)
    # CLIP's layers each fit in the H100's L2 while its weights do not: its eager bound is its ideal one
    text = next(stage for stage in time.stages if stage.stage == "text_encoding")
    assert text.lower_s == pytest.approx(text.ideal_s)
