"""Predicted peak memory against the real CPU run for every family, on its tiny random-weight pipeline.

For each tiny catalog pipeline: the real diffusers call on CPU (float32, the catalog's default settings, the
test prompt) under torch.profiler's memory timeline (``diffmeter.measure.memory_timeline``), against
``predict_memory(spec, on_cuda=False)`` for the same settings and prompt lengths; parameters resident and the
peak of each stage (text encoding, image encoding, one denoising step, VAE decode) and of the whole call; the
image-conditioned families also editing an input image. Tiny sizes magnify
what is small at real size (a pipeline's own small tensors, a mask), so a family off here may be close at real
size, but a family within 2% here has nothing left out that scales with the model. Random weights: sizes
are real, images noise.

Run from the repo root:  python benchmarks/memory_prediction_families_cpu.py   (about 3 minutes on 2 cores)
Writes benchmarks/results/memory_prediction_families_cpu.md and src/diffmeter/predict/data/memory_checks.json,
which ``profile --gpu`` reads to say, per family, whether its memory prediction was checked within 2%.
"""

from __future__ import annotations

import json
import os
import sys
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
os.environ["DIFFMETER_CACHE_DIR"] = "off"

from tiny_runs import TINY, tiny_call, token_settings  # noqa: E402

from diffmeter.families import get_family  # noqa: E402
from diffmeter.families.images import ImageConditioned  # noqa: E402
from diffmeter.measure.memory_timeline import measure_stage_peaks  # noqa: E402
from diffmeter.predict.memory import STAGE_OF_ROLE, predict_memory, settled_plan  # noqa: E402
from diffmeter.predict.memory_checks import CHECKS_PATH, TOLERANCE  # noqa: E402
from diffmeter.quiet import quiet_libraries  # noqa: E402
from diffmeter.spec import ProfileSpec  # noqa: E402

OUT = ROOT / "benchmarks" / "results" / "memory_prediction_families_cpu.md"
#: the whole call's peak, which may fall outside every component's call (a pipeline's own tensors)
WHOLE = "whole generation"


#: an input image (height, width) for the families that take one, checked beside their text-to-image run
EDIT_IMAGE = ((64, 72),)


def takes_images(entry) -> bool:
    family = get_family(entry.family)
    return isinstance(family, ImageConditioned) and family.takes_images(entry)


def compare(entry, image_sizes: tuple[tuple[int, int], ...] = ()) -> dict:
    """The prediction's error per stage (percent of the measured peak) and the resident bytes' difference."""
    pipe, call, settings = tiny_call(entry, image_sizes=image_sizes)
    spec = ProfileSpec(model=entry.name, **settings, **token_settings(entry, pipe))
    _, _, plan = settled_plan(spec)
    # keyed by component and method: a VAE encodes an input image and decodes the output
    components = {(c.component, c.method): (getattr(pipe, c.component), c.method, STAGE_OF_ROLE[c.role]) for c in plan}
    real = measure_stage_peaks(call, components)
    predicted = predict_memory(spec, on_cuda=False, vae_modes=())
    errors = {
        stage.stage: round(100 * (stage.peak_bytes / real.stage_peak_bytes[stage.stage] - 1), 2)
        for stage in predicted.stages
    }
    errors[WHOLE] = round(100 * (predicted.peak_bytes / real.peak_bytes - 1), 2)
    return {
        "model": entry.name + (" (editing a 72x64 image)" if image_sizes else ""),
        "resident_difference_bytes": predicted.stages[0].resident_param_bytes - real.resident_param_bytes,
        "stage_error_percent": errors,
    }


def main() -> int:
    quiet_libraries()
    rows = []
    # an image-to-video checkpoint (a default image in its entry) has no run from text alone: editing only
    runs = [(entry, ()) for entry in TINY if not entry.defaults.image_sizes]
    runs += [(entry, EDIT_IMAGE) for entry in TINY if takes_images(entry)]
    for entry, images in runs:
        rows.append({"family": entry.family, "editing": bool(images), **compare(entry, images)})
        print(rows[-1], flush=True)
    checks = {
        "families": summarize([row for row in rows if not row["editing"]]),
        "editing": summarize([row for row in rows if row["editing"]]),
    }
    when = f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC"
    CHECKS_PATH.write_text(
        json.dumps({"source": "benchmarks/memory_prediction_families_cpu.py", "date": when, **checks}, indent=1) + "\n"
    )
    write_table(rows, checks, when)
    print(f"written to {OUT} and {CHECKS_PATH}")
    return 0


def summarize(rows: list[dict]) -> dict:
    """Per family: whether every stage of every run was within the tolerance, and its worst stage."""
    by_family: dict[str, list[dict]] = {}
    for row in rows:
        by_family.setdefault(row["family"], []).append(row)
    return {
        family: {
            "within_tolerance": all(
                not row["resident_difference_bytes"]
                and all(abs(e) <= 100 * TOLERANCE for e in row["stage_error_percent"].values())
                for row in found
            ),
            "worst": max(
                ((stage, error, row["model"]) for row in found for stage, error in row["stage_error_percent"].items()),
                key=lambda item: abs(item[1]),
            ),
        }
        for family, found in sorted(by_family.items())
    }


def write_table(rows: list[dict], checks: dict, when: str) -> None:
    families = checks["families"]
    passed = sum(check["within_tolerance"] for check in families.values())
    edited = sum(check["within_tolerance"] for check in checks["editing"].values())
    lines = [
        "# Predicted peak memory against the real CPU run, every family (tiny random-weight pipelines)",
        "",
        f"- date: {when}; {len(rows)} runs of tiny pipelines of {len(families)} families; float32 on CPU, the "
        "catalog's default settings; prediction `predict_memory(spec, on_cuda=False)` against torch.profiler's "
        "memory timeline",
        f"- **{passed} of {len(families)} families within {100 * TOLERANCE:g}%** at every stage (parameters resident "
        "exact); the others are flagged where `profile --gpu` shows their memory",
        f"- editing an input image (72x64): **{edited} of {len(checks['editing'])} families within "
        f"{100 * TOLERANCE:g}%**, checked apart (a prediction with input images shows this check; tiny sizes magnify "
        "the pipeline's own small tensors)",
        "",
        "| model | family | resident (predicted - measured, bytes) | text encoding | image encoding | denoising step | "
        f"VAE decode | whole generation | within {100 * TOLERANCE:g}% |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        errors = row["stage_error_percent"]
        cells = [
            f"{errors[stage]:+.2f}%" if stage in errors else "-"
            for stage in ("text encoding", "image encoding", "denoising step", "VAE decode", WHOLE)
        ]
        ok = not row["resident_difference_bytes"] and all(abs(e) <= 100 * TOLERANCE for e in errors.values())
        lines.append(
            f"| {row['model']} | {row['family']} | {row['resident_difference_bytes']:,} | {' | '.join(cells)} | "
            + ("yes" if ok else "**no**")
            + " |"
        )
    OUT.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    sys.exit(main())
