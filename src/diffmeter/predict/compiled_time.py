"""torch.compile's effect on the work the expected time is computed from: the compiled components' operators and
host issue counted as the compiled code runs them, so the calibrated eager range (``roofline.predict_time``)
applies to the result unchanged.

Mechanism, per compiled call (the denoiser unless other components are named):
- inductor leaves matmuls, convolutions and attention to their libraries (cuBLAS, cuDNN, SDPA: ``EXTERN_KINDS``,
  their work unchanged) and fuses each chain of the other operators (pointwise, reductions, copies:
  ``FUSED_KINDS``) between two of them into one generated kernel (``CallWork.fused_chains``, counted in the order
  the operators run; on a tiny SD UNet 53 chains where inductor emits 57 kernels on CPU, tiny FLUX 22 for 23:
  tests/test_compiled_time.py). Each fused kernel reads its chain's inputs once and writes its outputs once (the
  intermediates stay in registers), moving what one of the eager operators it replaces moves on average: the fused
  kinds' kernels and bytes shrink by the same ratio.
- the host no longer dispatches ATen operators nor calls modules inside the graph: without CUDA graphs it
  launches each kernel of the compiled code (one dispatched operator per kernel, one call of the compiled
  function); with CUDA graphs (``CUDA_GRAPH_MODES``) it replays the recorded graph, one launch per call.
"""

from __future__ import annotations

from collections import defaultdict

from diffmeter.predict.schema import CallWork, OperatorGroup, OperatorWork

#: operator kinds inductor leaves to their libraries (extern kernels), and those it fuses into generated kernels
EXTERN_KINDS = ("matmul", "convolution", "attention")
FUSED_KINDS = ("elementwise", "normalization", "other")
#: torch.compile modes that record CUDA graphs (the host replays a graph per call)
CUDA_GRAPH_MODES = ("reduce-overhead", "max-autotune")


def fused_kernels(call: CallWork) -> tuple[int, int]:
    """(eager operators of the fused kinds, kernels inductor makes of them) in one call: a kernel per chain, or,
    for a call whose chains were not counted (a parallel rank's), at most one per gap between library kernels."""
    eager = sum(g.calls for g in call.operators if g.kind in FUSED_KINDS)
    extern = sum(g.calls for g in call.operators if g.kind in EXTERN_KINDS)
    chains = call.fused_chains if call.fused_chains is not None else extern + 1
    return eager, min(eager, chains)


def fused_call(call: CallWork) -> list[OperatorGroup]:
    """``call``'s operators as compiled: library kernels as they are; per fused kind and dtype one group of the
    kind's share of the fused kernels, each moving the kind's average bytes per eager operator."""
    eager, kernels = fused_kernels(call)
    kept = [g for g in call.operators if g.kind not in FUSED_KINDS]
    if not eager:
        return kept
    totals: dict[tuple[str, str | None], list[int]] = defaultdict(lambda: [0, 0, 0])  # calls, FLOPs, bytes
    for group in call.operators:
        if group.kind in FUSED_KINDS:
            total = totals[group.kind, group.dtype]
            total[0] += group.calls
            total[1] += group.flops * group.calls
            total[2] += group.bytes * group.calls
    fused = []
    for (kind, dtype), (calls, flops, moved) in totals.items():
        share = max(1, round(kernels * calls / eager))  # this kind's fused kernels, each as an average operator
        fused.append(OperatorGroup(kind=kind, flops=flops // share, bytes=moved // calls, calls=share, dtype=dtype))
    return kept + fused


def compiled_call(call: CallWork, mode: str) -> CallWork:
    """One compiled call: its fused operators, and what the host issues for it (``host_time``)."""
    operators = fused_call(call)
    if mode in CUDA_GRAPH_MODES:  # a graph replay: one launch, one call of the compiled function
        dispatched = 1
    else:  # the compiled code launches every kernel itself
        dispatched = sum(g.calls for g in operators)
    return call.model_copy(update={"operators": operators, "dispatched": dispatched, "modules": 1})


def compiled_work(work: OperatorWork, components: tuple[str, ...], mode: str = "default") -> OperatorWork:
    """``work`` with every call of ``components`` as ``torch.compile(mode=mode)`` runs it."""
    calls = [compiled_call(call, mode) if call.component in components else call for call in work.calls]
    return work.model_copy(update={"calls": calls})
