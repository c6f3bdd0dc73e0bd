"""A cache's effect on the expected time: the denoiser calls (or the blocks of a call) it skips, with what it adds.

Each cached denoiser call of the operator work is split into the calls that compute and those that skip; a skipped
call keeps the share of its multiply-accumulates the cache still runs (``flops.profile`` per module: the blocks it
always computes, and everything outside the blocks), its operators scaled by that share. Every cached call adds
the cache's own operators (the residual compare, the activations it stores or adds back). ``roofline.predict_time``
times the work at the lowest and at the highest skipped share and spans the two (``time_range``).

How many calls skip:
- interval caches: exactly, from the config and the calls (TaylorSeer; diffusers' hooks/taylorseer_cache.py:228-235);
- threshold caches (First-Block-Cache, cache-dit's DBCache): the hook's own rule run on a modelled drift of the first
  block's residual (``cache_threshold``), whose one constant each published run reproduces (``data/cache_skips.json``,
  written by benchmarks/calibrate_caches.py from benchmarks/published_caches.yaml); the range spans the constants of
  every published run.
"""

from __future__ import annotations

import re
from collections import Counter
from functools import cache

from diffmeter.catalog import resolve
from diffmeter.errors import DiffmeterError
from diffmeter.predict.cache_exact import (
    cache_contexts,
    deep_cache_full,
    deep_cache_macs,
    pab_macs,
    pab_skippable,
    taylorseer_computed,
)
from diffmeter.predict.cache_published import THRESHOLD_CACHES, extrapolated, published, threshold_share
from diffmeter.predict.cache_threshold import DEFAULT_THRESHOLD
from diffmeter.predict.schema import CacheSkip, CallWork, OperatorGroup, OperatorWork, TimePrediction

#: the caches this module times, and their parameter the published share is keyed by (None: an exact count)
TIMED = {
    **dict.fromkeys(THRESHOLD_CACHES, "threshold"),
    "taylorseer": None,
    "deep-cache": None,
    "pab": None,
}
#: the caches that change the time, and why one not timed is not
UNTIMED = {
    "mag-cache": "no published runs of its skipped steps were gathered",
    "sea-cache": "its skipped calls follow the drift of its spectral indicator of the latents (diffusers "
    "hooks/sea_cache.py:182-245), for which no published runs were gathered",
    "faster-cache": "in the calls that skip the unconditional branch it halves the denoiser's batch and approximates "
    "attention from stored outputs (diffusers hooks/faster_cache.py:276-293, 422-438), both gated on the scheduler's "
    "timesteps: the halved calls are not split out of the operator work yet",
}
CACHES = (*TIMED, *UNTIMED)
#: the block lists diffusers' hooks cache (diffusers hooks/_common.py:24-37, first_block_cache.py:229-236)
BLOCK_LISTS = ("blocks", "transformer_blocks", "single_transformer_blocks", "temporal_transformer_blocks", "layers")
#: the modules TaylorSeer hooks by default (diffusers hooks/taylorseer_cache.py:14-20, applied at :292-308)
TAYLORSEER_MODULES = (
    "^blocks.*attn",
    "^transformer_blocks.*attn",
    "^single_transformer_blocks.*attn",
    "^temporal_transformer_blocks.*attn",
)
#: First-Block-Cache's own operators per call, each over one hidden state: the head block's residual, the compare's
#: subtraction, two absolute values, two means and the division (first_block_cache.py:85, 139-141), and the tail
#: residuals stored or added back for the image and text streams (:98-106, :172-180)
FBC_OVERHEAD = 9


#: PAB's timestep window when none is given (optimize/pyramid_attention_broadcast.py Config)
PAB_WINDOW = (100, 800)
#: cache-dit's warm-up calls when none is given (optimize/cache_dit.py Config)
DEFAULT_WARMUP = {"cache-dit": {"warmup_steps": 8}}
#: what benchmarks/calibrate_caches.py found, held out a source at a time (its committed output,
#: benchmarks/results/calibration_caches.md, 2026-11-29): each cached run's skipped share from the other sources and
#: its time from the eager calibration refitted without the source's harness: the claim printed beside a cached time
HELD_OUT = (
    "held out by source (the shares and the eager calibration fitted without it), 16 of 17 published cached runs "
    "(94%) fell inside such a range, midpoint median error 6.7%, median hi/lo 2.14 "
    "(benchmarks/results/calibration_caches.md)"
)


def label(name: str, params: dict) -> str:
    """A cache as the prediction names it: "first-block-cache threshold=0.05"."""
    if name == "taylorseer":
        return f"taylorseer interval={params.get('cache_interval', 5)}"
    if name == "pab":
        window = tuple(params.get("timestep_skip_range", PAB_WINDOW))
        return f"pab range={params.get('block_skip_range', 2)} window={window}"
    if name == "deep-cache":
        return f"deep-cache interval={params.get('cache_interval', 3)} branch={params.get('cache_branch_id', 0)}"
    if name in DEFAULT_THRESHOLD:
        return f"{name} threshold={params.get('threshold', DEFAULT_THRESHOLD[name])}"
    return name


def skipped_line(skip: CacheSkip) -> str:
    """What ``profile`` prints under a cached time: the share skipped, how it was obtained, how well it held (the
    held-out claim only for the threshold caches: the exact counts have none to make)."""
    own = ", and every call the cache's own compare and stored residuals" if skip.overhead else ""
    claim = f"; {HELD_OUT}" if TIMED.get(skip.technique.split()[0]) == "threshold" else ""
    how = f"{skip.extrapolated}; {skip.how}" if skip.extrapolated else skip.how
    low, high = skip.skipped_share
    at = ""
    if low < high:  # the work and bounds shown are of the most skipped share (``time_range``)
        at = f"; the table's FLOPs, bytes and bounds at {high:.0%} skipped, its expected range over both"
    return (
        f"time with {skip.technique}: {skip.share_text()} skipped ({how}); a skipped call "
        f"still runs {skip.kept_share:.1%} of its work{own}; memory as without (its stored activations not "
        f"counted){at}{claim}"
    )


def why_untimed(name: str) -> str | None:
    return UNTIMED.get(name)


@cache
def module_macs(spec, component: str, depth: int = 3) -> tuple[dict[str, int], int]:
    """``component``'s multiply-accumulates per module (paths under it, ``depth`` levels below the pipeline) and in
    all, over a generation."""
    from diffmeter.flops.profile import profile_spec

    found = next(c for c in profile_spec(spec, depth=depth).components if c.name == component)
    prefix = component + "."
    return {k[len(prefix) :]: v for k, v in (found.modules_macs or {}).items() if k.startswith(prefix)}, found.macs


def block_of(path: str) -> tuple[str, int] | None:
    """("transformer_blocks", 3) for a module path inside a cached block list, else None."""
    parts = path.split(".")
    if len(parts) > 1 and parts[0] in BLOCK_LISTS and parts[1].isdigit():
        return parts[0], int(parts[1])
    return None


def skipped_macs(name: str, params: dict, modules: dict[str, int]) -> int:
    """The multiply-accumulates a skipped call leaves out."""
    if name == "taylorseer":
        return sum(v for k, v in modules.items() if any(re.fullmatch(p, k) for p in TAYLORSEER_MODULES))
    if name == "deep-cache":
        return deep_cache_macs(modules, params.get("cache_branch_id", 0))
    if name == "pab":
        return pab_macs(modules)
    blocks = sorted({b for k in modules if (b := block_of(k))}, key=lambda b: (BLOCK_LISTS.index(b[0]), b[1]))
    first, last = (1, 0) if name == "first-block-cache" else (params.get("fn", 8), params.get("bn", 0))
    middle = set(blocks[first : len(blocks) - last])
    return sum(v for k, v in modules.items() if block_of(k) in middle)


def hidden_state_bytes(call: CallWork) -> int:
    """One hidden state's bytes: half the largest normalization's (it reads one and writes one)."""
    return max((g.bytes for g in call.operators if g.kind == "normalization"), default=0) // 2


def overhead(name: str, params: dict, call: CallWork, hooked: int) -> list[OperatorGroup]:
    """The cache's own operators per call, each reading and writing hidden states (3 of them: two in, one out)."""
    state = 3 * hidden_state_bytes(call)
    if name in ("deep-cache", "pab"):  # the stored outputs are returned as they are (extension/deepcache.py:52-53,
        return []  # pyramid_attention_broadcast.py:170)
    if name == "taylorseer":  # per hooked module: the Taylor factors updated or the prediction summed (order+1 each)
        count = hooked * (params.get("max_order", 1) + 1)
    else:
        count = FBC_OVERHEAD
    return [OperatorGroup(kind="elementwise", flops=state // 6, bytes=state, calls=count)] if state else []


def cache_skip(work: OperatorWork, name: str, params: dict, denoisers: tuple[str, ...], spec, rows=None) -> CacheSkip:
    """What ``name`` skips in ``work``; ``rows``: the published shares (the shipped ones unless given)."""
    cached = [c for c in work.calls if c.component in denoisers]
    calls = sum(c.count for c in cached)
    modules, total = module_macs(spec, cached[0].component, 4 if name == "deep-cache" else 3)
    skipped = skipped_macs(name, params, modules)
    if not skipped:
        blocks = (
            "UNet down, mid and up blocks" if name == "deep-cache" else f"transformer blocks ({', '.join(BLOCK_LISTS)})"
        )
        raise DiffmeterError(
            f"{name}: the {cached[0].component} has none of the {blocks} {name} skips: drop --opt {name} for this model"
        )
    hooked = sum(1 for k in modules if any(re.fullmatch(p, k) for p in TAYLORSEER_MODULES))
    outside = None  # an exact count, or a threshold inside the published runs'
    settled = spec if None not in (spec.steps, spec.height) else spec.with_defaults(resolve(spec.model).defaults)
    if name == "taylorseer":
        interval, before = params.get("cache_interval", 5), params.get("disable_cache_before_step", 3)
        contexts = cache_contexts(settled, calls)
        per_denoiser = Counter()
        for call in cached:  # a denoiser's calls may be several CallWorks (cond and uncond texts of other lengths)
            per_denoiser[call.component] += call.count
        computed = sum(  # each denoiser's hooks count their own calls, per cache context
            contexts * taylorseer_computed(count // contexts, interval, before) for count in per_denoiser.values()
        )
        share = (calls - computed) / calls
        low, high = share, share
        each = f", in each of the {contexts} cache contexts (cond and uncond calls)" if contexts > 1 else ""
        how = (
            f"exact: {calls - computed} of {calls} calls predicted by the Taylor expansion (interval {interval}, "
            f"computed before call {before}{each}; diffusers hooks/taylorseer_cache.py:230-235), the hooked "
            "attention skipped in them"
        )
    elif name == "deep-cache":
        interval = params.get("cache_interval", 3)
        from diffmeter.families import schedule  # the families load torch: a cached fit reads this module without

        places = schedule.first_places(resolve(spec.model), settled.steps, settled.scheduler)  # a UNet call each
        full = deep_cache_full([place for place in places for _ in range(calls // len(places))], interval)
        low = high = (calls - full) / calls
        how = (
            f"exact: {calls - full} of {calls} UNet calls run only the shallow branch "
            f"{params.get('cache_branch_id', 0)} (one call in {interval} in full, from the first; DeepCache "
            "extension/deepcache.py:24-33)"
        )
    elif name == "pab":
        skip_range = params.get("block_skip_range", 2)
        window = tuple(params.get("timestep_skip_range", PAB_WINDOW))
        most = pab_skippable(calls, skip_range)
        low, high = 0.0, most / calls
        how = (
            f"from none up to the {most} calls past the first whose index is not a multiple "
            f"of {skip_range} (diffusers hooks/pyramid_attention_broadcast.py:157-170): those whose timestep is inside "
            f"{window} reuse the hooked self-attention; the timesteps follow the scheduler's config, not predicted"
        )
    else:
        params = {"threshold": DEFAULT_THRESHOLD[name], **DEFAULT_WARMUP.get(name, {}), **params}
        rows = published() if rows is None else rows
        low, high, how = threshold_share(name, params, settled, rows)
        outside = extrapolated(name, params, rows, settled)
    return CacheSkip(
        technique=label(name, params),
        components=list(denoisers),
        skipped_share=(low, high),
        calls=calls,
        kept_share=1 - skipped / total if total else 1.0,
        overhead=overhead(name, params, cached[0], hooked),
        how=how,
        extrapolated=outside,
    )


def scaled(call: CallWork, share: float, count: int) -> CallWork:
    """``count`` calls of ``call`` running ``share`` of its operators, modules and dispatches."""
    operators = [g.model_copy(update={"calls": round(g.calls * share)}) for g in call.operators]
    return call.model_copy(
        update={
            "count": count,
            "operators": [g for g in operators if g.calls],
            "dispatched": round(call.dispatched * share),
            "modules": round(call.modules * share),
            "fused_chains": None if call.fused_chains is None else round(call.fused_chains * share),
            "fused_bytes": None if call.fused_bytes is None else round(call.fused_bytes * share),
        }
    )


def at_share(work: OperatorWork, share: float) -> OperatorWork:
    """``work``'s cached calls with ``share`` of them skipped (rounded per call), the cache's operators added."""
    skip = work.cache
    calls = []
    for call in work.calls:
        if call.component not in skip.components:
            calls.append(call)
            continue
        skipped = round(call.count * share)
        plus = {"operators": [*call.operators, *skip.overhead], "dispatched": call.dispatched + len(skip.overhead)}
        if call.count - skipped:
            calls.append(call.model_copy(update={**plus, "count": call.count - skipped}))
        if skipped:
            light = scaled(call, skip.kept_share, skipped)
            calls.append(light.model_copy(update={"operators": [*light.operators, *skip.overhead]}))
    return work.model_copy(update={"calls": calls, "cache": None})


def spanned(fast: tuple[float, float] | None, slow: tuple[float, float] | None) -> tuple[float, float] | None:
    return (fast[0], slow[1]) if fast and slow else None


def time_range(work: OperatorWork, predict) -> TimePrediction:
    """``predict`` (a ``roofline.predict_time`` of ``work``'s device) at the most and the least skipped share:
    the expected range from the low end of the first to the high end of the second; each stage's work (FLOPs, bytes,
    operators) and bounds the first's, so a bound is of the work shown beside it."""
    low, high = work.cache.skipped_share
    fast, slow = predict(at_share(work, high)), predict(at_share(work, low))
    stages = []
    for quick, long in zip(fast.stages, slow.stages, strict=True):
        stages.append(
            quick.model_copy(
                update={
                    "expected_s": spanned(quick.expected_s, long.expected_s),
                    "gpu_s": spanned(quick.gpu_s, long.gpu_s),
                    "host_s": spanned(quick.host_s, long.host_s),
                }
            )
        )
    energy = slow.energy
    if energy and fast.energy:
        energy = energy.model_copy(update={"per_output_j": spanned(fast.energy.per_output_j, energy.per_output_j)})
    return slow.model_copy(
        update={
            "stages": stages,
            "lower_s": fast.lower_s,
            "ideal_s": fast.ideal_s,
            "expected_s": spanned(fast.expected_s, slow.expected_s),
            "energy": energy,
            "cache": work.cache,
        }
    )
