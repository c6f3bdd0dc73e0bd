"""Ulysses 2 and data parallel 2 against one process on this CPU: Wan 2.1 1.3B's denoiser, real size, random weights.

No whole pipeline with a context-parallel plan fits twice in this machine's memory (their text
encoders are T5/UMT5-XXL), so this times the denoiser alone: WanTransformer3DModel built from the
catalog's config (diffmeter.pipelines.build_component, float32: bfloat16 matmuls run about 100x
slower on this CPU, which has no AVX-512 BF16), the same seed in every process so every process
holds the same weights, and fixed random inputs (latents, text embeddings, a timestep).

Every configuration runs in processes started by diffmeter's own launcher
(diffmeter.distributed.launch.start: torch's elastic agent, spawned workers, c10d rendezvous),
the one-process ones too (a group of one), over gloo:

- 1 process x 2 torch threads: the whole batch in one process using both cores;
- 1 process x 1 thread: one core, the unit the scaling efficiency is counted against;
- Ulysses 2: 2 processes x 1 thread, diffusers' context parallelism set up by
  diffmeter.distributed.context_parallel (the sequence split, heads exchanged by all-to-all);
- data parallel 2: 2 processes x 1 thread, each its half of the batch.

A call is the group's: all processes start it together (a barrier), and its time is the slowest
process's (as `diffmeter bench` merges ranks). Seconds per sample = call time / batch.

The defaults (5 frames at 192x192 px, batch 2, 1 warm-up and 5 timed calls) took 9 to 14 minutes on
the shared 2-vCPU machine of the committed run; each process peaks at about 6.3 GB RSS.

Run from the repo root:  python benchmarks/multigpu_cpu.py
The report is printed and written to benchmarks/results/multigpu_cpu.md.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import resource
import statistics
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import torch

MODEL = "Wan-AI/Wan2.1-T2V-1.3B-Diffusers"
RESULTS = Path(__file__).parent / "results" / "multigpu_cpu.md"
#: bytes of memory the two-process configurations need at least (two float32 copies of the denoiser)
TWO_COPIES = 12 * 1024**3

#: (label, mode, processes, torch threads per process)
CONFIGURATIONS = [
    ("1 process x 2 threads", "single", 1, 2),
    ("Ulysses 2 (2 processes x 1 thread)", "ulysses", 2, 1),
    ("data parallel 2 (2 processes x 1 thread)", "data", 2, 1),
    ("1 process x 1 thread", "single", 1, 1),
]


def settings(arguments) -> dict:
    return dict(
        frames=arguments.frames,
        size=arguments.size,
        text_tokens=arguments.text_tokens,
        batch=arguments.batch,
        warmup=arguments.warmup,
        calls=arguments.calls,
    )


def denoiser() -> torch.nn.Module:
    """Wan 2.1 1.3B's transformer from the catalog's config, random float32 weights from seed 0."""
    from diffmeter.catalog import resolve
    from diffmeter.pipelines import build_component

    torch.manual_seed(0)
    return build_component(resolve(MODEL).components["transformer"], "cpu")


def sample_inputs(sample: int, config: dict) -> dict[str, torch.Tensor]:
    """One sample's fixed random inputs: latents (16 channels, (frames - 1) / 4 + 1 latent frames, 1/8 of
    the size), text embeddings (UMT5-XXL's 4096 channels) and a timestep."""
    generator = torch.Generator().manual_seed(1000 + sample)
    latent_frames, side = (config["frames"] - 1) // 4 + 1, config["size"] // 8
    return {
        "hidden_states": torch.randn(16, latent_frames, side, side, generator=generator),
        "encoder_hidden_states": torch.randn(config["text_tokens"], 4096, generator=generator),
        "timestep": torch.tensor(500.0),
    }


def batch_inputs(samples: list[int], config: dict) -> dict[str, torch.Tensor]:
    inputs = [sample_inputs(sample, config) for sample in samples]
    return {name: torch.stack([one[name] for one in inputs]) for name in inputs[0]}


def worker(mode: str, threads: int, config: dict) -> dict:
    """One process of a configuration: join the group, build the denoiser, split it (Ulysses) or
    take its share of the batch (data parallel), time the calls."""
    import torch.distributed as dist

    from diffmeter.distributed import communication, context_parallel
    from diffmeter.distributed.rank_run import COLLECTIVE_TIMEOUT_S

    torch.set_num_threads(threads)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", timeout=timedelta(seconds=COLLECTIVE_TIMEOUT_S))
    try:
        cpu = torch.device("cpu")
        model = denoiser()
        moved = {}  # what the collectives of the first (warm-up) call received, counted at the dispatcher
        if mode == "ulysses":
            mesh = context_parallel.device_mesh(cpu, 1, 1, 1, world, 1)
            context_parallel.enable(model, mesh, 1, world, cpu)
            communication.count_first_call(model, moved)
        samples = list(range(config["batch"]))
        if mode == "data":
            samples = samples[rank::world]
        inputs = batch_inputs(samples, config)
        times, cpu_times = [], []
        with torch.inference_mode():
            for _ in range(config["warmup"] + config["calls"]):
                dist.barrier()
                start, cpu_start = time.perf_counter(), time.process_time()
                output = model(**inputs, return_dict=False)[0]
                times.append(time.perf_counter() - start)
                cpu_times.append(time.process_time() - cpu_start)
        return {
            "times": times[config["warmup"] :],
            "cpu_share": sum(cpu_times[config["warmup"] :]) / sum(times[config["warmup"] :]),
            "moved": moved,
            "samples": samples,
            "output": output,
            "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            "threads": torch.get_num_threads(),
        }
    finally:
        dist.destroy_process_group()


def available_bytes() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 0


def run(label: str, mode: str, processes: int, threads: int, config: dict) -> dict:
    from diffmeter.distributed import launch

    if processes > 1 and available_bytes() < TWO_COPIES:
        raise SystemExit(f"{label}: {available_bytes() / 1e9:.1f} GB available, {TWO_COPIES / 1e9:.1f} GB needed")
    load_before = os.getloadavg()
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="diffmeter-bench-ranks-") as logs:
        returned = launch.start(processes, worker, (mode, threads, config), Path(logs))
    ranks = [returned[rank] for rank in range(processes)]
    calls = [max(times) for times in zip(*(rank["times"] for rank in ranks), strict=True)]
    outputs = {sample: out for rank in ranks for sample, out in zip(rank["samples"], rank["output"], strict=True)}
    same = all(torch.equal(rank["output"], ranks[0]["output"]) for rank in ranks) if mode == "ulysses" else None
    print(f"{label}: calls {', '.join(f'{t:.2f}' for t in calls)} s", flush=True)
    return {
        "label": label,
        "mode": mode,
        "processes": processes,
        "threads": threads,
        "calls_s": calls,
        "output": torch.stack([outputs[sample] for sample in sorted(outputs)]),
        "peak_rss_bytes": [rank["peak_rss_bytes"] for rank in ranks],
        "cpu_share": [rank["cpu_share"] for rank in ranks],
        "moved": [rank["moved"] for rank in ranks],
        "ranks_identical": same,
        "wall_s": time.perf_counter() - started,
        "load_before": load_before,
        "load_after": os.getloadavg(),
    }


def agreement(output: torch.Tensor, reference: torch.Tensor) -> str:
    """Max absolute difference and PSNR (peak: the reference's range) of two denoiser outputs."""
    difference = (output - reference).abs()
    mse = difference.pow(2).mean().item()
    peak = (reference.max() - reference.min()).item()
    psnr = math.inf if mse == 0 else 10 * math.log10(peak**2 / mse)
    return f"max abs difference {difference.max().item():.3g} (outputs span {peak:.3g}), PSNR {psnr:.1f} dB"


def report(runs: list[dict], config: dict, wall_s: float, load: tuple) -> str:
    from diffmeter import units
    from diffmeter.measure.stats import Stats
    from diffmeter.predict.cpu_peaks import cpu_name

    one_thread = next(r for r in runs if r["mode"] == "single" and r["threads"] == 1)
    two_threads = next(r for r in runs if r["mode"] == "single" and r["threads"] == 2)
    per_sample = {r["label"]: statistics.median(r["calls_s"]) / config["batch"] for r in runs}
    latent_frames, side = (config["frames"] - 1) // 4 + 1, config["size"] // 8
    tokens = latent_frames * (side // 2) ** 2
    now = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        "# Ulysses 2 and data parallel 2 against one process on CPU: Wan 2.1 1.3B denoiser, random weights",
        "",
        f"Run {now} by `python benchmarks/multigpu_cpu.py` in {wall_s / 60:.1f} min on {cpu_name()} "
        f"({os.cpu_count()} vCPUs of a shared virtual machine, {platform.machine()}), torch {torch.__version__}, "
        f"gloo over shared memory. Load average (1, 5, 15 min) before the measurements: "
        f"{load[0]:.2f}, {load[1]:.2f}, {load[2]:.2f}; the machine is shared with other agents' work.",
        "",
        f"The denoiser alone: {MODEL}'s WanTransformer3DModel (1.42B parameters, 30 blocks, 12 heads) "
        "built from diffmeter's catalog config with **random weights** (seed 0, the same in every process), "
        f"float32. Inputs fixed and random: batch {config['batch']}, {config['frames']} frames at "
        f"{config['size']}x{config['size']} px ({latent_frames} latent frames of {side}x{side}, {tokens} tokens per "
        f"sample), {config['text_tokens']} text tokens of 4096 channels, timestep 500. "
        f"{config['warmup']} warm-up and {config['calls']} timed calls per configuration; a call starts on every "
        "process together (barrier) and lasts as long as the slowest process. Every configuration runs in processes "
        "started by diffmeter's launcher (`distributed.launch.start`), Ulysses through "
        "`distributed.context_parallel` (diffusers' context parallelism).",
        "",
        "| configuration | median call (95% interval) | min-max | s / sample | speed-up vs 1 x 1 thread "
        "| scaling efficiency (speed-up / processes) | speed-up vs 1 x 2 threads | peak RSS per process |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        stats = Stats.of(r["calls_s"])
        interval = f"{units.seconds(stats.ci_low)}-{units.seconds(stats.ci_high)}"
        level = "" if stats.ci_level >= 0.95 else f", {stats.ci_level:.0%}"
        speedup = per_sample[one_thread["label"]] / per_sample[r["label"]]
        against_two = per_sample[two_threads["label"]] / per_sample[r["label"]]
        efficiency = f"{speedup / r['processes']:.0%}" if r["mode"] != "single" else "-"
        rss = ", ".join(units.gib(b) for b in r["peak_rss_bytes"])
        lines.append(
            f"| {r['label']} | {units.seconds(stats.median)} ({interval}{level}) | "
            f"{units.seconds(stats.min)}-{units.seconds(stats.max)} | {units.seconds(per_sample[r['label']])} | "
            f"x{speedup:.2f} | {efficiency} | x{against_two:.2f} | {rss} |"
        )
    lines += [
        "",
        "Output agreement with the one-process (1 thread) output, same inputs:",
        "",
    ]
    for r in runs:
        if r is not one_thread:
            lines.append(f"- {r['label']}: {agreement(r['output'], one_thread['output'])}")
    for r in runs:
        if r["ranks_identical"] is not None:
            counted = "; ".join(
                f"rank {rank}: {units.gib(m['bytes'])} in "
                + ", ".join(f"{calls} {name}" for name, calls in sorted(m["calls"].items()))
                for rank, m in enumerate(r["moved"])
            )
            lines.append(
                f"- {r['label']}: both processes returned identical outputs: {r['ranks_identical']}; "
                f"the collectives of one call received {counted} (counted at the dispatcher in the warm-up call)"
            )
    lines += [
        "",
        "CPU time / wall time of each process over the timed calls (1.0 = one whole vCPU; a 2-thread process can "
        "reach 2.0): "
        + "; ".join(f"{r['label']} {', '.join(f'{share:.2f}' for share in r['cpu_share'])}" for r in runs)
        + ".",
        "",
        "Load average after each configuration: "
        + "; ".join(f"{r['label']} {r['load_after'][0]:.2f}" for r in runs)
        + ".",
        "",
        "## What this says and does not say",
        "",
        "- Random weights, this CPU: the times describe this 2-vCPU shared virtual machine running the real-size "
        "denoiser's arithmetic, not the model's quality and not any GPU.",
        "- The 2 processes share 2 vCPUs and one memory system; their collectives are gloo over shared memory. "
        "CPU scaling says nothing about NVLink, NCCL or GPU scaling, where the all-to-all's cost relative to "
        "the compute is entirely different.",
        "- The scaling efficiency counts one process x 1 thread as one device; '1 process x 2 threads' uses the same "
        "two cores as the two-process runs, so the speed-up against it says whether splitting into processes beats "
        "torch's own threading on this machine.",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=5)
    parser.add_argument("--size", type=int, default=192)
    parser.add_argument("--text-tokens", type=int, default=128)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--calls", type=int, default=5)
    parser.add_argument("--only", help="run only configurations whose label contains this (no report written)")
    arguments = parser.parse_args()
    config = settings(arguments)
    load = os.getloadavg()
    print(f"load average {load[0]:.2f}, {load[1]:.2f}, {load[2]:.2f}", flush=True)
    started = time.perf_counter()
    chosen = [c for c in CONFIGURATIONS if arguments.only is None or arguments.only in c[0]]
    runs = [run(*configuration, config) for configuration in chosen]
    if arguments.only is not None:
        return
    text = report(runs, config, time.perf_counter() - started, load)
    RESULTS.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
