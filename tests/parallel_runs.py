"""What the parallel-run tests share: a CPU spec, the images of a run compared with another's, and the
environment of a run with a fault planted in one rank (tests/rank_faults/sitecustomize.py)."""

import os

from diffmeter.measure.quality import compare
from diffmeter.runs.spec import BenchSpec


def cpu_spec(model: str = "tiny-flux", **settings) -> BenchSpec:
    return BenchSpec(**{"model": model, "device": "cpu", "warmup": 1, "iterations": 2, **settings})


def images_of(result) -> dict:
    return {image.seed: result.folder / image.path for image in result.images}


def assert_same_images(result, reference) -> None:
    mine, theirs = images_of(result), images_of(reference)
    assert mine.keys() == theirs.keys()
    for seed, path in mine.items():
        quality = compare(path, theirs[seed], seed)
        assert quality.identical or quality.psnr_db > 60, (seed, quality)


def with_a_rank_fault(rank: int, fault: str) -> dict:
    """The environment of a CLI run whose rank ``rank`` carries ``fault`` (tests/rank_faults/sitecustomize.py)."""
    here = os.path.join(os.path.dirname(__file__), "rank_faults")
    path = os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "PYTHONPATH": path, "RANK_FAULT": fault, "RANK_FAULT_RANK": str(rank)}
