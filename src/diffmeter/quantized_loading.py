"""Components loaded quantized, as users load them (``--quantize BACKEND:TYPE``).

From a checkpoint folder: diffusers' ``PipelineQuantizationConfig(quant_mapping={component: config})`` given to
the pipeline's ``from_pretrained``, a GGUF or BFL single file through the model class's ``from_single_file(...,
quantization_config=GGUFQuantizationConfig(compute_dtype=...), config=<the component's folder>)``, and a pre-quantized
component folder (Nunchaku Lite) through the class's ``from_pretrained(folder)``, which reads the
``quantization_config`` its config.json holds.

Random-weight pipelines (tiny entries, ``--random-weights``) are built in memory, which no quantizer reads, so each
component to quantize is written with its own ``save_pretrained`` to a temporary folder and read back by its class's
``from_pretrained(folder, quantization_config=config, torch_dtype=dtype)``: the same loader, the same quantizer and
the same weights, only from a folder this run wrote.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from diffmeter.errors import DiffmeterError
from diffmeter.quiet import quiet_libraries


@dataclass(frozen=True)
class SingleFile:
    """A component's pre-quantized single file (GGUF) and the quantization config its loader takes."""

    path: Path
    config: Any


@dataclass(frozen=True)
class Folder:
    """A component's pre-quantized folder: its config.json holds the ``quantization_config`` diffusers loads it by;
    ``device_map``: the device ``from_pretrained`` loads it on, for a quantizer that picks its layers by it (None:
    diffusers' default, the CPU)."""

    path: Path
    device_map: str | None = None


def pretrained_arguments(root: Path, configs: dict[str, Any], torch_dtype) -> dict[str, Any]:
    """``from_pretrained``'s extra arguments for a checkpoint folder: the quantization mapping, and each single-file
    component loaded already (the pipeline then takes it as it is)."""
    from diffusers import PipelineQuantizationConfig

    arguments: dict[str, Any] = {}
    mapping = {name: config for name, config in configs.items() if not isinstance(config, (SingleFile, Folder))}
    if mapping:
        arguments["quantization_config"] = PipelineQuantizationConfig(quant_mapping=mapping)
    for name, config in configs.items():
        if isinstance(config, SingleFile):
            arguments[name] = from_single_file(name, config, root, _dtype_of(torch_dtype, name))
        elif isinstance(config, Folder):
            arguments[name] = from_folder(name, config, root, _dtype_of(torch_dtype, name))
    return arguments


def from_single_file(name: str, single: SingleFile, root: Path, dtype: torch.dtype):
    """The component ``name`` from its single file, its config read from ``root/name``."""
    import json

    import diffusers
    from diffusers.loaders.single_file_utils import SingleFileComponentError

    class_name = json.loads((root / name / "config.json").read_text())["_class_name"]
    model = getattr(diffusers, class_name)
    try:
        with quiet_libraries():
            return model.from_single_file(
                str(single.path), quantization_config=single.config, config=str(root), subfolder=name, torch_dtype=dtype
            )
    except SingleFileComponentError:  # its tensors converted to none of the class's (single_file_model.py:532-535)
        raise DiffmeterError(
            f"--weights {single.path.name}: diffusers found no {class_name} weights in it (the {name} of this "
            "model): it is another model's or another component's file; pass the one made from this model's "
            f"{name}, or name its component (NAME=BACKEND:TYPE)"
        ) from None
    except (IndexError, KeyError, ValueError, RuntimeError) as error:
        if isinstance(error, torch.OutOfMemoryError):
            raise
        # its keys are not this class's, so diffusers converts them (single_file_model.py:523) by this model's
        # mapping, which fails on another model's or variant's layout (a FLUX.1-dev file for schnell, SD3's for FLUX)
        first = (str(error).strip().splitlines() or [""])[0][:200]
        raise DiffmeterError(
            f"--weights {single.path.name}: diffusers could not load it as this model's {name} ({class_name}: "
            f"{type(error).__name__}: {first}): it is likely another model's or variant's file; pass the one made "
            f"from this model's {name}"
        ) from None


def from_folder(name: str, folder: Folder, root: Path, dtype: torch.dtype):
    """The component ``name`` from its pre-quantized folder, by the class ``root/name`` names (its quantizer from the
    folder's own config)."""
    import json

    import diffusers

    class_name = json.loads((root / name / "config.json").read_text())["_class_name"]
    placed = {"device_map": folder.device_map} if folder.device_map else {}
    with quiet_libraries():
        return getattr(diffusers, class_name).from_pretrained(str(folder.path), torch_dtype=dtype, **placed)


def quantize_built(pipe, configs: dict[str, Any], dtypes: dict[str, torch.dtype]) -> None:
    """Each component of an in-memory pipeline named in ``configs`` reloaded quantized, through a temporary folder
    (module docstring); ``dtypes``: each component's dtype as loaded."""
    for name, config in configs.items():
        module = getattr(pipe, name)
        with tempfile.TemporaryDirectory(prefix="diffmeter-quantize-") as folder:
            root = Path(folder)
            module.save_pretrained(root / name)
            if isinstance(config, SingleFile):
                loaded = from_single_file(name, config, root, dtypes[name])
            elif isinstance(config, Folder):
                loaded = from_folder(name, config, root, dtypes[name])
            else:
                loaded = load_quantized(type(module), root / name, config, dtypes[name])
        pipe.register_modules(**{name: loaded})


def load_quantized(cls, folder: Path, config, dtype: torch.dtype):
    """``cls.from_pretrained(folder)`` quantized by ``config`` (transformers names the dtype argument ``dtype``)."""
    import transformers

    key = "dtype" if issubclass(cls, transformers.PreTrainedModel) else "torch_dtype"
    with quiet_libraries():
        return cls.from_pretrained(folder, quantization_config=config, **{key: dtype})


def _dtype_of(torch_dtype, name: str) -> torch.dtype:
    return torch_dtype.get(name, torch_dtype["default"]) if isinstance(torch_dtype, dict) else torch_dtype
