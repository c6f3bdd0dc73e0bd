"""How fast is diffmeter, and how do its SD 1.5 UNet counts compare with thop and fvcore?

1. ``diffmeter profile --all --json`` 3 times as a cold subprocess (the real CLI, one worker per CPU) and
   once with ``--jobs 1``: wall and CPU time (s), peak RSS of the process tree (MiB, sampled every 50 ms),
   against targets of 30 s and 2 GiB.
2. One SD 1.5 UNet call at 512x512 with CFG (batch 2; 4x64x64 latents; 77 tokens of width 768) counted by
   diffmeter (``profile("sd15", steps=1)``, meta device), thop and fvcore (the UNet on CPU, random fp32
   weights), each timed with its peak-RSS increase (MiB); all report MACs, the differences broken down.

Run from the repo root:  python benchmarks/profile_speed.py   (5 to 10 minutes on 2 cores; thop and fvcore
come with the `compare` extra: pip install -e '.[compare]'). Writes benchmarks/results/profile_speed.md.
"""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

import torch

RUNS, TARGET_S, TARGET_MB = 3, 30.0, 2048
BATCH, LATENT, TOKENS = 2, 64, 77  # CFG doubles the batch; 512 px / 8; CLIP max length
RESULTS = Path(__file__).parent / "results" / "profile_speed.md"
EXTRA_HINT = "pip install -e '.[compare]'"


# -- measuring ---------------------------------------------------------------------------


def rss_mb() -> tuple[float, float]:
    """Current and peak resident set size of this process, in MiB (the kernel's kB are KiB)."""
    status = Path("/proc/self/status").read_text()
    return tuple(int(re.search(rf"{key}:\s+(\d+)", status).group(1)) / 1024 for key in ("VmRSS", "VmHWM"))


def measure(fn, *args):
    """Run ``fn``; return its result, wall seconds and the peak-RSS increase in MiB."""
    Path("/proc/self/clear_refs").write_text("5")  # resets the peak (VmHWM) to the current RSS
    before = rss_mb()[0]
    start = time.perf_counter()
    result = fn(*args)
    seconds = time.perf_counter() - start
    return result, seconds, rss_mb()[1] - before


def tree_rss_mb(pid: int) -> float:
    """Resident memory of a process and all its descendants (the CLI forks workers), in MiB."""
    total, pending = 0, [pid]
    while pending:
        current = pending.pop()
        try:
            total += int(re.search(r"VmRSS:\s+(\d+)", Path(f"/proc/{current}/status").read_text()).group(1))
            children = Path(f"/proc/{current}/task/{current}/children").read_text().split()
        except (OSError, AttributeError):  # exited meanwhile, or a zombie without VmRSS
            continue
        pending += [int(child) for child in children]
    return total / 1024


def run_cli(args: list[str]) -> dict:
    """One cold CLI process, its disk cache of profiles off (every model counted): wall and CPU
    seconds, peak RSS of the whole process tree (MiB, sampled every 50 ms), profiles printed, and
    the 1-minute load average when it started (other work on the machine inflates wall time)."""
    exe = Path(sys.executable).with_name("diffmeter")
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        load, start = os.getloadavg()[0], time.perf_counter()
        env = {**os.environ, "DIFFMETER_CACHE_DIR": "off"}
        proc = subprocess.Popen([str(exe), *args], stdout=out, stderr=err, env=env)
        peak = 0.0
        while True:
            waited, status, usage = os.wait4(proc.pid, os.WNOHANG)  # usage: the child and its workers
            if waited:
                break
            peak = max(peak, tree_rss_mb(proc.pid))
            time.sleep(0.05)
        seconds = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode:
            err.seek(0)
            raise RuntimeError(f"diffmeter {' '.join(args)} failed:\n{err.read().decode()[-2000:]}")
        out.seek(0)
        return {
            "wall_s": seconds,
            "cpu_s": usage.ru_utime + usage.ru_stime,
            "mb": peak,
            "models": len(json.load(out)["profiles"]),
            "load": load,
        }


# -- the three counters ------------------------------------------------------------------


class UNetOneInput(torch.nn.Module):
    """The UNet as a one-tensor module (thop and fvcore call forward positionally)."""

    def __init__(self, unet: torch.nn.Module) -> None:
        super().__init__()
        self.unet = unet
        self.timestep = torch.tensor(999.0)
        self.text = torch.randn(BATCH, TOKENS, unet.config.cross_attention_dim)

    def forward(self, sample: torch.Tensor) -> torch.Tensor:
        return self.unet(sample, self.timestep, encoder_hidden_states=self.text, return_dict=False)[0]


def diffmeter_unet() -> dict:
    import diffmeter

    profile = diffmeter.profile("sd15", height=512, width=512, steps=1, guidance_scale=7.5)
    unet = next(c for c in profile.components if c.name == "unet")
    assert (unet.calls, unet.batch_per_call) == (1, BATCH), (unet.calls, unet.batch_per_call)
    return {"macs": unet.macs_per_call, "by_kind": unet.macs_by_kind}


def thop_unet(model: torch.nn.Module, sample: torch.Tensor) -> dict:
    import thop

    macs, _, layers = thop.profile(model, inputs=(sample,), verbose=False, ret_layer_info=True)
    by_type: dict[str, int] = {}
    for path, ops in leaf_ops(layers):
        name = type(model.get_submodule(path)).__name__
        by_type[name] = by_type.get(name, 0) + int(ops)
    return {"macs": int(macs), "by_type": by_type}


def leaf_ops(layers: dict, prefix: str = ""):
    """(module path, ops) of every leaf in thop's nested layer report."""
    for name, (ops, _, children) in layers.items():
        path = f"{prefix}{name}"
        yield from leaf_ops(children, path + ".") if children else [(path, ops)]


def fvcore_unet(model: torch.nn.Module, sample: torch.Tensor) -> dict:
    from fvcore.nn import FlopCountAnalysis

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # jit tracer warnings
        analysis = FlopCountAnalysis(model, (sample,))
        analysis.unsupported_ops_warnings(False).uncalled_modules_warnings(False)
        total = analysis.total()
    return {
        "macs": int(total),
        "by_operator": dict(analysis.by_operator()),
        "unsupported": dict(analysis.unsupported_ops()),
    }


def analytic_attention_macs(config: dict) -> int:
    """softmax(QK^T)V of SD 1.x's UNet by hand: 2 matmuls of B*Lq*Lkv*C MACs per attention;
    every level but the last has (2 down + 3 up) transformer blocks, the mid block one."""
    levels = [
        (config["block_out_channels"][i], (LATENT >> i) ** 2, 2 * config["layers_per_block"] + 1)
        for i in range(len(config["block_out_channels"]) - 1)
    ]
    levels.append((config["block_out_channels"][-1], (LATENT >> (len(levels))) ** 2, 1))
    return sum(blocks * 2 * BATCH * length * (length + TOKENS) * channels for channels, length, blocks in levels)


def optional(module: str):
    try:
        __import__(module)
        return True
    except ImportError:
        return False


# -- report ------------------------------------------------------------------------------


def machine(load_at_start: float) -> list[str]:
    cpu = re.search(r"model name\s*:\s*(.+)", Path("/proc/cpuinfo").read_text())
    ram_kb = int(re.search(r"MemTotal:\s+(\d+)", Path("/proc/meminfo").read_text()).group(1))
    versions = ", ".join(f"{name} {version(name)}" for name in ("torch", "diffusers", "transformers", "thop", "fvcore"))
    return [
        f"- date: {datetime.now(timezone.utc):%Y-%m-%d %H:%M UTC}",
        f"- machine: {len(os.sched_getaffinity(0))} CPUs (nproc), {cpu.group(1) if cpu else 'unknown CPU'}, "
        f"{ram_kb / 2**20:.1f} GiB RAM; Python {sys.version.split()[0]}",
        f"- packages: diffmeter {version('diffmeter')}, {versions}",
        f"- 1-minute load average: {load_at_start:.2f} at start, {os.getloadavg()[0]:.2f} at end "
        f"(above ~0.1, other processes shared the CPUs and inflated wall times)",
    ]


def version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"


def g(macs: float) -> str:
    return f"{macs / 1e9:,.3f} GMAC"


def pct(value: float, reference: float) -> str:
    return f"{100 * (value - reference) / reference:+.2f} %"


def cli_section(runs: list[dict], serial: dict) -> list[str]:
    median = statistics.median(run["wall_s"] for run in runs)
    peak = max(run["mb"] for run in runs)
    lines = [
        "## 1. `diffmeter profile --all --json`, cold process",
        "",
        f"{runs[0]['models']} catalog models per run, each counted (the disk cache of profiles is off: "
        "`DIFFMETER_CACHE_DIR=off`; with it on, a repeated question is answered from disk).",
        "",
        "| run | wall time (s) | CPU time, user+sys (s) | peak RSS, all processes (MiB) | load avg at start (1 min) |",
        "|---|---|---|---|---|",
    ]
    lines += [
        f"| {i} | {r['wall_s']:.2f} | {r['cpu_s']:.2f} | {r['mb']:.0f} | {r['load']:.2f} |"
        for i, r in enumerate(runs, 1)
    ]
    lines.append(
        f"| `--jobs 1` (one process) | {serial['wall_s']:.2f} | {serial['cpu_s']:.2f} | {serial['mb']:.0f} | "
        f"{serial['load']:.2f} |"
    )
    lines += [
        "",
        f"- median wall time: {median:.2f} s (target < {TARGET_S:.0f} s): "
        f"**{'PASS' if median < TARGET_S else 'FAIL'}**",
        f"- peak RSS: {peak:.0f} MiB (target < {TARGET_MB} MiB): **{'PASS' if peak < TARGET_MB else 'FAIL'}**",
        f"- median CPU time: {statistics.median(run['cpu_s'] for run in runs):.2f} s; CPU time / wall time "
        f"{min(r['cpu_s'] / r['wall_s'] for r in runs):.0%} to {max(r['cpu_s'] / r['wall_s'] for r in runs):.0%} "
        "(the default forks one worker per CPU, so up to 200 % on 2 cores; lower means waiting for a CPU)",
    ]
    return lines


def unet_section(dm: dict, build: dict | None, thop_r: dict | None, fv: dict | None, analytic: int) -> list[str]:
    ref, kinds = dm["macs"], dm["by_kind"]
    attention = kinds["attention"]
    lines = [
        "## 2. SD 1.5 UNet, one call at 512x512, batch 2 (CFG), fp32, CPU",
        "",
        f"Inputs: sample {BATCH}x4x{LATENT}x{LATENT}, timestep scalar, text states {BATCH}x{TOKENS}x768. "
        "MAC = one multiply-accumulate. thop and fvcore run under torch.no_grad() on CPU with random "
        "real-size weights; diffmeter counts on the meta device (no weights, no arithmetic).",
        "",
        "| tool | MACs | difference vs diffmeter | time (s) | peak RSS increase (MiB) |",
        "|---|---|---|---|---|",
        f"| diffmeter (meta) | {g(ref)} ({ref:,}) | reference | {dm['seconds']:.2f} | {dm['mb']:.0f} |",
    ]
    if build:
        lines.append(f"| build UNet on CPU (for thop/fvcore) | - | - | {build['seconds']:.2f} | {build['mb']:.0f} |")
    for name, r in (("thop", thop_r), ("fvcore", fv)):
        if r:
            lines.append(
                f"| {name} (CPU forward) | {g(r['macs'])} ({r['macs']:,}) | {pct(r['macs'], ref)} | "
                f"{r['seconds']:.2f} | {r['mb']:.0f} |"
            )
        else:
            lines.append(f"| {name} | not installed: `{EXTRA_HINT}` | | | |")
    lines += [
        "",
        f"diffmeter by kind: matmul {g(kinds['matmul'])}, convolution {g(kinds['convolution'])}, "
        f"attention (SDPA: QK^T and AV) {g(attention)} = {100 * attention / ref:.2f} % of the call. "
        f"By hand from the config: {g(analytic)} attention "
        f"({'matches' if analytic == attention else 'DIFFERS'}).",
        f'diffmeter timing: first `diffmeter.profile("sd15", steps=1)` in a process after importing diffmeter '
        f"and the model classes ({dm['import_s']:.2f} s); it builds and counts all 3 components "
        f"(UNet, CLIP text encoder, VAE) on meta. "
        f"A repeated call (memoized counts) takes {dm['repeat_s']:.3f} s.",
    ]
    if thop_r:
        lines += ["", *thop_notes(thop_r, kinds, attention)]
    if fv:
        lines += ["", *fvcore_notes(fv, kinds, attention)]
    return lines


def thop_notes(r: dict, kinds: dict, attention: int) -> list[str]:
    by_type = r["by_type"]
    dense = by_type.get("Conv2d", 0) + by_type.get("Linear", 0)
    missing = kinds["matmul"] + kinds["convolution"] + attention - dense
    others = ", ".join(f"{k} {v:,}" for k, v in sorted(by_type.items()) if k not in ("Conv2d", "Linear") and v)
    return [
        "**thop** counts forward hooks on leaf modules by exact type. "
        f"Conv2d {g(by_type.get('Conv2d', 0))} + Linear {g(by_type.get('Linear', 0))} = {g(dense)}; "
        f"vs diffmeter's convolution + matmul: {dense - kinds['matmul'] - kinds['convolution']:+,} MACs. "
        f"It misses {g(missing)} of diffmeter's total, and diffmeter's attention is {g(attention)}: "
        f"{'exactly the shortfall' if missing == attention else f'off by {missing - attention:+,} MACs'}. "
        "`F.scaled_dot_product_attention` is a function, not a module, so thop never sees it. "
        f"thop also adds non-MAC ops: {others or 'none'} (LayerNorm at 4 ops per element); "
        "GroupNorm, SiLU and GELU have no thop rule and count 0."
    ]


FVCORE_DENSE = ("conv", "linear", "matmul", "bmm", "addmm", "einsum", "baddbmm")


def fvcore_notes(r: dict, kinds: dict, attention: int) -> list[str]:
    ops = r["by_operator"]
    dense = sum(ops.get(op, 0) for op in FVCORE_DENSE)
    missing = kinds["matmul"] + kinds["convolution"] + attention - dense
    extra = ", ".join(f"{op} {v:,}" for op, v in sorted(ops.items()) if op not in FVCORE_DENSE)
    unsupported = ", ".join(f"{op} x{n}" for op, n in sorted(r["unsupported"].items(), key=lambda kv: -kv[1]))
    return [
        '**fvcore** traces the model with the JIT and counts per aten op, one "flop" per multiply-add '
        f"(so MACs). By operator: {', '.join(f'{op} {v:,}' for op, v in sorted(ops.items()))}. "
        f"Its matmul-like ops ({'/'.join(FVCORE_DENSE)}) sum to {g(dense)}; "
        f"vs diffmeter's convolution + matmul: {dense - kinds['matmul'] - kinds['convolution']:+,} MACs. "
        f"It misses {g(missing)} of diffmeter's total vs diffmeter's attention {g(attention)}: "
        f"{'exactly the shortfall' if missing == attention else f'off by {missing - attention:+,} MACs'}. "
        f"Skipped as unsupported (op x occurrences): {unsupported}. "
        f"It also adds non-MAC estimates ({extra or 'none'}): norms at ~5 ops per element, upsampling at 1.",
    ]


def linear_check() -> str:
    """thop and fvcore on one nn.Linear(100, 200) with a 3x100 input: 3*100*200 = 60,000 MACs."""
    layer, x = torch.nn.Linear(100, 200), torch.randn(3, 100)
    found = []
    if optional("thop"):
        import thop

        found.append(f"thop {int(thop.profile(layer, inputs=(x,), verbose=False)[0]):,}")
    if optional("fvcore"):
        from fvcore.nn import FlopCountAnalysis

        found.append(f"fvcore {int(FlopCountAnalysis(layer, x).total()):,}")
    verdict = f"{', '.join(found)}: MACs, bias adds not counted" if found else "neither tool installed"
    return f"Unit check, nn.Linear(100, 200) on a 3x100 input = 3*100*200 = 60,000 MACs: {verdict}."


# -- main --------------------------------------------------------------------------------


def main() -> None:
    load_at_start = os.getloadavg()[0]
    runs = [run_cli(["profile", "--all", "--json"]) for _ in range(RUNS)]
    serial = run_cli(["profile", "--all", "--json", "--jobs", "1"])

    start = time.perf_counter()
    import diffmeter  # noqa: F401  (warm-up import)
    from diffmeter.catalog import resolve
    from diffmeter.pipelines import build_component, component_class

    entry = resolve("sd15")
    for component in entry.components.values():
        component_class(component.class_name)  # diffusers/transformers import classes lazily
    import_s = time.perf_counter() - start
    dm, seconds, mb = measure(diffmeter_unet)
    dm.update(seconds=seconds, mb=mb, import_s=import_s, repeat_s=measure(diffmeter_unet)[1])

    build, results = None, {}
    tools = {name: fn for name, fn in (("thop", thop_unet), ("fvcore", fvcore_unet)) if optional(name)}
    for name in {"thop", "fvcore"} - tools.keys():
        print(f"{name} is not installed, skipping it: {EXTRA_HINT}", file=sys.stderr)
    if tools:
        torch.manual_seed(0)
        model, seconds, mb = measure(lambda: UNetOneInput(build_component(entry.components["unet"], "cpu")))
        build = {"seconds": seconds, "mb": mb}
        sample = torch.randn(BATCH, 4, LATENT, LATENT)
        with torch.no_grad():
            for name, fn in tools.items():
                result, seconds, mb = measure(fn, model, sample)
                results[name] = {**result, "seconds": seconds, "mb": mb}

    lines = [
        "# diffmeter profile speed, and SD 1.5 UNet MACs vs thop and fvcore",
        "",
        *machine(load_at_start),
        "",
        *cli_section(runs, serial),
        "",
        *unet_section(
            dm,
            build,
            results.get("thop"),
            results.get("fvcore"),
            analytic_attention_macs(entry.components["unet"].config),
        ),
        "",
        linear_check(),
        "",
        "Reproduce: `python benchmarks/profile_speed.py` from the repo root.",
    ]
    text = "\n".join(lines) + "\n"
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(text)
    print(text)
    print(f"written to {RESULTS}", file=sys.stderr)


if __name__ == "__main__":
    main()
