"""Which ``--quantize BACKEND:TYPE`` formats have their time modelled (``quantized_time``), why the others have none,
and the held-out claim printed beside a quantized time: torch-free, so a cached ``fit`` loads no library."""

from __future__ import annotations

import json
from pathlib import Path

#: the types whose time is modelled, per backend
MODELLED = {
    "gguf": None,  # every block type (BF16 and F16 tensors are whole: no change)
    "bnb": ("nf4", "fp4"),
    "quanto": ("int8", "float8"),
    "torchao": ("int8wo", "float8wo", "float8dq-tensor", "float8dq-row"),
}
INT4 = (
    "its packed int4 kernels run far from any bound in eager mode: FLUX.1-dev on an H100, 109 s against 12 s in "
    "bfloat16 (benchmarks/published_quantized.yaml)"
)
#: why a type's time is not modelled
NOT_MODELLED = {
    "bnb": "LLM.int8() splits outlier columns by their values at run time",
    "torchao": INT4,
    "quanto": INT4,
    "sdnq": "no published quantized latency to check it on",
}
#: what the held-out test of these formats found, per format and for all (benchmarks/calibrate_quantized.py writes
#: it beside benchmarks/results/calibration_quantized.md): the claim printed beside a quantized time
HELD_OUT = Path(__file__).parent / "data" / "quantized_held_out.json"


def held_out_claim(names: list[str]) -> str:
    """The held-out figure of each quantized format in ``names`` ("gguf:Q4_K_S"): its own published eager runs'
    where there are any, else that there are none (benchmarks/calibrate_quantized.py leaves compiled runs out:
    torchao:float8dq-row's published runs are all compiled), with every eager quantized run's."""
    found = json.loads(HELD_OUT.read_text())

    def said(stats: dict) -> str:
        misses = stats["runs"] - stats["inside"]
        where = f"; the misses predicted too fast {stats['too_fast']}, too slow {misses - stats['too_fast']}"
        return (
            f"held out by source, {stats['inside']} of {stats['runs']} ({stats['inside'] / stats['runs']:.0%}) inside "
            f"such a range, midpoint median error {stats['median_error']:.1%}{where if misses else ''}"
        )

    formats, names = found["formats"], list(dict.fromkeys(names))  # one format on several components: said once
    claims = [f"{name}: its published runs {said(formats[name])}" for name in names if name in formats]
    if unpublished := [name for name in names if name not in formats]:  # said once for all of them
        which = "these formats" if len(unpublished) > 1 else "this format"
        claims.append(
            f"{', '.join(unpublished)}: no published eager run of {which} (the test takes eager runs only: no "
            f"compiled quantized run is held out); all {found['all']['runs']} published eager quantized runs: "
            f"{said(found['all'])}"
        )
    return "; ".join(claims) + " (benchmarks/results/calibration_quantized.md)"


def why_not_modelled(backend: str, kind: str) -> str | None:
    """Why the time of ``backend``:``kind`` is not modelled, or None where it is."""
    types = MODELLED.get(backend, ())
    if backend in MODELLED and (types is None or kind in types):
        return None
    return NOT_MODELLED.get(backend, "not modelled")


def needs_fp8(backend: str, kind: str) -> bool:
    """Whether the type runs its matmuls on FP8 tensor cores (CUDA, compute capability 8.9 and up)."""
    return backend == "torchao" and kind.startswith("float8dq")
