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


def why_untimed(plain, gpu, work, tf32: bool, named: bool) -> str:
    """Why a setting has no time: no GPU named (``fit --memory`` alone), the figure the GPU lacks for the plain
    pipeline (``plain``: ``plain_time``'s answer), else the host link offloading's transfers go over."""
    from diffmeter.predict.roofline import bench_fp32_math, missing_figures

    if not named:
        return "no GPU named, only its memory: name the card with --gpu, or give its figures with --gpu-spec"
    if plain is None:
        return missing_figures(gpu, work, bench_fp32_math(tf32))
    if gpu.given:
        return (
            "offloading's weight transfers are not timed: --gpu-spec gives no host link; add link=64GB/s (its rate"
            " per direction)"
        )
    return f"offloading's weight transfers are not timed: data/host_links.json has no host link for the {gpu.name}"


def next_step(prediction, entry, spec, fp8: bool, cards: list) -> str:
    """What to do when no setting fits: the least peak any setting bench runs reaches (``fp8``:
    with fp8 weights), what lowers it (a smaller batch, fewer frames, a smaller size) and the smallest card of the
    ``cards`` (the table's GPUs) it fits on once the CUDA context is held back. ``spec``: the generation with its
    defaults filled."""
    from diffmeter.predict.devices import CUDA_HOLDBACK_BYTES
    from diffmeter.predict.techniques import peak_under, settings
    from diffmeter.units import gib

    every, _ = runnable([(chosen, peak_under(prediction, chosen)) for chosen in settings(prediction)], entry, spec)

    def least(with_fp8: bool) -> tuple[tuple[str, ...], int]:
        return min(((c, peak) for c, peak in every if with_fp8 or "quantize-fp8" not in c), key=lambda row: row[1])

    chosen, peak = least(fp8)
    cards = sorted(cards, key=lambda card: card.memory_bytes)
    card = next((c for c in cards if least("fp8" in c.tflops)[1] <= c.memory_bytes - CUDA_HOLDBACK_BYTES), None)
    lower = [f"a smaller batch (--batch-size, {spec.batch_size} now)"] if spec.batch_size > 1 else []
    lower += [f"fewer frames (--num-frames, {spec.num_frames} now)"] if spec.num_frames else []
    lower.append(f"a smaller size (--height/--width, {spec.width}x{spec.height} px now)")
    larger = (
        f"the smallest card of the table it fits is the {card.name} ({gib(card.memory_bytes)})"
        if card
        else "no card of the table holds it"
    )
    return (
        f"Nothing fits: the least any setting reaches is {gib(peak)} ({' + '.join(chosen) or 'as is'}), "
        f"{gib(peak + CUDA_HOLDBACK_BYTES)} of GPU memory with CUDA's share; {' or '.join(lower)} lowers it; "
        f"{larger}."
    )
