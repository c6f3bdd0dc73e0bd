"""Fuse the query, key and value projections of every attention layer into one matmul."""

from __future__ import annotations

from diffmeter.optimize.base import Optimization, Target, denoisers
from diffmeter.optimize.registry import register


@register
class FuseQKV(Optimization):
    name = "fuse-qkv"
    kind = "fusion"
    lossless = True
    summary = "one matmul for Q, K and V (diffusers fuse_qkv_projections)"

    def supports(self, target: Target) -> str | None:
        if not hasattr(target.denoiser_class, "fuse_qkv_projections"):
            return f"{target.denoiser_class.__name__} has no fuse_qkv_projections"
        return None

    def apply(self, pipe, target: Target) -> None:
        for module in denoisers(pipe, target):
            module.fuse_qkv_projections()
