"""First-Block-Cache: run the first transformer block; when its residual changed less than
``threshold`` since the last full step, reuse the cached output of the remaining blocks."""

from __future__ import annotations

import torch
from pydantic import BaseModel, ConfigDict, Field

from diffmeter.optimize.base import Target
from diffmeter.optimize.hook_cache import HookCache, denoiser_modules, hooked_blocks
from diffmeter.optimize.registry import register
from diffmeter.predict.cache_threshold import DEFAULT_THRESHOLD


class Config(BaseModel):
    model_config = ConfigDict(extra="forbid")
    #: relative change of the first block's residual below which the rest is skipped; diffusers' own default
    threshold: float = Field(DEFAULT_THRESHOLD["first-block-cache"], gt=0)


@register
class FirstBlockCache(HookCache):
    name = "first-block-cache"
    summary = "skip all blocks after the first while the first block's output barely changes"
    Config = Config
    needs_context = True
    needs_registered_blocks = True

    def supports(self, target: Target) -> str | None:
        if reason := super().supports(target):
            return reason
        for name, module in denoiser_modules(target):
            if mismatch := head_and_tail_mismatch(module):
                return f"diffusers' first-block cache cannot run {name}: {mismatch}"
        return None

    def hook_config(self, pipe, target):
        from diffusers.hooks import FirstBlockCacheConfig

        return FirstBlockCacheConfig(threshold=self.config.threshold)


def head_and_tail_mismatch(module: torch.nn.Module) -> str | None:
    """Why diffusers' hook cannot pair the first block's output with the last's, or None. It stores the first
    block's output as a list where the block returns a tuple (hooks/first_block_cache.py:118-124) and subtracts it
    from the last block's output, a tuple's entries from its entries, a tensor as a whole (:170-179): a tuple first
    with a tensor last raises TypeError (FLUX.2's double then single blocks), the reverse subtracts a batch entry."""
    from diffusers.hooks._helpers import TransformerBlockRegistry

    blocks = hooked_blocks(module)
    if len(blocks) < 2:
        return None
    head, tail = (TransformerBlockRegistry.get(type(block)) for block in (blocks[0], blocks[-1]))
    first, last = ("one tensor" if m.return_encoder_hidden_states_index is None else "a tuple" for m in (head, tail))
    if first == last:
        return None
    return (
        f"its first block ({type(blocks[0]).__name__}) returns {first} and its last ({type(blocks[-1]).__name__}) "
        f"{last}, and the hook subtracts the one's output from the other's as if alike (a TypeError at the first "
        "call for a tuple first, wrong residuals for a tensor first)"
    )
