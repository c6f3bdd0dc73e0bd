"""The predicted size of a published quantized file of a catalog model (``catalog.quantized_files``), from the catalog's
config alone: a GGUF file's tensor data as city96's tools lay it out (``gguf_city96.file_bytes``, the rule set the
file names), a bitsandbytes checkpoint as diffusers' ``save_pretrained`` writes a component its quantizer loaded
(``rules: diffusers-bnb``), each shard of a sharded one included, nunchaku's 2024 SVDQuant files as its engine loads
them (``svdquant_files``)."""

from __future__ import annotations

import functools
import re

import torch

from diffmeter.catalog import resolve
from diffmeter.catalog.quantized_files import QuantizedFile
from diffmeter.predict import svdquant_files
from diffmeter.predict.footprints import meta_module
from diffmeter.predict.gguf_city96 import file_bytes
from diffmeter.predict.quantized_formats import stored_tensors

#: diffusers 0.42.1 ``ModelMixin.save_pretrained(max_shard_size="10GB")`` (models/modeling_utils.py:696), split by
#: huggingface_hub's ``split_torch_state_dict_into_shards`` in state-dict order
MAX_SHARD = "10GB"
#: a shard's place in its file name: ``-00001-of-00002``
SHARD = re.compile(r"-(\d{5})-of-(\d{5})\.")


@functools.cache
def component_module(model: str, component: str) -> torch.nn.Module:
    """A catalog model's component built on meta at bfloat16, once per process for every file predicted from it (a
    file's bytes follow the types its converter writes, not the dtype the module is built at)."""
    return meta_module(resolve(model).components[component], torch.bfloat16)


def predicted_bytes(files: list[QuantizedFile]) -> list[int | None]:
    """Each file's predicted bytes (None: a format whose layout is not predicted from the config)."""
    found = []
    for file in files:
        if file.rules in svdquant_files.RULES:  # nunchaku's own 2024 layout, tensor by tensor
            found.append(svdquant_files.file_bytes(resolve(file.model).components[file.component], file.rules))
            continue
        if file.format != "gguf" and file.rules != "diffusers-bnb":
            found.append(None)
            continue
        module = component_module(file.model, file.component)
        if file.format == "gguf":
            found.append(file_bytes(module, file.quant_type, file.rules))
        else:
            found.append(bnb_file_bytes(module, file))
    return found


def bnb_file_bytes(module: torch.nn.Module, file: QuantizedFile) -> int:
    """A bitsandbytes checkpoint of ``module`` saved at bfloat16 (``quantized_formats.stored_tensors``: every linear
    weight in the type, the rest whole), or the shard of it the file name gives; LLM.int8() writes each layer's
    ``SCB`` and a one-byte ``weight_format`` beside its weight (bitsandbytes nn/modules.py:1098-1114), counted in the
    weight's bytes, which is where they are saved. A 4-bit layer's ``quant_state`` description (a few hundred bytes of
    JSON per layer) is left out, as a GGUF file's header is."""
    from huggingface_hub import split_state_dict_into_shards_factory

    kind = "int8" if file.quant_type.startswith("int8") else "nf4"  # NF4 and FP4 take the same bytes
    sizes = {
        t.name: t.bytes + (1 if t.quantized and kind == "int8" else 0)
        for t in stored_tensors(module, "bnb", kind, torch.bfloat16)
    }
    shard = SHARD.search(file.file)
    if shard is None:
        return sum(sizes.values())
    split = split_state_dict_into_shards_factory(
        sizes,
        get_storage_size=lambda size: size,
        filename_pattern="model{suffix}.safetensors",
        max_shard_size=MAX_SHARD,
    )
    shards = list(split.filename_to_tensors.values())
    if len(shards) != int(shard.group(2)):
        raise ValueError(f"{file.file}: the split makes {len(shards)} shards, not {int(shard.group(2))}")
    return sum(sizes[name] for name in shards[int(shard.group(1)) - 1])


def error(predicted: int, file: QuantizedFile) -> float:
    """The prediction's relative error against the published size (0 inside a rounded figure's range)."""
    low, high = file.size.byte_range()
    if low <= predicted <= high:
        return 0.0
    return predicted / (low if predicted < low else high) - 1
