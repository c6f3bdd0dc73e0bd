"""What a CUDA run holds beyond its tensors, measured on the card: the CUDA context, cuBLAS's and cuDNN's
handles and workspaces (outside PyTorch's allocator), and what a convolution holds beside its tensors (inside it, so in
``max_memory_allocated``). These are the figures ``fit`` holds back before it says "fits".

    python benchmarks/cuda_overhead.py      # prints JSON and writes results/cuda_overhead_<device>.json

Memory held outside PyTorch's allocator is ``total - free - reserved`` (``torch.cuda.mem_get_info``, which is
``cudaMemGetInfo``); a convolution's extra is its peak allocated above what was allocated before it and its output, as a
multiple of its input + weight + output bytes.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from diffmeter.predict.convolution_copies import copy_bytes

MIB = 2**20


def outside_allocator_mib() -> float:
    free, total = torch.cuda.mem_get_info()
    return (total - free - torch.cuda.memory_reserved()) / MIB


def conv_copies(
    channels_in: int,
    channels_out: int,
    size: int,
    dtype: torch.dtype,
    kernel: int = 3,
    frames: int = 0,
    channels_last: bool = False,
    batch: int = 1,
) -> float:
    """One convolution's peak allocated above what was allocated before it and its output, as a multiple of its
    input + weight + output bytes (0: no copies; 1: a copy of each, as a layout change makes). ``frames``: a
    3-D convolution over that many frames."""
    shape = (batch, channels_in, frames, size, size) if frames else (batch, channels_in, size, size)
    x = torch.randn(shape, device="cuda", dtype=dtype)
    w = torch.randn(channels_out, channels_in, *([kernel] * (3 if frames else 2)), device="cuda", dtype=dtype)
    if channels_last:
        x, w = x.to(memory_format=torch.channels_last), w.to(memory_format=torch.channels_last)
    conv = F.conv3d if frames else F.conv2d
    conv(x, w, padding=kernel // 2)  # first call: cuDNN picks its algorithm
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    y = conv(x, w, padding=kernel // 2)
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - before - y.numel() * y.element_size()
    tensors = sum(t.numel() * t.element_size() for t in (x, w, y))
    del x, w, y
    torch.cuda.empty_cache()
    return round(extra / tensors, 3)


def predicted_copies(channels_in: int, channels_out: int, size: int, batch: int) -> float:
    """What the memory prediction holds for that bfloat16 3x3 convolution (``copy_bytes``), as the same multiple."""
    x = torch.empty(batch, channels_in, size, size, device="meta", dtype=torch.bfloat16)
    w = torch.empty(channels_out, channels_in, 3, 3, device="meta", dtype=torch.bfloat16)
    y = torch.empty(batch, channels_out, size, size, device="meta", dtype=torch.bfloat16)
    return round(copy_bytes(x, w, y) / sum(t.numel() * t.element_size() for t in (x, w, y)), 3)


def main() -> int:
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to measure")
        return 0
    smi = subprocess.run(
        ["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader,nounits", "-i", "0"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    torch.cuda.init()
    torch.empty(1, device="cuda")
    _, total = torch.cuda.mem_get_info()
    found = {
        "device": torch.cuda.get_device_name(0),
        "nvidia_smi_name_total_mib": smi,
        "cudaMemGetInfo_total_mib": total / MIB,
        "torch": torch.__version__,
        "cudnn": torch.backends.cudnn.version(),
        "context_mib": outside_allocator_mib(),
    }
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    (a @ a).sum().item()
    found["after_cublas_mib"] = outside_allocator_mib()
    q = torch.randn(1, 24, 4096, 128, device="cuda", dtype=torch.bfloat16)
    F.scaled_dot_product_attention(q, q, q).sum().item()
    found["after_sdpa_mib"] = outside_allocator_mib()
    del a, q
    torch.cuda.empty_cache()
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        name = str(dtype).removeprefix("torch.")
        cases = {
            "conv3x3_256to128_512px": dict(channels_in=256, channels_out=128, size=512),
            "conv3x3_512to512_64px": dict(channels_in=512, channels_out=512, size=64),
            "conv1x1_256to128_512px": dict(channels_in=256, channels_out=128, size=512, kernel=1),
            "conv3x3_channels_last_256to128_512px": dict(
                channels_in=256, channels_out=128, size=512, channels_last=True
            ),
            "conv3d_3x3x3_96to96_9f_240px": dict(channels_in=96, channels_out=96, size=240, frames=9),
        }
        for case, settings in cases.items():
            found[f"{case}_{name}_copies_of_in_w_out"] = conv_copies(dtype=dtype, **settings)
    found["after_cudnn_mib"] = outside_allocator_mib()
    # a VAE decoder's 1024 px convolutions as a batched decode runs them, beside what the prediction holds for them
    for channels_out in (256, 128):
        for batch in (1, 2, 4, 8, 16):
            name = f"conv3x3_256to{channels_out}_1024px_batch{batch}_bfloat16"
            found[f"{name}_copies_of_in_w_out"] = conv_copies(256, channels_out, 1024, torch.bfloat16, batch=batch)
            found[f"{name}_predicted"] = predicted_copies(256, channels_out, 1024, batch)
    text = json.dumps(found, indent=2)
    print(text)
    slug = "".join(c if c.isalnum() else "-" for c in found["device"].lower()).strip("-")
    (Path(__file__).parent / "results" / f"cuda_overhead_{slug}.json").write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
