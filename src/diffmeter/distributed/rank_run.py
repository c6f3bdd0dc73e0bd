"""One process of a parallel run: the one measured-run lifecycle (``runs.lifecycle``), placed on this rank's
device, with this rank's :class:`~diffmeter.distributed.group.RankGroup` as its group.

Ranks are laid out on a (data, ring, ulysses, tp) mesh: ranks of one data-parallel index form a
model-parallel (context- or tensor-parallel) group that generates the same images together; each
data-parallel index takes every ``data_parallel``-th batch of the workload. Rank 0 owns the run
folder; the leader of each group saves its images there, the other ranks save theirs under
``ranks/rank-N/`` only to check they are the same pixels, and keep their log there.
"""

from __future__ import annotations

from pathlib import Path

from diffmeter.distributed.group import RankFailed, RankGroup, first_line
from diffmeter.distributed.place import Place
from diffmeter.errors import DiffmeterError
from diffmeter.runs.lifecycle import MeasuredRun
from diffmeter.runs.spec import BenchSpec


def run(spec: BenchSpec, out: str | Path, force: bool, launcher: str, failures: str | None = None) -> Path | None:
    """This rank's part of ``spec``; rank 0 returns the run folder it wrote, the others None. A rank that
    fails writes why under ``failures`` (the launcher's) and ends its process; the launcher stops the rest."""
    place = Place.from_environment(spec)
    if place.world != spec.world_size:
        raise DiffmeterError(
            f"this launch has {place.world} processes but the degrees (ulysses x ring x tp x data parallel) need "
            f"{spec.world_size}; match --nproc-per-node to them"
        )
    group = RankGroup(place, Path(out), launcher, Path(failures) if failures else None)
    try:
        stored = MeasuredRun(spec, out, force, place=place.placement, group=group).run()
    except RankFailed:
        raise
    except Exception as error:
        group.abandon(first_line(error))  # raises RankFailed
    finally:
        group.leave()
    return None if stored is None else stored[1]
