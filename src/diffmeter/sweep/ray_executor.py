"""The Ray executor: each cell a Ray task asking for the GPUs it needs, so Ray places it; a task
on a node that is lost is retried elsewhere by Ray. The task runs the cell in its own process
on the node (as the local executor does) and sends the run folder back as bytes, so results
reach the driver's ``--out`` without a shared filesystem."""

from __future__ import annotations

import io
import os
import shutil
import socket
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from diffmeter.errors import DiffmeterError, MissingPackage
from diffmeter.runs import storage
from diffmeter.sweep.local import Job, LocalExecutor, Outcome

#: retries of a task whose node or worker process died (Ray's own retry of system failures)
NODE_RETRIES = 3


def _ray():
    _without_broken_amdsmi()
    try:
        import ray
    except ImportError:
        raise MissingPackage("--ray needs Ray, which is not installed: pip install 'diffmeter[ray]'") from None
    return ray


def _without_broken_amdsmi() -> dict[str, str]:
    """The environment variables Ray's processes need when amdsmi cannot be imported here (see
    ray_path/sitecustomize.py); applied to this process and to the processes it starts."""
    try:
        import amdsmi  # noqa: F401
    except ImportError:
        return {}
    except Exception:
        sys.modules["amdsmi"] = None
        shim = str(Path(__file__).parent / "ray_path")
        paths = [shim, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
        os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
        return {"PYTHONPATH": os.environ["PYTHONPATH"]}
    return {}


class RayExecutor:
    """Runs jobs as Ray tasks on the cluster at ``address`` ("auto": the running one, else a local instance)."""

    def __init__(self, out: Path, address: str = "auto", timeout_s: float | None = None, **init) -> None:
        ray = _ray()
        self.out, self.timeout_s = out, timeout_s
        if not ray.is_initialized():
            env = _without_broken_amdsmi()
            settings = dict(log_to_driver=False, runtime_env={"env_vars": env} if env else None, **init)
            try:
                ray.init(address=address, **settings)
            except ConnectionError:
                if address != "auto":
                    raise DiffmeterError(f"--ray {address}: no Ray cluster answers there; check the address") from None
                ray.init(include_dashboard=False, **settings)  # no cluster running: a local instance
        self._task = ray.remote(max_retries=NODE_RETRIES, retry_exceptions=False)(run_on_node)

    def describe(self) -> str:
        resources = _ray().cluster_resources()
        return f"Ray cluster ({int(resources.get('CPU', 0))} CPUs, {int(resources.get('GPU', 0))} GPUs)"

    def map(
        self, jobs: Iterable[Job], started: Callable[[Job], None], finished: Callable[[Job, Outcome], None]
    ) -> None:
        ray = _ray()
        pending = {}
        nodes = [node["Resources"] for node in ray.nodes() if node["Alive"]]
        node_cpus = max((int(node.get("CPU", 0)) for node in nodes), default=1)
        node_gpus = max((int(node.get("GPU", 0)) for node in nodes), default=0)
        jobs = list(jobs)
        if node_gpus == 0 and any(job.gpus for job in jobs):
            # refused before any runs: failed results for cells that never ran would stay in the study
            raise DiffmeterError(
                "cells of this sweep run on CUDA (its device, or the default where --ray names a cluster) and the Ray "
                "cluster has no GPU: set device: cpu in the sweep file, or add a node with GPUs"
            )
        for job in jobs:
            if job.gpus > node_gpus:  # Ray would wait for such a node for ever
                started(job)
                why = (
                    f"it needs {job.gpus} GPUs on one node and the Ray cluster's largest node has {node_gpus}: lower "
                    "the parallel degrees, or add a node with as many GPUs"
                )
                finished(job, Outcome(None, "", 0.0, "the Ray cluster", reason=why))
                continue
            stored = [name for name in job.reads if (self.out / name / storage.RESULTS).is_file()]
            reads = pack(self.out, stored) if stored else None
            # a CPU cell times on every core of its node (torch's threads, each rank's): it takes the node whole, no
            # other cell beside it, on the largest nodes (alike ones, its timings comparable); a GPU cell its GPUs
            cpus = 1 if job.gpus else node_cpus
            ref = self._task.options(num_gpus=job.gpus, num_cpus=cpus).remote(
                job.spec.model_dump_json(), job.name, reads, self.timeout_s, os.environ.get("OMP_NUM_THREADS")
            )
            pending[ref] = job
            started(job)
        try:
            while pending:
                done, _ = ray.wait(list(pending), num_returns=1)
                job = pending.pop(done[0])
                try:
                    outcome, folders = ray.get(done[0])
                except Exception as error:  # the task itself failed (not the cell): a crash outcome
                    why = f"its Ray task failed: {' '.join(str(error).split())[-2000:]}"
                    outcome, folders = Outcome(None, "", 0.0, "the Ray cluster", reason=why), None
                if folders:
                    unpack(folders, self.out, keep=set(job.reads))
                finished(job, outcome)
        except BaseException:
            for ref in pending:
                ray.cancel(ref, force=True)
            raise


def run_on_node(spec_json: str, name: str, reads: bytes | None, timeout_s: float | None, threads: str | None = None):
    """On a Ray worker: the cell in its own process in a scratch folder holding the stored runs it reads (its
    baseline, a parallel run's one-device run); returns (outcome, run folders as tar bytes). ``threads``: the
    driver's OMP_NUM_THREADS, which the cell gets in place of Ray's (Ray sets it to the task's CPUs, every rank of a
    parallel CPU cell then running that many threads on the node's cores, where a local sweep's ranks split them)."""
    from diffmeter.runs.spec import BenchSpec

    if threads is None:  # Ray's own (ray/_private/utils.py set_omp_num_threads_if_unset: the task's CPUs)
        os.environ.pop("OMP_NUM_THREADS", None)
    else:
        os.environ["OMP_NUM_THREADS"] = threads

    scratch = Path(tempfile.mkdtemp(prefix="diffmeter-cell-"))
    try:
        if reads:
            unpack(reads, scratch)
        executor = LocalExecutor(scratch, slots=[None], timeout_s=timeout_s)  # Ray already set CUDA_VISIBLE_DEVICES
        outcome = executor.run_cell(Job(BenchSpec.model_validate_json(spec_json), name), [None])
        outcome.where = f"{socket.gethostname()} (pid {os.getpid()})"
        folders = [path.name for path in scratch.iterdir() if path.is_dir() and not path.name.startswith(".")]
        return outcome, pack(scratch, folders) if folders else None
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def pack(root: Path, names: list[str]) -> bytes:
    """Run folders under ``root`` as one gzipped tar."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for name in names:
            if (root / name).is_dir():
                archive.add(root / name, arcname=name)
    return buffer.getvalue()


def unpack(data: bytes, out: Path, keep: set[str] = frozenset()) -> None:
    """Run folders into ``out``, each moved into place whole; folders named in ``keep`` that
    ``out`` already holds a result for stay as they are."""
    out.mkdir(parents=True, exist_ok=True)
    incoming = Path(tempfile.mkdtemp(prefix=".incoming-", dir=out))
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as archive:
            archive.extractall(incoming, filter="data")
        for folder in incoming.iterdir():
            final = out / folder.name
            if folder.name in keep and (final / storage.RESULTS).exists():
                continue
            previous = out / f".{folder.name}.replaced-{os.getpid()}-{time.monotonic_ns()}"
            if final.exists():
                final.rename(previous)
            folder.rename(final)
            shutil.rmtree(previous, ignore_errors=True)
    finally:
        shutil.rmtree(incoming, ignore_errors=True)
