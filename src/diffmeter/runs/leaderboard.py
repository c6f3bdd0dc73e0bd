"""The predicted leaderboard: every catalog model at its defaults on every GPU of the table, offline. For each
pair: whether it fits (and with which memory setting, fastest first, as ``fit`` answers), the predicted time
(the lower bound, and the calibrated expected range where the setting is the plain pipeline or a tiled or sliced
VAE decode, timed as it decodes) and the energy per image or video, each cell saying how it was predicted."""

from __future__ import annotations

from pydantic import BaseModel

from diffmeter.predict.devices import CUDA_HOLDBACK_BYTES, Device


class Cell(BaseModel):
    """One model on one GPU (bytes, seconds per generation, joules per output)."""

    model: str
    gpu: str
    architecture: str | None
    #: the GPU's memory as its driver reports it, and what is left after the CUDA context and libraries
    memory_bytes: int
    fits: bool
    #: the fastest setting bench can run that fits ([] = the plain pipeline); None where none fits
    setting: list[str] | None = None
    peak_bytes: int | None = None
    #: the plain pipeline's predicted peak (what does not fit, when nothing plain does)
    plain_peak_bytes: int
    #: the least quantization that fits without layer offloading (``fit_formats.least_quantization``): the run's
    #: dtype ("bf16") where no format is needed, a ``--quantize`` format (``gguf:Q6_K``), None where none does
    least_format: str | None = None
    lower_s: float | None = None
    expected_s: tuple[float, float] | None = None
    #: the setting bench can run with the least expected time, speed-ups included (``runs.fit_speedups``: compile,
    #: a first-block cache), and that range; None where no fitting setting's time is modelled
    fastest: list[str] | None = None
    fastest_s: tuple[float, float] | None = None
    energy_j: tuple[float, float] | None = None
    output: str = "image"
    #: how each figure was predicted, or why one is missing
    notes: list[str] = []


def default_spec(name: str):
    """The catalog entry of ``name`` and its generation at the catalog defaults."""
    from diffmeter.catalog import resolve
    from diffmeter.spec import ProfileSpec

    entry = resolve(name)
    return entry, ProfileSpec(model=name).with_defaults(entry.defaults)


def uncached(names: list[str]) -> list[str]:
    """Those of ``names`` whose prediction is not in the disk cache: each needs torch and a fake-tensor run."""
    from diffmeter.predict.cached import cached_memory_and_work

    return [name for name in names if cached_memory_and_work(default_spec(name)[1]) is None]


def model_cells(name: str, gpus: list[Device]) -> list[Cell]:
    """One model's cells on ``gpus``: one fake run of its generation at the catalog defaults (or its answer from
    the disk cache, without torch), then per GPU."""
    from diffmeter.predict.cached import cached_memory_and_work
    from diffmeter.predict.fit_formats import least_quantization
    from diffmeter.predict.kernel_kinds import of_architecture
    from diffmeter.predict.roofline import missing_figures
    from diffmeter.predict.techniques import fitting, peak_under
    from diffmeter.predict.vae_decode import VAE_MODES
    from diffmeter.runs.fit_speedups import SettingWork
    from diffmeter.runs.fitting import plain_time, runnable, why_untimed

    entry, spec = default_spec(name)
    found = cached_memory_and_work(spec)
    if found is None:
        from diffmeter.predict.operators import predict_memory_and_work

        found = predict_memory_and_work(spec)
    prediction, work = found
    plain = peak_under(prediction, ())
    output = "video" if spec.num_frames else "image"
    memory_note = f"memory: {prediction.checked}" if prediction.checked else "memory: tracked on fake tensors"
    cells, by_kernels = [], {}
    for gpu in gpus:
        kernels = of_architecture(gpu.architecture)
        if kernels not in by_kernels:  # shared by every GPU whose quantized kernels are of the kind
            formatted = card_formats(prediction, spec, gpu)
            by_kernels[kernels] = formatted, SettingWork(work, formatted, spec, tuple(prediction.denoisers))
        quantized, setting_work = by_kernels[kernels]
        usable = gpu.memory_bytes - CUDA_HOLDBACK_BYTES
        time = plain_time(work, prediction, gpu, spec.batch_size)
        by_time = time is not None and gpu.kind == "cuda"  # the fastest is ranked: fp8 matmuls kept, not dropped
        # the memory settings fit offers (--quantize formats, not the bare int8|fp8 it times as torchao's)
        formats, _ = runnable(fitting(quantized, usable, fp8="fp8" in gpu.tflops, timed=by_time), entry, spec)
        cell = Cell(
            model=name,
            gpu=gpu.name,
            architecture=gpu.architecture,
            memory_bytes=gpu.memory_bytes,
            fits=bool(formats),
            plain_peak_bytes=plain,
            least_format=least_quantization(quantized, formats),
            output=output,
            notes=[memory_note],
        )
        if formats:
            chosen, peak, found = quickest(formats, setting_work, gpu, spec, usable) if time else (*formats[0], None)
            cell.setting, cell.peak_bytes = list(chosen), peak
            if time is None:
                cell.notes.append(f"no time: {missing_figures(gpu, work)}")
            elif (timed := found.time) is not None:  # as fit and profile --gpu time the setting, its techniques in it
                cell.lower_s, cell.expected_s = timed.lower_s, timed.expected_s
                cell.energy_j = timed.energy.per_output_j if timed.energy else None
                if modes := [t for t in chosen if t in VAE_MODES]:  # its decode's operators as that mode runs them
                    cell.notes.append(f"time: the VAE decode as {' and '.join(modes)} runs it")
                cell.notes.append(f"time: {timed.calibration}")
                if timed.outside_calibration:
                    cell.notes.append(f"time: the expected range is {timed.outside_calibration}")
                cell.notes.append(f"energy: {timed.energy.calibration if timed.energy else timed.energy_left_out}")
            elif found.lower is None:  # an offloading setting on a card without a known host link
                cell.notes.append(f"no time: {why_untimed(time, gpu, work, tf32=True, named=True)}")
            else:
                cell.lower_s = found.lower
                cell.notes.append(f"time: lower bound only; {found.why}")
            if by_time:
                fastest(cell, setting_work, formats, gpu, entry, spec, usable)
        cells.append(cell)
    return cells


def quickest(fits, setting_work, gpu: Device, spec, usable: int):
    """(setting, peak, ``fit_speedups.Timed``) of the memory setting among ``fits`` that ``fit`` ranks first
    (``fit_speedups.rank_key``: by expected midpoint, room to spare before borderline), then in ``fits``' order."""
    from diffmeter.runs.fit_speedups import rank_key, timed

    found = [(chosen, peak, timed(setting_work, chosen, gpu, outputs=spec.batch_size)) for chosen, peak in fits]
    return min(found, key=lambda row: rank_key(row[1], usable, row[2].midpoint, row[2].lower))


def card_formats(prediction, spec, gpu: Device):
    """``prediction`` with the quantized formats' bytes as ``fit --gpu`` computes them for ``gpu``: with the kernels
    the backends pick on its architecture (``kernel_kinds.of_architecture``: quanto's tinygemm on sm_80 and later,
    its dequantized copy on a T4 or V100)."""
    from diffmeter.predict.fit_formats import with_fit_formats
    from diffmeter.predict.kernel_kinds import of_architecture

    return with_fit_formats(prediction, spec, of_architecture(gpu.architecture))


def fastest(cell: Cell, setting_work, fits, gpu: Device, entry, spec, usable: int) -> None:
    """``cell``'s fastest predicted setting: ``fits`` (the memory settings bench runs that fit) with every speed-up
    bench accepts, the first as ``fit`` ranks them (``fit_speedups.rank_key``) among those with a modelled time."""
    from diffmeter.runs.fit_speedups import rank_key, setting_name, timed, with_speedups
    from diffmeter.runs.fitting import runnable

    speedy, _ = runnable(with_speedups(fits), entry, spec)
    times = [(chosen, peak, timed(setting_work, chosen, gpu, outputs=spec.batch_size)) for chosen, peak in speedy]
    ranked = sorted(
        (rank_key(peak, usable, found.midpoint, None), chosen, found) for chosen, peak, found in times if found.midpoint
    )
    if not ranked:
        cell.notes.append("fastest: no fitting setting's time is modelled")
        return
    _, chosen, best = ranked[0]
    cell.fastest, cell.fastest_s = list(chosen), best.time.expected_s
    cell.notes.append(f"fastest: {setting_name(chosen) or 'plain'}, expected time with its techniques (fit_speedups)")


def table_gpus() -> list[Device]:
    """Every GPU of the table with a single memory size (a row covering several sizes cannot say what fits)."""
    from diffmeter.predict.devices import of_row
    from diffmeter.predict.peaks import PEAKS

    return [device for device in (of_row(row) for row in PEAKS) if device.memory_bytes]
