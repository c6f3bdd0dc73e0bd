"""How many denoiser calls a threshold cache skips (First-Block-Cache, cache-dit's DBCache): the hook's own rule run
on a modelled drift of the first block's residual, one constant fitted on published runs.

The rule: a call runs the remaining blocks when the relative L1 change of the first block's residual (mean |r - r_ref|
/ mean |r_ref|) exceeds the threshold, and the reference r_ref is stored only in a call that computes, so the change
accumulates over the calls skipped since (diffusers hooks/first_block_cache.py:122-125, 133-142; ParaAttention
first_block_cache/utils.py:221-234, 270-295, 363-375, the FBCache the published runs used; cache-dit
caching/cache_blocks/pattern_base.py:280-315). The drift: an Euler step of a flow-matching schedule moves the first
block's input by (sigma_i - sigma_i-1) times the predicted velocity, so the residual's relative change per call is
modelled as kappa |sigma_i - sigma_i-1|, kappa a constant of the model: each published run gives the kappas that
reproduce its skipped calls (``kappas_of``), and a prediction spans those of the runs it is given (``share_range``).
More steps take smaller sigma steps: the same threshold skips more of them. The sigmas are FLUX.1's (the only model
with published cached runs): linspace(1, 1/N, N) (diffusers pipelines/flux/pipeline_flux.py:823) shifted by exp(mu),
mu from the image tokens (:73-83, :826-833; schedulers/scheduling_flow_match_euler_discrete.py:655-656).
"""

from __future__ import annotations

import math

#: FLUX.1's dynamic shift: calculate_shift's defaults, FluxPipeline's fallback (pipeline_flux.py:73-79, 827-833)
BASE_TOKENS, MAX_TOKENS, BASE_SHIFT, MAX_SHIFT = 256, 4096, 0.5, 1.15
#: the threshold each threshold cache runs at when none is given, the library's own default: diffusers 0.42.1
#: FirstBlockCacheConfig.threshold (hooks/first_block_cache.py:48) and cache-dit 1.5.3's DBCacheConfig
#: .residual_diff_threshold (caching/cache_contexts/cache_config.py:37); optimize/first_block_cache.py and
#: cache_dit.py default to these
DEFAULT_THRESHOLD = {"first-block-cache": 0.05, "cache-dit": 0.08}
#: the kappa grid searched: relative residual change per unit of sigma, log-spaced
GRID = tuple(0.2 * 1.01**k for k in range(700))


def sigmas(steps: int, height: int, width: int) -> list[float]:
    """FLUX.1's sigma at each of ``steps`` calls at ``height`` x ``width`` (image tokens: the latent's 2x2 patches)."""
    tokens = (height // 16) * (width // 16)
    slope = (MAX_SHIFT - BASE_SHIFT) / (MAX_TOKENS - BASE_TOKENS)
    mu = tokens * slope + BASE_SHIFT - slope * BASE_TOKENS
    plain = [1 - (1 - 1 / steps) * i / (steps - 1) for i in range(steps)] if steps > 1 else [1.0]
    return [math.exp(mu) / (math.exp(mu) + (1 / s - 1)) for s in plain]


def skipped(kappa: float, threshold: float, sigma: list[float], always: int = 1) -> int:
    """The calls the rule skips: the first ``always`` compute, then a call skips while the change accumulated since
    the last computing call stays within ``threshold``."""
    count, change = 0, 0.0
    for i in range(max(always, 1), len(sigma)):
        change += kappa * abs(sigma[i] - sigma[i - 1])
        if change <= threshold:
            count += 1
        else:
            change = 0.0
    return count


def kappas_of(share: float, threshold: float, sigma: list[float], always: int = 1) -> tuple[float, float]:
    """The drift constants that reproduce a published skipped ``share``: the lowest and highest kappa whose skipped
    count comes nearest to it."""
    target = share * len(sigma)
    misses = [abs(skipped(k, threshold, sigma, always) - target) for k in GRID]
    best = [k for k, miss in zip(GRID, misses, strict=True) if miss == min(misses)]
    return best[0], best[-1]


def share_range(kappas: tuple[float, float], threshold: float, sigma: list[float], always: int) -> tuple[float, float]:
    """The lowest and highest skipped share over the kappas from ``kappas[0]`` to ``kappas[1]``."""
    counts = [skipped(k, threshold, sigma, always) for k in GRID if kappas[0] <= k <= kappas[1]]
    counts = counts or [skipped(kappas[0], threshold, sigma, always)]
    return min(counts) / len(sigma), max(counts) / len(sigma)
