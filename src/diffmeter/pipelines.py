"""Materialize pipeline components from catalog configs: on the meta device for counting,
or with random weights on a real device for tiny test pipelines."""

from __future__ import annotations

import contextlib
import copy
import functools
import importlib
import inspect
import pkgutil

import diffusers
import torch
import transformers
from diffusers.models.modeling_utils import no_init_weights

from diffmeter.catalog.entry import ComponentEntry
from diffmeter.errors import DiffmeterError
from diffmeter.quiet import quiet_libraries

#: layers the fp8 text-encoder technique keeps in the compute dtype, as its prediction does: T5's feed-forward
#: casts its input to wo's weight dtype, so wo stays
FP8_SKIP_MODULES_PATTERN = ("embed", "norm", "shared", r"\.wo$")


def component_class(class_name: str) -> type:
    """The diffusers or transformers class a component names."""
    for library in (diffusers, transformers):
        cls = getattr(library, class_name, None)
        if cls is not None:
            return cls
    module = _pipeline_module_exporting(class_name)
    if module is not None:  # a model only its pipeline's package exports (LTX-2's connectors and vocoder)
        return getattr(importlib.import_module(module), class_name)
    raise DiffmeterError(
        f"component class '{class_name}' is in neither diffusers {diffusers.__version__} nor "
        f"transformers {transformers.__version__}; upgrade them (pip install -U diffusers transformers)"
    )


def config_value(component: ComponentEntry, key: str):
    """A config setting as the loaded model holds it: the file's value (a null stays null, as diffusers passes it
    to ``__init__``), else the class's ``__init__`` default where the file leaves the key out."""
    if key in component.config:
        return component.config[key]
    return inspect.signature(component_class(component.class_name).__init__).parameters[key].default


@functools.cache
def _pipeline_module_exporting(class_name: str) -> str | None:
    """The ``diffusers.pipelines`` package whose lazy exports name ``class_name``, if any."""
    with quiet_libraries():
        for info in pkgutil.iter_modules(diffusers.pipelines.__path__):
            if not info.ispkg:
                continue
            name = f"diffusers.pipelines.{info.name}"
            structure = getattr(importlib.import_module(name), "_import_structure", {})
            if any(class_name in names for names in structure.values()):
                return name
    return None


def build_component(component: ComponentEntry, device: str | torch.device = "meta") -> torch.nn.Module:
    """Instantiate a component from its config; on ``meta`` no weight memory is used."""
    cls = component_class(component.class_name)
    # on meta, initializing weights only costs time (torch runs each init's decomposition): skip it
    skip_init = no_init_weights() if torch.device(device).type == "meta" else contextlib.nullcontext()
    # a copy: transformers rewrites nested configs in place (Qwen2.5-VL's vision_config.model_type), which
    # changed the catalog entry and with it every cache key computed from it afterwards
    settings = copy.deepcopy(component.config)
    with quiet_libraries(), torch.device(device), skip_init:
        if issubclass(cls, diffusers.ModelMixin):
            module = cls.from_config(settings)
        else:
            config = transformers.AutoConfig.for_model(**settings)
            module = cls(config)
    return module.eval()


def count_params(module: torch.nn.Module) -> int:
    return sum(parameter.numel() for parameter in module.parameters())


def count_stored_elements(module: torch.nn.Module) -> int:
    """Elements a checkpoint stores: parameters plus persistent buffers (e.g. SD3's pos_embed)."""
    unique = {id(tensor): tensor for tensor in module.state_dict(keep_vars=True).values()}
    return sum(tensor.numel() for tensor in unique.values())
