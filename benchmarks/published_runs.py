"""A published figure as a run the time fit reads (``diffmeter.predict.fit_published.PublishedRun``): its predicted
work on its GPU at the settings its source states (those it does not state take its ``predict_with``), the eager bound
per operator kind from ``roofline.lower_bounds``, its attention on the kernel its stack ran, the host's counts, and
the harness it was measured by. Shared by the calibration scripts (published, techniques, quantized, offload)."""

from __future__ import annotations

from published_comparison import settings

from diffmeter.predict.attention_kernels import MEASURED, sdpa_default
from diffmeter.predict.calibration import shipped_power_exponent
from diffmeter.predict.fit_energy import EnergyRun
from diffmeter.predict.fit_published import GROUP_OF_KIND, GROUPS, PublishedRun, StageWork, era_of
from diffmeter.predict.gpu_spec import chosen_gpu
from diffmeter.predict.host_time import host_counts
from diffmeter.predict.operators import operator_work
from diffmeter.predict.power_limit import sustained
from diffmeter.predict.roofline import (
    TORCH_FP32,
    flop_rates,
    kernel_speedup,
    lower_bounds,
    missing_figures,
    stage_scores,
)
from diffmeter.predict.vae_decode import VAE_MODES
from diffmeter.spec import ProfileSpec

#: techniques whose time is not the eager operators on the GPU
LEFT_OUT = {"compile": "compiled", "offload-model": "offloaded: host transfers are outside the roofline"}


def stack_attention(stack: dict, architecture: str | None) -> str:
    """The kernel a figure's attention ran on: SDPA's default for its torch version and card where it ran SDPA or
    does not say (``sdpa_default``), a kernel with a measured ratio by name (cudnn, flash-attn-3: ``MEASURED``), else
    the flash-class kernel it names (flash-attn, xformers), the calibration's."""
    attention = stack.get("attention", "sdpa")
    if attention == "sdpa":
        return sdpa_default(architecture, stack.get("torch"))
    return attention if attention in MEASURED else "flash"


def source_of(figure: dict) -> str:
    """The harness a figure was measured by, so that one harness's pages are held out together: its source's title
    up to the first parenthesis, and up to its colon where it names a project's pages ("OneDiff: SD 1.5 example
    README" -> "OneDiff"); TeaCache's READMEs per model are one harness."""
    title = figure["source"]["title"].split(" (")[0]
    harness = title.split(":")[0] if ":" in title else title
    return "TeaCache" if harness.startswith("TeaCache4") else harness


def energy_run(figure: dict, run: PublishedRun) -> EnergyRun | None:
    """The run's published energy per output with its card's TDP, where the figure stores one."""
    energy, tdp = figure.get("published_energy"), chosen_gpu(figure["gpu"], None).tdp_w
    if not energy or tdp is None:
        return None
    return EnergyRun(run, energy["value"], settings(figure)[0]["batch_size"] or 1, tdp)


def published_run(figure: dict, exponent: float | None = None) -> tuple[PublishedRun | None, str]:
    """The run, or None and why it is left out; ``exponent``: the power limit's (``power_limit``), the shipped
    calibrations' where not given."""
    if not figure.get("usable", True):
        return None, "not usable"
    if figure.get("left_out_of_fit"):
        return None, figure["left_out_of_fit"]
    for technique in figure["techniques"]:
        if technique in LEFT_OUT:
            return None, LEFT_OUT[technique]
    return run_of(figure, exponent=exponent)


def run_of(figure: dict, transform=None, exponent: float | None = None) -> tuple[PublishedRun | None, str]:
    """The run of a figure whatever its techniques, its predicted work passed through ``transform`` first (a
    technique's effect on the operators: ``benchmarks/calibrate_techniques.py``), or None and why; its peaks at
    the share the card's TDP sustains to ``exponent`` (the shipped calibrations' where not given)."""
    chosen, _ = settings(figure)
    spec_text = figure.get("gpu_spec")
    device = chosen_gpu(None if spec_text else figure["gpu"], spec_text)
    table = chosen_gpu(figure["gpu"], None)  # the architecture of the row the figures are of
    spec = ProfileSpec(model=figure["model"], **{k: v for k, v in chosen.items() if v is not None})
    modes = tuple(t for t in figure["techniques"] if t in VAE_MODES)
    work = operator_work(spec, modes)  # a tiled or sliced decode: its own operators, the rest the plain run's
    work = transform(work) if transform else work
    fp32 = figure["source"].get("fp32", TORCH_FP32)  # how the run did float32 work: PyTorch's defaults unless said
    if missing_figures(device, work, fp32):
        return None, "the GPU's figures lack a peak of a dtype the run uses, or the bandwidth"
    exponent = shipped_power_exponent() if exponent is None else exponent
    if exponent is None:
        raise SystemExit("efficiency.json has no power_exponent: run python benchmarks/calibrate_published.py first")
    rates = flop_rates(sustained(device, exponent), work, fp32)  # the expected time's input: what the TDP sustains
    kernel = kernel_speedup(work, table.architecture, stack_attention(figure.get("stack") or {}, table.architecture))
    bounds = lower_bounds(work, rates, device.bandwidth_bytes_per_s, device.l2_bytes, kernel)
    hosts = host_counts(work)
    stages = {}
    covered = ("denoising",) if figure.get("covers") == "denoising" else tuple(bounds)
    for stage, kinds in bounds.items():
        if stage not in covered:
            continue
        groups = dict.fromkeys(GROUPS, 0.0)
        for kind, (seconds, _) in kinds.items():
            groups[GROUP_OF_KIND[kind]] += seconds
        kernels = int(sum(count for _, count in kinds.values()))
        stages[stage] = StageWork(groups, stage_scores(work, stage, kernel), kernels, **hosts[stage])
    run = PublishedRun(
        id=figure["id"],
        source=source_of(figure),
        architecture=table.architecture,
        model=figure["model"],
        published_s=figure["published"]["value"],
        stages=stages,
        whole_call=figure.get("covers") is None,
        era=era_of(figure.get("stack") or {}),
    )
    return run, ""
