"""The caches whose skipped work follows from their config alone: DeepCache's shallow UNet calls, TaylorSeer's
predicted calls (per cache context), and the calls in which Pyramid Attention Broadcast may reuse attention.

Pyramid Attention Broadcast (diffusers hooks/pyramid_attention_broadcast.py; ``optimize/pyramid_attention_broadcast.py``
configures spatial attention only): a hooked attention module computes in its first call, in every call whose index is
a multiple of ``block_skip_range``, and in every call whose timestep is outside the open window
``timestep_skip_range`` (:157-165); in the others it returns its stored output (:167-170). It hooks every attention
module whose name holds a block list's name and that is not cross-attention (:241-253, hooks/_common.py:24-33).

DeepCache (the ``DeepCache`` package's ``DeepCacheSDHelper``, extension/deepcache.py, which ``optimize/deep_cache.py``
applies): a UNet call runs in full when its timestep's index, counted from the first call's, is a multiple of
``cache_interval`` (:25-29, the index from the scheduler's timesteps :41); in the others every wrapped module past the
cached branch returns its stored output (:24-33, :46-55), so only the shallow branch computes: ``conv_in``, the time
embedding, the down and up blocks' layers up to branch ``cache_branch_id`` and ``conv_out``.
"""

from __future__ import annotations

import re

from diffmeter.catalog import resolve

#: a module DeepCache wraps, at depth 2 of the UNet: (down|up)_blocks.i.(resnets|attentions|downsamplers|upsamplers).j
WRAPPED = re.compile(r"(down|up)_blocks\.(\d+)\.(resnets|attentions|downsamplers|upsamplers)\.(\d+)(\..*)?")


def deep_cache_full(places: list[int], interval: int) -> int:
    """The UNet calls DeepCache runs in full: the calls whose index from the first is a multiple of ``interval``
    (extension/deepcache.py:29); the index is the timestep's first place in the scheduler's timesteps (:41,
    ``families.schedule.first_places``, one per call), so a repeated timestep (PNDM's) repeats its index."""
    return sum(1 for place in places if (place - places[0]) % interval == 0)


def layers(modules: dict[str, int]) -> dict[tuple[str, int], int]:
    """The resnets in each (side, block) of the UNet: the layers DeepCache numbers a block's modules by."""
    found: dict[tuple[str, int], set[int]] = {}
    for path in modules:
        if (match := WRAPPED.fullmatch(path)) and match[3] == "resnets":
            found.setdefault((match[1], int(match[2])), set()).add(int(match[4]))
    return {key: len(value) for key, value in found.items()}


def deep_cache_skipped(path: str, branch: int, counts: dict[tuple[str, int], int], up_blocks: int) -> bool:
    """Whether DeepCache's shallow call leaves out module ``path`` (extension/deepcache.py:24-33 on the numbering of
    :61-81: a down block's layers in order, a downsampler after its resnets; the up blocks and their layers counted
    from the output end, an upsampler as layer 0; a wrapped block as layer 0 of its own number)."""
    if path.startswith("mid_block."):
        return True
    match = WRAPPED.fullmatch(path)
    if match is None:
        return False
    cached_layer, cached_block = branch % 3, branch // 3
    side, block, kind, index = match[1], int(match[2]), match[3], int(match[4])
    if side == "down":
        layer = counts.get((side, block), 0) if kind == "downsamplers" else index
        if block != cached_block:
            return block > cached_block
        return cached_layer == 0 or layer >= cached_layer  # the block itself (layer 0) is skipped at layer 0
    number = up_blocks - block - 1
    layer = 0 if kind == "upsamplers" else counts.get((side, block), 0) - index - 1
    if number != cached_block:
        return number > cached_block
    return layer > cached_layer


def deep_cache_macs(modules: dict[str, int], branch: int) -> int:
    """The multiply-accumulates a shallow call leaves out, from the UNet's ``modules`` (paths two blocks deep)."""
    counts = layers(modules)
    up_blocks = 1 + max((b for side, b in counts if side == "up"), default=-1)
    return sum(macs for path, macs in modules.items() if deep_cache_skipped(path, branch, counts, up_blocks))


#: the attention PAB hooks for spatial attention, at depth 2 of a transformer: self-attention in a block list
#: (hooks/_common.py:24-30; cross-attention, diffusers' ``attn2``, is left: pyramid_attention_broadcast.py:244-248)
PAB_ATTENTION = re.compile(r"[a-z_]*(blocks|layers)\.\d+\.attn1?")


def pab_skippable(calls: int, block_skip_range: int) -> int:
    """The calls in which PAB's hooked attention reuses its output if their timestep is inside its window: every call
    but the first and those whose index is a multiple of ``block_skip_range`` (pyramid_attention_broadcast.py:157-165).
    """
    return sum(1 for call in range(1, calls) if call % block_skip_range)


def pab_macs(modules: dict[str, int]) -> int:
    """The multiply-accumulates of the attention PAB hooks, from the denoiser's ``modules`` (paths two deep)."""
    return sum(macs for path, macs in modules.items() if PAB_ATTENTION.fullmatch(path))


def taylorseer_computed(calls: int, interval: int, before: int) -> int:
    """The calls in which TaylorSeer's hooked modules compute (diffusers hooks/taylorseer_cache.py:230-235: the
    step counts from 0 per module call; it computes before ``before`` and every ``interval`` after)."""
    return sum(1 for step in range(calls) if step < before or (step - before - 1) % interval == 0)


def cache_contexts(settled, calls: int) -> int:
    """The cache contexts a hook keeps its state in: two where CFG runs the uncond and cond calls apart, each in its
    own (``cache_context("uncond")`` and ``("cond")`` in the pipelines that separate them: QwenImagePipeline,
    WanPipeline), else one; read from the denoiser calls per step of ``settled`` (a ProfileSpec, defaults filled)."""
    from diffmeter.families import schedule  # the families load torch: a cached fit reads this module without

    return 2 if calls == 2 * schedule.denoiser_steps(resolve(settled.model), settled) else 1
