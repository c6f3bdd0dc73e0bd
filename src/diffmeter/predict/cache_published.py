"""The threshold caches' skipped share (First-Block-Cache, cache-dit's DBCache) from published runs: the hook's own
rule run on a modelled drift of the first block's residual (``cache_threshold``), whose one constant each published
run reproduces (``data/cache_skips.json``, written by benchmarks/calibrate_caches.py from
benchmarks/published_caches.yaml); the range spans the constants of every published run of the same variant."""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path

from diffmeter.predict.cache_threshold import kappas_of, share_range, sigmas
from diffmeter.spec import size_text, sizes_text  # (height, width) as width x height

SKIPS = Path(__file__).parent / "data" / "cache_skips.json"
#: the caches whose skipped calls follow a threshold on the first blocks' residual
THRESHOLD_CACHES = ("first-block-cache", "cache-dit")


def published(path: Path = SKIPS) -> tuple[dict, ...]:
    """The published skipped shares (``benchmarks/calibrate_caches.py``'s rows)."""
    return tuple(json.loads(path.read_text())["rows"])


def variant(technique: str, params: dict) -> str:
    """What a threshold cache computes every call: cache-dit's DBCache with fn=1 and bn=0 is First-Block-Cache."""
    if technique == "cache-dit" and (params.get("fn", 8), params.get("bn", 0)) != (1, 0):
        return f"cache-dit fn={params.get('fn', 8)} bn={params.get('bn', 0)}"
    return "first block"


def threshold_share(technique: str, params: dict, spec, rows) -> tuple[float, float, str]:
    """(lowest, highest skipped share, how) at ``params``' threshold for ``spec``'s steps and size: the hook's rule on
    the drift the published ``rows`` of the same ``variant`` were reproduced with (``cache_threshold``); with none,
    every threshold cache's (they all compare the relative L1 change of the first blocks' residual)."""
    mine, lent = drift_rows(technique, params, rows)
    kappas = [
        row_kappas(r["skipped_share"], r["threshold"], r["steps"], r["height"], r["width"], always(r["params"]))
        for r in mine
    ]
    span = min(k[0] for k in kappas), max(k[1] for k in kappas)
    low, high = share_range(span, params["threshold"], sigmas(spec.steps, spec.height, spec.width), always(params))
    sources = sorted({r["source"] for r in mine})
    how = (
        f"{lent}threshold {params['threshold']} at {spec.steps} steps: the hook's rule on the first block's residual "
        f"changing by {span[0]:.2f} to {span[1]:.2f} x each step of FLUX.1's sigmas, the drift that reproduces "
        f"the skipped calls of {len(mine)} published run{'s' * (len(mine) != 1)} ({'; '.join(sources)})"
    )
    return low, high, how


@cache
def row_kappas(share: float, threshold: float, steps: int, height: int, width: int, first: int) -> tuple[float, float]:
    """A published run's drift constants (``kappas_of``), once per process: every setting on every GPU reads the same
    rows (``fit --all`` spent half its warm time recomputing them)."""
    return kappas_of(share, threshold, sigmas(steps, height, width), first)


def drift_rows(technique: str, params: dict, rows) -> tuple[list[dict], str]:
    """The published ``rows`` a threshold cache's share is predicted from: those of the same ``variant``, else every
    threshold cache's, with a phrase saying so."""
    kind = variant(technique, params)
    mine = [r for r in rows if variant(r["technique"], r["params"]) == kind]
    if mine:
        return mine, ""
    mine = [r for r in rows if r["technique"] in THRESHOLD_CACHES]
    if not mine:
        raise ValueError(f"no published skipped share of {technique}")
    return mine, f"no published runs of {kind}: those of every threshold cache, "


def extrapolated(technique: str, params: dict, rows, spec=None) -> str | None:
    """Why the skipped share is extrapolated from the published runs it is predicted from (``drift_rows``): the
    threshold below or above theirs and, given the asked ``spec``, its model, steps or size unlike any of theirs (the
    drift constants are read on those runs' denoiser and schedule); None inside them."""
    mine = drift_rows(technique, params, rows)[0]
    published = [r["threshold"] for r in mine]
    low, high, threshold = min(published), max(published), params["threshold"]
    outside = []
    if not low <= threshold <= high:
        side = "below" if threshold < low else "above"
        outside.append(f"threshold {threshold:g} {side} the published {low:g}-{high:g}")
    if spec is not None:
        models, steps, sizes = settings_of(mine)
        if models and spec.model not in models:
            outside.append(f"model {spec.model}, the published runs' {', '.join(models)}")
        if not steps[0] <= spec.steps <= steps[-1]:
            outside.append(f"{spec.steps} steps, the published {span(steps)}")
        if (spec.height, spec.width) not in sizes:
            outside.append(f"{size_text((spec.height, spec.width))} px, the published {sizes_text(sizes)}")
    return f"skipped share extrapolated: {'; '.join(outside)}" if outside else None


#: how ``extrapolated`` says the threshold itself lies outside the published runs' (``threshold_outside`` reads it)
THRESHOLD_OUTSIDE = re.compile(r"threshold \S+ (below|above) the published")


def threshold_outside(said: str | None) -> bool:
    """Whether an ``extrapolated`` reason says the threshold itself lies outside the published runs' (not only the
    model, steps or size)."""
    return bool(said) and THRESHOLD_OUTSIDE.search(said) is not None


def published_settings(technique: str, params: dict, rows) -> str:
    """The models, steps and sizes of the published runs the share is predicted from, as a phrase."""
    models, steps, sizes = settings_of(drift_rows(technique, params, rows)[0])
    return f"{', '.join(models)} at {span(steps)} steps, {sizes_text(sizes)} px"


def settings_of(rows) -> tuple[list[str], list[int], list[tuple[int, int]]]:
    """The models (where named), step counts and (height, width) sizes of published ``rows``, each sorted."""
    models = sorted({r["model"] for r in rows if r.get("model")})
    return models, sorted({r["steps"] for r in rows}), sorted({(r["height"], r["width"]) for r in rows})


def span(values: list[int]) -> str:
    """``[28]`` as "28", ``[20, 28, 50]`` as "20-50"."""
    return f"{values[0]}" if values[0] == values[-1] else f"{values[0]}-{values[-1]}"


def always(params: dict) -> int:
    """The first calls a threshold cache computes whatever the residual: one (no reference yet), or cache-dit's
    warm-up steps (caching/cache_contexts/cache_context.py:313-339: calls 0 .. max_warmup_steps - 1)."""
    return max(1, params.get("warmup_steps", 1))
