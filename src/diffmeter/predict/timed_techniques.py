"""The techniques that change the expected time and not the memory prediction, applied to a generation's operator
work: torch.compile per mode (``compiled_time``) and the attention kernel (``attention_kernels``). ``profile --gpu``
and bench's stored prediction both go through ``timed_work``; what it cannot time it names, for ``time_left_out``.
"""

from __future__ import annotations

from diffmeter.predict.attention_kernels import kernel_of, with_kernel
from diffmeter.predict.compiled_time import compiled_work
from diffmeter.predict.schema import OperatorWork

#: the optimizations (``optimize`` names) that act on the time alone: no memory technique, nothing to refuse
TIME_ONLY = ("compile", "sdpa-kernel", "attention")

#: what the held-out test of these techniques found (benchmarks/calibrate_techniques.py, its committed output
#: benchmarks/results/calibration_techniques.md, 2026-11-29): the claim printed beside such a time
HELD_OUT = (
    "held out by source, 13 of 19 published runs (68%) fell inside such a range, midpoint median error 11.1%; "
    "compile's default mode 80%, reduce-overhead 58% (predicted too fast; benchmarks/results/"
    "calibration_techniques.md)"
)


def label(name: str, params: dict) -> str:
    """A technique as the prediction names it: "compile mode=reduce-overhead", "sdpa-kernel math"."""
    if name == "compile":
        return f"compile mode={params.get('mode', 'default')}"
    value = params.get("kernel", "flash") if name == "sdpa-kernel" else params.get("backend", "native")
    return f"{name} {value}"


def why_untimed(name: str, params: dict) -> str | None:
    """Why a time-only technique's effect is not modelled, or None where it is."""
    if name == "compile":
        backend = params.get("backend", "inductor")
        return None if backend == "inductor" else f"the {backend} backend (inductor's fusion is what is modelled)"
    if kernel_of(name, params) is None:
        return "no published runs separate this kernel's time"
    return None


def timed_work(
    work: OperatorWork, asked: list[tuple[str, dict]], denoisers: tuple[str, ...]
) -> tuple[OperatorWork, list[str], list[str]]:
    """``work`` with each time-only technique in ``asked`` ((name, params) of the optimizations) applied that is
    modelled; (work, labels timed, "label: why" of those not)."""
    timed, untimed = [], []
    for name, params in asked:
        if name not in TIME_ONLY:
            continue
        if why := why_untimed(name, params):
            untimed.append(f"{label(name, params)}: {why}")
            continue
        if name == "compile":
            components = tuple(params.get("components") or denoisers)
            work = compiled_work(work, components, params.get("mode", "default"))
        else:  # sdpa-kernel: every SDPA call of the pipeline; a diffusers backend: the denoisers' attention
            work = with_kernel(work, kernel_of(name, params), None if name == "sdpa-kernel" else denoisers)
        timed.append(label(name, params))
    return work, timed, untimed
