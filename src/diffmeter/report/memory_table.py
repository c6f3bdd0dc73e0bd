"""The predicted peak memory of a generation: a row per stage, then the whole generation and
whether it fits the chosen GPU."""

from __future__ import annotations

from rich.markup import escape

from diffmeter.predict.devices import CUDA_HOLDBACK_BYTES, Device
from diffmeter.predict.fit_formats import NEEDS_FP8
from diffmeter.predict.memory_checks import TOLERANCE
from diffmeter.predict.schema import MemoryPrediction
from diffmeter.predict.techniques import borderline, short_of, stages_under, stored_params
from diffmeter.report.layout import Column, FittedTable
from diffmeter.units import figure, gib

#: the architectures of ``predict.devices.ARCHITECTURES`` whose cards run AMD's ROCm (HIP), which torch reaches as
#: "cuda": what is held back there is the ROCm runtime's, sized by CUDA's (``CUDA_HOLDBACK_BYTES``, an H200's)
ROCM_ARCHITECTURES = ("cdna3",)


def runtime(gpu: Device) -> str:
    """Whose context and libraries the held-back memory stands for on ``gpu``: CUDA's, or the ROCm runtime's."""
    return "the ROCm runtime" if gpu.architecture in ROCM_ARCHITECTURES else "CUDA"


def held_back_line(gpu: Device, held_back: int) -> str:
    """What ``held_back`` bytes are, with where the figure was measured."""
    if runtime(gpu) == "CUDA":
        context, measured = "the CUDA context and libraries", "measured on an H200"
    else:
        context = "the ROCm runtime's context and libraries"
        measured = "CUDA's, measured on an H200: ROCm's not measured"
    return f"Held back: {gib(held_back)} for {context} ({measured}, docs/memory-prediction.md)."


#: what a ``gguf:TYPE`` format's bytes are of: no file is read (profile and fit take none; bench reads its --weights)
GGUF_LINE = (
    "GGUF: each tensor at the type city96's tools give it in a file of this model (ComfyUI-GGUF's convert.py and "
    "lcpp.patch rules: some layers kept wider); a file made with other rules stores other bytes, which bench "
    "--weights FILE.gguf measures; `diffmeter models MODEL` lists the published files against this prediction."
)


def memory_table(
    prediction: MemoryPrediction,
    gpu: Device | None,
    techniques: tuple[str, ...] = (),
    fit_command: str = "",
    dtypes: str | None = None,
) -> FittedTable:
    """A row per stage, with every component loaded or as ``techniques`` (the names ``predict.techniques`` models
    them by) keep them; then the whole generation, the run without the techniques beside it, and whether it fits
    ``gpu``; ``fit_command``: the ``diffmeter fit`` line for this model and card, offered when it does not fit;
    ``dtypes``: the run's dtypes as the title names them (``report.tables.run_dtypes``: "bfloat16, vae float32"),
    the prediction's own dtype where not given."""

    named = ", ".join(_on_components(prediction, t) for t in techniques)
    loaded = f"under {named}" if named else "every component loaded"
    title = f"predicted peak memory ({dtypes or prediction.dtype}; {loaded})"
    table = FittedTable(
        escape(title),
        [
            Column("stage", justify="left"),
            Column("call", justify="left", drop=3),
            Column("parameters + buffers", drop=1),
            Column("carried", drop=2),
            Column("activations", drop=0),
            Column("peak"),
        ],
    )
    stages = stages_under(prediction, techniques) if techniques else prediction.stages
    for stage in stages:
        table.add_row(
            stage.stage,
            escape(f"{stage.component} (batch {stage.batch}{f', cast to {stage.cast_to}' if stage.cast_to else ''})"),
            gib(stage.resident_param_bytes),
            gib(stage.carried_bytes),
            gib(stage.activation_bytes),
            gib(stage.peak_bytes),
        )
    heaviest = max(stages, key=lambda stage: stage.peak_bytes)  # the first of equal peaks, as the prediction's
    peak = heaviest.peak_bytes
    table.add_row("whole generation", f"at {heaviest.stage}", "", "", "", gib(peak), section=True)
    if techniques:
        without = f"at {prediction.peak_stage}"
        table.add_row("without the techniques", without, "", "", "", gib(prediction.peak_bytes), style="dim")
    if gpu is not None and gpu.memory_bytes:
        held = CUDA_HOLDBACK_BYTES if gpu.kind == "cuda" else 0
        short = short_of(prediction, gpu, techniques)
        fits = short is None
        verdict = ("fits" if fits else "does not fit") + (
            f" (borderline: within {TOLERANCE:.0%} of the peak, the checked error)"
            if borderline(peak, gpu.memory_bytes - held)
            else ""
        )
        kept = f", {gib(held)} held back for {runtime(gpu)}" if held else ""
        table.add_row(
            escape(f"{gpu.name} ({gib(gpu.memory_bytes)}{kept})"),
            verdict,
            "",
            "",
            "",
            gib(gpu.memory_bytes - held - peak) + " left" if fits else gib(short) + " short",
            style=None if fits else "red",
        )
        if not fits:  # what would: offloading, quantization, VAE modes, each predicted
            command = fit_command or "diffmeter fit MODEL --gpu NAME"
            table.caption = f"does not fit: `{escape(command)}` lists the memory settings that do"
    elif gpu is not None:  # a card sold in several memory sizes (the V100's 16 and 32 GB)
        command = f"{fit_command or 'diffmeter fit MODEL --gpu NAME'} --memory 32GB"
        table.add_row(escape(gpu.name), "not judged", "", "", "", "", style="yellow")
        sizes = f"not judged: the {escape(gpu.name)} comes in several memory sizes"
        table.caption = f"{sizes}; `{escape(command)}` judges one"
    gguf = GGUF_LINE if any(t.startswith("quantize-gguf-") for t in techniques) else None
    if prediction.checked or gguf:
        table.caption = "\n".join(filter(None, (escape(prediction.checked or ""), table.caption, escape(gguf or ""))))
    return table


def fit_table(
    model: str,
    prediction: MemoryPrediction,
    gpu: Device,
    rows: list[tuple[tuple[str, ...], int, float | None]],
    held_back: int,
    refused: list[tuple[tuple[str, ...], str]],
    untimed: str | None = None,
    next_step: str | None = None,
    per_row: tuple[dict, dict, dict, dict] = ({}, {}, {}, {}),
    fitting: int | None = None,
    skips: dict | None = None,
    claims: list[str] | None = None,
    catalog_name: str = "",
) -> FittedTable:
    """The settings that fit once ``held_back`` bytes are kept for CUDA, with their lower bounds of time (no column
    where none has one), ranked by time where known, else in ``predict.techniques.settings``' order, and ``untimed``:
    why a setting has none; a line if none fits, and
    ``next_step``: what to do then; ``per_row``: each setting's quality cost, why its time is the unquantized
    pipeline's (``runs.fitting.time_note``), its expected range (the rows ranked by it) and why a row has none
    (``unranked``); ``fitting``: how many settings fit (``rows`` may be the first of them); ``skips``: a cached
    setting's skipped calls (``CacheSkip``), said once per cache shown; ``claims``: the held-out figure of each
    expected range shown (``runs.fitting.held_out_claims``); ``catalog_name``: the model as resolved, whose listed
    published files a GGUF row is checked against."""
    qualities, notes, expected, unranked = per_row

    some = any(time is not None for _, _, time in rows)  # no time at all: no column for it
    order = "by expected time" if expected else "by time's lower bound" if some else "least offload first"
    usable = gpu.memory_bytes - held_back
    if some and any(borderline(peak, usable) for _, peak, _ in rows):  # ranked after those with room to spare
        order = f"room to spare first, {order}"
    held = f", {gib(held_back)} held back for {runtime(gpu)}" if held_back else ""
    table = FittedTable(
        escape(
            f"{model} on {gpu.name} ({gib(gpu.memory_bytes)}{held}): "
            f"predicted peak without techniques {gib(prediction.peak_bytes)}"
        ),
        [
            Column(f"setting ({order})", justify="left"),
            Column("predicted peak"),
            Column("left", drop=1),
            *([Column("time >= s/generation", drop=0)] if some else []),
            *([Column("expected s", drop=4)] if expected else []),  # only a setting that moves no weights has one
            Column("quality", drop=2),
        ],
    )
    for chosen, peak, time in rows:
        shown = figure(time) if time is not None else "-"  # a tiny model's 0.0042 s never reads 0.00
        shown += " unquantized" if time is not None and notes.get(chosen) else ""
        ranged = f"{figure(expected[chosen][0])}-{figure(expected[chosen][1])}" if expected.get(chosen) else "-"
        quality = qualities.get(chosen, "-")
        ranged = [ranged] if expected else []
        shown = [shown] if some else []
        left = gib(usable - peak) + (" (borderline)" if borderline(peak, usable) else "")
        table.add_row(escape(setting_text(chosen)), gib(peak), left, *shown, *ranged, quality)
    if not rows:
        table.add_row("nothing fits, even with sequential offload", *[""] * (len(table.columns) - 1), style="red")
    link = f" over its {gpu.host_link}" if gpu.host_link else ""
    lines = [escape(next_step)] if next_step else []
    if prediction.peak_bytes > usable:
        lines.append(
            f"As is ({prediction.dtype}) it does not fit: its peak {gib(prediction.peak_bytes)} at "
            f"{prediction.peak_stage} ({gib(sum(prediction.component_param_bytes.values()))} of parameters and "
            f"buffers) is over the {gib(usable)} left of {gib(gpu.memory_bytes)}."
        )
    elif borderline(prediction.peak_bytes, usable):  # its supersets stay listed (predict.techniques.fitting)
        lines.append(
            f"As is ({prediction.dtype}) it fits by {gib(usable - prediction.peak_bytes)}, within the memory "
            f"prediction's checked {TOLERANCE:.0%}: borderline, a real run may not fit, so the settings that save "
            "memory are listed too."
        )
    else:  # the settings a fitting run adds memory techniques to are left out (predict.techniques.fitting)
        lines.append(
            f"As is ({prediction.dtype}) it fits, so the settings that only save memory (offload, tiling, slicing, "
            "the quantized formats but fp8 matmuls) are not listed: each only costs time here; profile --gpu with "
            "--quantize BACKEND:TYPE or --offload predicts one."
        )
    if rows and prediction.peak_bytes > usable:
        lines.append(
            "A setting that adds a memory saving to one listed (not borderline) is left out unless it is predicted "
            "faster (weights stored smaller crossing the host link under offloading, fp8 matmuls): else it only "
            "costs time; profile --gpu with --quantize BACKEND:TYPE or --offload predicts one."
        )
    if any(borderline(peak, usable) for _, peak, _ in rows):
        lines.append(
            f"(borderline): the peak is within the memory prediction's checked {TOLERANCE:.0%} of what is left: a "
            "real run may not fit."
        )
    if fitting is not None and fitting > len(rows):
        lines.append(f"{fitting - len(rows)} more settings fit: --all-settings lists them (--json holds all).")
    if held_back:
        lines.append(held_back_line(gpu, held_back))
    if rows and not some:
        lines.append(
            "Order: no time without the card's figures, so not by speed: by offload (none, model, group, sequential: "
            "each moves more weights per generation), unquantized before quantized, fewer techniques first, then "
            "the formats in fit's list order (predict/fit_formats.py FIT_FORMATS)."
        )
    if host := host_memory_line(prediction, [chosen for chosen, _, _ in rows]):
        lines.append(host)
    if some:
        lines.append(
            f"Time: a lower bound, the roofline plus offloading's weight transfers{link} at its standard rate."
        )
    said = sorted({notes[chosen] for chosen, _, time in rows if time is not None and notes.get(chosen)})
    if said:
        lines.append(
            "unquantized: the format's time is not modelled; the bound shown is the unquantized pipeline's with the "
            f"setting's offload transfers, and these rows follow the timed ones: {escape('; '.join(said))}."
        )
    if expected:
        lines.append(
            "Expected: the calibrated range with every technique of the setting (compile, first-block-cache, a timed "
            "format, offloading's transfers at their fitted rates), the rows ranked by its geometric midpoint (room to "
            "spare first); compile and first-block-cache keep their memory setting's peak (CUDA graphs' pool and the "
            "cache's kept activations not counted); each technique's time is held out alone on published runs, their "
            "combinations are not."
        )
        if claims:
            lines.append(escape(f"Held out: {'; '.join(claims)}."))
    cached = [skip for chosen, _, _ in rows if (skip := (skips or {}).get(chosen))]
    # the expected range spans the share: say how it was had
    said = {(s.technique, s.skips_text(f" ({s.extrapolated})" if s.extrapolated else "")) for s in cached}
    for technique, skips in sorted(said):
        lines.append(escape(f"Cache: {technique} {skips}."))
    if said := sorted({why for chosen, _, _ in rows if (why := unranked.get(chosen))}):
        said = escape("; ".join(said))
        lines.append(f"Not ranked (no expected range; after the ranked rows, by lower bound): {said}.")
        if maybe := maybe_faster(rows, expected):
            lines.append(escape(maybe))
    if any(quality == "not measured" for quality in qualities.values()):
        lines.append(
            "Quality: not measured for any quantized format or cache here (no measured figure in the repository); "
            "bench --compare-baseline measures PSNR and SSIM against the unchanged pipeline's images."
        )
    if not gpu.tflops and any({"quantize-fp8", *NEEDS_FP8} & set(chosen) for chosen, _, _ in rows):
        lines.append(
            "float8: those formats need FP8 tensor cores (compute capability 8.9+: Ada, Hopper, "
            "Blackwell); with only --memory given those rows are listed: name the card with --gpu to have them "
            "checked."
        )
    if any(t.startswith("quantize-gguf-") for chosen, _, _ in rows for t in chosen):
        lines.append(GGUF_LINE + (unlisted_gguf(catalog_name, rows) if catalog_name else ""))
    if untimed:
        lines.append(f"No time: {escape(untimed)}.")
    if refused:
        lines.append(f"Left out, bench refuses them: {escape(refused_text(refused))}.")
    if prediction.checked and not prediction.checked.startswith("checked"):
        lines.append(f"Memory: {escape(prediction.checked)}.")
    table.caption = " ".join(lines)
    return table


def host_memory_line(prediction: MemoryPrediction, settings: list[tuple[str, ...]]) -> str | None:
    """What the offloaded settings listed keep in the machine's own memory: every component's weights as the
    setting stores them (each moved to the GPU only while it runs), which the machine needs free beside the GPU."""
    held = sorted(
        sum(stored_params(prediction, chosen).values())
        for chosen in settings
        if any(t.startswith("offload-") for t in chosen)
    )
    if not held:
        return None
    amount = gib(held[0]) if held[0] == held[-1] else f"{gib(held[0])} to {gib(held[-1])}"
    return (
        f"Host memory: an offloaded setting keeps the pipeline's weights in the machine's RAM, each component on "
        f"the GPU only while it runs: {amount} as those settings store them, which the machine needs free beside "
        "the GPU (not checked here)."
    )


def maybe_faster(rows, expected: dict) -> str | None:
    """The unranked rows whose lower bound is under the first ranked row's expected range: ranked after it for want
    of a range, not for being slower (a new user's trial: group offload's 50.86 s bound listed below a row expected
    at 116-178 s), or None."""
    first = next((chosen for chosen, _, _ in rows if expected.get(chosen)), None)
    if first is None:
        return None
    low = expected[first][0]
    under = [(chosen, time) for chosen, _, time in rows if not expected.get(chosen) and time is not None and time < low]
    if not under:
        return None
    named = ", ".join(f"{setting_text(chosen)} ({figure(time)} s)" for chosen, time in under[:3])
    more = f" and {len(under) - 3} more" if len(under) > 3 else ""
    return (
        f"May be faster than the first row, whose expected range starts at {figure(low)} s: {named}{more}, whose "
        "lower bounds are under it; unranked for want of a range, not for being slower."
    )


def refused_text(refused: list[tuple[tuple[str, ...], str]], shown: int = 3) -> str:
    """The settings bench refuses, one clause per reason, each naming its first ``shown`` settings as the table
    does and counting the rest (a new user's trial: Wan 2.2's one GGUF reason said 32 times over)."""
    by_reason: dict[str, list[str]] = {}
    for chosen, why in refused:
        by_reason.setdefault(why, []).append(setting_text(chosen))
    said = []
    for why, names in by_reason.items():
        more = f" and {len(names) - shown} more" if len(names) > shown else ""
        said.append(f"{', '.join(names[:shown])}{more}: {why}")
    return "; ".join(said)


def unlisted_gguf(model: str, rows) -> str:
    """The GGUF types offered for which the catalog lists no published file of ``model`` (its catalog name, as
    ``fit`` resolved it; a new user's trial: fit
    offered Qwen-Image's gguf:Q8_0, which ``diffmeter models qwen-image`` does not list), as a sentence, or ""."""
    from diffmeter.catalog.quantized_files import files_of

    listed = {found.quant_type for found in files_of(model) if found.format == "gguf"}
    prefix = "quantize-gguf-"
    offered = {t.removeprefix(prefix) for chosen, _, _ in rows for t in chosen if t.startswith(prefix)}
    missing = sorted(offered - listed)
    if not missing:
        return ""
    return (
        f" Of {model}'s published files the catalog lists none of type {', '.join(missing)}: bench needs one "
        "(--weights), made with city96's tools or found elsewhere."
    )


def setting_text(chosen: tuple[str, ...]) -> str:
    """A setting as the table shows it: a ``--quantize BACKEND:TYPE`` format as that value (``gguf:Q4_K_S``), a
    speed-up as bench's ``--opt`` takes it, with its parameters (``first-block-cache:threshold=0.05``)."""
    from diffmeter.runs.fit_speedups import setting_name

    return setting_name(chosen) or "as is"


def _on_components(prediction, technique: str) -> str:
    """A technique as the user asks for it, a --quantize BACKEND:TYPE format with the components it quantizes
    ("bnb:nf4 on transformer"): the same name on the denoiser or a text encoder peaks differently (new users'
    trials: "quantize-bnb-nf4" for a format typed as bnb:nf4, and no word of what it quantizes)."""
    components = prediction.quantized_bytes.get(technique) if technique.startswith("quantize-") else None
    named = setting_text((technique,))
    return f"{named} on {'+'.join(components)}" if components else named
