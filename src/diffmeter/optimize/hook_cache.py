"""The shared part of the caches diffusers ships as hooks (First-Block-Cache, PAB,
FasterCache, TaylorSeer, MagCache, SeaCache): they attach to denoisers built on ``CacheMixin``.
Checked before loading as the hooks fail at the first call: a hook that keeps its state per cache context needs a
pipeline that sets one (diffusers hooks/hooks.py:71-76, "No cache context is set"), and one that reads each
transformer block's metadata needs every block class in diffusers' ``TransformerBlockRegistry``
(hooks/_helpers.py:95-98, "Model class ... not registered")."""

from __future__ import annotations

import functools
import inspect
import json
from typing import Annotated, ClassVar

import torch
from pydantic import AfterValidator

from diffmeter.optimize.base import Optimization, Target, denoisers
from diffmeter.pipelines import build_component
from diffmeter.quiet import quiet_libraries


def _ordered(window: tuple[int, int]) -> tuple[int, int]:
    if window[0] >= window[1]:
        raise ValueError(f"a timestep window is (low, high) with low < high, got {list(window)}: the hook never acts")
    return window


#: a timestep window (low, high): diffusers' PAB and FasterCache hooks act where ``low < timestep < high``
#: (hooks/pyramid_attention_broadcast.py:158, faster_cache.py:272-274 and :423)
Window = Annotated[tuple[int, int], AfterValidator(_ordered)]


class HookCache(Optimization):
    """Subclasses set ``hook_config(pipe, target)``; ``needs_timestep`` for timestep-gated caches."""

    kind = "cache"
    lossless = False
    exclusive = True
    needs_timestep = False
    #: the hook keeps its state per cache context (diffusers' StateManager), which the pipeline's call must set
    needs_context: ClassVar[bool] = False
    #: the hook reads each block's metadata from diffusers' TransformerBlockRegistry
    needs_registered_blocks: ClassVar[bool] = False

    def supports(self, target: Target) -> str | None:
        from diffusers.models.cache_utils import CacheMixin

        if not issubclass(target.denoiser_class, CacheMixin):
            return f"{target.denoiser_class.__name__} has no diffusers cache hooks (it is not a CacheMixin model)"
        if self.needs_timestep and not hasattr(target.pipeline_class, "current_timestep"):
            return f"{target.entry.pipeline_class} does not expose current_timestep, which {self.name} is gated on"
        if self.needs_context and not sets_cache_context(target.pipeline_class):
            return (
                f"{target.entry.pipeline_class} never sets a cache context (model.cache_context), which {self.name} "
                "keeps its state in: diffusers would fail at the first call ('No cache context is set')"
            )
        if self.needs_registered_blocks:
            for name, module in denoiser_modules(target):
                if missing := unregistered_blocks(module):
                    return (
                        f"diffusers' {self.name} hook has no metadata for {', '.join(missing)} of {name} (its "
                        "TransformerBlockRegistry): it would fail at the first call"
                    )
        return None

    def hook_config(self, pipe, target: Target):
        raise NotImplementedError

    def apply(self, pipe, target: Target) -> None:
        for module in denoisers(pipe, target):
            module.enable_cache(self.hook_config(pipe, target))


def sets_cache_context(pipeline_class: type) -> bool:
    """Whether the module defining the pipeline calls ``cache_context`` around its denoiser calls."""
    try:
        return ".cache_context(" in inspect.getsource(inspect.getmodule(pipeline_class))
    except (OSError, TypeError):
        return True  # no source to read: left to the run


def denoiser_modules(target: Target):
    """Each denoiser of ``target`` (every expert) on the meta device, by component name."""
    for name in target.family.denoisers(target.entry):
        component = target.entry.components[name]
        yield name, meta_build(component.class_name, json.dumps(component.config, sort_keys=True))


@functools.cache
def meta_build(class_name: str, config: str) -> torch.nn.Module:
    """A component built on the meta device, once per class and config."""
    from diffmeter.catalog.entry import ComponentEntry

    with quiet_libraries():
        return build_component(ComponentEntry(class_name=class_name, config=json.loads(config)), "meta")


def hooked_blocks(module: torch.nn.Module) -> list[torch.nn.Module]:
    """The blocks diffusers' block hooks attach to, in order: those of the ``ModuleList``s its identifiers name
    (hooks/_common.py)."""
    from diffusers.hooks._common import _ALL_TRANSFORMER_BLOCK_IDENTIFIERS

    return [
        block
        for name, child in module.named_children()
        if name in _ALL_TRANSFORMER_BLOCK_IDENTIFIERS and isinstance(child, torch.nn.ModuleList)
        for block in child
    ]


def unregistered_blocks(module: torch.nn.Module) -> tuple[str, ...]:
    """The classes of ``hooked_blocks`` that diffusers' registry has no metadata for."""
    from diffusers.hooks._helpers import TransformerBlockRegistry

    missing = []
    for block in hooked_blocks(module):
        try:
            TransformerBlockRegistry.get(type(block))
        except ValueError:
            missing.append(type(block).__name__)
    return tuple(dict.fromkeys(missing))
