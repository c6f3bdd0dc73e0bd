"""A published multi-GPU run (benchmarks/published_parallel.yaml) as `diffmeter profile MODEL --gpu GPU --json` with
its degrees predicts it, counted once and timed under any eager calibration: the shipped one (what `profile` prints)
or one refitted without a source (``without``: its held-out test). Shared by benchmarks/calibrate_parallel.py."""

from __future__ import annotations

from math import prod

from diffmeter.distributed.group_prediction import RankSplit
from diffmeter.predict.calibration import Calibration
from diffmeter.predict.fit_published import Fit, PublishedRun, as_calibration
from diffmeter.predict.gpu_spec import chosen_gpu
from diffmeter.predict.operators import predict_memory_and_work
from diffmeter.predict.roofline import bench_fp32_math, predict_time
from diffmeter.predict.techniques import peak_under
from diffmeter.spec import ProfileSpec

#: a run's degrees, as the yaml names them (1 when absent), in ``RankSplit``'s order
DEGREES = ("ulysses", "ring", "cfg", "tp")


def base(time: dict, group: dict | None) -> dict:
    """What a run's prediction (``time`` and ``group``: `profile --json`'s "time" and "parallel") is without its
    communication: the denoising stage's GPU, host and lower bound, the whole generation's range, and the
    communication's figures to price."""
    (stage,) = [s for s in time["stages"] if s["stage"] == "denoising"]
    reported = (group or {}).get("communication_s") or 0.0
    issued = (group or {}).get("communication_host_s") or 0.0
    gpu, host = stage["gpu_s"] or stage["expected_s"], stage["host_s"]
    return {
        "gpu": (gpu[0] - reported, gpu[1] - reported),
        "host": (host[0] - issued, host[1] - issued) if host else None,
        "lower": stage["lower_s"] - reported,
        "stage": tuple(stage["expected_s"]),
        "total": tuple(time["expected_s"]),
        "received": (group or {}).get("received_by_collective", {}),
        "calls": (group or {}).get("calls_by_collective", {}),
        "link": group["link"] if group and group.get("link") else None,
    }


class CountedRun:
    """One GPU of a published run's group as `profile --gpu` counts it (its memory and operator work, each denoiser
    call the rank's, counted over a fake process group), timed by ``figures`` under a calibration."""

    def __init__(self, run: dict) -> None:
        spec = ProfileSpec(model=run["model"], height=run["height"], width=run["width"], steps=run["steps"])
        self.device = chosen_gpu(run["gpu"], None)
        self.outputs = spec.batch_size
        one, work = predict_memory_and_work(spec, True, ())
        degrees = tuple(run.get(name, 1) for name in DEGREES)
        self.split = RankSplit(spec, degrees, on_cuda=True) if prod(degrees) > 1 else None
        self.memory, self.work = self.split.split(one, work) if self.split else (one, work)
        self.peaks = (peak_under(one, ()), peak_under(self.memory, ()))

    def figures(self, calibration: Calibration | None) -> dict:
        """``base``'s figures with the eager time from ``calibration`` (None: the shipped one, as `profile` times it:
        TF32 on, SDPA's own kernel) and the communication at the link's datasheet rate (removed again by ``base``)."""
        time = predict_time(self.work, self.device, calibration, weights=self.memory.weight_read_bytes,
                            outputs=self.outputs, fp32_math=bench_fp32_math(True))  # fmt: skip
        group = None
        if self.split:
            time, group, _ = self.split.communicate(time, self.device, self.peaks)
        return base(time.model_dump(mode="json"), group.model_dump(mode="json") if group else None)


def without(found: Fit, runs: list[PublishedRun], architecture: str, source: str) -> Calibration:
    """``architecture``'s eager calibration from ``found``, the fit of the published eager ``runs`` other than
    ``source``'s, as benchmarks/calibrate_published.py ships the fit on all of them (``as_calibration``)."""
    if architecture not in found.gpus:
        raise SystemExit(
            f"the eager fit without {source} has no {architecture} runs: its multi-GPU runs cannot be held out"
        )
    return as_calibration(found, architecture, f"the published eager runs but {source}'s", runs)
