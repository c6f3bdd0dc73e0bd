"""CFG parallelism: the conditional and unconditional halves of each classifier-free-guided step on the two
ranks of a CFG group, their noise predictions gathered so both ranks continue with the whole step.

What xDiT calls CFG parallelism, applied here as one more layer on the loaded denoiser (after diffusers'
context parallelism, which then runs inside each half), in two forms:

* **batched** (SD, SDXL, PixArt, SANA, SD3...: one denoiser call on the unconditional and conditional batches
  stacked): each rank runs its half of the stacked batch, every input whose first dimension is the stacked
  batch cut to that half; the two output halves are gathered back in order.
* **separate** (Wan, QwenImage, Chroma, true CFG...: two denoiser calls per step, the first then the second):
  rank 0 runs the first call of each pair and rank 1 the second. The rank that skips a call returns an empty
  tensor of the output's shape at once, and fills it in place when the pair's outputs are exchanged at the end
  of the second call, before the pipeline combines them (diffusers' pipelines read the first prediction only
  after the second call returns). The very first pair runs its first call on both ranks, so rank 1 learns the
  output's shape; every later pair, the measured calls included, is split.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

BATCHED, SEPARATE = "batched", "separate"


class CfgParallel:
    """The layer itself: ``wrap`` it around each denoiser (one shared instance: experts alternate within a run)."""

    def __init__(self, group, mode: str) -> None:
        self.group, self.mode = group, mode
        self.rank = dist.get_rank(group)
        self.calls = 0  # separate: calls so far; an even one opens a pair
        self.held: torch.Tensor | None = None  # separate: the pair's first prediction (or its empty stand-in)
        self.like: tuple | None = None  # separate: the first prediction's shape, dtype and device

    def wrap(self, model: torch.nn.Module) -> None:
        """Around ``model.forward`` (inside its hooks, outside any compiled forward), as diffusers' hooks are."""
        forward = model.forward
        split = self._batched if self.mode == BATCHED else self._separate

        def cfg_parallel_forward(*args, **kwargs):
            return split(forward, args, kwargs)

        model.forward = cfg_parallel_forward

    def _batched(self, forward, args: tuple, kwargs: dict):
        stacked = _first_tensor((args, kwargs)).shape[0]
        half = stacked // 2
        cut = _map((args, kwargs), lambda t: t[self.rank * half : (self.rank + 1) * half], stacked)
        output = forward(*cut[0], **cut[1])
        return _map(output, self._gathered, half)

    def _separate(self, forward, args: tuple, kwargs: dict):
        opening = self.calls % 2 == 0
        self.calls += 1
        if opening:
            if self.rank == 0 or self.like is None:
                output = forward(*args, **kwargs)
                prediction = _first_tensor(output)
                self.like = (prediction.shape, prediction.dtype, prediction.device)
                self.held, self.structure = prediction, output
                return output
            shape, dtype, device = self.like
            self.held = torch.empty(shape, dtype=dtype, device=device)
            return _replace_first(self.structure, self.held)
        if self.rank == 1:
            output = forward(*args, **kwargs)
            mine = _first_tensor(output)
        else:
            output, mine = self.structure, self.held
        first, second = self._exchange(mine)
        if self.rank == 0:
            return _replace_first(output, second)
        self.held.copy_(first)  # the stand-in the pipeline holds for the first prediction
        return output

    def _exchange(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        parts = [torch.empty_like(tensor) for _ in range(dist.get_world_size(self.group))]
        dist.all_gather(parts, tensor.contiguous(), group=self.group)
        return parts

    def _gathered(self, tensor: torch.Tensor) -> torch.Tensor:
        return torch.cat(self._exchange(tensor), dim=0)


def _first_tensor(value: Any) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value
    items = value.values() if isinstance(value, dict) else value if isinstance(value, list | tuple) else ()
    for item in items:
        found = _first_tensor(item)
        if found is not None:
            return found
    return None


def _map(value: Any, change, batch: int) -> Any:
    """``value`` with every tensor whose first dimension is ``batch`` changed, through tuples, lists and dicts
    (a diffusers output is an ordered dict)."""
    if isinstance(value, torch.Tensor):
        return change(value) if value.dim() > 0 and value.shape[0] == batch else value
    if isinstance(value, dict):
        return type(value)(**{key: _map(item, change, batch) for key, item in value.items()})
    if isinstance(value, list | tuple):
        return type(value)(_map(item, change, batch) for item in value)
    return value


def _replace_first(structure: Any, tensor: torch.Tensor) -> Any:
    """The denoiser's output ``structure`` (a tensor, a tuple, a diffusers output) with ``tensor`` as its prediction."""
    if isinstance(structure, torch.Tensor):
        return tensor
    if isinstance(structure, tuple):
        return (tensor, *structure[1:])
    first = next(iter(structure))
    return type(structure)(**{**structure, first: tensor})
