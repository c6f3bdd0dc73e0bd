"""Which memory settings a generation can run with on a GPU: those whose predicted peak fits, less those bench
refuses before loading (the same checks), each with its predicted lower bound of time (``cli/fit.py``,
``runs/leaderboard.py``)."""

from __future__ import annotations

from diffmeter.errors import DiffmeterError


def runnable(fits, entry, spec):
    """(the settings bench runs on a CUDA GPU, [(setting, why bench refuses it)]): the same checks bench makes
    before loading anything (``optimize.registry.check``); a missing package is kept, since installing it is the
    user's choice. Remembered on disk with the prediction (a check may import a component's class: seconds)."""
    from diffmeter import cache

    key = {
        "entry": entry.model_dump(mode="json"),
        "dtype": spec.dtype,
        "steps": spec.steps,
        "settings": [list(chosen) for chosen, _ in fits],
    }
    stored = cache.load("runnable", key)
    if stored is None:
        stored = [[list(chosen), why] for chosen, why in refusals([chosen for chosen, _ in fits], entry, spec)]
        cache.store("runnable", key, stored)
    refused = [(tuple(chosen), why) for chosen, why in stored]
    said = {chosen for chosen, _ in refused}
    return [(chosen, peak) for chosen, peak in fits if tuple(chosen) not in said], refused


def refusals(settings, entry, spec) -> list[tuple[tuple[str, ...], str]]:
    import torch

    from diffmeter.errors import MissingPackage
    from diffmeter.families import get_family
    from diffmeter.optimize import registry
    from diffmeter.optimize.base import Target
    from diffmeter.optimize.options import memory_setting_specs

    target = Target(entry, get_family(entry.family), torch.device("cuda"), spec.dtype, spec.steps)
    refused = []
    for chosen in settings:
        try:
            registry.check(registry.build(memory_setting_specs(chosen)), target)
        except MissingPackage:
            pass
        except DiffmeterError as error:
            refused.append((tuple(chosen), str(error)))
    return refused


def plain_time(work, prediction, gpu, outputs: int = 1, tf32: bool = True):
    """The plain pipeline's predicted time on ``gpu`` (``roofline.TimePrediction``), float32 matmuls and convolutions
    on TF32 or not as bench's ``--tf32``; None without the GPU's figures for the dtype."""
    from diffmeter.predict.roofline import bench_fp32_math, missing_figures, predict_time

    fp32_math = bench_fp32_math(tf32)
    if missing_figures(gpu, work, fp32_math):
        return None
    return predict_time(work, gpu, weights=prediction.weight_read_bytes, outputs=outputs, fp32_math=fp32_math)


def lower_times(time, prediction, gpu, settings) -> dict[tuple[str, ...], float]:
    """Each setting's lower bound of seconds per generation on ``gpu``, from the plain pipeline's ``time``
    (``plain_time``; none without it, or without the GPU's host link for an offloading setting)."""
    from diffmeter.predict.offload_time import lower_s, moved_bytes

    if time is None:
        return {}
    return {
        chosen: lower_s(time.lower_s, prediction, chosen, gpu.host_link_bytes_per_s)
        for chosen in settings
        if gpu.host_link_bytes_per_s or not moved_bytes(prediction, chosen)
    }
