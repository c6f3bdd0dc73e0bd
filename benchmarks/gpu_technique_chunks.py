"""The chunks of benchmarks/gpu_validation.py that run diffmeter's techniques: every registered technique and
variant on a real-size UNet, MMDiT and DiT, torch.compile's modes, and compiled graphs running in every call."""

from __future__ import annotations

import time
import traceback

import torch
from gpu_runs import DEVICE, MODELS, Report, model_spec, run, wall_clock

from diffmeter.catalog import resolve
from diffmeter.families import get_family
from diffmeter.optimize import REGISTRY, OptimizationSpec, Target, build
from diffmeter.tiny import tiny_pipeline

#: the technique chunks of each model: the techniques but two, offload's variants, compile's
PARTS = ("techniques", "offloading", "compiling")
#: extra parameter sets worth running beyond each technique's variants
EXTRA = {
    "compile": [
        {"mode": "reduce-overhead"},
        {"mode": "default", "fullgraph": True},
        {"mode": "default", "regional": True},
        {"mode": "default", "components": None},  # None: the denoiser and the VAE (filled in below)
    ],
}
#: compile with offloading, run by the offloading chunks: rules between techniques (the last one is refused)
COMBOS = [
    [("compile", {}), ("offload", {"mode": "model"})],
    [("compile", {"fullgraph": True}), ("offload", {"mode": "model"})],
    [("compile", {"fullgraph": True}), ("offload", {"mode": "group"})],
]


GRAPH_RUNS = {"n": 0}


def _counting_backend(graph_module, example_inputs):
    def counted(*args):
        GRAPH_RUNS["n"] += 1
        return graph_module.forward(*args)

    return counted


def chunk_graph_runs(report: Report) -> None:
    from torch._dynamo import register_backend

    register_backend(_counting_backend, name="gpu_validation_counting")
    entry = resolve("tiny-sd")
    target = Target(entry, get_family("sd"), torch.device(DEVICE), "float32", 4)
    for label, asked in (
        ("compile alone", [("compile", {"backend": "gpu_validation_counting"})]),
        ("compile + model offload", [("compile", {"backend": "gpu_validation_counting"}), ("offload", {})]),
    ):
        pipe = tiny_pipeline(entry)
        placed = any(name == "offload" for name, _ in asked)
        if not placed:
            pipe.to(DEVICE)
        for optimization in build([OptimizationSpec(name=name, params=params) for name, params in asked]):
            optimization.apply(pipe, target)  # on CPU, offload's hooks run with the CPU as their device
        runs = []
        for _ in range(3):
            GRAPH_RUNS["n"] = 0
            pipe("a cat", num_inference_steps=4, height=32, width=32, output_type="np", guidance_scale=1.0)
            runs.append(GRAPH_RUNS["n"])
        ok = runs[0] > 0 and len(set(runs)) == 1
        report.add("graph-runs", label, "PASS" if ok else "FAIL", f"compiled graph runs per call {runs} on {DEVICE}")
        torch._dynamo.reset()


def technique_specs(kind: str, part: str) -> list[tuple[str, list[OptimizationSpec]]]:
    """``part``: "techniques", every variant of every registered technique but compile and offload;
    "offloading", offload's variants and compile with offloading (minutes each on a real-size model: every call
    moves its weights over the host link); "compiling", compile's variants and extra parameter sets."""
    family = get_family(resolve(MODELS[kind][0]).family)
    part_of = {"compile": "compiling", "offload": "offloading"}
    specs = []
    for name, cls in sorted(REGISTRY.items()):
        if name == "tf32" or part_of.get(name, "techniques") != part:
            continue  # tf32 is on for every CUDA run already
        for variant in cls.variants():
            specs.append((variant.label(), [variant.spec()]))
        for extra in EXTRA.get(name, []):
            if extra.get("components", "") is None:
                extra = {**extra, "components": [family.denoiser, family.decoder]}
            specs.append((_label(name, extra), [OptimizationSpec(name=name, params=extra)]))
    for combo in COMBOS if part == "offloading" else []:
        label = " + ".join(_label(name, params) for name, params in combo)
        specs.append((label, [OptimizationSpec(name=name, params=params) for name, params in combo]))
    return specs


def _label(name: str, params: dict) -> str:
    return name + ("(" + ", ".join(f"{k}={v}" for k, v in params.items()) + ")" if params else "")


def chunk_techniques(kind: str, part: str):
    def chunk(report: Report) -> None:
        name = f"{part}-{kind}"
        for label, optimizations in technique_specs(kind, part):
            started = time.perf_counter()
            report.doing = label
            try:
                result, refusal = run(model_spec(kind, optimizations=optimizations), name)
            except Exception as error:  # a crash is the finding: record it and go on
                last = traceback.format_exception_only(type(error), error)[-1].strip()
                report.add(name, label, "FAIL", last[:300])
                continue
            if result is None:
                report.add(name, label, "REFUSED", refusal)
                continue
            ok, detail = wall_clock(result)
            clean = result.summary.compilation.clean
            outcome = "PASS" if ok and clean and result.status == "complete" else "FAIL"
            report.add(
                name,
                label,
                outcome,
                f"{result.summary.latency_s.median:.3f} s/call; {detail}; compilation inside measured calls: "
                f"{'none' if clean else result.summary.compilation}; {time.perf_counter() - started:.0f} s",
            )

    return chunk
