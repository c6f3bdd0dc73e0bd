"""The ladders of benchmarks/gpu_ladder.py and how one chunk of a ladder climbs: each rung is the last rung that ran
plus one technique (the first candidate bench accepts, or refused with its one-line reason), predicted before it runs,
run as a real diffmeter bench run whose log survives a stop, and recorded as one JSON line (``Journal``)."""

from __future__ import annotations

import dataclasses
import json
import threading
import time
import traceback
from datetime import datetime, timezone
from pathlib import Path

import torch
from gpu_runs import KeptLog

from diffmeter.catalog import entry_of
from diffmeter.errors import DiffmeterError
from diffmeter.families import get_family
from diffmeter.optimize import OptimizationSpec, Target, build, check
from diffmeter.quantization_spec import optimization_specs
from diffmeter.runs import speedups
from diffmeter.runs.baseline import compare_with_baseline
from diffmeter.runs.ladder import Rung
from diffmeter.runs.ladder_prediction import RungPrediction, predict_rungs
from diffmeter.runs.lifecycle import MeasuredRun
from diffmeter.runs.spec import BenchSpec
from diffmeter.runs.storage import RESULTS, read_result

RUNGS = ("eager", "sdpa", "fuse-qkv", "compile", "cuda-graphs", "fp8dq", "cache", "distilled")
#: the SDPA backend choice, best first: FlashAttention 3 through diffusers (where installed), then PyTorch's kernels
SDPA = (
    ("attention", {"backend": "_flash_3"}),
    ("sdpa-kernel", {"kernel": "cudnn"}),
    ("sdpa-kernel", {"kernel": "flash"}),
)
#: compile as users climb it: the repeated blocks first (diffusers' compile_repeated_blocks: one block compiled, a cold
#: start that fits a lent GPU's minutes), the whole denoiser where a model declares none
NO_GRAPHS, GRAPHS = "max-autotune-no-cudagraphs", "max-autotune"
#: set by the chunk's SIGTERM handler: a library that turns the KeyboardInterrupt into its own error (dynamo wraps what
#: a compile raises) still ends the rung as stopped
STOP = threading.Event()
#: steps of the CPU self-test's tiny runs (a cache needs steps to skip; the distilled rung's own steps stay)
SELF_TEST_STEPS = 6


@dataclasses.dataclass(frozen=True)
class Ladder:
    """One model's ladder: its GPU settings, its tiny stand-in for the self-test, its published cache, its distilled
    variant (model, tiny stand-in, steps), and its chunks (name, rungs), each under 8 minutes on an H200."""

    key: str
    model: str
    tiny: str
    settings: dict
    cache: OptimizationSpec
    cache_source: str
    distilled: tuple[str, str, int] | None
    chunks: tuple[tuple[str, tuple[str, ...]], ...]


LADDERS = (
    Ladder(
        "flux-dev", "flux-dev", "tiny-flux", {"height": 1024, "width": 1024, "steps": 28},
        OptimizationSpec(name="first-block-cache", params={"threshold": 0.12}),
        "threshold 0.12, ParaAttention's FBCache row for FLUX.1-dev at 1024 px and 28 steps (README.md:57-62, "
        "benchmarks/published_caches.yaml), the cache diffusers' FirstBlockCache ports",
        ("flux-schnell", "tiny-flux-schnell", 4),
        (("flux-1", RUNGS[:4]), ("flux-2", RUNGS[4:])),
    ),
    Ladder(
        "sdxl", "sdxl", "tiny-sdxl", {"height": 1024, "width": 1024, "steps": 30},
        OptimizationSpec(name="deep-cache", params={"cache_interval": 3, "cache_branch_id": 0}),
        "DeepCache interval 3, branch 0 (diffmeter's defaults, DeepCache's README example; not checked against its "
        "source here: no internet); a first-block cache needs a transformer",
        None,
        (("sdxl-1", RUNGS[:4]), ("sdxl-2", RUNGS[4:])),
    ),
    Ladder(
        "wan21-t2v-1.3b", "wan21-t2v-1.3b", "tiny-wan", {"height": 480, "width": 832, "num_frames": 81, "steps": 10},
        OptimizationSpec(name="first-block-cache", params={"threshold": 0.12}),
        "threshold 0.12 as FLUX.1-dev's: benchmarks/published_caches.yaml holds no published first-block threshold "
        "for Wan 2.1 1.3B",
        None,
        (("wan-1", RUNGS[:4]), ("wan-2", RUNGS[4:])),
    ),
)  # fmt: skip
CHUNKS = {name: (ladder, rungs) for ladder in LADDERS for name, rungs in ladder.chunks}


class Journal:
    """The ladder's records, one JSON object a line, appended as each rung or chunk ends (the .jsonl)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lines = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def add(self, record: dict) -> None:
        record = {**record, "utc": datetime.now(timezone.utc).isoformat(timespec="seconds")}
        with open(self.path, "a") as out:
            out.write(json.dumps(record) + "\n")
        self.lines.append(record)

    def latest(self, **match) -> dict | None:
        found = [line for line in self.lines if all(line.get(key) == value for key, value in match.items())]
        return found[-1] if found else None


def base_spec(ladder: Ladder, cpu: bool) -> BenchSpec:
    """The eager rung: the model's dtype, scheduler and steps, batch 1, TF32 off; random real-size weights on a GPU,
    the tiny stand-in on a CPU. The prediction is made before the run (``predict_rungs``), not again after it."""
    common = dict(warmup=1, iterations=2, batch_size=1, tf32=False, predict=False)
    if cpu:
        return BenchSpec(model=ladder.tiny, device="cpu", steps=SELF_TEST_STEPS, **common)
    return BenchSpec(model=ladder.model, device="cuda", random_weights=True, **ladder.settings, **common)


def candidates(rung: str, current: BenchSpec, ladder: Ladder, cpu: bool) -> list[tuple[str, BenchSpec]]:
    """(what the rung adds, its spec) to try, best first."""

    def plus(*added: OptimizationSpec, spec: BenchSpec = current) -> BenchSpec:
        return spec.model_copy(update={"optimizations": [*spec.optimizations, *added]})

    if rung == "eager":
        return [("eager: the model's dtype, scheduler and steps", current)]
    if rung == "sdpa":
        return [
            (
                f"SDPA backend: {name} {', '.join(f'{k}={v}' for k, v in params.items())}",
                plus(OptimizationSpec(name=name, params=params)),
            )
            for name, params in SDPA
        ]
    if rung == "fuse-qkv":
        return [("fused QKV projections", plus(OptimizationSpec(name="fuse-qkv")))]
    if rung == "compile":
        return [
            (
                f"torch.compile {NO_GRAPHS}, {where}",
                plus(OptimizationSpec(name="compile", params={"mode": NO_GRAPHS, **p})),
            )
            for where, p in (("the repeated blocks", {"regional": True}), ("the whole denoiser", {}))
        ]
    if rung == "cuda-graphs":
        graphs = with_compile_mode(current, GRAPHS)
        return [(f"torch.compile {GRAPHS} (CUDA graphs)", graphs)] if graphs else []
    if rung == "fp8dq":
        return [
            ("--quantize fp8dq (torchao float8 dynamic activations, per tensor)", plus(*optimization_specs(["fp8dq"])))
        ]
    if rung == "cache":
        cached = plus(ladder.cache)
        label = f"{ladder.cache.name} ({ladder.cache_source})"
        undone = with_compile_mode(cached, NO_GRAPHS)
        keeps = f"; compile back to {NO_GRAPHS}: CUDA graphs overwrite what the cache keeps"
        return [(label, cached)] + ([(label + keeps, undone)] if undone and undone != cached else [])
    if ladder.distilled is None:
        return []
    model, tiny, steps = ladder.distilled
    model = tiny if cpu else model
    distilled = current.model_copy(update={"model": model, "steps": steps, "guidance_scale": None})
    return [(f"{model}, {steps} steps, its own guidance", distilled)]


def with_compile_mode(spec: BenchSpec, mode: str) -> BenchSpec | None:
    """``spec`` with its compile technique in ``mode``; None when it compiles nothing."""
    if not any(o.name == "compile" for o in spec.optimizations):
        return None
    changed = [
        OptimizationSpec(name=o.name, params={**o.params, "mode": mode}) if o.name == "compile" else o
        for o in spec.optimizations
    ]
    return spec.model_copy(update={"optimizations": changed})


def refusal(spec: BenchSpec) -> str | None:
    """Why bench would refuse ``spec`` before loading (its techniques against the model and device), or None."""
    entry = entry_of(spec)
    try:
        settled = spec.settle(entry, here=False)
        target = Target(entry, get_family(entry.family), torch.device(settled.device), settled.dtype, settled.steps)
        check(build(settled.optimizations), target)
    except DiffmeterError as error:
        return str(error)
    return None


def prediction_of(rung: str, adds: str, spec: BenchSpec) -> RungPrediction:
    """The rung's expected time, as bench would store it, made before it runs."""
    try:
        return predict_rungs([Rung(rung, adds, spec)])[0]
    except DiffmeterError as error:
        return RungPrediction(rung, untimed=f"no prediction: {error}")


def expected_text(prediction: RungPrediction) -> str:
    if prediction.expected_s is None:
        return f"not timed ({prediction.untimed})"
    low, high = prediction.expected_s
    return f"{low:.3f}-{high:.3f} s per call"


def climb(chunk: str, cpu: bool, out: Path, journal: Journal, say) -> None:
    """Every rung of ``chunk``: those of earlier chunks replayed from the journal (a chunk builds on them), a rung the
    journal holds as ended not rerun, the others predicted, run and recorded. A stop (SIGTERM) records where."""
    ladder, names = CHUNKS[chunk]
    current, below = base_spec(ladder, cpu), None
    for rung in RUNGS[: RUNGS.index(names[-1]) + 1]:
        record = journal.latest(kind="rung", ladder=ladder.key, rung=rung)
        if rung not in names and (record is None or record["status"] == "stopped"):
            earlier = next(name for name, rungs in ladder.chunks if rung in rungs)
            raise DiffmeterError(f"chunk {chunk} climbs from rung {rung}, not run yet: run chunk {earlier} first")
        if record is not None and record["status"] != "stopped":
            say(f"{ladder.key} {rung}: {record['status']} at {record['utc']}, not rerun")
            if record["status"] == "complete":
                folder = Path(record["folder"])
                current = BenchSpec.model_validate(record["spec"])
                below = (read_result(folder), folder, rung) if (folder / RESULTS).exists() else (None, folder, rung)
            continue
        current, below = run_rung(ladder, chunk, rung, current, below, cpu, out, journal, say)


def run_rung(ladder, chunk, rung, current, below, cpu, out, journal, say):
    """One rung: chosen, predicted, run, recorded; returns the (spec, below) the next rung builds on."""
    head = {"kind": "rung", "ladder": ladder.key, "chunk": chunk, "rung": rung}
    reasons, chosen = [], None
    for candidate in candidates(rung, current, ladder, cpu):
        reason = refusal(candidate[1])
        if reason is None:
            chosen = candidate
            break
        reasons.append(reason)
    if chosen is None:
        reason = "; ".join(reasons) or (
            f"{ladder.model} has no distilled variant in diffmeter's catalog"
            if rung == "distilled"
            else "no compile rung below"
        )
        journal.add({**head, "status": "refused", "reason": reason})
        say(f"{ladder.key} {rung}: refused: {reason}")
        return current, below
    adds, spec = chosen
    prediction = prediction_of(rung, adds, spec)
    say(f"{ladder.key} {rung}: {adds}; expected {expected_text(prediction)}")
    started, group = time.perf_counter(), KeptLog()  # its bench.log also kept beside the run folder while it runs
    try:
        result, folder = MeasuredRun(spec, out / ladder.key, force=True, group=group).run()
        group.copy.unlink(missing_ok=True)
    except KeyboardInterrupt as stop:
        stopped(journal, head | {"adds": adds}, group, started, str(stop))
        raise
    except Exception as error:  # a refusal, out of memory or a crash is the rung's finding; the next builds below it
        if STOP.is_set():  # the stop's KeyboardInterrupt, turned into its own error by a library
            stopped(journal, head | {"adds": adds}, group, started, "signal 15")
            raise KeyboardInterrupt("signal 15") from error
        last = traceback.format_exception_only(type(error), error)[-1].strip()
        status = "failed" if isinstance(error, DiffmeterError) else "crashed"
        seconds = time.perf_counter() - started
        journal.add({**head, "status": status, "adds": adds, "seconds": seconds, "reason": last[:500]})
        say(f"{ladder.key} {rung}: {status}: {last[:300]}")
        return current, below
    record = {**head, "status": "complete", "adds": adds, "spec": spec.model_dump(mode="json")}
    record |= figures(result, folder, below, prediction)
    record["seconds"] = time.perf_counter() - started
    journal.add(record)
    say(f"{ladder.key} {rung}: {record['median_s']:.3f} s per call, {record['verdict']}, {record['seconds']:.0f} s")
    return spec, (result, folder, rung)


def stopped(journal: Journal, head: dict, group, started: float, why: str) -> None:
    """A rung stopped by its chunk's time limit, with its run's bench.log where the run had begun (kept beside)."""
    seconds = time.perf_counter() - started
    reason, kept = f"{why} after {seconds:.0f} s", getattr(group, "copy", None)
    if group.stored():  # the stop came while the run closed: its folder holds it, bench.log included
        kept.unlink(missing_ok=True)
        reason += ", after its run was stored (its figures not recorded: a resume runs it again)"
        found = {"folder": str(group.final)}
    else:
        found = {"log": str(kept)} if kept is not None and kept.exists() else {}
    journal.add(head | {"status": "stopped", "seconds": seconds, "reason": reason} | found)


def figures(result, folder: Path, below, prediction: RungPrediction) -> dict:
    """A complete rung's record: time per stage, MFU, peak memory, energy, the prediction and its miss, and the speed
    and image difference against the rung below."""
    summary = result.summary
    memory, energy, median = summary.peak_memory, summary.energy, summary.latency_s.median
    cuda = memory.cuda_max_allocated_bytes is not None
    found = {
        "folder": str(folder),
        "model": result.model.name,
        "steps": result.spec.steps,
        "dtype": result.spec.dtype,
        "techniques": [o.label for o in result.optimizations],
        "load_s": result.load_s,
        "first_call_s": result.first_call_s,
        "median_s": median,
        "interval_s": [summary.latency_s.ci_low, summary.latency_s.ci_high],
        "calls": summary.latency_s.n,
        "stages_s": {name: stats.median for name, stats in summary.stages_s.items() if stats.max > 0},
        "step_s": summary.step_s.median,
        "mfu": summary.mfu.get("total"),
        "mfu_note": None if summary.mfu else summary.mfu_note,
        "peak_memory_bytes": memory.cuda_max_allocated_bytes if cuda else memory.process_peak_rss_bytes,
        "peak_memory_kind": "CUDA max allocated" if cuda else "process peak RSS",
        "energy_j_per_image": energy.gpu_j_per_image if energy.available else None,
        "energy_note": None if energy.available else energy.reason,
        "compiled_in_measured_calls": not summary.compilation.clean,
        "expected_s": list(prediction.expected_s) if prediction.expected_s else None,
        "lower_s": prediction.lower_s,
        "untimed": prediction.untimed,
        "verdict": prediction.verdict(median),
        "host_link": result.environment.host_link.text() if result.environment.host_link else None,
    }
    if prediction.expected_s:  # the miss: how far outside the range, signed (0 inside)
        low, high = prediction.expected_s
        found["miss"] = median / high - 1 if median > high else median / low - 1 if median < low else 0.0
    return found | against_below(result, folder, below)


def against_below(result, folder: Path, below) -> dict:
    """Speed (the one rule of every speed-up) and images at the same seeds against the rung below."""
    if below is None:
        return {"below": None}
    other, other_folder, name = below
    if other is None:
        return {"below": name, "difference": f"the {name} rung's run is not on this machine (run in another session)"}
    rule = speedups.between(other, result)
    found = {"below": name, "speedup": [rule.estimate, rule.low, rule.high], "speedup_text": rule.text()}
    if other.model.name != result.model.name:
        return found | {"difference": f"another model ({other.model.name} below): images not compared"}
    quality = compare_with_baseline(result, folder, other, other_folder)
    return found | {
        "psnr_db": quality.mean_psnr_db,
        "min_psnr_db": quality.min_psnr_db,
        "ssim": quality.mean_ssim,
        "identical": f"{quality.identical} of {len(quality.images)}",
    }
