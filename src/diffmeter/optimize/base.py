"""What every optimization is: a name, a kind, whether it changes the images, a pydantic
config, a check that names why it does not apply, and ``apply``.

``supports`` only looks at a ``Target`` (the catalog entry, its family and component
classes, device, dtype), so an unsupported combination is refused before any weight is
loaded. ``apply`` then changes a loaded pipeline in place; ``call_context`` wraps each
pipeline call for techniques that act per call (TF32); ``restore`` undoes what ``apply``
changed outside the pipeline (process-wide settings), so runs in one process do not leak
into each other.
"""

from __future__ import annotations

import contextlib
import importlib.util
import inspect
from dataclasses import dataclass
from functools import cached_property
from typing import ClassVar

import torch
from pydantic import BaseModel, ConfigDict

from diffmeter.catalog.entry import PipelineEntry
from diffmeter.families.base import Family
from diffmeter.optimization_spec import OptimizationSpec
from diffmeter.pipelines import component_class


class NoParams(BaseModel):
    model_config = ConfigDict(extra="forbid")


@dataclass(frozen=True)
class Target:
    """What a technique is checked against before loading: configs, classes, device, dtype."""

    entry: PipelineEntry
    family: Family
    device: torch.device
    dtype: str
    steps: int
    #: components the run loaded on the CPU for the technique that places them on ``device`` (``holds_back``)
    held: tuple[str, ...] = ()
    #: the run hands the pipeline input images (a family may then run another pipeline class: Wan's image-to-video
    #: through ``from_pipe``, ``Family.conditioned_pipeline``)
    images: bool = False
    #: the run folds a LoRA into the denoiser's weights (``--fuse-lora``: peft's merge, which a packed format refuses)
    fused_lora: bool = False

    @cached_property
    def denoiser_class(self) -> type:
        return component_class(self.entry.components[self.family.denoiser].class_name)

    @cached_property
    def pipeline_class(self) -> type:
        import diffusers

        return getattr(diffusers, self.entry.pipeline_class)

    @property
    def is_flow(self) -> bool:
        return self.family.flow_matching

    def denoiser_source_mentions(self, text: str) -> bool:
        """Whether the module defining the denoiser class uses ``text`` (e.g. dispatch_attention_fn)."""
        module = inspect.getmodule(self.denoiser_class)
        try:
            return text in inspect.getsource(module)
        except (OSError, TypeError):
            return False


class Optimization:
    """Base class; subclasses set the class attributes and override what they need."""

    name: ClassVar[str]
    #: precision | compile | attention | fusion | cache | scheduler | memory | quantization
    kind: ClassVar[str]
    #: True when images stay the same up to floating-point reassociation
    lossless: ClassVar[bool]
    summary: ClassVar[str]
    Config: ClassVar[type[BaseModel]] = NoParams
    #: (importable module, pip extra of diffmeter that installs it)
    package: ClassVar[tuple[str, str] | None] = None
    #: only one technique of this kind at a time (two caches, two schedulers ...)
    exclusive: ClassVar[bool] = False
    #: the pipeline stays on the CPU when loaded; ``apply`` places it (offloading)
    places_pipeline: ClassVar[bool] = False
    #: ``supports`` needs the package itself to decide (cache-dit's adapter registry)
    package_decides_support: ClassVar[bool] = False

    def __init__(self, config: BaseModel) -> None:
        self.config = config

    @classmethod
    def missing_package(cls) -> str | None:
        if cls.package is None:
            return None
        module, extra = cls.package
        if not importable(module):
            return f"{cls.name} needs the {module} package: pip install 'diffmeter[{extra}]'"
        return None

    def supports(self, target: Target) -> str | None:
        """None when the technique applies to ``target``; otherwise the reason it does not."""
        return None

    def refusal(self, target: Target) -> tuple[str | None, bool]:
        """(why the technique cannot run on ``target``, whether only a missing package stops it).
        Not applying comes first: a package is only worth installing for a technique that fits."""
        missing = self.missing_package()
        if missing and self.package_decides_support:
            return f"{missing} (needed to tell whether it applies)", True
        reason = self.supports(target)
        return (reason, False) if reason else (missing, missing is not None)

    @classmethod
    def variants(cls) -> list[Optimization]:
        """Instances that span the technique's choices, for the compatibility matrix."""
        return [cls(cls.Config())]

    def clashes(self, others: list[Optimization]) -> str | None:
        """None when the technique combines with ``others`` (the rest of the run's techniques);
        otherwise why it does not."""
        return None

    def apply(self, pipe, target: Target) -> None:
        raise NotImplementedError

    def holds_back(self, target: Target) -> tuple[str, ...]:
        """Components to load on the CPU: this technique moves them to ``target.device`` itself (quantization:
        a layer at a time, so the unquantized weights are never whole on the GPU)."""
        return ()

    def quantized_components(self, target: Target) -> tuple[str, ...]:
        """The components whose weights this technique quantizes (two techniques may not share one)."""
        return ()

    def load_configs(self, target: Target) -> dict:
        """Component -> the quantization config the loader passes to ``from_pretrained`` (``--quantize
        BACKEND:TYPE``: ``optimize/quantize_at_load.py``); empty for techniques applied after loading."""
        return {}

    def one_byte_components(self, target: Target) -> tuple[str, ...]:
        """Components whose weights this technique stores at one byte per parameter (int8, float8): the
        memory check counts them so (a lower bound: scales and unquantized layers come on top)."""
        return ()

    def note(self, target: Target) -> str | None:
        """What a reader of the run's figures must know about this technique (None: nothing)."""
        return None

    def call_context(self):
        """A context entered around every pipeline call (most techniques need none)."""
        return contextlib.nullcontext()

    def restore(self, pipe, target: Target) -> None:
        """Undo what ``apply`` changed beyond ``pipe`` (global settings, patched classes); called
        after the run in reverse order of application, even when the run failed."""

    def label(self) -> str:
        """Name plus the parameters that differ from the defaults, for run folders and tables."""
        defaults = type(self.config)().model_dump() if _has_defaults(type(self.config)) else {}
        changed = {k: v for k, v in self.config.model_dump().items() if defaults.get(k, object()) != v}
        if not changed:
            return self.name
        return self.name + "-" + "-".join(f"{k}={_short(v)}" for k, v in sorted(changed.items()))

    def spec(self) -> OptimizationSpec:
        return OptimizationSpec(name=self.name, params=self.config.model_dump(exclude_defaults=True, mode="json"))


def importable(module: str) -> bool:
    """Whether ``module`` can be imported (a dotted name whose parent package is missing cannot)."""
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


def _has_defaults(config: type[BaseModel]) -> bool:
    return all(not field.is_required() for field in config.model_fields.values())


def _short(value) -> str:
    if isinstance(value, list | tuple):
        return "+".join(map(str, value))
    return str(value)


def denoisers(pipe, target: Target) -> list[torch.nn.Module]:
    """The denoiser and any expert the pipeline switches to between steps (Wan 2.2's transformer_2):
    a technique on "the denoiser" applies to each, or half the steps would run without it."""
    names = target.family.denoisers(target.entry)
    return [getattr(pipe, name) for name in names if getattr(pipe, name, None) is not None]


def unknown_components(target: Target, names: list[str]) -> str | None:
    """Why ``names`` cannot be this model's components (naming the ones it has), or None where all are."""
    unknown = [name for name in names if name not in target.entry.components]
    if not unknown:
        return None
    return f"it has no component {', '.join(unknown)}; its components: {', '.join(target.entry.components)}"


class KeepsInductorFlags:
    """Mixed into a technique that changes inductor's process-wide flags (compile's, torchao's transforms):
    ``keep_inductor_flags`` before the change, and ``restore`` puts them back."""

    def keep_inductor_flags(self) -> None:
        import torch._inductor.config as inductor

        self._inductor = inductor.get_config_copy()

    def restore(self, pipe, target: Target) -> None:
        import torch._inductor.config as inductor

        if hasattr(self, "_inductor"):
            inductor.load_config(self._inductor)
