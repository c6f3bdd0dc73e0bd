"""The techniques that change the expected time and not the memory prediction, applied to a generation's operator
work: torch.compile per mode (``compiled_time``), the attention kernel (``attention_kernels``) and the denoiser caches
(``cache_time``). ``profile --gpu`` and bench's stored prediction both go through ``timed_work``; what it cannot time
it names, for ``time_left_out``.
"""

from __future__ import annotations

from diffmeter.predict.attention_kernels import kernel_of, with_kernel
from diffmeter.predict.attention_kernels import why_untimed as kernel_untimed
from diffmeter.predict.cache_time import CACHES, cache_skip
from diffmeter.predict.cache_time import label as cache_label
from diffmeter.predict.cache_time import why_untimed as cache_untimed
from diffmeter.predict.compiled_time import compiled_work
from diffmeter.predict.schema import OperatorWork

#: the optimizations (``optimize`` names) that act on the time alone: no memory technique, nothing to refuse
TIME_ONLY = ("compile", "sdpa-kernel", "attention", *CACHES)

#: what the held-out test of these techniques found (benchmarks/calibrate_techniques.py, its committed output
#: benchmarks/results/calibration_techniques.md, 2026-12-01): the claim printed beside such a time
HELD_OUT = (
    "held out by source (the eager calibration and its power exponent fitted without it), 121 of 183 published runs "
    "(66%) fell inside such a range, midpoint median error 13.9%: compile's default mode 50% (3 of 6), "
    "reduce-overhead 52%, attention without SDPA 69%, xformers and flash-attn 70%; 61 of the 62 misses predicted "
    "too fast, most in Lambda Labs' 2022 benchmark on A100 PCIe cards and the RTX A6000 and on the diffusers PyTorch "
    "2.0 page's A100 and V100, whose eager runs miss alike; against the same source's eager run the predicted "
    "speed-up is off by 4.1% (median of 61 runs; reduce-overhead 10.2%, too optimistic); 27 runs compiled with "
    "graph breaks left out "
    "(benchmarks/results/calibration_techniques.md)"
)


def label(name: str, params: dict) -> str:
    """A technique as the prediction names it: "compile mode=reduce-overhead", "sdpa-kernel math"."""
    if name == "compile":
        return f"compile mode={params.get('mode', 'default')}"
    if name in CACHES:
        return cache_label(name, params)
    value = params.get("kernel", "flash") if name == "sdpa-kernel" else params.get("backend", "native")
    return f"{name} {value}"


#: the one mode the CPU calibration's compiled fits were made with (benchmarks/roofline_cpu_variants.py): on a CPU
#: inductor runs the fused operators as its own C++ loops (convolutions channels-last, torch/_inductor/graph.py
#: ``decide_layout_opt``), priced by those fits (``Calibration.variants``); the CUDA-graph modes' replay is no CPU's
CPU_COMPILE_MODE = "default"


def why_untimed(name: str, params: dict, on_cpu: bool = False) -> str | None:
    """Why a time-only technique's effect is not modelled (``on_cpu``: on this CPU), or None where it is."""
    if name == "compile":
        backend = params.get("backend", "inductor")
        if backend != "inductor":
            return f"the {backend} backend (inductor's fusion is what is modelled)"
        if params.get("regional"):  # the repeated blocks compiled, each its own graph; the rest of the call eager
            return "regional compilation (the whole denoiser compiled is what is modelled)"
        mode = params.get("mode", "default")
        if on_cpu and mode != CPU_COMPILE_MODE:
            return f"on a CPU only mode={CPU_COMPILE_MODE} was fitted (benchmarks/roofline_cpu_variants.py)"
        return None
    if name in CACHES:
        return cache_untimed(name)
    if kernel_of(name, params) is None:
        return kernel_untimed(params.get("backend", "")) if name == "attention" else "not modelled"
    return None


def timed_work(
    work: OperatorWork, asked: list[tuple[str, dict]], denoisers: tuple[str, ...], spec=None, on_cpu: bool = False
) -> tuple[OperatorWork, list[str], list[str]]:
    """``work`` with each time-only technique in ``asked`` ((name, params) of the optimizations) applied that is
    modelled (``on_cpu``: timed on this CPU); (work, labels timed, "label: why" of those not). A cache needs the
    ``spec`` (its blocks' shares)."""
    timed, untimed = [], []
    for name, params in asked:
        if name not in TIME_ONLY:
            continue
        if why := why_untimed(name, params, on_cpu):
            untimed.append(f"{label(name, params)}: {why}")
            continue
        if name in CACHES:  # timed at both ends of its skipped share (predict.cache_time)
            work = work.model_copy(update={"cache": cache_skip(work, name, params, denoisers, spec)})
        elif name == "compile":
            components = tuple(params.get("components") or denoisers)
            work = compiled_work(work, components, params.get("mode", "default"))
        else:  # sdpa-kernel: every SDPA call of the pipeline; a diffusers backend: the denoisers' attention
            work = with_kernel(work, kernel_of(name, params), None if name == "sdpa-kernel" else denoisers)
        timed.append(label(name, params))
    return work, timed, untimed


def without_untimed(time, left_out: list[tuple[str, bool]]):
    """``time`` as far as it holds with techniques left out of it (``left_out``: "label: why" and whether the
    technique can make the run faster): unchanged without any; None where one can make it faster (its lower and
    ideal bounds no longer bound the run); else (it can only slow the run: an offload's untimed transfers) its bounds
    kept, with no expected range and no energy, which would be the pipeline's without it."""
    if not left_out or time is None:
        return time
    if any(faster for _, faster in left_out):
        return None
    names = ", ".join(said.split(": ")[0] for said, _ in left_out)
    gone = f"no expected range: {names} left out of the time (its bounds still hold: it can only slow the run)"
    stages = [stage.model_copy(update={"expected_s": None, "gpu_s": None, "host_s": None}) for stage in time.stages]
    return time.model_copy(
        update={"stages": stages, "expected_s": None, "outside_stages_s": None, "busy_share": None, "energy": None,
                "energy_left_out": gone, "calibration": gone}
    )  # fmt: skip
