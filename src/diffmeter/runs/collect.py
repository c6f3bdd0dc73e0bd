"""Every run folder under a directory as one tidy table: a row per run (``diffmeter table``,
``diffmeter.load_results``). Columns and units are listed in ``COLUMNS``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from diffmeter.errors import DiffmeterError
from diffmeter.measure.environment import device_name
from diffmeter.measure.quality_schema import Quality
from diffmeter.measure.speedup import within_noise_rule
from diffmeter.runs import speedups, storage
from diffmeter.runs.ladder_rungs import LadderRung, ladder_rungs
from diffmeter.runs.results import BenchResult
from diffmeter.spec import sizes_text

#: column -> what it holds, with its unit (documented in docs/table.md)
COLUMNS: dict[str, str] = {
    "folder": "the run folder, relative to the directory read",
    "model": "catalog name, hub id or local folder",
    "weights": "pretrained | random (real size, random weights) | tiny-random (a test pipeline)",
    "width": "pixels",
    "height": "pixels",
    "frames": "frames per video (video models)",
    "batch": "images (videos) per pipeline call",
    "steps": "denoising steps",
    "guidance": "guidance scale",
    "input_images": "input images (editing, image-to-video) as WxH, joined by + (empty: text-to-image)",
    "lora": "the LoRA on the denoiser: rank N or its file, fused or unfused (empty: none)",
    "controlnet": "the ControlNet steering the denoiser (empty: none)",
    "settings": "the other settings that change what is generated, as the run folder names them, joined by + "
    "(true-cfg-4, max-sequence-length-16, a LoRA, input images, component dtypes, prompts; empty: none)",
    "dtype": "float16 | bfloat16 | float32",
    "device": "cuda:N or cpu, as run",
    "hardware": "the GPU's name, or the CPU's for CPU runs",
    "optimizations": "techniques applied, joined by + (empty: none)",
    "status": "complete | failed",
    "error": "why a failed run failed",
    "processes": "processes (GPUs) the run used: ulysses x ring x tp x cfg x data-parallel degrees",
    "parallel": "the parallel degrees above 1, as the run folder names them (ulysses-2+data-parallel-2; empty: none)",
    "s_per_image": "seconds per image: median call latency / images per call (batch x data-parallel degree)",
    "s_per_image_p90": "seconds per image: 90th-percentile call latency / images per call",
    "images_per_s": "images per second over the measured calls' total time (a mean: not 1 / s_per_image, a median)",
    "text_share": "fraction of the mean call spent encoding text (show's share column)",
    "image_share": "fraction of the mean call spent encoding input images (VAE encode; editing, image-to-video)",
    "denoise_share": "fraction of the mean call spent in the denoising loop",
    "decode_share": "fraction of the mean call spent decoding latents (VAE)",
    "other_share": "fraction of the mean call spent elsewhere in the pipeline",
    "peak_cuda_bytes": "bytes: the largest CUDA allocation during the measured calls",
    "peak_rss_bytes": "bytes: the process's peak resident memory",
    "gpu_j_per_image": "joules of GPU energy per image (Zeus)",
    "cpu_j_per_image": "joules of CPU package energy per image (Zeus, RAPL)",
    "tflops_per_image": "TFLOPs (10^12 floating-point operations) per image, from the offline profile",
    "denoise_tflops_per_s": "achieved TFLOP/s of the denoising loop",
    "mfu": "denoising loop's achieved TFLOP/s / the device's dense peak",
    "psnr_db": "mean PSNR in dB against the unoptimized images at the same seeds, over the images that differ "
    "(identical ones, infinite, are counted in identical_images; a ladder rung: its ladder baseline's, from "
    "ladder-*.json; empty when all are identical)",
    "identical_images": "images bit-identical to the unoptimized run's at the same seed",
    "ssim": "mean SSIM against the unoptimized images (a ladder rung: its ladder baseline's)",
    "lpips": "mean LPIPS against the unoptimized images (lower is closer)",
    "speedup": "times faster than its baseline (a ladder rung's ladder baseline; else its --compare-baseline run; else "
    "the unoptimized run of the same settings in its own --out folder, or the table's only one, stored apart, said in "
    "speedup_noise): Hodges-Lehmann estimate over every pair of measured calls, per image (1 for an unoptimized run, "
    "its own baseline)",
    "speedup_ci_low": "lower end of the speed-up's exact Mann-Whitney interval (empty for a baseline: 1 by definition)",
    "speedup_ci_high": "upper end of that interval",
    "speedup_coverage": "the probability that interval covers the true speed-up (below 95% with few calls)",
    "speedup_verdict": f"faster | slower | within noise ({within_noise_rule()}) | baseline",
    "speedup_noise": "the noise notes of this run and its baseline, joined by ' | ', which the speed-up carries "
    "(empty: both quiet)",
    "speedup_against": "ladder baseline (a ladder rung: its speed-up, PSNR and SSIM are against the ladder's first "
    "run, which may run more steps or another dtype) | same settings (the unoptimized run of its settings; "
    "empty: no speed-up, or the run is a baseline itself)",
    "speedup_baseline": "the run folder of that baseline, relative to the directory read where it is under it",
    "noise": "this run's own notes on noise in its timings (an interval too wide, other processes busy), "
    "joined by ' | '",
    "scaling_speedup": "parallel runs: the one-device run's median s/image (same spec, same folder) / this run's",
    "scaling_efficiency": "scaling_speedup / processes (empty: no one-device run of the same spec stored beside it)",
    "scaling_verdict": "the speed-up rule's verdict on the same two runs (faster | slower | within noise: "
    f"{within_noise_rule()}); empty in runs stored before it",
    "iterations": "measured calls",
    "created_utc": "when the run was stored",
}

#: the techniques bench applies unasked (TF32 on CUDA): a run with no other is unoptimized
DEFAULTS = frozenset({"tf32"})
#: how the noise columns join their notes (a note may hold "; ")
NOTES_JOINER = " | "

#: spec fields that do not change what a run generates: how it was measured, its techniques (what a speed-up is
#: of), the seed (the same work), and the model as named (the row's resolved name stands for it)
_NOT_GENERATION = (
    *storage.MEASURED_BY,
    "optimizations",
    "tf32",
    "seed",
    "save_images",
    "memory_check",
    "predict",
    "model",
)


def find_results(directory: str | Path) -> list[Path]:
    """Every results.json under ``directory`` (any depth), skipping staging and hidden folders."""
    root = Path(directory).expanduser()
    if not root.is_dir():
        raise DiffmeterError(f"{root} is not a folder; point at the --out folder of bench, ladder or sweep")
    found = [
        path
        for path in sorted(root.rglob(storage.RESULTS))
        if not any(part.startswith(".") for part in path.relative_to(root).parts)
    ]
    return found


def readable_results(paths: list[Path], skipped: list[str] | None = None) -> list[tuple[Path, BenchResult]]:
    """(run folder, result) for every results.json in ``paths`` (``find_results``) that can be read; each one
    that cannot (truncated, hand-edited, from another version) is left out with a line naming it in ``skipped``."""
    found = []
    for path in paths:
        try:
            found.append((path.parent, storage.read_result(path.parent)))
        except DiffmeterError as error:
            if skipped is None:
                raise
            skipped.append(f"skipped: {error}")
    return found


def rows(directory: str | Path, skipped: list[str] | None = None) -> list[dict[str, Any]]:
    """One dict per stored run, with the keys of ``COLUMNS`` (None where not measured); with ``skipped``,
    unreadable results are left out and named there instead of refusing the whole folder."""
    root = Path(directory).expanduser()
    readable = readable_results(find_results(root), skipped)
    table = [row(result, str(folder.relative_to(root))) for folder, result in readable]
    add_speedups(table, [result for _, result in readable], ladder_rungs(root))
    return table


def row(result: BenchResult, folder: str) -> dict[str, Any]:
    spec, summary, quality = result.spec, result.summary, result.quality
    weights = "tiny-random" if result.model.origin == "tiny" else "random" if result.weights_random else "pretrained"
    labels = [o.label for o in result.optimizations]
    values: dict[str, Any] = dict.fromkeys(COLUMNS)
    values.update(
        folder=folder,
        model=result.model.name,
        weights=weights,
        width=spec.width,
        height=spec.height,
        frames=spec.num_frames,
        batch=spec.batch_size,
        steps=spec.steps,
        guidance=spec.guidance_scale,
        input_images=sizes_text(spec.image_sizes, "+"),
        lora=spec.lora_text,
        controlnet=spec.controlnet or "",
        settings="+".join(storage.other_settings(spec)),
        dtype=spec.dtype,
        device=spec.device,
        hardware=hardware(result),
        optimizations="+".join(labels),
        processes=spec.world_size,
        parallel="+".join(storage.parallel_parts(spec)),
        status=result.status,
        error=result.error,
        created_utc=result.created_utc,
    )
    if result.profile is not None:
        values["tflops_per_image"] = result.profile.total_flops / 1e12 / spec.batch_size
    if summary is not None:
        shares = {name: percent / 100 for name, (_, percent) in summary.stage_shares().items()}  # show's
        memory, energy = summary.peak_memory, summary.energy
        per_call = summary.images / summary.iterations  # batch x data-parallel degree
        values.update(
            s_per_image=summary.latency_s.median / per_call,
            s_per_image_p90=summary.latency_s.p90 / per_call,
            images_per_s=summary.images_per_s,
            text_share=shares.get("text_encoding", 0.0),
            image_share=shares.get("image_encoding", 0.0),
            denoise_share=shares.get("denoising", 0.0),
            decode_share=shares.get("vae_decode", 0.0),
            other_share=shares.get("other", 0.0),
            peak_cuda_bytes=memory.cuda_max_allocated_bytes,
            peak_rss_bytes=memory.process_peak_rss_bytes,
            gpu_j_per_image=energy.gpu_j_per_image,
            cpu_j_per_image=energy.cpu_j_per_image,
            denoise_tflops_per_s=summary.achieved_tflops.get("denoising"),
            mfu=summary.mfu.get("denoising"),
            iterations=summary.iterations,
        )
    if quality is not None:
        values.update(quality_columns(quality))
    scaling = result.parallel.scaling if result.parallel is not None else None
    if scaling is not None and scaling.call is not None:
        values.update(scaling_speedup=scaling.call.speedup, scaling_efficiency=scaling.call.efficiency)
        values["scaling_verdict"] = scaling.call.rule.verdict if scaling.call.rule is not None else None
    values["noise"] = NOTES_JOINER.join(speedups.noise_notes(result)) if result.status == "complete" else None
    return values


def quality_columns(quality: Quality) -> dict[str, Any]:
    """Images against a baseline's as the table's columns."""
    return dict(
        psnr_db=quality.mean_psnr_db,
        identical_images=quality.identical,
        ssim=quality.mean_ssim,
        lpips=quality.mean_lpips,
    )


def hardware(result: BenchResult) -> str:
    """The GPU the run used, or the CPU for CPU runs."""
    return device_name(result.environment, result.spec.device or "cpu")


def add_speedups(
    table: list[dict[str, Any]], results: list[BenchResult], ladders: dict[Path, LadderRung] | None = None
) -> None:
    """Each complete run's speed-up (``runs.speedups.between``) against its baseline: a ladder rung's, its
    ladder's baseline (``runs.ladder_rungs``: a rung may change the dtype or the steps), with the rung's images
    against it as the ladder measured them where its own result has none; else the run its
    --compare-baseline named, from the table or its folder on disk; else the unoptimized run of the same
    generation beside it (the same --out folder; the first found where several are, differing in what the generation
    key leaves out, such as the seed), else the table's only such run, stored apart (said in its noise notes; never
    one of several stored apart); an unoptimized run without one is a baseline itself. Unoptimized: no technique
    but TF32, which bench applies unasked on CUDA; a run's baseline has fewer techniques than it, none where such a
    run was measured (--no-tf32: bench's own baseline), else TF32 alone. ``results`` are the table's rows' results,
    in order."""
    by_folder = {_resolved(result.folder): result for result in results if result.folder is not None}
    names = {_resolved(r.folder): row["folder"] for row, r in zip(table, results, strict=True) if r.folder is not None}
    unoptimized: dict[tuple, list[BenchResult]] = {}
    for row, result in zip(table, results, strict=True):
        if row["status"] == "complete" and _techniques(result) <= DEFAULTS and result.folder is not None:
            unoptimized.setdefault(_generation(row, result), []).append(result)
    for row, result in zip(table, results, strict=True):
        if row["status"] != "complete":
            continue
        folder = _resolved(result.folder) if result.folder is not None else None
        rung = (ladders or {}).get(folder)
        baseline = by_folder.get(rung.baseline) if rung is not None else None
        if baseline is not None and rung.quality is not None and result.quality is None:
            row.update(quality_columns(rung.quality))
        against = "ladder baseline" if baseline is not None else "same settings"
        baseline = baseline or _named_baseline(result, by_folder)
        apart = None
        if baseline is None and folder is not None:
            candidates = [c for c in unoptimized.get(_generation(row, result), []) if _fewer(c, result)]
            least = min((len(_techniques(c)) for c in candidates), default=0)
            fewest = [c for c in candidates if len(_techniques(c)) == least]
            near = [c for c in fewest if _resolved(c.folder).parent == folder.parent]
            baseline = (near or (fewest if len(fewest) == 1 else [None]))[0]
            apart = None if near or baseline is None else f"baseline: stored apart, in {baseline.folder}"
        if baseline is None and _techniques(result) <= DEFAULTS:
            # 1x by definition, not measured: no interval, no coverage
            row.update(speedup=1.0, speedup_ci_low=None, speedup_ci_high=None, speedup_coverage=None)
            row["speedup_verdict"] = "baseline"
            continue
        found = speedups.between(baseline, result) if baseline is not None else None
        if found is not None:
            row.update(speedup_columns(found), speedup_against=against)
            row["speedup_baseline"] = names.get(_resolved(baseline.folder), str(baseline.folder))
            if apart:
                row["speedup_noise"] = NOTES_JOINER.join(filter(None, (row["speedup_noise"], apart)))


def speedup_columns(found: speedups.Speedup) -> dict[str, Any]:
    """A speed-up as the table's columns."""
    return dict(
        speedup=found.estimate,
        speedup_ci_low=found.low,
        speedup_ci_high=found.high,
        speedup_coverage=found.coverage,
        speedup_verdict=found.verdict,
        speedup_noise=NOTES_JOINER.join(found.notes),
    )


def _techniques(result: BenchResult) -> set[str]:
    return {applied.name for applied in result.optimizations}


def _fewer(baseline: BenchResult, result: BenchResult) -> bool:
    """Whether ``baseline`` ran a proper subset of ``result``'s techniques (a plain run on CUDA, TF32 alone, is the
    baseline of its techniques, and one measured --no-tf32 is the baseline of both)."""
    return _techniques(baseline) < _techniques(result)


def _resolved(folder: str | Path) -> Path:
    return Path(folder).expanduser().resolve()


def _named_baseline(result: BenchResult, by_folder: dict[Path, BenchResult]) -> BenchResult | None:
    """The baseline a --compare-baseline run names: the run of that folder's name beside it in the table (a study
    copied or moved keeps its runs side by side, while the stored path, as the run was given it, may still point
    at the original), else the named folder in the table, else that folder on disk."""
    if result.speedup is None:
        return None
    folder = _resolved(result.speedup.baseline)
    if result.folder is not None:
        beside = _resolved(result.folder).parent / folder.name
        if beside in by_folder:
            return by_folder[beside]
    if folder in by_folder:
        return by_folder[folder]
    if (folder / storage.RESULTS).is_file():
        try:
            return storage.read_result(folder)
        except DiffmeterError:
            return None
    return None


def _generation(row: dict[str, Any], result: BenchResult) -> tuple:
    """What makes two runs the same generation (a run and its unoptimized baseline): the model and its weights,
    and every setting of the spec but ``_NOT_GENERATION`` (true CFG and the text length too, not only the
    table's columns)."""
    settings = {k: v for k, v in result.spec.model_dump(mode="json").items() if k not in _NOT_GENERATION}
    return row["model"], row["weights"], json.dumps(settings, sort_keys=True)


def load_results(directory: str | Path, skipped: list[str] | None = None):
    """Every run under ``directory`` as a pandas DataFrame, one row per run (columns: ``COLUMNS``); with
    ``skipped``, unreadable results are named there and left out."""
    import pandas

    table = rows(directory, skipped)
    frame = pandas.DataFrame(table, columns=list(COLUMNS))
    return frame.astype({column: "Int64" for column in COLUMNS if _whole(row[column] for row in table)})


def _whole(values) -> bool:
    """A column of whole numbers with gaps (frames: None for images), which pandas would turn into floats."""
    present = [value for value in values if value is not None]
    return bool(present) and all(isinstance(value, int) and not isinstance(value, bool) for value in present)


def filtered(frame, where: str | None, sort: str | None):
    """``frame`` restricted by a pandas query expression and sorted by a column; bad input in one line."""
    if where:
        try:
            frame = frame.query(where, engine="python")
        except Exception as error:
            raise DiffmeterError(
                f"--where {where!r}: {' '.join(str(error).split())}; write a pandas query such as "
                "\"model == 'sdxl' and batch >= 2\" (columns: see docs/table.md)"
            ) from None
    if sort:
        column, descending = sort.lstrip("-"), sort.startswith("-")
        if column not in frame.columns:
            raise DiffmeterError(f"--sort {sort}: no column '{column}'; the columns are {', '.join(frame.columns)}")
        frame = frame.sort_values(column, ascending=not descending, na_position="last", kind="stable")
    return frame


def to_json(frame) -> str:
    return json.dumps(json.loads(frame.to_json(orient="records")), indent=2)
