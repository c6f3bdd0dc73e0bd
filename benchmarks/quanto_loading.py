"""What ``pipe.to('cuda')`` allocates on the GPU for a pipeline loaded with optimum-quanto weights (diffusers' and
transformers' ``QuantoConfig`` at ``from_pretrained``), replayed through PyTorch's caching allocator
(``reserved_memory.Allocator``): the reserved bytes after loading, and the allocator a generation then continues.

Where it happens: without a ``device_map`` both libraries load and quantize on the CPU (diffusers of 2025-05-20,
ba8dc7dc, models/model_loading_utils.py:137-141 ``_determine_param_device`` -> "cpu", quantizers/quanto/
quanto_quantizer.py:104-105 ``set_module_tensor_to_device`` then ``freeze``; transformers 4.x quantizers/
quantizer_quanto.py ``update_device_map``: ``{"": "cpu"}``); ``pipe.to('cuda')`` then moves the
components in sorted name order (pipelines/pipeline_utils.py:469-471 in ``to``, :1658 ``sorted(expected_modules)``),
each by ``nn.Module._apply``: a module's children first, then its parameters, then its buffers (torch/nn/modules/
module.py:932, :957, :1032 in the installed 2.13).

What a move allocates, optimum-quanto 0.2.7 (the release of 2025-03-06, the newest when the post ran; the installed
one, its files equal to the tag's), under optimum/quanto/:
- a tensor left whole, and an int8 weight's data then scale (tensor/weights/qbytes.py:298-299): each once, kept;
- an int4 weight: its scale, packed data and shift moved (tensor/weights/qbits.py:296-298), then rebuilt on the GPU
  (:299 -> ``create``). A bfloat16 weight in groups of 128 takes tinygemm's layout there (qbits.py:111-121; CUDA 12.1
  or later and an sm_80 or later GPU, the H100 the post names): ``data.unpack()`` (the CUDA extension's kernel, one
  byte per weight: library/extensions/cuda/unpack.cu:26-31), ``TinyGemmPackedTensor.pack`` (tinygemm/packed.py:
  54-59: the weights as int32, ``t[::, ::2] << 4``, ``| t[::, 1::2]``, ``.to(uint8)``, then
  ``torch._convert_weight_to_int4pack``: one int32 output of half a byte per weight, aten/src/ATen/native/cuda/
  int4mm.cu ``_convert_weight_to_int4pack_cuda``), then the scale and shift as tinygemm wants them (tinygemm/
  qbits.py:92-103: ``-shift``, ``8 * scale``, their sum, ``torch.cat``, ``.contiguous()``). Every temporary dies with
  its Python frame: ``pack``'s at its return, ``__init__``'s at its, the moved tensors at ``__torch_dispatch__``'s.
  Any other int4 weight keeps the moved tensors as they are (qbits.py:123).
"""

from __future__ import annotations

from itertools import count

import torch
from reserved_memory import Allocator

from diffmeter.predict.footprints import meta_module
from diffmeter.predict.memory import DTYPES, settled_plan
from diffmeter.predict.quantized_formats import Stored, stored_tensors
from diffmeter.predict.quantized_layouts import quanto_group

#: tinygemm's group (tensor/weights/qbits.py:111)
TINYGEMM_GROUP = 128


def tinygemm_move(allocator: Allocator, name: str, out_features: int, in_features: int, itemsize: int) -> None:
    """One bfloat16 int4 weight moved to the GPU and repacked for tinygemm; its packed data and scale-shift kept
    (``name``, ``name + ':scale_shift'``), every temporary freed where its frame ends."""
    weights, groups = out_features * in_features, out_features * in_features // TINYGEMM_GROUP
    temporary = count()

    def new(size: int) -> str:
        key = f"{name}:{next(temporary)}"
        allocator.malloc(key, size)
        return key

    moved = [new(groups * itemsize), new(weights // 2), new(groups * itemsize)]  # scale, packed data, shift
    unpacked = new(weights)  # quanto::unpack, a byte per weight
    as_int32 = new(4 * weights)  # packed.py:54 t.to(torch.int32)
    shifted = new(2 * weights)  # packed.py:58 t[::, ::2] << 4 (int32, half the columns)
    ored = new(2 * weights)  # | t[::, 1::2]
    allocator.release(shifted)
    as_uint8 = new(weights // 2)  # .to(torch.uint8)
    allocator.release(ored)
    allocator.malloc(name, weights // 2)  # packed.py:59 _convert_weight_to_int4pack: int32, kept
    for key in (as_int32, as_uint8):  # pack returns
        allocator.release(key)
    scales = [new(groups * itemsize) for _ in range(3)]  # qbits.py:98-101: -shift, 8 * scale, their sum
    joined = new(2 * groups * itemsize)  # qbits.py:103 torch.cat([scale, shift], 2)
    allocator.malloc(f"{name}:scale_shift", 2 * groups * itemsize)  # .transpose(0, 1).contiguous(): kept
    allocator.release(joined)
    for key in (*scales, unpacked, *moved):  # __init__, create, then __torch_dispatch__ return
        allocator.release(key)


def post_order(module: torch.nn.Module, prefix: str = "", seen: set | None = None):
    """Module names in ``nn.Module._apply``'s order: a module's children before the module (each module once)."""
    seen = set() if seen is None else seen
    for name, child in module.named_children():
        if id(child) not in seen:
            seen.add(id(child))
            yield from post_order(child, f"{prefix}{name}.", seen)
    yield prefix.rstrip(".")


def move_component(allocator: Allocator, module: torch.nn.Module, kind: str | None, dtype: torch.dtype) -> int:
    """``module.to('cuda')`` of a component loaded at ``dtype``, quantized by quanto as ``kind`` (None: left whole);
    the bytes it keeps."""
    stored = (
        stored_tensors(module, "quanto", kind, dtype)
        if kind
        else [Stored(name, tensor.numel() * tensor.element_size(), False) for name, tensor in _tensors(module)]
    )
    by_owner: dict[str, list[Stored]] = {}
    for tensor in stored:
        by_owner.setdefault(tensor.name.rpartition(".")[0], []).append(tensor)
    kept = 0
    for owner in post_order(module):
        for tensor in by_owner.pop(owner, []):
            kept += tensor.bytes
            shape = module.get_parameter(tensor.name).shape if tensor.quantized else ()
            if tensor.quantized and kind == "int4" and _tinygemm(shape, dtype):
                tinygemm_move(allocator, tensor.name, shape[0], shape[1], dtype.itemsize)
            elif tensor.quantized:
                _move_parts(allocator, tensor.name, kind, shape, dtype)
            else:
                allocator.malloc(tensor.name, tensor.bytes)
    if by_owner:
        raise ValueError(f"tensors outside the module tree: {sorted(by_owner)}")
    return kept


def _tensors(module: torch.nn.Module):
    seen = set()
    for name, tensor in [*module.named_parameters(), *module.named_buffers()]:
        if id(tensor) not in seen:
            seen.add(id(tensor))
            yield name, tensor


def _tinygemm(shape, dtype: torch.dtype) -> bool:
    return len(shape) == 2 and dtype == torch.bfloat16 and quanto_group(shape[1]) == TINYGEMM_GROUP


def _move_parts(allocator: Allocator, name: str, kind: str, shape, dtype: torch.dtype) -> None:
    """A quantized weight whose move rebuilds nothing: int8 data then scale per row; int4 scale, data, shift."""
    out_features, in_features = shape[0], shape.numel() // shape[0]
    if kind in ("int8", "float8"):
        if kind == "float8":
            raise ValueError("quanto float8 on CUDA takes Marlin's layout (qbytes.py:122-141): not replayed")
        parts = [out_features * in_features, out_features * dtype.itemsize]
    else:
        group = quanto_group(in_features)
        rows, columns = (out_features, in_features) if group is None else (out_features * in_features // group, group)
        parts = [rows * dtype.itemsize, (rows + 1) // 2 * columns, rows * dtype.itemsize]
    for index, size in enumerate(parts):
        allocator.malloc(f"{name}:{index}", size)


def loaded(spec, kinds: dict[str, str]) -> tuple[Allocator, int]:
    """The allocator after ``pipe.to('cuda')`` of ``spec``'s pipeline, each component in ``kinds`` quantized by quanto
    at load as its type there, and the bytes the pipeline keeps."""
    entry, settled, _ = settled_plan(spec)
    allocator, kept = Allocator(), 0
    for name in sorted(entry.components):  # pipeline_utils.py:1658, the nn.Module components only
        dtype = DTYPES[settled.dtype_of(name)]
        kept += move_component(allocator, meta_module(entry.components[name], dtype), kinds.get(name), dtype)
    return allocator, kept
