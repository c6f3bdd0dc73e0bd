"""Real-size random-weight components built on the CPU without torch's serial CPU random generator.

Initialising a real-size model on the CPU draws every weight from one generator, serially (T5-XXL: 132 s). Here the
parameters are made on meta (accelerate's ``init_empty_weights(include_buffers=False)``: buffers such as position
ids and rotary tables are still computed as the class computes them), then materialized at their exact shape and
dtype and filled by repeating one seeded tile of uniform values: a memory-bound copy. The scale is the one PyTorch's
own ``nn.Linear``/``nn.Conv`` initialisation gives a weight (``kaiming_uniform_(a=sqrt(5))``: U(-1/sqrt(fan_in),
1/sqrt(fan_in))), so activations stay finite and non-degenerate; gains of norms sit near 1, other vectors near 0.
The values do not change the work a dense model does (the same matmuls, convolutions and attention at the same
shapes), which is all a timing run needs.
"""

from __future__ import annotations

import math

import torch
from accelerate import init_empty_weights

from diffmeter.catalog.entry import ComponentEntry
from diffmeter.pipelines import build_component

#: the tile's length: a prime, so the rows of a matrix are different shifts of it, not copies
TILE = 65_521


def build_random(component: ComponentEntry, device: str | torch.device, seed: int = 0) -> torch.nn.Module:
    """The component with random weights on ``device``: on the CPU, filled from a tile (see the module); elsewhere
    by the classes' own initialisation, as before."""
    if torch.device(device).type != "cpu":
        return build_component(component, device)
    with init_empty_weights(include_buffers=False):
        module = build_component(component, "cpu")
    fill_parameters(module, seed)
    if hasattr(module, "tie_weights"):  # made on meta, a tied weight was registered twice, as two tensors
        module.tie_weights()
    return module


def fill_parameters(module: torch.nn.Module, seed: int = 0) -> None:
    """Every parameter left on meta materialized on the CPU at its shape and dtype and filled from the tile; a
    parameter shared by several modules (tied embeddings) stays one tensor."""
    tile = torch.empty(TILE, dtype=torch.float32).uniform_(-1.0, 1.0, generator=torch.Generator().manual_seed(seed))
    made: dict[int, torch.nn.Parameter] = {}
    for _, owner in module.named_modules(remove_duplicate=False):
        for name, parameter in list(owner._parameters.items()):
            if parameter is None or not parameter.is_meta:
                continue
            if id(parameter) not in made:
                data = torch.empty(parameter.shape, dtype=parameter.dtype)
                _fill(data, tile, name)
                made[id(parameter)] = torch.nn.Parameter(data, requires_grad=parameter.requires_grad)
            owner._parameters[name] = made[id(parameter)]


def _fill(data: torch.Tensor, tile: torch.Tensor, name: str) -> None:
    """``data`` from the tile repeated: a matrix or kernel at 1/sqrt(fan_in), a norm's gain near 1, another vector
    near 0."""
    if not data.is_floating_point() or data.numel() == 0:
        data.zero_()
        return
    if data.dim() >= 2:
        values, offset = tile / math.sqrt(math.prod(data.shape[1:])), 0.0
    else:
        values, offset = 0.02 * tile, 1.0 if name == "weight" else 0.0
    flat = data.view(-1)
    first = min(flat.numel(), TILE)
    flat[:first].copy_(values[:first] + offset)
    done = first
    while done < flat.numel():  # doubling copies: memory-bound, not one generator draw per element
        step = min(done, flat.numel() - done)
        flat[done : done + step].copy_(flat[:step])
        done += step
