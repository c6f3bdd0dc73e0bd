"""`diffmeter doctor` on the terminal: what this machine can measure, one screen."""

from __future__ import annotations

from rich.console import Group
from rich.markup import escape
from rich.text import Text

from diffmeter import units
from diffmeter.doctor import DTYPES, Doctor, Kernel
from diffmeter.report.layout import Column, FittedTable

SHORT = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}


def doctor_report(doctor: Doctor) -> Group:
    parts = [_facts(doctor), _gpus(doctor)]
    parts += [_kernels("PyTorch SDPA kernels (forced, on a 128-token call)", doctor.sdpa_kernels, doctor.device)]
    parts += [_kernels("diffusers attention backends", doctor.attention_backends, doctor.device)]
    parts += [_packages(doctor), _cache(doctor)]
    return Group(*parts)


def _facts(doctor: Doctor) -> Text:
    energy = doctor.energy
    lines = [
        f"diffmeter {doctor.diffmeter}, Python {doctor.python}, {doctor.platform}",
        f"torch {doctor.torch} ({doctor.build})"
        + (f", cuDNN {doctor.cudnn}" if doctor.cudnn else "")
        + (f", NCCL {doctor.nccl}" if doctor.nccl else "")
        + (f", driver {doctor.driver}" if doctor.driver else ""),
        f"CPU: {doctor.cpu}",
        cpu_peaks_line(doctor.cpu_peaks),
        "timing: CUDA events per stage" if doctor.gpus else "timing: host clock (no CUDA GPU: CPU runs only)",
        "energy, GPU: " + ("measurable (Zeus, NVML counters)" if energy.gpu is None else f"not measured: {energy.gpu}"),
        "energy, CPU: " + ("measurable (Zeus, RAPL counters)" if energy.cpu is None else f"not measured: {energy.cpu}"),
    ]
    return Text("\n".join(lines))


def cpu_peaks_line(peaks) -> str:
    """This CPU's stored peaks, with when they were measured and whether the machine was busy then."""
    again = "doctor --remeasure-cpu measures again"
    if peaks is None:
        return f"CPU peaks: not measured yet (the first CPU prediction measures and stores them; {again})"
    busy = f" while other processes used {peaks.others_cores:.1f} cores: may be low" if peaks.busy else ""
    rates = ", ".join(f"{key} {units.flop_rate(value * 1e12)}" for key, value in peaks.tflops.items())
    return (
        f"CPU peaks ({units.counted(peaks.threads, 'thread')}), measured {peaks.measured_at:%Y-%m-%d %H:%M} UTC"
        f"{busy}: {rates}, "
        f"copy {peaks.bandwidth_bytes_per_s / 1e9:.1f} GB/s; every CPU prediction uses them ({again})"
    )


def _gpus(doctor: Doctor) -> FittedTable | Text:
    if not doctor.gpus:
        return Text("GPUs: none visible (CPU-only torch build, no driver, or CUDA_VISIBLE_DEVICES empty)")
    precisions = ("fp32", "tf32", "bf16", "fp16", "fp8")
    table = FittedTable(
        "GPUs and the dense peaks used for MFU (TFLOP/s)",
        [
            Column("#"),
            Column("name", justify="left"),
            Column("memory", drop=2),
            Column("capability", drop=1),
            Column("table row", justify="left"),
            *(Column(key, drop=3) for key in precisions),
        ],
    )
    for gpu in doctor.gpus:
        table.add_row(
            str(gpu.index),
            escape(gpu.name),
            units.gib(gpu.memory_bytes),
            gpu.compute_capability,
            gpu.peak_row or "[yellow]unknown: pass --peak-tflops for MFU[/]",
            *(f"{gpu.peak_tflops[key]:g}" if key in gpu.peak_tflops else "-" for key in precisions),
        )
    return table


def _kernels(title: str, kernels: list[Kernel], device: str) -> FittedTable:
    """A row per kernel, "yes" or "no (n)" per dtype; each distinct reason once, numbered, below."""
    table = FittedTable(
        f"{title} on {device}",
        [Column("name", justify="left"), *(Column(SHORT[dtype]) for dtype in DTYPES), Column("with a mask")],
    )
    reasons: dict[str, int] = {}
    for kernel in kernels:
        cells = []
        for dtype in DTYPES:
            reason = kernel.dtypes[dtype]
            if reason is None:
                cells.append("[green]yes[/]")
            else:
                cells.append(f"[red]no[/] ({reasons.setdefault(reason, len(reasons) + 1)})")
        table.add_row(kernel.name, *cells, {True: "yes", False: "no", None: "-"}[kernel.masks])
    table.caption = "\n".join(f"({number}) {escape(reason)}" for reason, number in reasons.items()) or None
    return table


def _packages(doctor: Doctor) -> FittedTable:
    table = FittedTable(
        "optional packages",
        [
            Column("package", justify="left"),
            Column("version", justify="left"),
            Column("for", justify="left", drop=1),
            Column("install", justify="left"),
        ],
    )
    for package in doctor.packages:
        table.add_row(
            package.name,
            package.version or "[dim]not installed[/]",
            package.purpose,
            "" if package.version else escape(package.install),
        )
    return table


def _cache(doctor: Doctor) -> Text:
    models = ", ".join(doctor.cached_models) if doctor.cached_models else "none"
    return Text(
        f"Hugging Face cache: {doctor.hf_cache}\n"
        f"catalog models with weights there: {len(doctor.cached_models)} of {doctor.catalog_models} ({models}); "
        "the others run with --random-weights, or after `hf download HUB_ID`"
    )
