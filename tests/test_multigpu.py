"""Parallel runs over torch.distributed on CPU (gloo, 2 processes): diffusers' context parallelism
gives the one-process images, data parallelism gives every one of them, refusals come before
anything loads, rank 0 writes the one result (a rank that dies, and Ctrl-C: test_multigpu_signals.py)."""

import json
import os
import re
import statistics
import subprocess

import pytest
import torch
from parallel_runs import assert_same_images, cpu_spec, with_a_rank_fault

from diffmeter import units
from diffmeter.distributed.merge import parallel_lines
from diffmeter.errors import DiffmeterError
from diffmeter.execute import bench
from diffmeter.report.prediction_lines import prediction_lines
from diffmeter.runs.prepared import prepare
from diffmeter.runs.spec import BenchSpec
from diffmeter.runs.speedups import between
from diffmeter.runs.storage import RESULTS, read_result

#: how a scaling record names its two runs in the noise notes it carries
NAMES = ("one-device run", "this run")


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
        prepare(cpu_spec(**settings))
    assert message in str(refused.value)


def _on_cuda(monkeypatch, **settings):
    """A CUDA target for the checks: torch.cuda.device_count is faked (no GPU here); the checks are diffmeter's."""
    import dataclasses

    run = prepare(cpu_spec(**settings))
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


def test_tensor_parallel_with_a_quantized_denoiser_is_refused_before_loading(monkeypatch):
    """diffusers refuses it only after loading (hooks/tensor_parallel.py, _check_tp_supported)."""
    from diffmeter.optimize import build
    from diffmeter.optimize.options import from_config
    from diffmeter.runs import parallel_support as support

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)  # no GPU here: the checks are diffmeter's
    spec, target = _on_cuda(monkeypatch)
    spec = spec.model_copy(update={"tp_degree": 2})
    with pytest.raises(DiffmeterError, match="quantizes the denoiser, and diffusers cannot shard quantized"):
        support.check(spec, target, build(from_config(["quantize"])), here=False)
    text_only = {"name": "quantize", "params": {"components": ["text_encoder_2"]}}
    support.check(spec, target, build(from_config([text_only])), here=False)
    with pytest.raises(DiffmeterError, match="a parallel run keeps each rank's on its own GPU"):
        support.check(spec, target, build(from_config(["offload"])), here=False)  # diffusers: after loading


def test_the_cli_refuses_ring_on_native_attention_in_one_line(cli, tmp_path):
    code, _, err = cli("bench", "tiny-flux", "--device", "cpu", "--ring-degree", "2", "--out", tmp_path)
    assert code == 2 and err.startswith("error:") and len(err.strip().splitlines()) == 1
    assert "log-sum-exp" in err and not any(tmp_path.iterdir())


def test_more_cpu_ranks_than_usable_cores_are_refused_before_any_starts(cli, tmp_path, monkeypatch):
    """Each CPU rank takes a share of the cores this process may use (its affinity, not the machine's count): past
    two a core (--data-parallel 64 on 2 cores started 128 processes), the ranks would time each other's contention;
    refused in one line, nothing started or stored."""
    import os

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    code, _, err = cli("bench", "tiny-sd", "--device", "cpu", "--data-parallel", "5", "--out", tmp_path)
    assert code == 2 and err.startswith("error:") and len(err.strip().splitlines()) == 1
    assert "5 processes on a CPU with 2 cores" in err and "at most 4" in err and not any(tmp_path.iterdir())


@pytest.mark.slow
@pytest.mark.parametrize(
    ("model", "settings"), [("tiny-flux", {}), ("tiny-wan", {"height": 32, "width": 32})], ids=["flux", "wan"]
)
def test_ulysses_2_gives_the_one_process_images_and_rank_0_writes_once(model, settings, tmp_path):
    reference, _ = bench(cpu_spec(model, **settings), out=tmp_path / "one")
    result, folder = bench(cpu_spec(model, ulysses_degree=2, **settings), out=tmp_path / "two")
    assert_same_images(result, reference)
    assert result.parallel.images_identical_across_ranks is True
    assert [rank.rank for rank in result.parallel.ranks] == [0, 1]
    assert result.parallel.backend == "gloo" and result.parallel.launcher == "diffmeter"
    assert result.environment.torch_threads == max(1, os.cpu_count() // 2)  # the cores split between the ranks
    assert list((tmp_path / "two").rglob(RESULTS)) == [folder / RESULTS]  # one result, from rank 0
    assert not (folder / "ranks" / "rank-1" / "images").exists()  # the copy was checked and dropped
    for merged, *own in zip(result.iterations, *(rank.iterations for rank in result.parallel.ranks), strict=True):
        slow = max(own, key=lambda call: call.total_s)  # the slowest rank's call, whole: its stages add up to it
        assert merged.total_s == slow.total_s and merged.stages == slow.stages
        parts = merged.stages
        assert parts.text_encoding_s + parts.denoising_s + parts.vae_decode_s + parts.other_s == pytest.approx(
            merged.total_s, rel=1e-6
        )
    assert result.summary.flops["denoising"] == reference.summary.flops["denoising"] // 2
    offline = result.parallel.communication  # counted on the meta device over a fake process group
    assert offline.collectives_per_denoiser_call["all_to_all_single"] > 0
    assert [rank.measured_bytes_per_denoiser_call for rank in result.parallel.ranks] == [
        offline.bytes_per_denoiser_call
    ] * 2
    scaling = result.parallel.scaling  # the one-device run is under another --out
    assert scaling.call is None and scaling.denoising is None and scaling.processes == 2
    # the stored prediction is one GPU's of the group, counted by rank 0 before it joined
    predicted, alone = result.prediction, reference.prediction
    assert predicted is not None and not [note for note in result.notes if note.startswith("no prediction")]
    assert predicted.parallel.gpus == 2 and predicted.parallel.ulysses_degree == 2
    assert predicted.parallel.one_gpu_peak_memory_bytes == alone.peak_memory_bytes
    assert predicted.parallel.per_gpu_peak_memory_bytes == predicted.peak_memory_bytes <= alone.peak_memory_bytes
    assert predicted.parallel.bytes_received_per_gpu > 0
    group, one = (next(s for s in p.time.stages if s.stage == "denoising") for p in (predicted, alone))
    assert group.lower_s < one.lower_s  # half the denoiser's work each
    # a CPU has no link figure: the communication is named as left out, not silently missing
    assert any(said.startswith("multi-GPU communication: no link figure") for said in predicted.time_left_out)
    assert not any("datasheet rate" in said for said in predicted.time_left_out)  # nothing timed at any rate
    (communication,) = [line for line in parallel_lines(result.parallel) if line.startswith("communication")]
    assert f"{units.gib(offline.bytes_per_denoiser_call)} received in the first denoiser call" in communication
    said = " ".join(prediction_lines(result))
    assert "predicted for one GPU of 2 (ulysses 2 x ring 1 x CFG 1)" in said and "not timed (no link figure)" in said
    assert f"no one-device run of the same spec under {tmp_path / 'two'}" in scaling.reason
    # the way to a figure, as it works: at each rank's threads (a one-device run at all of them is refused as
    # unlike), then the parallel run again
    threads = result.environment.torch_threads
    assert f"without the parallel degrees with OMP_NUM_THREADS={threads} into the same --out" in scaling.reason
    assert scaling.reason.endswith("then this one again with --force")


def _median_s_per_image(result, stage: str | None = None) -> float:
    return statistics.median(
        (call.total_s if stage is None else getattr(call.stages, stage)) / call.images for call in result.iterations
    )


def test_a_scaling_ratio_two_noisy_runs_do_not_support_reads_within_noise():
    """The one-device run's calls and the parallel run's overlap: the ratio of their medians (1.22x) is shown
    with the speed-up rule's verdict on the same calls, within noise, as every other speed-up is."""
    from diffmeter.distributed.scaling import line
    from diffmeter.measure.speedup import estimate
    from diffmeter.runs.parallel_records import Scaling, ScalingRule, StageScaling

    one, two = [1.0, 1.3, 0.7, 1.1, 0.95], [0.9, 0.6, 1.2, 0.8, 0.78]
    rule = ScalingRule(**estimate(one, two).model_dump())
    ratio = statistics.median(one) / statistics.median(two)
    stage = StageScaling(
        one_device_s_per_image=statistics.median(one),
        parallel_s_per_image=statistics.median(two),
        speedup=ratio,
        efficiency=ratio / 2,
        rule=rule,
    )
    text = line(Scaling(processes=2, one_device_run="single", call=stage, denoising=stage))
    assert rule.verdict == "within noise" and f"{ratio:.2f}x = {ratio / 2:.0%} of 2 processes" in text
    assert f"by the speed-up rule: whole call {rule.text()}, denoising {rule.text()}" in text


@pytest.mark.slow
def test_data_parallel_2_gives_every_image_of_one_process_and_its_scaling(cli, tmp_path, tmp_path_factory):
    """Against the one-process run at each rank's thread count (the ranks split the CPU's cores); at another count
    no figure, saying why (2 threads against 1 each read as 532% of 2 processes, a new user's finding)."""
    threads = torch.get_num_threads()
    each = max(1, os.cpu_count() // 2)
    torch.set_num_threads(each + 1)
    try:
        apart = tmp_path_factory.mktemp("other-threads")
        bench(cpu_spec(iterations=4), out=apart)
        result, _ = bench(cpu_spec(data_parallel=2), out=apart)
        assert result.parallel.scaling.call is None
        assert f"used {each + 1} torch threads, each rank {each}" in result.parallel.scaling.reason
        torch.set_num_threads(each)
        _, single = bench(cpu_spec(iterations=4), out=tmp_path)
    finally:
        torch.set_num_threads(threads)
    result, folder = bench(cpu_spec(data_parallel=2), out=tmp_path)
    reference = read_result(single)
    assert_same_images(result, reference)
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
        rule = between(reference, stored, stage.removesuffix("_s") if field else "call", names=NAMES)
        assert figures.rule.model_dump() == rule.model_dump()  # the factor's support, by the one speed-up rule
    code, out, _ = cli("show", folder)
    assert code == 0 and f"{scaling.call.speedup:.2f}x = {scaling.call.efficiency:.0%} of 2 processes" in out
    assert f"by the speed-up rule: whole call {scaling.call.rule.text()}" in " ".join(out.split())
    code, out, _ = cli("table", tmp_path, "--json")
    rows = {row["parallel"]: row for row in json.loads(out)}
    assert code == 0 and rows["data-parallel-2"]["scaling_efficiency"] == pytest.approx(scaling.call.efficiency)
    assert rows["data-parallel-2"]["scaling_verdict"] == scaling.call.rule.verdict
    code, _, _ = cli("report", tmp_path, "--out", tmp_path / "report.html")
    page = (tmp_path / "report.html").read_text()  # the two runs' rows told apart by how they ran
    assert code == 0 and "<th>parallel</th>" in page
    assert ">data-parallel-2</td>" in page and ">one process</td>" in page
    # its scaling, as table's: the report had none (a new user's trial)
    assert "<th>scaling</th>" in page and f"{scaling.call.speedup:.2f}x = {scaling.call.efficiency:.0%} of 2" in page
    assert ", 2 processes: Pareto frontier" in page  # one process's peak memory: a line apart from one-process runs
    code, out, _ = cli("table", tmp_path)
    assert code == 0 and "data-parallel-2" in out  # told apart from the one-process row in the terminal too
    assert rows["data-parallel-2"]["processes"] == 2 and rows[""]["scaling_efficiency"] is None
    assert rows["data-parallel-2"]["s_per_image"] == pytest.approx(stored.summary.latency_s.median / 2)  # 2 per call


def test_counting_the_first_call_leaves_a_compiled_denoiser_compiling():
    """The communication count runs a dispatch mode in the first denoiser call; dynamo meeting a frame under a
    dispatch mode skips it for good, so without force_eager around the count no later call compiled (0 graphs)."""
    from diffmeter.distributed.communication import count_first_call
    from diffmeter.measure.compilation import watch_compilation

    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU())
    model.forward = torch.compile(model.forward, backend="eager")
    store = {}
    count_first_call(model, store)
    assert torch.compiler.is_compiling() is False
    with watch_compilation() as compilation:
        for _ in range(3):
            model(torch.randn(2, 8))
    assert store == {"bytes": 0, "calls": {}}  # counted (no collective in this model)
    assert compilation.graphs_compiled > 0


def _logged_at(line: str):
    from datetime import datetime

    return datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")


@pytest.mark.slow
def test_a_rank_out_of_memory_in_its_second_step_ends_the_run_with_that_reason(tmp_path):
    """Rank 1 runs out of memory in the second step of its first call while rank 0 waits in Ulysses'
    all-to-all: the run ends within seconds (not the collectives' 10 minutes) and the stored failure names
    rank 1 and quotes its error, with both ranks' logs."""
    from datetime import datetime

    out = tmp_path / "out"
    command = ["diffmeter", "bench", "tiny-flux", "--ulysses-degree", "2", "--steps", "2", "--iterations", "3"]
    done = subprocess.run(
        [*command, "--out", str(out)], env=with_a_rank_fault(1, "oom:3"), capture_output=True, text=True, timeout=300
    )
    ended = datetime.now()
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    planted = "rank 1: out of memory on cpu: CUDA out of memory. Tried to allocate 20.00 GiB (planted by the test)"
    assert planted in done.stderr
    (stored,) = out.glob(f"*/{RESULTS}")
    result = read_result(stored.parent)
    assert result.status == "failed" and result.error == planted
    rank_1 = (stored.parent / "ranks" / "rank-1" / "bench.log").read_text()
    (oom,) = [line for line in rank_1.splitlines() if "ERROR out of memory" in line]
    assert (ended - _logged_at(oom)).total_seconds() < 30
    assert "rank 0 of 2" in (stored.parent / "bench.log").read_text()
    assert not list(out.glob(".*partial*"))


@pytest.mark.slow
def test_no_rank_measures_while_another_is_still_warming_up(tmp_path):
    """Data parallel 2 with rank 1's warm-up slowed by 4 s: rank 0's first measured call starts only after
    rank 1's warm-up ended (the barrier before the measured loop); without it rank 0 starts ~4 s earlier."""
    from datetime import timedelta

    out = tmp_path / "out"
    command = ["diffmeter", "bench", "tiny-flux", "--data-parallel", "2", "--steps", "2", "--iterations", "2"]
    done = subprocess.run(
        [*command, "--out", str(out)], env=with_a_rank_fault(1, "sleep:4:1"), capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    (stored,) = out.glob(f"*/{RESULTS}")
    rank_0 = (stored.parent / "bench.log").read_text().splitlines()
    rank_1 = (stored.parent / "ranks" / "rank-1" / "bench.log").read_text().splitlines()
    warmed = _logged_at(next(line for line in rank_1 if "first call" in line))
    first = next(line for line in rank_0 if " iteration 0: " in line)
    seconds = float(re.search(r"iteration 0: ([0-9.]+) s", first).group(1))
    assert _logged_at(first) - timedelta(seconds=seconds) >= warmed - timedelta(milliseconds=50)


#: the real models of docs/multigpu.md and the tiny ones its commands run with here
TINY = {
    "black-forest-labs/FLUX.1-dev": "tiny-flux",
    "FLUX.1-dev": "tiny-flux",
    "stabilityai/stable-diffusion-xl-base-1.0": "tiny-sdxl",
}


def _documented_commands() -> list[list[str]]:
    """Every diffmeter command in docs/multigpu.md's code blocks, the model swapped for its tiny one."""
    import shlex
    from pathlib import Path

    text = (Path(__file__).parents[1] / "docs" / "multigpu.md").read_text()
    blocks = re.findall(r"```\n(.*?)```", text, flags=re.S)
    commands = []
    for line in (line for block in blocks for line in block.splitlines()):
        words = shlex.split(line.removeprefix("$ "), comments=True)
        if words[:1] == ["diffmeter"]:
            commands.append([TINY.get(word, word) for word in words])
    return commands


@pytest.mark.slow
def test_every_command_of_the_multigpu_guide_runs_on_this_cpu(tmp_path):
    """No --device: the ranks find no CUDA and run on the CPU over gloo, each command as written."""
    commands = _documented_commands()
    assert len(commands) == 11 and all(command[2].startswith(("tiny-", "runs/")) for command in commands)
    for command in commands:
        done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, (command, done.stderr)
        assert "Traceback" not in done.stderr
    stored = [read_result(path.parent) for path in tmp_path.rglob(RESULTS)]
    assert len(stored) == 9 and all(result.status == "complete" for result in stored)
    assert sorted(result.parallel.world_size for result in stored if result.parallel) == [2, 2, 2, 2, 2, 2, 4]


def _schema_differences(one, other, where: str = "") -> list[str]:
    """Where two stored results differ in shape: a field one has and the other lacks, or values of different
    types where both hold one (a field left null by one kind of run, e.g. ``parallel``, is not a difference)."""
    if one is None or other is None:
        return []
    if isinstance(one, dict) and isinstance(other, dict):
        differences = [f"{where}.{key}" for key in sorted(set(one) ^ set(other))]
        for key in sorted(set(one) & set(other)):
            differences += _schema_differences(one[key], other[key], f"{where}.{key}")
        return differences
    if isinstance(one, list) and isinstance(other, list):
        return _schema_differences(one[0], other[0], f"{where}[0]") if one and other else []
    numbers = (int, float)
    if isinstance(one, numbers) and isinstance(other, numbers) and not isinstance(one, bool | str):
        return []  # 1.0 is stored as 1
    return [] if type(one) is type(other) else [f"{where}: {type(one).__name__} vs {type(other).__name__}"]


@pytest.mark.slow
def test_a_parallel_run_a_one_process_run_and_a_sweep_cell_store_the_same_schema(tmp_path):
    from diffmeter.sweep.file import SweepFile
    from diffmeter.sweep.local import LocalExecutor
    from diffmeter.sweep.run import run_sweep

    settings = {"model": "tiny-flux", "device": "cpu", "warmup": 1, "iterations": 2}
    _, one = bench(BenchSpec(**settings), out=tmp_path / "one")
    _, parallel = bench(BenchSpec(**settings, data_parallel=2), out=tmp_path / "two")
    fixed = {key: value for key, value in settings.items() if key != "model"}
    sweep = SweepFile(name="cell", axes={"model": ["tiny-flux"]}, fixed=fixed)
    run_sweep(sweep, tmp_path / "sweep", LocalExecutor(tmp_path / "sweep", slots=[None], timeout_s=300))
    (cell,) = [path.parent for path in (tmp_path / "sweep").rglob(RESULTS)]
    stored = {name: json.loads((folder / RESULTS).read_text()) for name, folder in
              (("one", one), ("parallel", parallel), ("cell", cell))}  # fmt: skip
    assert stored["parallel"]["parallel"] is not None and stored["one"]["parallel"] is None
    assert _schema_differences(stored["one"], stored["parallel"]) == []
    assert _schema_differences(stored["one"], stored["cell"]) == []
    assert set(stored["one"]) == set(stored["parallel"]) == set(stored["cell"])
    assert _schema_differences({"a": 1, "b": [1]}, {"a": "1"}) == [".b", ".a: int vs str"]  # the check can fail
