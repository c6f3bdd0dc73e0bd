"""The bytes inductor's generated kernels move, by inductor's own estimate, beside the fused bytes diffmeter counts
for the same call: a catalog component built with random weights on this CPU, called once as the plan calls it.

Inductor logs ``graph.count_bytes()`` (each scheduler node's buffers read and written once, the writes no other node
reads dropped: torch 2.13 torch/_inductor/scheduler.py:1680-1820) on the "inductor_metrics" artifact logger at INFO
(torch/_inductor/compile_fx.py:244, 1649-1661). Its nodes include the library kernels (``ExternKernelSchedulerNode``,
charged their whole buffers); only the generated ones are kept here, as ``CallWork.fused_bytes`` counts only the
chains inductor fuses."""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass

import torch

from diffmeter.pipelines import build_component
from diffmeter.predict.compiled_time import FUSED_KINDS, fused_call
from diffmeter.predict.memory import DTYPES, cast_floating, settled_plan
from diffmeter.predict.operators import OperatorTally
from diffmeter.predict.schema import CallWork
from diffmeter.spec import ProfileSpec


@dataclass
class Bytes:
    inductor: int  # inductor's estimate for its generated kernels
    counted: int  # CallWork.fused_bytes: the chains' dataflow
    new_rule: int  # what compiled_time charges the fused kinds: the dataflow, normalizations' inputs read again
    old_rule: int  # each chain's kernel as an average eager operator, with the same re-read


class Metrics(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.graphs: list[dict] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.graphs.append(record.args if isinstance(record.args, dict) else record.args[0])


def generated_bytes(graphs: list[dict]) -> int:
    """The bytes of the generated kernels (not library calls, not no-ops) of the logged graphs."""
    from torch._inductor.scheduler import ExternKernelSchedulerNode, NopKernelSchedulerNode

    skipped = (ExternKernelSchedulerNode, NopKernelSchedulerNode)
    # nodes_num_elem holds each node's bytes // 4 (graph.py count_bytes)
    return sum(
        4 * quarter for graph in graphs for node, quarter in graph["nodes_num_elem"] if not isinstance(node, skipped)
    )


@contextlib.contextmanager
def inductor_metrics(**config):
    """Inductor's metrics of every graph compiled inside (``Metrics.graphs``), with its ``config`` patched and its
    caches off (a cached graph is not counted again)."""
    logger = logging.getLogger("torch._inductor.compile_fx.__inductor_metrics")
    metrics, propagate = Metrics(), logger.propagate
    try:
        torch._logging.set_logs(inductor_metrics=True)
        logger.addHandler(metrics)
        logger.propagate = False
        with torch._inductor.config.patch(force_disable_caches=True, **config):
            torch._dynamo.reset()
            yield metrics
    finally:
        logger.removeHandler(metrics)
        logger.propagate = propagate
        torch._logging.set_logs()
        torch._dynamo.reset()


def fused_bytes_against_inductor(model: str, component: str, config: dict | None = None, **settings) -> Bytes:
    """``model``'s first call of ``component`` at ``settings`` in float32: counted eagerly, then compiled (with
    inductor's ``config`` patched)."""
    entry, spec, plan = settled_plan(ProfileSpec(model=model, steps=1, dtype="float32", **settings))
    call = next(c for c in plan if c.component == component and c.count)
    torch.manual_seed(0)
    module = build_component(entry.components[component], "cpu").to(DTYPES["float32"])
    inputs = cast_floating(call.build(torch.device("cpu")), torch.float32)
    handle = call.prepare(module) if call.prepare else None
    try:
        with torch.no_grad():
            with OperatorTally(torch.float32) as tally:
                output = getattr(module, call.method)(**inputs)
            del output
            with inductor_metrics(**(config or {})) as metrics:
                torch.compile(getattr(module, call.method))(**inputs)
    finally:
        if handle is not None:
            handle.remove()
    work = CallWork(stage="denoising", component=component, count=1, operators=tally.operators(), **tally.host_counts())

    def charged(rule: CallWork) -> int:
        return sum(g.bytes * g.calls for g in fused_call(rule) if g.kind in FUSED_KINDS)

    return Bytes(
        inductor=generated_bytes(metrics.graphs),
        counted=work.fused_bytes,
        new_rule=charged(work),
        old_rule=charged(work.model_copy(update={"fused_bytes": None})),
    )
