"""torch.compile: mode, fullgraph, which components, whole-model or regional, inductor flags
for diffusion models, channels_last. Compilation happens in the first (cold) call, which the
run reports apart from the steady state.

Components are compiled in place, on the method the pipeline calls: ``forward`` for the
denoiser and text encoders, ``decode`` for the VAE. Hooks registered on the module (the
stage timer, offloading) therefore stay outside the graph, and offloading, applied after
compilation, wraps the compiled method and survives the pipeline's re-installation of its
hooks after every call (a ``torch.compile(module)`` wrapper would silently fall back to the
eager forward from the second call on).

CUDA-graph modes (reduce-overhead, max-autotune) reuse output memory on every replay, so a
compiled component's outputs are cloned after each call: pipelines that keep one call's
output across the next (separate-CFG Wan and Lumina 2, prompt then negative prompt in the
text encoders) then read valid memory. The copy is one output tensor per call.
"""

from __future__ import annotations

import types
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict

from diffmeter.optimize.base import KeepsInductorFlags, Optimization, Target, unknown_components
from diffmeter.optimize.registry import register
from diffmeter.pipelines import build_component, component_class
from diffmeter.predict.compiled_time import CUDA_GRAPH_MODES

#: inductor settings that help diffusion models (as in diffusers' and PyTorch's guides)
DIFFUSION_INDUCTOR_FLAGS = {
    "conv_1x1_as_mm": True,
    "coordinate_descent_tuning": True,
    "epilogue_fusion": False,
    "coordinate_descent_check_all_directions": True,
}


class Config(BaseModel):
    model_config = ConfigDict(extra="forbid")
    mode: Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"] = "default"
    fullgraph: bool = False
    #: pipeline components to compile; empty means the denoiser (and the experts it switches to)
    components: list[str] = []
    #: compile only the repeated blocks (diffusers' compile_repeated_blocks): much faster to compile
    regional: bool = False
    inductor_flags: bool = False
    channels_last: bool = False
    backend: str = "inductor"


@register
class Compile(KeepsInductorFlags, Optimization):
    name = "compile"
    kind = "compile"
    lossless = True
    exclusive = True
    summary = "torch.compile the denoiser (or named components), whole or regionally"
    Config = Config

    @property
    def cuda_graphs(self) -> bool:
        return self.config.backend == "inductor" and self.config.mode in CUDA_GRAPH_MODES

    def components(self, target: Target) -> list[str]:
        return self.config.components or list(target.family.denoisers(target.entry))

    def supports(self, target: Target) -> str | None:
        names = self.components(target)
        if reason := unknown_components(target, names):
            return reason
        if self.config.regional:
            for name in names:
                cls = component_class(target.entry.components[name].class_name)
                if not getattr(cls, "_repeated_blocks", None):
                    return f"{cls.__name__} declares no repeated blocks for regional compilation"
        if self.cuda_graphs and target.device.type != "cuda":
            return f"{self.config.mode} records CUDA graphs; this run is on {target.device.type}"
        if self.config.channels_last:
            return _channels_last_refusal(target, names)
        return None

    def clashes(self, others: list[Optimization]) -> str | None:
        offload = next((o for o in others if o.name == "offload"), None)
        if offload is not None and offload.config.mode == "sequential":
            return (
                "compile and sequential offload do not combine: weights move on every layer call, so the "
                "compiled graph is rebuilt or broken up; use offload mode=model or group"
            )
        if offload is not None and self.cuda_graphs:
            return (
                f"compile mode={self.config.mode} records CUDA graphs at fixed weight addresses, and offloading "
                "moves the weights on every call, so every call would record the graphs again; use mode=default"
            )
        if offload is not None and offload.config.mode == "group" and self.config.fullgraph:
            return (
                "group offload moves weights inside the forward, where diffusers keeps its onload/offload out of "
                "the graph (a graph break per group), so fullgraph=True cannot compile; drop fullgraph"
            )
        cache = next((o for o in others if o.kind == "cache"), None)
        if cache is not None and self.cuda_graphs:
            return (
                f"{cache.name} keeps denoiser activations from one call to the next, which CUDA graphs overwrite "
                f"on every replay; use compile mode=default or max-autotune-no-cudagraphs"
            )
        return None

    def apply(self, pipe, target: Target) -> None:
        import torch._inductor.config as inductor

        self.keep_inductor_flags()
        if self.config.inductor_flags:
            for flag, value in DIFFUSION_INDUCTOR_FLAGS.items():
                setattr(inductor, flag, value)
        options = {"mode": self.config.mode, "fullgraph": self.config.fullgraph, "backend": self.config.backend}
        if self.config.backend != "inductor":
            options.pop("mode")
        for name in self.components(target):
            module = getattr(pipe, name)
            if self.config.channels_last:
                module.to(memory_format=torch.channels_last)
            if self.config.regional:
                module.compile_repeated_blocks(**options)
                if self.cuda_graphs:
                    module.register_forward_hook(lambda _module, _args, output: cloned(output))
            elif name == target.family.decoder:
                self._compile_decode(module, options)
            else:
                module.forward = torch.compile(module.forward, **options)
                if self.cuda_graphs:
                    module.register_forward_hook(lambda _module, _args, output: cloned(output))

    def _compile_decode(self, vae: torch.nn.Module, options: dict) -> None:
        """Compile what ``vae.decode`` runs; diffusers' offload decorator on ``decode`` is re-applied
        outside the graph, so offloading moves the VAE eagerly and the graph holds only decoding."""
        method = type(vae).decode
        undecorated = getattr(method, "__wrapped__", None)
        compiled = torch.compile(types.MethodType(undecorated or method, vae), **options)
        fresh = cloned if self.cuda_graphs else (lambda output: output)

        def decode(module, *args, **kwargs):
            return fresh(compiled(*args, **kwargs))

        if undecorated is not None:
            from diffusers.utils.accelerate_utils import apply_forward_hook

            decode = apply_forward_hook(decode)
        vae.decode = types.MethodType(decode, vae)

    def restore(self, pipe, target: Target) -> None:
        """Put the inductor settings back and drop compiled code: a later run in this process
        compiles afresh instead of hitting dynamo's recompile limit and running eagerly."""
        super().restore(pipe, target)
        torch._dynamo.reset()


def cloned(output):
    """``output`` with every tensor copied out of memory that a CUDA-graph replay will overwrite."""
    return torch.utils._pytree.tree_map_only(torch.Tensor, torch.clone, output)


def _channels_last_refusal(target: Target, names: list[str]) -> str | None:
    """channels_last lays out 4-D tensors only: 3-D convolutions (5-D weights) make ``module.to`` raise,
    and a component without 2-D convolutions would not change."""
    for name in names:
        module = build_component(target.entry.components[name], "meta")
        ranks = {parameter.dim() for parameter in module.parameters()}
        if 5 in ranks:
            return (
                f"{name} ({type(module).__name__}) has 3-D convolutions, whose 5-D weights channels_last cannot "
                "lay out; it applies to 2-D convolution models"
            )
        if 4 not in ranks:
            return f"{name} ({type(module).__name__}) has no 2-D convolution, so channels_last would change nothing"
    return None
