"""What ``torch.cuda.max_memory_reserved()`` holds beyond ``max_memory_allocated()`` over one generation: PyTorch's
CUDA caching allocator replayed on the generation's allocations, traced on fake tensors (no GPU).

Every storage a call's operators create is an allocation, freed when its last tensor dies (a finalizer on the
storage); a convolution cuDNN copies also takes its workspace (``convolution_copies.copy_bytes``) for its run. The
calls run as the pipeline runs them: the text encoders (their outputs kept to the end), two denoising steps (the
segments the first reserves serve the rest alike), the VAE decode. The parameters are left out: they sit in segments
of their own from loading on (``pipe.to('cuda')`` frees nothing), so the slack here is the activations'.

The allocator, as c10/cuda/CUDACachingAllocator.cpp has it (torch 2.x, default settings: no expandable segments, no
``max_split_size``): a request rounded up to 512 bytes; up to 1 MiB from the small pool, else the large; the smallest
free block of the pool that fits, split when what remains is at least 512 bytes (small) or over 1 MiB (large); else a
new segment: 2 MiB for a small request, 20 MiB for one under 10 MiB, else the request rounded up to 2 MiB; a freed
block merged with its free neighbours in its segment; segments kept until emptied by ``empty_cache`` (never here).
"""

from __future__ import annotations

import bisect
import json
import sys
import weakref
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

MIN_BLOCK, SMALL_SIZE, SMALL_BUFFER = 512, 2**20, 2 * 2**20
MIN_LARGE_ALLOC, ROUND_LARGE, LARGE_BUFFER = 10 * 2**20, 2 * 2**20, 20 * 2**20
GIB = 2**30
#: a simulated figure this close to the measured one (GiB) counts as reproducing it in the result's summary
CLOSE = 0.3


def rounded(size: int, unit: int) -> int:
    return -(-size // unit) * unit


@dataclass(eq=False)
class Block:
    segment: int
    offset: int
    size: int
    free: bool = True
    prev: Block | None = None
    next: Block | None = None


@dataclass
class Allocator:
    """The caching allocator's block bookkeeping on one stream: allocated and reserved bytes, and their peaks."""

    pools: dict[bool, list] = field(default_factory=lambda: {True: [], False: []})  # small? -> sorted free blocks
    allocated: int = 0
    reserved: int = 0
    peak_allocated: int = 0
    peak_reserved: int = 0
    segments: int = 0
    live: dict = field(default_factory=dict)

    def malloc(self, key, size: int) -> None:
        size = MIN_BLOCK if size < MIN_BLOCK else rounded(size, MIN_BLOCK)
        small = size <= SMALL_SIZE
        pool = self.pools[small]
        at = bisect.bisect_left(pool, (size, -1, -1))
        if at < len(pool):
            _, _, _, block = pool.pop(at)
        else:
            whole = (
                SMALL_BUFFER
                if small
                else LARGE_BUFFER
                if size < MIN_LARGE_ALLOC
                else -(-size // ROUND_LARGE) * ROUND_LARGE
            )
            self.segments += 1
            block = Block(self.segments, 0, whole)
            self.reserved += whole
            self.peak_reserved = max(self.peak_reserved, self.reserved)
        remaining = block.size - size
        if remaining >= MIN_BLOCK if small else remaining > SMALL_SIZE:
            rest = Block(block.segment, block.offset + size, remaining, True, block, block.next)
            if block.next is not None:
                block.next.prev = rest
            block.next, block.size = rest, size
            self._insert(rest, small)
        block.free = False
        self.live[key] = (block, small)
        self.allocated += block.size
        self.peak_allocated = max(self.peak_allocated, self.allocated)

    def release(self, key) -> None:
        block, small = self.live.pop(key)
        self.allocated -= block.size
        block.free = True
        for neighbour in (block.prev, block.next):
            if neighbour is not None and neighbour.free:
                self.pools[small].remove(self._entry(neighbour))
                first, second = (neighbour, block) if neighbour is block.prev else (block, neighbour)
                first.size += second.size
                first.next = second.next
                if second.next is not None:
                    second.next.prev = first
                block = first
        self._insert(block, small)

    @staticmethod
    def _entry(block: Block) -> tuple:
        return (block.size, block.segment, block.offset, block)

    def _insert(self, block: Block, small: bool) -> None:
        pool = self.pools[small]
        entry = self._entry(block)
        pool.insert(bisect.bisect_left(pool, entry[:3]), entry)


class Traced(TorchDispatchMode):
    """Feeds ``allocator`` every storage the operators create, and frees it when the storage dies."""

    def __init__(self, allocator: Allocator) -> None:
        super().__init__()
        self.allocator = allocator

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        from diffmeter.predict.convolution_copies import copy_bytes

        output = func(*args, **(kwargs or {}))
        given = {t.untyped_storage()._cdata for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
        for tensor in tree_leaves(output):  # a view or an in-place result is its argument's storage: no allocation
            if isinstance(tensor, torch.Tensor) and tensor.untyped_storage()._cdata not in given:
                self.track(tensor)
        if func is torch.ops.aten.convolution.default and (workspace := copy_bytes(args[0], args[1], output)):
            self.allocator.malloc("workspace", workspace)
            self.allocator.release("workspace")
        return output

    def track(self, tensor: torch.Tensor) -> None:
        storage = tensor.untyped_storage()
        key = storage._cdata
        if key in self.allocator.live or not storage.nbytes():
            return
        self.allocator.malloc(key, storage.nbytes())
        weakref.finalize(storage, self._free, key)

    def _free(self, key) -> None:
        if key in self.allocator.live:
            self.allocator.release(key)


def generation(spec, steps: int = 2, generations: int = 1, allocator: Allocator | None = None) -> Allocator:
    """The allocator after ``generations`` generations at ``spec`` (its plan, as ``predict.memory`` runs it),
    parameters left out: text encoders (outputs kept to the generation's end), ``steps`` denoising steps, the VAE
    decode; ``allocator``: one that loading left (its blocks live and cached), continued."""
    from diffmeter.predict.fake_run import fake_run
    from diffmeter.predict.memory import DTYPES, cast_floating, fake_module, settled_plan
    from diffmeter.stages import DENOISER, TEXT_ENCODER

    entry, spec, plan = settled_plan(spec)
    allocator, modules = Allocator() if allocator is None else allocator, {}
    for _ in range(generations):
        kept = []
        for call in plan:
            if not call.count:
                continue
            dtype = DTYPES[spec.dtype_of(call.component, call.dtype)]
            if (call.component, dtype) not in modules:
                modules[call.component, dtype] = fake_module(entry.components[call.component], dtype)
            module = modules[call.component, dtype]
            handle = call.prepare(module) if call.prepare else None
            try:
                for _ in range(min(call.count, steps) if call.role == DENOISER else 1):
                    with fake_run(call.reads_values), Traced(allocator):
                        with torch.device("cpu"):
                            inputs = cast_floating(call.build(torch.device("cpu")), dtype)
                        output = getattr(module, call.method)(**inputs)
                        if call.role == TEXT_ENCODER:
                            kept.append(output)
                        del inputs, output
            finally:
                if handle is not None:
                    handle.remove()
        del kept
    return allocator


ROOT = Path(__file__).resolve().parent.parent
#: bench runs on an H200 with CUDA's allocated and reserved peaks (torch 2.11, diffusers 0.42.1)
MEASURED = ROOT / "benchmarks" / "results" / "gpu_calibration_nvidia-h200.jsonl"
OUT = ROOT / "benchmarks" / "results" / "reserved_memory_h200.md"


def measured_runs() -> list[dict]:
    """Each measured run's setting and CUDA peaks (bytes): max allocated and max reserved of its measured
    iterations, which follow loading and the warm-up (``reset_peak_memory_stats`` leaves the reserved segments)."""
    runs = []
    for line in MEASURED.read_text().splitlines():
        run = json.loads(line)
        memory = run.get("summary", {}).get("peak_memory", {})
        if run.get("status") != "complete" or not memory.get("cuda_max_reserved_bytes"):
            continue
        runs.append({"spec": run["spec"], **memory})
    return runs


def main() -> int:
    from diffmeter.spec import ProfileSpec

    lines = [
        "# Cached blocks of the CUDA caching allocator: simulated vs measured",
        "",
        f"- measured: {MEASURED.relative_to(ROOT)} (bench on an H200: reserved minus allocated peak of the measured "
        "iterations, after loading and the warm-up); simulated: benchmarks/reserved_memory.py over as many "
        "generations (warm-up + iterations), parameters left out. GiB. Nothing is fitted.",
        "",
        "| model | setting | measured | simulated | difference |",
        "|---|---|---|---|---|",
    ]
    differences = []
    for run in measured_runs():
        spec = run["spec"]
        settings = {key: spec[key] for key in ("height", "width", "steps", "batch_size", "dtype", "num_frames")}
        allocator = generation(ProfileSpec(model=spec["model"], **settings), 2, spec["warmup"] + spec["iterations"])
        measured = (run["cuda_max_reserved_bytes"] - run["cuda_max_allocated_bytes"]) / GIB
        simulated = (allocator.peak_reserved - allocator.peak_allocated) / GIB
        setting = f"{spec['width']}x{spec['height']}, batch {spec['batch_size']}, {spec['dtype']}"
        lines.append(
            f"| {spec['model']} | {setting} | {measured:.3f} | {simulated:.3f} | {simulated - measured:+.3f} |"
        )
        differences.append(simulated - measured)
        print(lines[-1], flush=True)
    close = sum(abs(d) <= CLOSE for d in differences)
    lines += [
        "",
        f"{close} of {len(differences)} within {CLOSE} GiB; the others are not explained (the trace is of fake CPU "
        "tensors: a CUDA kernel's own temporaries, other than cuDNN's convolution copies, are not in it)",
    ]
    OUT.write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
