"""torch.compile's effect on the work the expected time is computed from: the compiled components' operators and
host issue counted as the compiled code runs them, so the calibrated eager range (``roofline.predict_time``)
applies to the result unchanged.

Mechanism, per compiled call (the denoiser unless other components are named):
- inductor leaves matmuls, convolutions and attention to their libraries (cuBLAS, cuDNN, SDPA: ``EXTERN_KINDS``,
  their work unchanged) and fuses each chain of the other operators (pointwise, reductions, copies:
  ``FUSED_KINDS``) between two of them into one generated kernel (``CallWork.fused_chains``, counted in the order
  the operators run; on a tiny SD UNet 53 chains where inductor emits 57 kernels on CPU, tiny FLUX 22 for 23:
  tests/test_compiled_time.py). Each fused kernel reads once each tensor its chain takes from outside it and
  writes once each tensor it makes that is used outside it; the intermediates stay in registers. Those bytes are
  counted from the operators' storages as they run (``CallWork.fused_bytes``, ``fused_bytes.FusedBytes``), the
  rule inductor's own estimate follows (torch 2.13 torch/_inductor/scheduler.py:1680-1820,
  ``get_read_write_buffer_accesses``: a fused node's buffers once each, its writes no other node reads dropped),
  and shared among the fused kinds by their eager bytes. On this CPU, against that estimate for inductor's
  generated kernels (with the re-read below; tests/test_compiled_time.py, slow): tiny FLUX's transformer -3.9%,
  tiny SD's UNet -14.0%, SD 1.5's at 256 px -13.9% (float32, random weights), where one eager operator's average
  per kernel (the rule before the count, still used for a call counted without it) gave -61%, -30% and -33%. The
  UNets compiled without the channels-last layout inductor always picks for convolutions on a CPU
  (torch/_inductor/graph.py:766-776), whose conversion kernels are no chain's work (with it tiny SD's is -43%);
  what remains is inductor fusing less than a chain (a reduction and the pointwise ops after it in two kernels).
- a normalization is a reduction whose output every element of its input needs: a chain's kernel computes the
  statistics over the input, then reads the input again to normalize it (a second loop over the reduction in the
  same Triton kernel, or a new kernel when the reduction is split in two for want of rows:
  torch/_inductor/codegen/simd.py ``can_fuse``, ir.py ``Reduction.num_splits``, choices.py
  ``reduction_split_factor``). Eager PyTorch's normalization kernel does that read inside the one operator counted,
  so each compiled normalization moves its input once more (``REREAD_SHARE`` of its counted bytes) than the fused
  bytes say: the dataflow, like inductor's estimate, reads each input once ("in theory, it only needs to access its
  input once": scheduler.py:1687-1689). A reduction whose row stays in registers (a persistent one, rows of at most
  1024 values: choices.py ``should_use_persistent_reduction``) does not re-read; the count does not separate those,
  so they are charged it.
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
#: the share of a normalization operator's counted bytes (its input read, its output written) that is its input:
#: what the compiled kernel reads again after the statistics
REREAD_SHARE = 0.5
#: the operator kinds that are reductions over their input before an elementwise pass over it
REDUCTION_KINDS = ("normalization",)


def fused_kernels(call: CallWork) -> tuple[int, int]:
    """(eager operators of the fused kinds, kernels inductor makes of them) in one call: a kernel per chain, or,
    for a call counted without its chains, at most one per gap between library kernels."""
    eager = sum(g.calls for g in call.operators if g.kind in FUSED_KINDS)
    extern = sum(g.calls for g in call.operators if g.kind in EXTERN_KINDS)
    chains = call.fused_chains if call.fused_chains is not None else extern + 1
    return eager, min(eager, chains)


def fused_call(call: CallWork) -> list[OperatorGroup]:
    """``call``'s operators as compiled: library kernels as they are; per fused kind and dtype one group of the
    kind's share of the fused kernels, moving the kind's share (by its eager bytes) of the chains' fused bytes
    (``CallWork.fused_bytes``; where they were not counted, the kind's average bytes per eager operator per kernel),
    a reduction kind's kernels also its operators' inputs read again (``REREAD_SHARE``)."""
    eager, kernels = fused_kernels(call)
    kept = [g for g in call.operators if g.kind not in FUSED_KINDS]
    if not eager:
        return kept
    # per kind and dtype: calls, FLOPs, bytes, bytes read again
    totals: dict[tuple[str, str | None], list[int]] = defaultdict(lambda: [0, 0, 0, 0])
    for group in call.operators:
        if group.kind in FUSED_KINDS:
            total = totals[group.kind, group.dtype]
            total[0] += group.calls
            total[1] += group.flops * group.calls
            total[2] += group.bytes * group.calls
            total[3] += round(group.bytes * REREAD_SHARE) * group.calls if group.kind in REDUCTION_KINDS else 0
    moved_eagerly = sum(total[2] for total in totals.values())
    fused = []
    for (kind, dtype), (calls, flops, moved, reread) in totals.items():
        share = max(1, round(kernels * calls / eager))  # this kind's fused kernels
        if call.fused_bytes is not None:
            each = round(call.fused_bytes * moved / moved_eagerly / share) if moved_eagerly else 0
        else:  # counted before the fused bytes were: each kernel as an average eager operator
            each = moved // calls
        fused.append(
            OperatorGroup(kind=kind, flops=flops // share, bytes=each + reread // share, calls=share, dtype=dtype)
        )
    return kept + fused


def compiled_call(call: CallWork, mode: str) -> CallWork:
    """One compiled call: its fused operators, and what the host issues for it (``host_time``)."""
    operators = fused_call(call)
    if mode in CUDA_GRAPH_MODES:  # a graph replay: one launch, one call of the compiled function
        dispatched = 1
    else:  # the compiled code launches every kernel itself
        dispatched = sum(g.calls for g in operators)
    return call.model_copy(update={"operators": operators, "dispatched": dispatched, "modules": 1, "compiled": True})


def compiled_work(work: OperatorWork, components: tuple[str, ...], mode: str = "default") -> OperatorWork:
    """``work`` with every call of ``components`` as ``torch.compile(mode=mode)`` runs it."""
    calls = [compiled_call(call, mode) if call.component in components else call for call in work.calls]
    return work.model_copy(update={"calls": calls})
