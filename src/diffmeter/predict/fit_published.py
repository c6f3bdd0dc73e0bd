"""The expected time range of eager runs on CUDA GPUs, fitted on published, measured runs
(``benchmarks/calibrate_published.py`` reads benchmarks/published_figures.yaml and writes the fit into
``data/efficiency.json``: one calibration per GPU architecture, one for the host).

Model. Per stage (text encoding, denoising, VAE decode), the GPU's time and the host's, overlapped as CUDA's
asynchronous launch overlaps them: the stage takes the longer of the two.
- GPU, per architecture: the sum over operator kind groups (``GROUPS``) of a_group x the eager bound of the group's
  operators + score_s x its attention scores (softmax exponentials, on the special-function units) + gap_s x its
  kernels (the GPU's own cost per kernel). a = 1 / the fraction of the roofline a group achieves, so a >= 1 (the
  matmuls' a at least the inverse of a bare matmul's measured fraction, ``BARE_MATMUL_FRACTION``).
- Host, one for every architecture (the CPU issuing the work, not the GPU): op_s x every dispatched ATen operator
  (views too) + module_s x the ``nn.Module`` calls + step_s x the denoiser calls (the scheduler's step and the
  loop's own work).
- Plus call_s once per pipeline call: its work outside the components (latents, timesteps, postprocessing).
Fitted jointly by least squares on relative errors (each run counts alike, whatever its length). An architecture with
fewer than ``FULL_MODEL_ROWS`` runs or ``FULL_MODEL_MODELS`` models scales its nearest fully fitted neighbour's GPU
fit by one factor and has its own cost per kernel (``calibration.NEIGHBOURS``), or has one multiplier for all its
groups where there is none.
The software stack: with ``eras``, the fit also gives each torch era its sources state (``era_of``) a factor on
the GPU's time, relative to ``REFERENCE_ERA``; ``benchmarks/calibrate_published.py`` reports it and its held-out
effect beside the shipped fit, which has none.

The range: the midpoint times [1 / w, w], hi / lo = w^2 = 1.5 (``RANGE_FACTOR``, not fitted), widened per
architecture where fewer than ``LEAST_INSIDE`` (80%) of its fitted runs would fall inside it; the validation below
measures how many held-out runs it holds.
Validation (``fit_holdout``) leaves one source out at a time (every architecture refitted without it), or one model
where a single source measured every run of an architecture: the held-out runs against the range fitted without
them.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

import numpy as np
from scipy.optimize import lsq_linear, minimize_scalar

from diffmeter.predict.calibration import Calibration, neighbours_of
from diffmeter.predict.host_time import ISSUED, HostCalibration

#: the operator kinds fitted together, each group with its own multiplier
GROUPS = {
    "matmul": ("matmul",),
    "convolution": ("convolution",),
    "attention": ("attention",),
    "normalization": ("normalization",),
    "elementwise": ("elementwise",),
    "other": ("other",),
}
GROUP_OF_KIND = {kind: group for group, kinds in GROUPS.items() for kind in kinds}
#: the host's terms, one figure each for every architecture
HOST_TERMS = ("op_s", "module_s", "step_s", "call_s")
COVERAGE = 0.95
#: the time range's factor w (hi / lo 1.5), and the share of the fitted runs it must hold, else it is widened
RANGE_FACTOR, LEAST_INSIDE = math.sqrt(1.5), 0.8
#: the least runs and models for a multiplier per group: three times the architecture's 8 parameters, 4 models
FULL_MODEL_ROWS, FULL_MODEL_MODELS = 24, 4
#: per architecture, the highest fraction of the table's dense bf16 peak a bare 8192^3 bf16 matmul reached,
#: measured: no eager matmul beats it. Hopper: 782-802 TFLOP/s of the H200's 989.5 in five runs
#: (benchmarks/results/gpu_validation_nvidia-h200.md, the peak chunk, CUDA events)
BARE_MATMUL_FRACTION = {"hopper": 802 / 989.5}
#: each parameter's unit in the least squares, so the columns are alike in size: multipliers 1, seconds per 10^12
#: scores, microseconds per kernel, per dispatched operator, per module call; milliseconds per step and per call
SCALE = {"score_s": 1e-12, "gap_s": 1e-6, "op_s": 1e-6, "module_s": 1e-6, "step_s": 1e-3, "call_s": 1e-3}
#: rounds of refitting: an architecture that scales its lender's fit, and the eras' factors
OUTER_ROUNDS = 4
#: the era every other's GPU-time factor is relative to, and the bounds of a factor
REFERENCE_ERA, ERA_BOUNDS = "torch 2.7+", (0.5, 2.0)
#: torch eras by (major, minor), first and last: before SDPA (1.x), SDPA without FlashAttention-2 (2.0-2.1), with
#: it (2.2-2.6), with cuDNN's attention and FlashAttention-3-era kernels (2.7+)
ERAS = {
    "torch 1.x": ((1, 0), (1, 99)),
    "torch 2.0-2.1": ((2, 0), (2, 1)),
    "torch 2.2-2.6": ((2, 2), (2, 6)),
    REFERENCE_ERA: ((2, 7), (99, 99)),
}

#: at most this many rounds of choosing each stage's longer side and solving, from each of these multiples of the
#: host's starting terms
MAX_ROUNDS, STARTS = 30, (0.25, 1.0, 4.0)
START = {"score_s": 0.5, "gap_s": 2.0, "op_s": 4.0, "module_s": 20.0, "step_s": 0.5, "call_s": 10.0}


@dataclass(frozen=True)
class StageWork:
    """One stage's work over a generation: the eager bound per kind group (seconds), attention scores (those run on a
    faster kernel than the calibration's divided by its ratio, ``roofline.stage_scores``), kernels, and what the host
    issues (dispatched operators, module calls, denoiser calls)."""

    bounds: dict[str, float] = field(hash=False)
    scores: float = 0.0
    kernels: int = 0
    dispatched: int = 0
    modules: int = 0
    steps: int = 0


@dataclass(frozen=True)
class PublishedRun:
    """One published eager run with its predicted work per stage."""

    id: str
    source: str
    architecture: str
    model: str
    published_s: float
    stages: dict[str, StageWork] = field(hash=False)
    #: False where the published time covers only some stages (``stages`` has those): no pipeline call's own work
    whole_call: bool = True
    #: the software stack's era the source states (``era_of``), "" where it does not
    era: str = ""

    @property
    def eager_s(self) -> float:
        """The whole eager bound (seconds)."""
        return sum(sum(stage.bounds.values()) for stage in self.stages.values())


@dataclass(frozen=True)
class GpuFit:
    """One architecture's a per kind group (>= 1), seconds per attention score and per kernel, and range factor."""

    multipliers: dict[str, float] = field(hash=False)
    score_s: float
    gap_s: float
    width: float = 1.0

    def seconds(self, stage: StageWork) -> float:
        eager = sum(self.multipliers[group] * seconds for group, seconds in stage.bounds.items())
        return eager + self.score_s * stage.scores + self.gap_s * stage.kernels


@dataclass(frozen=True)
class HostFit:
    """Seconds per dispatched operator, per module call, per denoiser call, and per pipeline call."""

    op_s: float
    module_s: float
    step_s: float
    call_s: float

    def seconds(self, stage: StageWork) -> float:
        return sum(getattr(self, term) * getattr(stage, count) for term, count in ISSUED.items())


@dataclass(frozen=True)
class Fit:
    """Every architecture's GPU fit and the host's."""

    gpus: dict[str, GpuFit] = field(hash=False)
    host: HostFit
    #: the GPU time's factor per software era (``era_of``), 1 for ``REFERENCE_ERA`` and an era not fitted
    eras: dict[str, float] = field(default_factory=dict, hash=False)

    def era_factor(self, run: PublishedRun) -> float:
        return self.eras.get(run.era, 1.0)

    def parts(self, run: PublishedRun, gpu: GpuFit | None = None) -> tuple[float, float]:
        """(GPU-busy seconds, whole seconds) of ``run``'s midpoint: per stage the longer of the GPU's and the
        host's time, plus the call's own; ``gpu``: another architecture's fit than the run's own."""
        gpu, k = gpu or self.gpus[run.architecture], self.era_factor(run)
        busy = sum(k * gpu.seconds(stage) for stage in run.stages.values())
        whole = sum(max(k * gpu.seconds(stage), self.host.seconds(stage)) for stage in run.stages.values())
        return busy, whole + self.host.call_s * run.whole_call

    def midpoint(self, run: PublishedRun, gpu: GpuFit | None = None) -> float:
        return self.parts(run, gpu)[1]

    def busy_share(self, run: PublishedRun) -> float:
        """The share of the midpoint the GPU is busy (the rest it waits for the host)."""
        busy, whole = self.parts(run)
        return min(1.0, busy / whole)

    def range(self, run: PublishedRun, gpu: GpuFit | None = None) -> tuple[float, float]:
        middle, width = self.midpoint(run, gpu), (gpu or self.gpus[run.architecture]).width
        return middle / width, middle * width


def full_model(runs: list[PublishedRun]) -> bool:
    return len(runs) >= FULL_MODEL_ROWS and len({run.model for run in runs}) >= FULL_MODEL_MODELS


def lender_of(architecture: str, full: set[str]) -> str | None:
    """The nearest architecture with a full model that ``architecture`` borrows the shape of
    (``calibration.NEIGHBOURS``), or None."""
    return next((lender for lender in neighbours_of(architecture) if lender in full), None)


class Layout:
    """Where each architecture's parameters and the host's sit in the least squares' vector. An architecture with
    too few runs for a multiplier per group scales its lender's GPU fit in ``reference`` (one factor: the shape of
    a neighbour, the speed of its own runs) and has its own cost per kernel, or has one multiplier for all its
    groups where there is none."""

    def __init__(self, runs: list[PublishedRun], reference: Fit | None = None) -> None:
        self.names: list[tuple[str, str]] = [("host", term) for term in HOST_TERMS]
        architectures = sorted({run.architecture for run in runs})
        self.full = {a: full_model([run for run in runs if run.architecture == a]) for a in architectures}
        full = {a for a, is_full in self.full.items() if is_full}
        self.lenders = {
            a: lender for a in architectures if not self.full[a] and reference and (lender := lender_of(a, full))
        }
        self.reference = reference
        for architecture in architectures:
            if self.full[architecture]:
                names = [*GROUPS, "score_s", "gap_s"]
            else:
                names = ["scale", "gap_s"] if architecture in self.lenders else ["all"]
            self.names += [(architecture, name) for name in names]

    def lent(self, architecture: str) -> GpuFit:
        """The lender's GPU fit ``architecture`` scales."""
        return self.reference.gpus[self.lenders[architecture]]

    def bounds(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Each parameter's least value and none greatest, and where the search starts."""
        lower, start = [], []
        for architecture, name in self.names:
            if name in SCALE:
                least, first = 0.0, START[name]
            elif name == "scale":  # no group's multiplier under 1
                least = 1.0 / min(self.lent(architecture).multipliers.values())
                first = max(least, 1.0)
            else:
                least = 1.0 / BARE_MATMUL_FRACTION.get(architecture, 1.0) if name in ("matmul", "all") else 1.0
                first = max(least, 2.0)
            lower.append(least)
            start.append(first)
        return np.array(lower), np.full(len(lower), np.inf), np.array(start)

    def unpack(self, x: np.ndarray, eras: dict[str, float] | None = None) -> Fit:
        values: dict[str, dict[str, float]] = {}
        for (owner, name), value in zip(self.names, x, strict=True):
            values.setdefault(owner, {})[name] = value * SCALE.get(name, 1.0)
        host = HostFit(**values.pop("host"))
        gpus = {}
        for architecture, found in values.items():
            if "scale" in found:
                lent, k = self.lent(architecture), found["scale"]
                gpus[architecture] = GpuFit(
                    {g: k * a for g, a in lent.multipliers.items()}, k * lent.score_s, found["gap_s"]
                )
            elif "all" in found:
                gpus[architecture] = GpuFit(dict.fromkeys(GROUPS, found["all"]), 0.0, 0.0)
            else:
                gpus[architecture] = GpuFit({g: found[g] for g in GROUPS}, found["score_s"], found["gap_s"])
        return Fit(gpus, host, dict(eras or {}))


def design_row(layout: Layout, run: PublishedRun, on_host: dict[str, bool], era: float = 1.0) -> np.ndarray:
    """The run's time as a linear function of the parameters (in ``SCALE`` units), each stage on the side
    ``on_host`` puts it: the GPU's features of the run's architecture, or the host's."""
    row = np.zeros(len(layout.names))
    column = {name: index for index, name in enumerate(layout.names)}
    architecture = run.architecture
    for name, stage in run.stages.items():
        if on_host[name]:
            for term, count in ISSUED.items():
                row[column["host", term]] += getattr(stage, count) * SCALE[term]
            continue
        if architecture in layout.lenders:
            lent = layout.lent(architecture)
            row[column[architecture, "scale"]] += era * (lent.seconds(stage) - lent.gap_s * stage.kernels)
            row[column[architecture, "gap_s"]] += era * stage.kernels * SCALE["gap_s"]
            continue
        for group, seconds in stage.bounds.items():
            row[column[architecture, group if layout.full[architecture] else "all"]] += era * seconds
        if layout.full[architecture]:
            row[column[architecture, "score_s"]] += era * stage.scores * SCALE["score_s"]
            row[column[architecture, "gap_s"]] += era * stage.kernels * SCALE["gap_s"]
    row[column["host", "call_s"]] += SCALE["call_s"] * run.whole_call
    return row


def sides(found: Fit, run: PublishedRun) -> dict[str, bool]:
    """Per stage, whether the host's time is the longer under ``found``."""
    gpu = found.gpus[run.architecture]
    return {name: found.host.seconds(stage) > gpu.seconds(stage) for name, stage in run.stages.items()}


def solve_sides(
    runs: list[PublishedRun], layout: Layout, found: Fit, lower: np.ndarray, upper: np.ndarray
) -> tuple[float, Fit]:
    """From ``found``: each stage put on its longer side, the parameters solved, until no stage moves; the best
    (squared relative error, fit) seen."""
    published = np.array([run.published_s for run in runs])
    best, seen = None, set()
    for _ in range(MAX_ROUNDS):
        chosen = [sides(found, run) for run in runs]
        key = tuple(tuple(sorted(side.items())) for side in chosen)
        if key in seen:
            break
        seen.add(key)
        matrix = np.array(
            [design_row(layout, run, side, found.era_factor(run)) for run, side in zip(runs, chosen, strict=True)]
        )
        solved = lsq_linear(matrix / published[:, None], np.ones(len(runs)), bounds=(lower, upper), tol=1e-12)
        found = layout.unpack(solved.x, found.eras)
        error = float(np.sum((np.array([found.midpoint(run) for run in runs]) / published - 1) ** 2))
        if best is None or error < best[0]:
            best = (error, found)
    return best


def fit(runs: list[PublishedRun], eras: bool = False) -> Fit:
    """Every architecture's model and the host's fitted on ``runs`` together, each architecture's range factor
    from its own runs. The time is linear in the parameters once each stage's longer side is known: solved by
    bounded linear least squares on relative errors, each stage then put on the side the answer makes longer, until
    no stage moves (the best answer kept where sides keep moving). The first round leaves out the runs of
    architectures that will borrow a shape, so that the shapes they scale are their lenders' own.
    ``eras``: each stated torch era's factor too."""
    full = {a for a, is_full in Layout(runs).full.items() if is_full}
    borrowing = {run.architecture for run in runs} - full
    borrowing = {a for a in borrowing if lender_of(a, full)}
    found = None
    for _ in range(OUTER_ROUNDS):  # a lender's or an era's factor moved: the rest again
        fitted = runs if found else [run for run in runs if run.architecture not in borrowing] or runs
        layout = Layout(fitted, found)
        lower, upper, start = layout.bounds()
        known = found.eras if found else {}
        best = None
        for factor in STARTS:  # the host's terms from several starts: the sides first chosen decide where it ends
            host = np.array([factor if owner == "host" else 1.0 for owner, _ in layout.names])
            tried = solve_sides(fitted, layout, layout.unpack(start * host, known), lower, upper)
            if best is None or tried[0] < best[0]:
                best = tried
        found = dataclasses.replace(best[1], eras=fit_eras(fitted, best[1]) if eras else {})
    widths = {}
    for architecture, gpu in found.gpus.items():
        ratios = [found.midpoint(run) / run.published_s for run in runs if run.architecture == architecture]
        widths[architecture] = GpuFit(
            gpu.multipliers, gpu.score_s, gpu.gap_s, max(RANGE_FACTOR, covering(ratios, LEAST_INSIDE))
        )
    return Fit(widths, found.host, found.eras)


def era_of(stack: dict) -> str:
    """The torch era of a published stack (``{"torch": "2.1.0", ...}``), "" where the source does not say."""
    if not stack.get("torch"):
        return ""
    version = tuple(int(part) for part in str(stack["torch"]).split(".")[:2])
    return next(name for name, (low, high) in ERAS.items() if low <= version <= high)


def fit_eras(runs: list[PublishedRun], found: Fit) -> dict[str, float]:
    """Each software era's factor on the GPU's time (``REFERENCE_ERA`` 1), the rest of ``found`` held: the
    factor minimizing its runs' squared relative errors, for an era two sources or more measured."""
    eras = {}
    for era in sorted({run.era for run in runs} - {REFERENCE_ERA}):
        mine = [run for run in runs if run.era == era]
        if era == "" or len({run.source for run in mine}) < 2:
            continue

        def error(k: float, mine: list[PublishedRun] = mine, era: str = era) -> float:
            trial = dataclasses.replace(found, eras={**found.eras, era: k})
            return sum((trial.midpoint(run) / run.published_s - 1) ** 2 for run in mine)

        eras[era] = float(minimize_scalar(error, bounds=ERA_BOUNDS, method="bounded").x)
    return eras


def covering(ratios: list[float], share: float = COVERAGE) -> float:
    """The smallest factor w with ``share`` of the predicted / published ``ratios`` inside [1 / w, w]."""
    spread = sorted(max(ratio, 1 / ratio) for ratio in ratios)
    return spread[min(len(spread) - 1, math.ceil(share * len(spread)) - 1)] * (1 + 1e-9)  # the edge run inside


def as_calibration(found: Fit, architecture: str, source: str, runs: list[PublishedRun]) -> Calibration:
    """``architecture``'s fit as achieved fractions per kind ([lowest, highest]), its per-kernel and per-score
    costs and the host's terms as ranges, and the least eager bound per kernel among its runs: the range
    ``roofline.predict_time`` computes from them is the midpoint times [1 / w, w]. A highest fraction may pass 1
    (a kind fitted at its bound); ``roofline.predict_time`` keeps a range from going under the eager bound."""
    gpu = found.gpus[architecture]
    w = gpu.width
    fractions = {kind: (1 / (gpu.multipliers[g] * w), w / gpu.multipliers[g]) for kind, g in GROUP_OF_KIND.items()}
    host = HostCalibration(
        **{term: (getattr(found.host, term) / w, getattr(found.host, term) * w) for term in HOST_TERMS}
    )
    mine = [run for run in runs if run.architecture == architecture]
    kernels = [sum(stage.kernels for stage in run.stages.values()) for run in mine]
    least = min(run.eager_s / count for run, count in zip(mine, kernels, strict=True) if count)
    return Calibration(
        source=source,
        fractions=fractions,
        overhead_s=(gpu.gap_s / w, gpu.gap_s * w),
        score_s=(gpu.score_s / w, gpu.score_s * w),
        least_bound_per_operator_s=least,
        host=host,
    )
