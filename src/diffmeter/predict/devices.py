"""The device a prediction is for: a GPU row of ``predict.peaks`` (datasheet memory, bandwidth and dense peaks) named
by the user, figures given with ``--gpu-spec``, or ``cpu``: this machine's CPU, its peaks measured (``cpu_peaks``)."""

from __future__ import annotations

import difflib
import functools
import json
import re
import statistics
from importlib import resources

from pydantic import BaseModel

from diffmeter import units
from diffmeter.errors import DiffmeterError
from diffmeter.predict.peaks import NEUTRAL, PEAKS, PRECISION, VARIANTS, conv_key, find_device, other_size, tokens

#: what a CUDA process cannot give its tensors, held back before "fits": on an H200 (driver 580, torch
#: 2.11+cu130) the driver kept 615 MiB of nvidia-smi's total from ``cudaMemGetInfo``, and the CUDA context
#: (527 MiB), cuBLAS's handle and workspace (158 MiB) and SDPA's and cuDNN's (10 MiB) took 695 MiB outside
#: PyTorch's allocator (benchmarks/cuda_overhead.py, results/cuda_overhead_nvidia-h200.json)
CUDA_HOLDBACK_BYTES = (615 + 695) * 2**20

#: a memory size word ("80gb", "16g"): not a model number
MEMORY_SIZE_WORD = re.compile(r"\d+g(b)?")


class Device(BaseModel):
    """Memory in bytes, bandwidth in bytes/s, peaks in TFLOP/s. A table GPU's memory is what its driver
    reports (nvidia-smi's MiB, ``data/gpu_memory.json``, each figure cited): an "80GB" H100 81,559 MiB, a
    "48GB" L40S 46,068 MiB with ECC on; where no driver figure was found, the datasheet's GB read as GiB less
    the reserve the measured cards of its memory kind show (``datasheet_memory``)."""

    name: str
    #: "cuda" or "cpu": which calibration of achieved fractions applies (``roofline``)
    kind: str = "cuda"
    memory_bytes: int | None
    bandwidth_bytes_per_s: float | None
    tflops: dict[str, float]
    source: str
    #: the link between host and GPU ("PCIe Gen5 x16", "NVLink-C2C") and its datasheet rate per direction,
    #: bytes/s (``data/host_links.json``, each cited): what offloading's transfers go over
    host_link: str | None = None
    host_link_bytes_per_s: float | None = None
    #: the GPU architecture ("hopper", "ampere", ...): which fitted calibration applies (``roofline``)
    architecture: str | None = None
    #: the L2 cache, bytes (``data/gpu_cache.json``, each cited; whitepaper MB as 2^20 bytes)
    l2_bytes: int | None = None
    #: the card's TDP (board power), watts (``data/gpu_power.json``, cited): what the energy prediction's share is of
    tdp_w: float | None = None

    @property
    def given(self) -> bool:
        """Figures given with --gpu-spec (or only ``fit``'s --memory), not a row of the table or this CPU."""
        return self.source.startswith("--gpu-spec")

    def peak_tflops(self, dtype: str) -> float | None:
        return self.tflops.get(PRECISION[dtype], self.tflops.get("any"))


def _plain(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


def is_this_cpu(name: str | None) -> bool:
    """``--gpu cpu``: this machine's CPU, measured."""
    return name is not None and _plain(name) in ("cpu", "thiscpu")


def named_gpu(name: str, dtypes: tuple[str, ...] = ()) -> Device:
    """The table's GPU for a name ("h100", "H100 PCIe", "l4"): an exact name first, else the first row
    whose name starts with it (the table lists the SXM form first)."""
    if is_this_cpu(name):
        return this_cpu(*dtypes)
    rows = _matching(name) or [row for row in [find_device(name)] if row is not None]  # as nvidia-smi names it
    if not rows:
        known = ", ".join(row.name for row in PEAKS)
        near = _nearest(name)
        hint = f"did you mean {near}? " if near else ""
        raise DiffmeterError(
            f"unknown GPU '{name}'; {hint}known: {known}, cpu (this machine's, measured); or give its figures with "
            "--gpu-spec"
        )
    return of_row(rows[0])


def _nearest(name: str) -> str | None:
    """The table's GPU closest to an unknown name, among the rows of its model number first ("H100 96GB": an H100,
    not the A100 80GB its spelling is nearer)."""
    models = {word for word in tokens(name) if any(c.isdigit() for c in word) and not MEMORY_SIZE_WORD.fullmatch(word)}
    same_model = [row for row in PEAKS if models & set(tokens(row.name))]
    for rows, cutoff in ((same_model, 0.0), (PEAKS, 0.5)):
        close = difflib.get_close_matches(_plain(name), [_plain(row.name) for row in rows], n=1, cutoff=cutoff)
        if close:
            return next(row.name for row in rows if _plain(row.name) == close[0])
    return next((row.name for row in PEAKS if _plain(name) and _plain(name) in _plain(row.name)), None)


def _holds(row, word: str) -> bool:
    """Whether a ``--gpu`` word names something of ``row``: a word of its name, its form's generation ("sxm5" of an
    SXM card), its memory size ("80gb"), or a word drivers add ("nvidia", "hbm3")."""
    names = set(tokens(row.name))
    return (
        word in names
        or word in NEUTRAL
        or other_size(row, word) is False
        or (re.fullmatch(r"sxm\d", word) is not None and "sxm" in names)
    )


def _matching(name: str) -> list:
    """The rows a ``--gpu`` name matches: the one of that exact name; else every row holding each of its words
    (``_holds``: "4090" is the RTX 4090, "v100s" the V100S PCIe, "H100 80GB" and "h100 sxm5" the H100 SXM); else
    every row whose name starts with it; the SXM form first ("h200" is the H200 SXM: the table lists the NVL first,
    for driver names). A row adding a variant word ("ti", "super") is another card ("rtx 4070": no RTX 4070 Ti)."""
    wanted, words = _plain(name), set(tokens(name))
    if not wanted:
        return []
    same_card = [row for row in PEAKS if not (set(tokens(row.name)) - words) & VARIANTS]
    exact = [row for row in PEAKS if _plain(row.name) == wanted]
    holding = [row for row in same_card if all(_holds(row, word) for word in words)]
    starting = [row for row in same_card if _plain(row.name).startswith(wanted)]
    return exact or sorted(holding or starting, key=lambda row: "SXM" not in row.name.split())


def of_row(row) -> Device:
    """A ``predict.peaks`` row as a device, its memory as its driver reports it."""
    reported = driver_memory().get(row.name)
    if reported:
        memory, said = reported["mib"] * 2**20, f"memory {reported['mib']:,} MiB as nvidia-smi reports it"
    elif row.memory_gb:
        memory, said = datasheet_memory(row)
    else:
        memory, said = None, "no single memory size"
    link = host_links().get(row.name, {})
    return Device(
        name=row.name,
        memory_bytes=memory,
        bandwidth_bytes_per_s=row.bandwidth_gb_s * 1e9 if row.bandwidth_gb_s else None,
        tflops=dict(row.tflops),
        source=f"{row.source}; {said}",
        host_link=link.get("link"),
        host_link_bytes_per_s=link["gb_s_per_direction"] * 1e9 if link else None,
        l2_bytes=int(l2_caches()[row.name]["l2_mb"] * 2**20) if row.name in l2_caches() else None,
        architecture=architecture_of(row.name),
        tdp_w=board_power()[row.name]["tdp_w"] if row.name in board_power() else None,
    )


#: the models of the table's GPUs (a row's name, or its first words) by architecture
ARCHITECTURES = {
    "hopper": ("H100", "H200", "H800", "H20", "GH200"),
    "blackwell": ("B200", "GB200", "B300"),
    # GB202 / GB203 / GB205 / GB206 (sm_120): not the B200's GB100 (sm_100)
    "rtx-blackwell": ("RTX 5090", "RTX 5080", "RTX 5070", "RTX 5060 Ti"),
    "ada": ("L4", "L40", "L40S", "L20", "RTX 4090", "RTX 4080", "RTX 4070", "RTX 4060 Ti", "RTX 6000 Ada"),
    "ampere": ("A100", "A800", "A10G", "A10", "A40", "A30", "RTX 3090", "RTX 3060", "RTX A6000"),
    "turing": ("T4",),
    "volta": ("V100", "V100S"),
    "cdna3": ("MI300X",),  # AMD: no published run fitted, no neighbour, so no expected range
}


#: the table's GPUs with stacked memory (HBM); the others have GDDR
HBM_MODELS = (
    "H100", "H200", "H800", "H20", "GH200", "B200", "GB200", "B300", "A100", "A800", "A30", "V100", "V100S", "MI300X",
)  # fmt: skip
#: data-center GDDR cards, shipped with ECC on: the driver gives 1/16 of the memory to it
ECC_ON_MODELS = ("A10G", "A10", "A40", "L4", "L40", "L40S", "L20", "T4")


def _is(name: str, models: tuple[str, ...]) -> bool:
    return any(name == model or name.startswith(model + " ") for model in models)


def _memory_kind(name: str, ecc_on: bool) -> str:
    return "HBM" if _is(name, HBM_MODELS) else "ECC-on GDDR" if ecc_on else "GDDR"


@functools.cache
def memory_reserves() -> dict[str, tuple[float, int]]:
    """Per memory kind, (MiB, cards): the median of (datasheet GB read as GiB, less ECC's 1/16 where on) minus
    nvidia-smi's total over the table's cards with a driver figure (``data/gpu_memory.json``). A GDDR card whose
    figure is at most 15/16 of its size was read with ECC on."""
    gaps: dict[str, list[float]] = {}
    for row in PEAKS:
        reported = driver_memory().get(row.name)
        if reported and row.memory_gb:
            size = row.memory_gb * 1024
            ecc_on = not _is(row.name, HBM_MODELS) and reported["mib"] <= size * 15 / 16
            gaps.setdefault(_memory_kind(row.name, ecc_on), []).append(
                size * (15 / 16 if ecc_on else 1) - reported["mib"]
            )
    return {kind: (statistics.median(found), len(found)) for kind, found in gaps.items()}


def datasheet_memory(row) -> tuple[int, str]:
    """A card with no driver figure: its datasheet GB read as GiB (GDDR "GB" are GiB), less 1/16 on a data-center
    GDDR card (ECC on by default), less the median reserve of the measured cards of its memory kind; bytes and the
    rule as its source says it."""
    ecc_on = _is(row.name, ECC_ON_MODELS)
    kind = _memory_kind(row.name, ecc_on)
    reserve, cards = memory_reserves()[kind]
    memory = int(row.memory_gb * 2**30 * (15 / 16 if ecc_on else 1) - reserve * 2**20)
    ecc = ", 1/16 off for ECC (on by default on data-center GDDR cards)," if ecc_on else ""
    said = (
        f"memory the datasheet's {row.memory_gb:g} GB read as GiB{ecc} less {reserve:g} MiB: no driver figure found, "
        f"so the median gap between that and nvidia-smi's total over the {cards} {kind} cards that have one "
        f"(data/gpu_memory.json)"
    )
    return memory, said


def uncalibrated(device: Device) -> str:
    """Why ``device`` has no calibration (``roofline.calibration_for`` gives None), naming what would give it one."""
    if device.kind != "cuda":
        return f"no calibration for {device.kind} devices yet"
    if device.architecture is None:
        return f'{device.name} names no architecture; add arch={"|".join(ARCHITECTURES)} (JSON: "architecture")'
    return f"no published run on a {device.architecture} GPU, or on a neighbouring architecture, is fitted yet"


def architecture_of(name: str) -> str | None:
    """A table GPU's architecture, by its name's model ("H100 SXM" -> hopper); None for another name."""
    for architecture, models in ARCHITECTURES.items():
        if _is(name, models):
            return architecture
    return None


def gpu_table(file: str) -> dict[str, dict]:
    """The rows of a ``data/`` file keyed by GPU row name, each alias resolved (``resolve_same_as``)."""
    rows = json.loads(resources.files("diffmeter.predict").joinpath("data", file).read_text())["gpus"]
    return resolve_same_as(rows, f"data/{file}")


def resolve_same_as(rows: dict[str, dict], where: str) -> dict[str, dict]:
    """``rows`` with each ``{"same_as": "other row"}`` (cards of one die sharing the figure, stated once) read as
    that row's entry; an alias of a missing row or of another alias is an error in the data file ``where``."""
    found = {}
    for name, entry in rows.items():
        target = entry.get("same_as")
        if target is not None and (target not in rows or "same_as" in rows[target]):
            raise ValueError(f"{where}: {name} is the same as {target!r}, which is not a stated row")
        found[name] = rows[target] if target is not None else entry
    return found


@functools.cache
def driver_memory() -> dict[str, dict]:
    """Each table GPU's memory as its driver reports it, with the nvidia-smi output it was read from."""
    return gpu_table("gpu_memory.json")


@functools.cache
def host_links() -> dict[str, dict]:
    """Each table GPU's host link and its rate per direction, with the datasheet line it was read from."""
    return gpu_table("host_links.json")


@functools.cache
def l2_caches() -> dict[str, dict]:
    """Each table GPU's L2 cache (MB) with the whitepaper line it was read from; absent where none states it."""
    return gpu_table("gpu_cache.json")


@functools.cache
def nvlinks() -> dict[str, dict]:
    """Each data-center GPU's NVLink: ``gb_s``, its per-GPU GB/s with both directions summed (None: the card has no
    NVLink), and the line it was read from; absent where none was found. For multi-GPU time (issue 46): no prediction
    reads it yet."""
    return gpu_table("gpu_nvlink.json")


@functools.cache
def board_power() -> dict[str, dict]:
    """Each table GPU's TDP (watts) with the datasheet line it was read from; absent where none was found."""
    return {name: figures for name, figures in gpu_table("gpu_power.json").items() if figures.get("tdp_w")}


def this_cpu(*dtypes: str) -> Device:
    """This machine's CPU at torch's thread count: matmul and convolution peaks (of ``dtypes`` alone when given)
    and copy rate measured, memory the system's."""
    import psutil

    from diffmeter.predict.cpu_peaks import cpu_peaks

    peaks = cpu_peaks(tuple({PRECISION[dtype] for dtype in dtypes}) or ("fp32", "bf16", "fp16"))
    busy = (
        f" while other processes used {peaks.others_cores:.1f} cores: may be low, every bound high"
        if peaks.busy
        else ""
    )
    return Device(
        name=f"CPU {peaks.cpu} ({units.counted(peaks.threads, 'thread')}; peaks measured {peaks.measured_on}{busy})",
        kind="cpu",
        memory_bytes=psutil.virtual_memory().total,
        bandwidth_bytes_per_s=peaks.bandwidth_bytes_per_s,
        tflops=peaks.tflops,
        source=f"measured here on {peaks.measured_on}: best matmul and convolution per dtype, best copy rate from "
        "1 MiB to 256 MiB (predict.cpu_peaks), stored for every later prediction; `diffmeter doctor "
        "--remeasure-cpu` measures again"
        + (
            ""
            if conv_key("fp32") in peaks.tflops
            else "; no convolution rate stored (measured before diffmeter "
            "measured them): convolutions are charged the matmul peak until remeasured"
        ),
    )


def other_cards(name: str | None) -> str | None:
    """What a short ``--gpu`` name left out ("a100": three more A100s; "rtx": every RTX, Ti and Super ones too), or
    that one cut inside a model number ("rtx 409") was read as the card it starts; None where its words name one row."""
    rows = [] if not name or is_this_cpu(name) else [row.name for row in _matching(name)]
    if len(rows) < 2:  # a model number cut short: a word of the card's name goes on with a digit
        last = (tokens(name or "") or [""])[-1]
        cut = rows and any(w.startswith(last) and w[len(last) : len(last) + 1].isdigit() for w in tokens(rows[0]))
        return f"--gpu {name} is read as the {rows[0]}, whose name it starts: name the card whole" if cut else None
    rows += [row.name for row in PEAKS if row.name not in rows and all(_holds(row, w) for w in tokens(name))]
    return f"--gpu {name} is the {rows[0]}; the table also has the {', '.join(rows[1:])}: name one for another card"
