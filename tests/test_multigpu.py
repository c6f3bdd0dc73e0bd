"""Parallel runs over torch.distributed on CPU (gloo, 2 processes): diffusers' context parallelism
gives the one-process images, data parallelism gives every one of them, refusals come before
anything loads, rank 0 writes the one result, and a rank that dies ends the run with a failed result."""

import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time

import pytest
import torch

from diffmeter.errors import DiffmeterError
from diffmeter.execute import bench
from diffmeter.measure.quality import compare
from diffmeter.runs.runner import prepare
from diffmeter.runs.spec import BenchSpec
from diffmeter.runs.storage import RESULTS, read_result


def _spec(model: str = "tiny-flux", **settings) -> BenchSpec:
    return BenchSpec(**{"model": model, "device": "cpu", "warmup": 1, "iterations": 2, **settings})


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"ring_degree": 2}, "cannot return (diffusers raises on return_lse)"),
        ({"ulysses_degree": 3}, "2 attention heads, not divisible by --ulysses-degree 3"),
        ({"ulysses_degree": 2, "max_sequence_length": 33}, "'input.encoder_hidden_states' has 33 tokens"),
        ({"ulysses_degree": 2, "model": "tiny-sd"}, "UNet2DConditionModel has no context-parallel plan"),
        ({"ulysses_degree": 2, "model": "tiny-wan"}, "at 'rope.0' has 3 tokens"),  # 16x16 px, 9 frames
        ({"data_parallel": 2, "min_duration_s": 1.0}, "--min-duration stops each process"),
        ({"data_parallel": 0}, "--data-parallel must be at least 1"),
        ({"tp_degree": 2}, "diffusers' tensor parallelism runs on cuda, neuron, tpu, xpu devices, not cpu"),
        ({"tp_degree": 2, "model": "tiny-wan"}, "WanTransformer3DModel has no tensor-parallel plan"),
        ({"tp_degree": 2, "ulysses_degree": 2}, "context parallelism or tensor parallelism to a model, not both"),
        ({"engine": "xdit"}, "xDiT (xfuser) runs on CUDA GPUs only"),
    ],
)
def test_unsupported_parallel_runs_are_refused_before_loading(settings, message):
    with pytest.raises(DiffmeterError) as refused:
        prepare(_spec(**settings))
    assert message in str(refused.value)


def _on_cuda(monkeypatch, **settings):
    """A CUDA target for the checks: torch.cuda.device_count is faked (no GPU here); the checks are diffmeter's."""
    import dataclasses

    run = prepare(_spec(**settings))
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    return run.spec, dataclasses.replace(run.target, device=torch.device("cuda", 0))


def test_more_processes_than_gpus_is_refused(monkeypatch):
    from diffmeter.runs import parallel_support as support

    spec, target = _on_cuda(monkeypatch, data_parallel=2)
    with pytest.raises(DiffmeterError, match="need as many GPUs, but 1 are visible"):
        support.check(spec, target, [])
    support.check(spec, target, [], here=False)  # planned for another machine: its GPUs are counted there


def test_tensor_parallel_heads_and_xdit_on_cuda_are_refused(monkeypatch):
    from diffmeter.runs import parallel_support as support

    spec, target = _on_cuda(monkeypatch)
    with pytest.raises(DiffmeterError, match="2 attention heads, not divisible by --tp-degree 4"):
        support.check_tensor_parallel(spec.model_copy(update={"tp_degree": 4}), target)
    with pytest.raises(DiffmeterError, match="--engine xdit is not implemented"):
        support.check_engine("xdit", target.device)


def test_the_cli_refuses_ring_on_native_attention_in_one_line(cli, tmp_path):
    code, _, err = cli("bench", "tiny-flux", "--device", "cpu", "--ring-degree", "2", "--out", tmp_path)
    assert code == 2 and err.startswith("error:") and len(err.strip().splitlines()) == 1
    assert "log-sum-exp" in err and not any(tmp_path.iterdir())


def _images(result) -> dict:
    return {image.seed: result.folder / image.path for image in result.images}


def _assert_same_images(result, reference) -> None:
    mine, theirs = _images(result), _images(reference)
    assert mine.keys() == theirs.keys()
    for seed, path in mine.items():
        quality = compare(path, theirs[seed], seed)
        assert quality.identical or quality.psnr_db > 60, (seed, quality)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("model", "settings"), [("tiny-flux", {}), ("tiny-wan", {"height": 32, "width": 32})], ids=["flux", "wan"]
)
def test_ulysses_2_gives_the_one_process_images_and_rank_0_writes_once(model, settings, tmp_path):
    reference, _ = bench(_spec(model, **settings), out=tmp_path / "one")
    result, folder = bench(_spec(model, ulysses_degree=2, **settings), out=tmp_path / "two")
    _assert_same_images(result, reference)
    assert result.parallel.images_identical_across_ranks is True
    assert [rank.rank for rank in result.parallel.ranks] == [0, 1]
    assert result.parallel.backend == "gloo" and result.parallel.launcher == "diffmeter"
    assert result.environment.torch_threads == max(1, os.cpu_count() // 2)  # the cores split between the ranks
    assert list((tmp_path / "two").rglob(RESULTS)) == [folder / RESULTS]  # one result, from rank 0
    assert not (folder / "ranks" / "rank-1" / "images").exists()  # the copy was checked and dropped
    for merged, *own in zip(result.iterations, *(rank.iterations for rank in result.parallel.ranks), strict=True):
        assert merged.stages.denoising_s == max(call.stages.denoising_s for call in own)
        assert merged.total_s == max(call.total_s for call in own)
    assert result.summary.flops["denoising"] == reference.summary.flops["denoising"] // 2
    offline = result.parallel.communication  # counted on the meta device over a fake process group
    assert offline.collectives_per_denoiser_call["all_to_all_single"] > 0
    assert [rank.measured_bytes_per_denoiser_call for rank in result.parallel.ranks] == [
        offline.bytes_per_denoiser_call
    ] * 2
    scaling = result.parallel.scaling  # the one-device run is under another --out
    assert scaling.call is None and scaling.denoising is None and scaling.processes == 2
    assert f"no one-device run of the same spec under {tmp_path / 'two'}" in scaling.reason


def _median_s_per_image(result, stage: str | None = None) -> float:
    return statistics.median(
        (call.total_s if stage is None else getattr(call.stages, stage)) / call.images for call in result.iterations
    )


@pytest.mark.slow
def test_data_parallel_2_gives_every_image_of_one_process_and_its_scaling(cli, tmp_path):
    _, single = bench(_spec(iterations=4), out=tmp_path)
    result, folder = bench(_spec(data_parallel=2), out=tmp_path)
    reference = read_result(single)
    _assert_same_images(result, reference)
    assert result.summary.images == 4 and [call.images for call in result.iterations] == [2, 2]
    assert result.parallel.images_identical_across_ranks is None
    assert [rank.measured_bytes_per_denoiser_call for rank in result.parallel.ranks] == [None, None]
    assert sorted(tmp_path.rglob(RESULTS)) == sorted([folder / RESULTS, single / RESULTS])  # one from the ranks
    stored = read_result(folder)
    scaling = stored.parallel.scaling  # against the one-device run stored beside it, from both stored medians
    assert scaling.one_device_run == single.name and scaling.reason is None and scaling.processes == 2
    for stage, figures in (("total_s", scaling.call), ("denoising_s", scaling.denoising)):
        field = None if stage == "total_s" else stage
        one, two = _median_s_per_image(reference, field), _median_s_per_image(stored, field)
        assert (figures.one_device_s_per_image, figures.parallel_s_per_image) == (one, two)
        assert figures.speedup == one / two and figures.efficiency == one / two / 2
    code, out, _ = cli("show", folder)
    assert code == 0 and f"{scaling.call.speedup:.2f}x = {scaling.call.efficiency:.0%} of 2 processes" in out
    code, out, _ = cli("table", tmp_path, "--json")
    rows = {row["parallel"]: row for row in json.loads(out)}
    assert code == 0 and rows["data-parallel-2"]["scaling_efficiency"] == pytest.approx(scaling.call.efficiency)
    assert rows["data-parallel-2"]["processes"] == 2 and rows[""]["scaling_efficiency"] is None
    assert rows["data-parallel-2"]["s_per_image"] == pytest.approx(stored.summary.latency_s.median / 2)  # 2 per call


def test_offline_ulysses_volume_matches_its_closed_form(cli):
    """tiny-flux, 32 px, float32, Ulysses 2: each of its 1 + 1 blocks sends Q, K, V and the attention
    output through an all-to-all (each rank keeps half of its 48 of 64 + 32 tokens x 2 heads x 16
    channels), and the output projection's all-gather receives the other rank's 32 tokens x 16 channels."""
    code, out, _ = cli("profile", "tiny-flux", "--ulysses-degree", "2", "--json")
    split = json.loads(out)["context_parallel_per_gpu_step"]
    tokens, channels, blocks, fp32 = 64 + 32, 2 * 16, 1 + 1, 4
    per_block = 4 * (tokens // 2) * channels // 2 * fp32
    assert code == 0 and split["bytes_received_per_step_per_gpu"] == blocks * per_block + 32 * 16 * fp32
    assert split["collectives_per_denoiser_call"] == {"all_to_all_single": 8, "all_gather_into_tensor": 1}
    assert split["flops_per_step_per_gpu"] * 2 == split["flops_per_step"]


def test_profile_refuses_a_split_the_model_cannot_take(cli):
    code, _, err = cli("profile", "tiny-sd", "--ulysses-degree", "2")
    assert code == 2 and "no context-parallel plan" in err and len(err.strip().splitlines()) == 1


def _loaded_rank_1(out) -> int | None:
    """The process id of rank 1 once it has loaded the pipeline (from its log)."""
    for log in out.glob(".*partial*/ranks/rank-1/bench.log"):
        text = log.read_text()
        if "loaded and optimized" in text:
            return int(re.search(r"process (\d+)", text).group(1))
    return None


@pytest.mark.slow
@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_a_rank_that_dies_ends_the_run_with_a_failed_result(tmp_path):
    out = tmp_path / "out"
    process = subprocess.Popen(
        ["diffmeter", "bench", "tiny-flux", "--device", "cpu", "--ulysses-degree", "2", "--steps", "50"]
        + ["--iterations", "1000", "--out", str(out), "--quiet"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 120
        while (victim := _loaded_rank_1(out)) is None:
            assert process.poll() is None, process.communicate()
            assert time.monotonic() < deadline, "the ranks did not load"
            time.sleep(0.2)
        os.kill(victim, signal.SIGKILL)
        _, err = process.communicate(timeout=120)  # no hang: rank 0 is not left waiting in a collective
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    assert process.returncode == 2 and "Traceback" not in err
    assert "rank 1 died (killed by signal SIGKILL)" in err
    (stored,) = out.glob(f"*/{RESULTS}")
    result = read_result(stored.parent)
    assert result.status == "failed" and "rank 1 died" in result.error
    assert not list(out.glob(".*partial*"))
