"""`diffmeter fit`: which memory settings let a generation fit a GPU, likely fastest first (``predict/``)."""

from __future__ import annotations

import json
import re
from typing import Annotated

import typer

from diffmeter.cli.app import command, console, load_libraries
from diffmeter.cli.options import (
    GENERATION,
    AsJson,
    BatchSize,
    ComponentDtype,
    GpuName,
    GuidanceScale,
    Height,
    ModelArgument,
    NumFrames,
    TrueCfgScale,
    Width,
)
from diffmeter.errors import DiffmeterError


@command()
def fit(
    model: ModelArgument,
    memory: Annotated[
        str | None,
        typer.Option(
            metavar="SIZE", help='GPU memory to fit in, e.g. "22.5GB" (read as GiB: nvidia-smi\'s 23034MiB is 22.5GB)'
        ),
    ] = None,
    gpu: GpuName = None,
    height: Height = None,
    width: Width = None,
    batch_size: BatchSize = 1,
    guidance_scale: GuidanceScale = None,
    true_cfg_scale: TrueCfgScale = None,
    num_frames: NumFrames = None,
    dtype: Annotated[
        str | None, typer.Option(metavar="DTYPE", help="float16 | bfloat16 | float32", rich_help_panel=GENERATION)
    ] = None,
    component_dtype: ComponentDtype = None,
    as_json: AsJson = False,
) -> None:
    """List the memory settings (offload, quantization, VAE tiling, fp8 text encoder) whose predicted
    peak fits the GPU, likely fastest first (ordered by how each technique works: no time is predicted)."""
    from diffmeter.predict.devices import chosen_gpu, spec_gpu
    from diffmeter.report.memory_table import fit_table
    from diffmeter.spec import ProfileSpec, parse_component_dtypes

    if (memory is None) == (gpu is None):
        raise DiffmeterError("give the memory to fit in: --memory 24GB, or --gpu NAME (not both)")
    target = chosen_gpu(gpu, None) if gpu else spec_gpu(_memory(memory)).model_copy(update={"name": memory})
    if not target.memory_bytes:
        raise DiffmeterError(f"{target.name} has no single memory size in the table; pass --memory")
    spec = ProfileSpec(
        model=model,
        height=height,
        width=width,
        batch_size=batch_size,
        guidance_scale=guidance_scale,
        true_cfg_scale=true_cfg_scale,
        num_frames=num_frames,
        dtype=dtype,
        component_dtypes=parse_component_dtypes(component_dtype),
    )
    load_libraries()
    from diffmeter.predict.memory import predict_memory
    from diffmeter.predict.techniques import fitting

    prediction = predict_memory(spec)
    # fp8 weights need FP8 tensor cores: a table GPU says whether it has them; a bare --memory is not refused
    fits = fitting(prediction, target.memory_bytes, fp8=gpu is None or "fp8" in target.tflops)
    if as_json:
        rows = [{"techniques": list(chosen), "peak_bytes": peak} for chosen, peak in fits]
        print(json.dumps({"model": model, "memory_bytes": target.memory_bytes, "fits": rows}, indent=2))
        return
    console.print(fit_table(model, prediction, target, fits))


def _memory(text: str) -> str:
    """``--memory``: a positive size in GB (read as GiB) or GiB, such as 24GB; one clear line otherwise."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(gb|gib|g)?\s*", text, re.IGNORECASE)
    if match is None or float(match.group(1)) <= 0:
        raise DiffmeterError(f"--memory takes a positive size such as 24GB (read as GiB); got '{text}'")
    return f"{match.group(1)}GB"
