"""Which memory settings a generation can run with on a GPU: those whose predicted peak fits, less those bench
refuses before loading (the same checks), each with its predicted lower bound of time (``cli/fit.py``,
``runs/leaderboard.py``)."""

from __future__ import annotations

import re

from diffmeter.errors import DiffmeterError
from diffmeter.predict.fit_formats import NEEDS_FP8, label
from diffmeter.predict.technique_names import format_parts


def runnable(fits, entry, spec, device: str = "cuda"):
    """(the settings bench runs on ``device``, a CUDA GPU or this CPU, [(setting, why bench refuses it)]): the same
    checks bench makes before loading anything (``optimize.registry.check``: offloading and CUDA-only formats refused
    on a CPU); a missing package is kept, since installing it is the user's choice. Remembered on disk with the
    prediction (a check may import a component's class: seconds)."""
    from diffmeter import cache

    key = {
        "entry": entry.model_dump(mode="json"),
        "dtype": spec.dtype,
        "steps": spec.steps,
        "settings": [list(chosen) for chosen, _ in fits],
        **({} if device == "cuda" else {"device": device}),  # CUDA's answers as stored before devices were asked
    }
    stored = cache.load("runnable", key)
    if stored is None:
        settings = [chosen for chosen, _ in fits]
        stored = [[list(chosen), why] for chosen, why in refusals(settings, entry, spec, device)]
        cache.store("runnable", key, stored)
    refused = [(tuple(chosen), why) for chosen, why in stored]
    said = {chosen for chosen, _ in refused}
    return [(chosen, peak) for chosen, peak in fits if tuple(chosen) not in said], refused


def refusals(settings, entry, spec, device: str = "cuda") -> list[tuple[tuple[str, ...], str]]:
    """A GGUF format is checked without its file (the download the user picks: ``diffmeter models MODEL`` lists the
    published ones); bench checks the file's tensor type when it runs."""
    import torch

    from diffmeter.errors import MissingPackage
    from diffmeter.families import get_family
    from diffmeter.optimize import registry
    from diffmeter.optimize.base import Target
    from diffmeter.optimize.options import memory_setting_specs
    from diffmeter.quiet import quiet_import

    target = Target(entry, get_family(entry.family), torch.device(device), spec.dtype, spec.steps)
    refused = []
    with quiet_import():  # a backend's check imports it: SDNQ and bitsandbytes say which kernels they lack
        for chosen in settings:
            checked = tuple(t for t in chosen if not t.startswith("quantize-gguf-"))
            files = [t for t in chosen if t.startswith("quantize-gguf-")]
            try:
                for gguf in registry.build(memory_setting_specs(tuple(files))):  # a file per run: one component
                    if len(named := gguf.components(target)) != 1:
                        raise DiffmeterError(
                            f"a GGUF file holds one component's weights, and {entry.name} has {len(named)} denoisers "
                            f"({', '.join(named)}), while bench takes one --weights file"
                        )
                registry.check(registry.build(memory_setting_specs(checked)), target)
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


def lower_times(time, prediction, gpu, settings, formats: dict | None = None) -> dict[tuple[str, ...], float]:
    """Each setting's lower bound of seconds per generation on ``gpu``, from the plain pipeline's ``time``
    (``plain_time``; none without it, or without the GPU's host link for an offloading setting), or from its
    formats' (``formats``: ``format_times``) where their time is modelled."""
    from diffmeter.predict.offload_time import lower_s, moved_bytes

    if time is None:
        return {}
    formats = formats or {}
    return {
        chosen: lower_s(base_time(time, chosen, formats).lower_s, prediction, chosen, gpu.host_link_bytes_per_s)
        for chosen in settings
        if gpu.host_link_bytes_per_s or not moved_bytes(prediction, chosen)
    }


def quantized_of(chosen: tuple[str, ...]) -> tuple[str, ...]:
    """A setting's quantized formats (on the denoisers, on the text encoders), as ``format_times`` keys them."""
    return tuple(t for t in chosen if t.startswith("quantize-"))


def base_time(time, chosen: tuple[str, ...], formats: dict):
    """The time a setting's compute is predicted from: its formats' where modelled, else the plain pipeline's."""
    return formats.get(quantized_of(chosen), time)


def format_times(work, prediction, spec, gpu, tf32: bool, settings) -> dict:
    """The formats of each setting among ``settings`` whose time is modelled (``predict.quantized_time``), as
    ``profile --gpu --quantize`` predicts them: the plain pipeline's work with each named component's quantized layers
    as the backend runs them (``TimePrediction`` per ``quantized_of`` tuple; none without the GPU's figures).
    Remembered on disk (a meta build each)."""
    from diffmeter import cache
    from diffmeter.predict.cached import cache_key
    from diffmeter.predict.schema import TimePrediction

    wanted = {quantized_of(chosen) for chosen in settings} - {()}
    found = {}
    for names in sorted(n for n in wanted if not any(why_untimed_format(t) for t in n)):
        key = {"spec": cache_key(spec), "gpu": gpu.model_dump(mode="json"), "tf32": tf32, "formats": list(names)}
        stored = cache.load("fit-format-time", key)
        if stored is None:
            from diffmeter.predict.quantized_memory import Format
            from diffmeter.predict.quantized_work import quantized_work

            time = plain_time(quantized_work(work, spec, list(map(Format.named, names))), prediction, gpu, tf32=tf32)
            stored = {"time": time.model_dump(mode="json") if time else None}
            cache.store("fit-format-time", key, stored)
        if stored["time"] is not None:
            found[names] = TimePrediction.model_validate(stored["time"])
    return found


def why_untimed_format(name: str) -> str | None:
    """Why a quantization technique's time is not modelled (None: it is); the legacy torchao-after-loading names
    are not."""
    from diffmeter.predict.quantized_modelled import why_not_modelled

    if name in ("quantize-int8", "quantize-fp8"):
        return "torchao applied after loading is not timed"
    return why_not_modelled(*format_parts(name)[:2])


def time_note(chosen: tuple[str, ...], timed: dict) -> str | None:
    """Why a setting's time is the unquantized pipeline's: a format's time is not modelled, or the GPU lacks a figure
    (``timed``: ``format_times``' answer); None where the setting has no such quantization."""
    formats = quantized_of(chosen)
    if not formats or formats in timed:
        return None
    untimed = [t for t in formats if why_untimed_format(t)] or formats
    legacy = ("quantize-int8", "quantize-fp8")
    return "; ".join(
        f"{t if t in legacy else label(t)} not timed ({why_untimed_format(t) or 'no time for this GPU'})"
        for t in untimed
    )


def quality_costs(settings) -> dict[tuple[str, ...], str]:
    """Each setting's image quality cost: "lossless" where every technique is (its ``lossless``), else "not
    measured" (no measured quality figure of a quantized format is in the repository: bench --compare-baseline
    measures PSNR and SSIM against the unquantized images). Remembered on disk (the techniques' classes import torch
    and diffusers: seconds)."""
    from diffmeter import cache

    key = {"settings": sorted(list(chosen) for chosen in settings)}
    stored = cache.load("quality", key)
    if stored is None:
        from diffmeter.optimize import registry
        from diffmeter.optimize.options import memory_setting_specs

        lossless = {t: registry.build(memory_setting_specs((t,)))[0].lossless for c in settings for t in c}
        stored = [[list(c), "lossless" if all(lossless[t] for t in c) else "not measured"] for c in settings]
        cache.store("quality", key, stored)
    return {tuple(chosen): cost for chosen, cost in stored}


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
        fp8_only = {"quantize-fp8", *NEEDS_FP8}
        return min(((c, peak) for c, peak in every if with_fp8 or not fp8_only & set(c)), key=lambda row: row[1])

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
        f"{gib(peak + CUDA_HOLDBACK_BYTES)} of GPU memory with the runtime's share (CUDA's, measured on an H200); "
        f"{' or '.join(lower)} lowers it; "
        f"{larger}."
    )


def whose_fit(said: str) -> str:
    """Whose fit a prediction's calibration line ``said`` names, to keep beside its held-out figure once the rest is
    cut: " (ada GPUs' fit)", " (ampere GPUs' fit, borrowed for turing (T4) from ampere)", or "" (a CPU's)."""
    fitted = re.search(r"published eager runs on (\w+) GPUs", said)
    lent = re.search(r"borrowed for .+? from \w+", said)
    if not fitted:
        return ""
    return f" ({fitted[1]} GPUs' fit{', ' + lent[0] if lent else ''})"


def held_out_claims(plain, ranged: list[tuple[str, ...]]) -> list[str]:
    """The held-out figure of every expected range ``fit`` shows, as ``profile --gpu`` prints each beside its time:
    the eager calibration's, and each technique's in the settings ``ranged`` (those shown with a range)."""
    from diffmeter.predict.cache_time import HELD_OUT as CACHED
    from diffmeter.predict.offload_time import rates
    from diffmeter.predict.quantized_modelled import held_out_claim
    from diffmeter.predict.timed_techniques import HELD_OUT as TECHNIQUES

    said = plain.calibration
    claims = [f"the eager range{whose_fit(said)}: {said[said.find('held out') :] if 'held out' in said else said}"]
    used = {technique for chosen in ranged for technique in chosen}
    if used & {"compile", "compile-reduce-overhead"}:
        claims.append(f"compile: {TECHNIQUES}")
    if "first-block-cache" in used:
        claims.append(f"first-block-cache: {CACHED}")
    named = {format_parts(t)[:2] for t in used if t.startswith("quantize-")}
    if formats := sorted(f"{backend}:{kind}" for backend, kind in named if kind):  # not the legacy int8/fp8
        claims.append(held_out_claim(formats))
    claims += [f"{mode}: {rates()[mode]['calibration']}" for mode in sorted(used & set(rates()))]
    return claims
