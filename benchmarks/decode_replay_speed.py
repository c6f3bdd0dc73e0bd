"""What replaying a tiled and sliced VAE decode buys: the decode call of two real-size video runs tracked on fake
tensors (memory tracker, cuDNN's copies, the operator tally) with every tile and slice run, then with repeated ones
replayed (``predict/replay.py``, ``predict/vae_decode.decode_units``), in one process: wall seconds each, their
ratio, and whether every figure is equal.

Run from the repo root:  python benchmarks/decode_replay_speed.py   (about 10 minutes on one core).
Writes benchmarks/results/decode_replay_speed.md.
"""

from __future__ import annotations

import platform
import time
from datetime import datetime, timezone
from pathlib import Path

from diffmeter.families import VAE_DECODER
from diffmeter.predict.memory import DTYPES, fake_module, settled_plan, track_call
from diffmeter.predict.operators import OperatorTally
from diffmeter.quiet import quiet_libraries
from diffmeter.spec import ProfileSpec

OUT = Path(__file__).resolve().parent / "results" / "decode_replay_speed.md"
RUNS = [
    ProfileSpec(model="cogvideox-2b", height=480, width=720, num_frames=49, steps=1, batch_size=2),
    ProfileSpec(model="wan21-t2v-1.3b", height=480, width=832, num_frames=81, steps=1, batch_size=2),
]


def tracked(spec: ProfileSpec, replay: bool):
    """(seconds, memory, operator groups) of the run's VAE decode with tiling and slicing on."""
    entry, spec, plan = settled_plan(spec)
    (call,) = [c for c in plan if c.role == VAE_DECODER and c.component == "vae"]
    dtype = DTYPES[spec.dtype_of(call.component, call.dtype)]
    vae = fake_module(entry.components["vae"], dtype)
    vae.enable_tiling()
    vae.enable_slicing()
    tally = OperatorTally()
    start = time.perf_counter()
    memory = track_call(vae, call, dtype, on_cuda=True, also=tally, replay=replay)
    return time.perf_counter() - start, memory, tally.groups


def main() -> None:
    lines = [
        "# Replaying a tiled and sliced VAE decode on fake tensors",
        "",
        f"Written {datetime.now(timezone.utc):%Y-%m-%d %H:%M UTC} by `python benchmarks/decode_replay_speed.py` on "
        f"{platform.processor() or platform.machine()} (one process, one core busy; wall seconds, one run each, "
        "so a ratio, not a timing to quote alone). Each row: the decode call of the run with `enable_tiling()` and "
        "`enable_slicing()`, tracked with every tile and slice run, then with repeated ones replayed.",
        "",
        "| run | all run (s) | replayed (s) | ratio | every figure equal |",
        "|---|---|---|---|---|",
    ]
    with quiet_libraries():
        for spec in RUNS:
            full_s, *full = tracked(spec, replay=False)
            replay_s, *replayed = tracked(spec, replay=True)
            setting = f"{spec.model} {spec.width}x{spec.height}x{spec.num_frames}, batch {spec.batch_size}"
            lines.append(
                f"| {setting} | {full_s:.1f} | {replay_s:.1f} | {full_s / replay_s:.1f}x | "
                f"{'yes' if full == replayed else 'NO'} |"
            )
            print(lines[-1], flush=True)
    OUT.write_text("\n".join(lines) + "\n")
    print(f"written to {OUT}")


if __name__ == "__main__":
    main()
