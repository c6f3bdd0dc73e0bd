"""Each rank of a parallel run on its own fake GPU (tests/fake_cuda), its collectives faked: data-parallel ranks
0 and 1, a context-parallel rank up to its first collective, a tensor-parallel rank's denoiser sharded from the
CPU; and the launcher, which asks no GPU about memory. The sharding itself needs real collectives
(tests/test_multigpu.py)."""

from __future__ import annotations

import contextlib
import shutil
from pathlib import Path
from unittest import mock

import pytest
import torch
from fake_cuda import LEDGER, FakeCuda, unavailable_reason

from diffmeter.distributed.group import RankFailed
from diffmeter.errors import DiffmeterError
from diffmeter.runs.results import BenchResult
from diffmeter.runs.spec import BenchSpec

REASON = unavailable_reason()
pytestmark = [pytest.mark.fake_cuda, pytest.mark.skipif(REASON is not None, reason=REASON or "")]


@contextlib.contextmanager
def rank_environment(rank: int, world: int, monkeypatch, staging: Path, reached=None, others=None):
    """This process as rank ``rank`` of ``world`` under torchrun, with the collectives faked: the group is
    joined (or ``reached`` raised there), rank 0's staging folder broadcast (``staging``: the folder a rank
    other than 0 receives), and what this rank sends to the gather kept in the list it yields. On rank 0 the
    gather delivers each rank's own object in rank order, as ``gather_object`` does: ``others`` maps each
    other rank to (what it sent, the staging folder it wrote its images into, which were written into rank 0's
    folder on a shared disk, so they are copied there)."""
    import torch.distributed as dist

    for name, value in {"RANK": rank, "WORLD_SIZE": world, "LOCAL_RANK": rank, "LOCAL_WORLD_SIZE": world}.items():
        monkeypatch.setenv(name, str(value))
    gathered, opened = [], []

    def join(*args, **kwargs):
        if reached is not None:
            raise reached

    def broadcast(objects, src=0):
        if objects[0] is None:  # rank 0 sends its staging folder; the others receive it
            objects[0] = str(staging)
        opened.append(Path(objects[0]))

    def gather(obj, object_gather_list=None, dst=0, **kwargs):
        gathered.append(obj)
        if object_gather_list is None:  # a rank other than dst only sends
            return
        sent = {rank: obj} | {other: payload for other, (payload, _) in (others or {}).items()}
        missing = sorted(set(range(world)) - set(sent))
        if missing:
            raise AssertionError(f"the fake gather got nothing from rank(s) {missing}: pass their results as others")
        object_gather_list[:] = [sent[index] for index in range(world)]
        for _, written in (others or {}).values():
            shutil.copytree(written / "images", opened[0] / "images", dirs_exist_ok=True)

    with contextlib.ExitStack() as stack:
        for name, fake in {
            "init_process_group": join,
            "destroy_process_group": lambda: None,
            "broadcast_object_list": broadcast,
            "gather_object": gather,
            "barrier": lambda *args, **kwargs: None,
        }.items():
            stack.enter_context(mock.patch.object(dist, name, fake))
        stack.enter_context(mock.patch.object(dist.device_mesh, "init_device_mesh"))
        yield gathered


class ReachedTheGroup(Exception):
    """Raised where a rank joins its process group: everything before it ran on the fake."""


@pytest.mark.parametrize("device", [None, "cuda"])
def test_a_data_parallel_rank_runs_whole_on_its_own_gpu(tmp_path, monkeypatch, device):
    """Rank 1 of a 2-way data-parallel run, the spec naming no device or index-less "cuda" (docs/multigpu.md's
    first command): placed on cuda:1 before any CUDA call (its memory check reads GPU 1), measured there."""
    from diffmeter.distributed import rank_run

    staging = tmp_path / "staging"
    spec = BenchSpec(model="tiny-flux", device=device, data_parallel=2, steps=2, iterations=1, predict=False)
    with rank_environment(1, 2, monkeypatch, staging) as gathered, FakeCuda(own="cuda:1") as cuda:
        assert rank_run.run(spec, tmp_path, False, "torchrun") is None
    assert not cuda.violations
    assert cuda.calls[0].name == "set_device" and cuda.calls[0].device == 1
    assert ("mem_get_info", 1) in {(call.name, call.device) for call in cuda.calls}
    result = BenchResult.model_validate_json(gathered[0][0])
    assert result.status == "complete" and result.spec.device == "cuda:1"
    assert result.summary.energy.gpu_indices == [1]
    assert [path.name for path in (staging / "images").iterdir()]  # data-parallel index 1 leads its group
    LEDGER.append(("rank 1 of data parallel 2", "covered (collectives faked)"))


def test_rank_0_of_a_data_parallel_run_merges_every_ranks_own_result(tmp_path, monkeypatch):
    """Rank 1 runs on cuda:1 first; rank 0 then runs on cuda:0 and gathers its own result beside rank 1's real one
    (as ``gather_object`` delivers them): it places itself first, measures, merges and commits a run folder whose
    result names both GPUs, their energy and both ranks' images."""
    from diffmeter.distributed import rank_run
    from diffmeter.runs.storage import read_result

    spec = BenchSpec(model="tiny-flux", data_parallel=2, steps=2, iterations=1, predict=False)
    shared = tmp_path / "rank-1-staging"
    with rank_environment(1, 2, monkeypatch, shared) as sent, FakeCuda(own="cuda:1"):
        assert rank_run.run(spec, tmp_path / "rank-1-out", False, "torchrun") is None
    others = {1: (sent[0], shared)}
    with (
        rank_environment(0, 2, monkeypatch, tmp_path / "unused", others=others) as gathered,
        FakeCuda(own="cuda:0") as cuda,
    ):
        folder = rank_run.run(spec, tmp_path, False, "torchrun")
    assert not cuda.violations and cuda.calls[0] == type(cuda.calls[0])("set_device", 0, True)
    assert {call.device for call in cuda.calls if call.name == "Event.record"} == {0}
    stored = read_result(folder)
    assert stored.status == "complete" and stored.parallel.world_size == 2 and stored.parallel.data_parallel == 2
    assert [rank.device for rank in stored.parallel.ranks] == ["cuda:0", "cuda:1"]
    assert stored.summary.energy.gpu_indices == [0, 1]  # GPU energy summed over both ranks' GPUs
    assert len(stored.images) == 2 and all((folder / image.path).exists() for image in stored.images)
    assert len({image.seed for image in stored.images}) == 2  # each rank generated its own share
    assert len(gathered) == 1 and not (tmp_path / "unused").exists()
    LEDGER.append(("rank 0 of data parallel 2", "covered (collectives faked): measured, merged and stored"))


def test_a_context_parallel_rank_places_itself_before_any_cuda_call(tmp_path, monkeypatch):
    """Rank 1 of Ulysses 2 up to its first collective: set_device(1) is its first CUDA call, and nothing
    before the group is joined touches another GPU (every rank once checked GPU 0's memory)."""
    from diffmeter.distributed import rank_run

    spec = BenchSpec(model="tiny-flux", ulysses_degree=2, steps=2, iterations=1, predict=False)
    with rank_environment(1, 2, monkeypatch, tmp_path, reached=ReachedTheGroup()), FakeCuda(own="cuda:1") as cuda:
        with pytest.raises(RankFailed, match="rank 1: ReachedTheGroup"):  # under torchrun: the rank ends, says why
            rank_run.run(spec, tmp_path, False, "torchrun")
    assert not cuda.violations
    assert cuda.calls[0] == type(cuda.calls[0])("set_device", 1, True)
    assert ("mem_get_info", 1) in {(call.name, call.device) for call in cuda.calls}
    LEDGER.append(("rank 1 of Ulysses 2", "covered up to its first collective"))


def test_a_tensor_parallel_rank_never_holds_its_whole_denoiser_on_its_gpu(tmp_path, monkeypatch):
    """Rank 1 of tensor parallel 2 (collectives faked): its denoiser loads on the CPU and is still wholly there when
    the shard is taken (``distribute_tensor`` then moves one parameter at a time and keeps the rank's slice), while
    the other components are on its GPU; the sharding itself needs real collectives (tests/test_multigpu.py)."""
    from diffmeter.distributed import context_parallel, rank_run

    seen = {}

    def shard(model, mesh, device):
        seen["denoiser on"] = {str(parameter.device) for parameter in model.parameters()}
        seen["device"] = device

    spec = BenchSpec(model="tiny-flux", tp_degree=2, steps=2, iterations=1, predict=False)
    with (
        rank_environment(1, 2, monkeypatch, tmp_path / "staging") as gathered,
        FakeCuda(own="cuda:1") as cuda,
        mock.patch.object(context_parallel, "enable_tensor_parallel", shard),
    ):
        assert rank_run.run(spec, tmp_path, False, "torchrun") is None
    assert not cuda.violations and cuda.calls[0] == type(cuda.calls[0])("set_device", 1, True)
    assert seen == {"denoiser on": {"cpu"}, "device": torch.device("cuda:1")}
    result = BenchResult.model_validate_json(gathered[0][0])
    assert result.status == "complete" and result.spec.device == "cuda:1"
    assert gathered[0][1]["parameter_bytes"] > 0  # what it holds, handed to rank 0 for the group's record
    LEDGER.append(
        ("rank 1 of tensor parallel 2", "covered (collectives faked): denoiser loaded on the CPU, sharded from there")
    )


def test_the_launcher_asks_no_gpu_about_memory(tmp_path, monkeypatch):
    """The process starting the ranks checks everything it can, but not memory: that would open a context on
    GPU 0 for the whole run; each rank checks its own GPU."""
    from diffmeter.distributed import launch

    monkeypatch.delenv("RANK", raising=False)
    spec = BenchSpec(model="tiny-flux", ulysses_degree=2, steps=2, iterations=1)
    with FakeCuda(own="cuda:1") as cuda, mock.patch.object(launch, "_launch", side_effect=ReachedTheGroup()):
        with pytest.raises(DiffmeterError, match="the parallel launch failed"):  # stored as a failed result
            launch.bench_parallel(spec, tmp_path)
    assert not cuda.violations
    assert {call.name for call in cuda.calls} <= {"get_device_name", "get_device_properties"}
    LEDGER.append(("the parallel launcher", "covered"))
