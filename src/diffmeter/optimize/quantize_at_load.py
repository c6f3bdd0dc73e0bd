"""What every quantization backend applied at load time shares (``--quantize BACKEND:TYPE``): the components it
quantizes, its refusals before loading, and the config objects the loader passes to ``from_pretrained``.

A backend's file says which config class makes its type (``config_for``) and why a type cannot run on a
device (``cannot_run``); ``loading`` applies the configs as users do (``PipelineQuantizationConfig``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar

from diffmeter.optimize.base import Optimization, Target, unknown_components
from diffmeter.pipelines import component_class
from diffmeter.quantization_spec import BACKENDS, DENOISER
from diffmeter.quantized_loading import Folder


class QuantizeAtLoad(Optimization):
    """A backend's type on the denoisers or named components, made by the loader; ``apply`` has nothing left."""

    kind = "quantization"
    lossless = False
    #: the types whose weights are stored in one byte (the memory check's lower bound); 4-bit ones count so too
    one_byte_types: ClassVar[tuple[str, ...]] = ()
    #: reads a pre-quantized single file through diffusers' ``from_single_file`` (GGUF, BFL)
    single_file: ClassVar[bool] = False
    #: why peft cannot merge a LoRA into its layers (``--fuse-lora``), where it cannot; None: it can
    unfusable: ClassVar[str | None] = None

    @classmethod
    def backend(cls):
        return BACKENDS[cls.name]

    @classmethod
    def variants(cls) -> list[Optimization]:
        return [cls(cls.Config(type=kind)) for kind in cls.backend().types]

    def components(self, target: Target) -> list[str]:
        names = list(self.config.components) or [DENOISER]
        denoisers = list(target.family.denoisers(target.entry))
        return list(dict.fromkeys(n for name in names for n in (denoisers if name == DENOISER else [name])))

    def cannot_run(self, target: Target) -> str | None:
        """Why this backend's type cannot run on ``target.device`` (None: it can)."""
        return None

    def component_refusal(self, target: Target) -> str | None:
        """Why a component it names cannot take this backend on any device: a LoRA fused into a format peft cannot
        merge into (``unfusable``); a pre-quantized single file (GGUF, BFL) loads through diffusers'
        ``from_single_file`` (``FromOriginalModelMixin``), which transformers' models (the text encoders) do not
        have."""
        if self.unfusable and target.fused_lora and target.family.denoiser in self.components(target):
            return f"--fuse-lora: {self.unfusable}; drop --fuse-lora (the adapter then runs beside the layers)"
        if not self.single_file:
            return None
        for name in self.components(target):
            if name not in target.entry.components:
                continue  # a name the model lacks: ``unknown_components`` says so
            held = component_class(target.entry.components[name].class_name)
            if not hasattr(held, "from_single_file"):
                return (
                    f"{name} is a {held.__name__}, which loads no single file (diffusers' from_single_file is its own "
                    f"models'): give the {self.name} file to a diffusers model (the denoiser, the VAE), or quantize "
                    f"{name} with another backend ({name}=bnb:nf4)"
                )
        return None

    def supports(self, target: Target) -> str | None:
        if reason := unknown_components(target, self.components(target)) or self.component_refusal(target):
            return reason
        reason = self.cannot_run(target)
        if reason or self.missing_package():
            return reason
        try:  # the library's own checks of its config (torchao's version, a type it does not take), before loading
            self.load_configs(target)
        except (ImportError, ValueError, TypeError) as error:
            return f"{self.name} refuses {self.config.type}: {' '.join(str(error).split())}"
        return None

    def quantized_components(self, target: Target) -> tuple[str, ...]:
        return tuple(self.components(target))

    def one_byte_components(self, target: Target) -> tuple[str, ...]:
        return tuple(self.components(target)) if self.config.type in self.one_byte_types else ()

    def is_transformers(self, target: Target, name: str) -> bool:
        return component_class(target.entry.components[name].class_name).__module__.startswith("transformers")

    def config_for(self, target: Target, transformers: bool) -> Any:
        """The library's config object for this type: transformers' class for a transformers model."""
        raise NotImplementedError

    def load_configs(self, target: Target) -> dict[str, Any]:
        return {name: self.config_for(target, self.is_transformers(target, name)) for name in self.components(target)}

    def apply(self, pipe, target: Target) -> None:
        """Nothing: the loader quantized the components (``load_configs``)."""

    def label(self) -> str:
        components = "" if not self.config.components else "-" + "+".join(self.config.components)
        return f"{self.name}-{self.config.type}{components}"


class QuantizedFolder(QuantizeAtLoad):
    """A backend whose component comes from a folder saved quantized (``--weights DIR``): diffusers reads the
    folder's ``quantization_config`` from its config.json and loads it as it is."""

    #: how a refusal names such a folder ("an AutoRound folder"), and what makes one ("auto-round's export")
    folder: ClassVar[str] = ""
    made_by: ClassVar[str] = ""

    def folder_config(self, target: Target) -> tuple[Path, dict] | str:
        """The folder and its ``quantization_config``, or why it cannot be this run's: none given, several
        components asked for, no readable config.json."""
        if self.config.file is None:
            return f"{self.name} reads a pre-quantized component folder ({self.made_by}): add --weights DIR"
        if len(self.components(target)) != 1:
            return f"{self.folder} holds one component: name one (NAME={self.name}:TYPE)"
        path = Path(self.config.file).expanduser()
        try:
            config = json.loads((path / "config.json").read_text())
        except (OSError, ValueError):
            return f"{path} is no component folder with a config.json"
        return path, config.get("quantization_config") or {}

    def config_for(self, target: Target, transformers: bool):
        return Folder(Path(self.config.file).expanduser())

    def label(self) -> str:
        return f"{super().label()}-{Path(self.config.file or 'none').name}"
