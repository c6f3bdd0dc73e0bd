"""What the sweep tests share (tests/test_sweep.py, test_sweep_resume.py): the fast cell settings, the stored runs
read back, and an executor benching cells in this process."""

import json
from pathlib import Path

from diffmeter.errors import DiffmeterError
from diffmeter.runs.storage import RESULTS

#: every cell: the tiny SD pipeline, one measured call of one step on CPU
FAST = {"steps": 1, "iterations": 1, "device": "cpu", "save_images": False}


def stored(out: Path) -> dict[str, dict]:
    """Run folder name -> its results.json, for every stored run."""
    return {path.parent.name: json.loads(path.read_text()) for path in out.glob(f"*/{RESULTS}")}


class InProcessExecutor:
    """Runs cells with diffmeter's own runner in this process (no process of their own to start), each job's name
    kept in order, failing every batch above ``fits`` with CUDA's out-of-memory error: the batch search stops on
    it; a real OOM cannot happen on this CPU."""

    def __init__(self, out: Path, fits: int = 2**30) -> None:
        self.out, self.fits, self.batches, self.ran = out, fits, [], []

    def describe(self) -> str:
        return "in-process test executor"

    def map(self, jobs, started, finished):
        import torch

        from diffmeter.runs.lifecycle import bench
        from diffmeter.sweep.local import Outcome

        for job in jobs:
            started(job)
            self.batches.append(job.spec.batch_size)
            self.ran.append(job.name)

            def exhaust(what, done, total, batch=job.spec.batch_size):
                if what == "measuring" and batch > self.fits:
                    raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 8.00 GiB")

            try:
                bench(job.spec, out=self.out, force=True, progress=exhaust)
            except DiffmeterError:
                pass
            finished(job, Outcome(0, "", 0.0))
