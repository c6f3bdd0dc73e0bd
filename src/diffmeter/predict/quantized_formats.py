"""The stored bytes of each parameter and buffer of a component (built on meta, ``footprints.meta_module``) as a
``--quantize BACKEND:TYPE`` backend stores it after loading, in diffusers 0.42.1 with the installed torchao 0.18,
optimum-quanto 0.2.7, gguf 0.19 and bitsandbytes 0.50: which tensors it quantizes (``quantized_formats`` rules,
``quantized_layouts`` for the bytes of one tensor in its format). No backend is imported at import time (SDNQ's
own rules are run when asked: ``sdnq_tensors``).

Which tensors each backend quantizes, read from diffusers/quantizers/ (paths under site-packages/diffusers):

* every backend: the model class's ``_keep_in_fp32_modules`` join ``modules_to_not_convert`` (each quantizer's
  ``use_keep_in_fp32_modules = True``: torchao/torchao_quantizer.py:178, quanto/quanto_quantizer.py:45,
  gguf/gguf_quantizer.py:41, bitsandbytes/bnb_quantizer.py:54 and :339; read by models/modeling_utils.py:1218-1225);
  diffmeter passes no ``modules_to_not_convert`` of its own.
* torchao: the ``weight`` of an ``nn.Linear`` whose parameter name holds no ``key + "."`` of that list
  (torchao/torchao_quantizer.py:350-359, :442-447); torchao's own handler may still leave it whole (layouts).
* bitsandbytes: ``nn.Linear`` modules, skipped the same way by their dotted path (bitsandbytes/utils.py:58-62).
* quanto: ``nn.Linear`` children whose own name is not in the list (quanto/utils.py:24-40), so a keep-in-float32
  module's linear layers are quantized all the same (its name is the parent's); each gets ``input_scale`` and
  ``output_scale`` buffers (optimum/quanto/nn/qmodule.py:139-141).
* a transformers model (a text encoder, through transformers' own config): its quantizers' patterns instead
  (``transformers_skips``), matched by transformers' rule against the parameter's name (torchao) or the module's.
* SDNQ: its own skip tables and quantizer, run on the meta tensors (``sdnq_tensors``).
* after loading (``after_loading``: torchao's ``quantize_`` or quanto's ``quantize`` + ``freeze`` on a loaded module,
  as diffusers-torchao's scripts and the quanto blog apply them): no skip list at all. torchao: every ``nn.Linear``
  (``filter_fn=_is_linear``, torchao/quantization/quant_api.py:168-180, :275-278); quanto: every module with a
  quantized counterpart (optimum/quanto/quantize.py:55-98, nn/qmodule.py:81-91: ``nn.Linear`` and ``nn.Conv2d``;
  ``nn.LayerNorm`` only with activations, nn/qlayernorm.py:37-38), each built at its own weight's dtype
  (nn/qlinear.py:41), so a float32 keep-in-float32 module (T5's ``wo`` at float16) is quantized with float32 scales.
* GGUF: the file decides (``--weights FILE``: each tensor's stored type, read with ``gguf_types``); offline, a file
  as city96's tools make it (``gguf_city96.file_types``). Tensors stored F32/F16 load at the
  run's dtype (models/model_loading_utils.py:733-747, :238-244); a quantized tensor of a keep-in-float32 module is
  dequantized to float32 (gguf/gguf_quantizer.py:124-136).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from diffmeter.predict import quantized_layouts as layouts
from diffmeter.predict.gguf_city96 import file_types as gguf_file_types
from diffmeter.predict.in_flight import UNPLACED
from diffmeter.predict.kernel_kinds import SM80
from diffmeter.predict.layer_levels import layer_key
from diffmeter.predict.prequantized_formats import autoround_tensors, bfl_file_types, bfl_tensors, nunchaku_tensors
from diffmeter.predict.quantized_kernels import quanto_in_flight, quanto_outputs, torchao_in_flight, torchao_outputs

#: the backends predicted when applied to a loaded module, and the module kinds each quantizes then
AFTER_LOADING = {"torchao": torch.nn.Linear, "quanto": (torch.nn.Linear, torch.nn.Conv2d)}


@dataclass(frozen=True)
class Stored:
    """One parameter or buffer as stored after loading: its bytes, and whether the backend quantized it."""

    name: str
    bytes: int
    quantized: bool
    #: the bytes the layer allocates for its weight while it runs, its weight dequantized at the compute dtype and
    #: what that takes (0: its kernel multiplies the stored weight; quanto's: ``quantized_kernels``)
    dequantized: int = 0
    #: of those, what stays live beside the layer's output: its weight dequantized, the promotion temporaries and
    #: intermediate casts freed before the matmul (``quantized_kernels``); None: all of them
    held: int | None = None
    #: output-sized tensors the layer holds at once after its matmul (2: a bias or scale applied out of place), where
    #: an unquantized layer holds its output alone; and the bytes live beside those outputs (a scale cast)
    outputs: int = 1
    beside_outputs: int = 0


def keep_fp32(module: torch.nn.Module) -> list[str]:
    """A diffusers model's ``_keep_in_fp32_modules`` (a transformers model's count in ``transformers_skips``)."""
    return list(getattr(module, "_keep_in_fp32_modules", None) or [])


def transformers_skips(module: torch.nn.Module) -> list[str] | None:
    """A transformers model's (a text encoder's) patterns its quantizers leave whole: its tied weights, its last
    parameter's module and output embeddings (transformers/quantizers/base.py:39-63), and its whole
    ``_keep_in_fp32_modules`` (quantizer_torchao.py:94-96, quantizer_quanto.py:87-89, quantizer_bnb_4bit.py:121-123);
    None for a diffusers model."""
    import transformers
    from transformers.quantizers.base import get_keys_to_not_convert

    if not isinstance(module, transformers.PreTrainedModel):
        return None
    return [*get_keys_to_not_convert(module), *(module._keep_in_fp32_modules or [])]


def converted(name: str, patterns: list[str]) -> bool:
    """transformers' own match (quantizers/quantizers_utils.py:26-37): from the start to a module boundary, as a regex,
    or as a suffix."""
    from transformers.quantizers.quantizers_utils import should_convert_module

    return should_convert_module(name, patterns)


def skipped_by_path(name: str, skip: list[str]) -> bool:
    """torchao's and bitsandbytes' rule: a key of the skip list as a dotted part of the tensor's name."""
    return any(key + "." in name or key == name for key in skip)


def stored_tensors(
    module: torch.nn.Module,
    backend: str,
    kind: str,
    dtype: torch.dtype,
    gguf: dict | None = None,
    after_loading: bool = False,
    kernels: str = SM80,
):
    """Every parameter and buffer of ``module`` (on meta, as loaded at ``dtype``) as ``backend``:``kind`` stores it,
    tied tensors once; ``gguf``: a GGUF file's type per tensor name (else ``gguf_file_types``); ``after_loading``:
    quantized on the loaded module (torchao ``quantize_``, quanto ``quantize``), not at load; ``kernels``: the device
    it runs on (``quantized_kernels``)."""
    if after_loading and backend not in AFTER_LOADING:
        raise ValueError(f"{backend} after loading: only {' and '.join(AFTER_LOADING)} are predicted so")
    if backend == "sdnq":
        return sdnq_tensors(module, kind, dtype)
    if backend == "bfl":  # ``gguf``: a BFL file's type per quantized weight (``checkpoint_types``)
        return [Stored(*found) for found in bfl_tensors(module, kind, dtype, gguf)]
    if backend == "nunchaku":  # ``gguf``: a Nunchaku Lite folder's quantization_config
        if gguf is None:
            raise ValueError(
                "the layers a Nunchaku Lite folder quantizes are its config's targets, known only from the folder"
            )
        return [Stored(*found) for found in nunchaku_tensors(module, dtype, gguf)]
    if backend == "autoround":  # ``gguf``: an AutoRound folder's quantization_config
        if gguf is None:
            raise ValueError("the layers an AutoRound folder quantizes are its config's, known only from the folder")
        return [Stored(*found) for found in autoround_tensors(module, dtype, gguf)]
    patterns = None if after_loading else transformers_skips(module)
    skip = keep_fp32(module) if patterns is None and not after_loading else []
    kinds = AFTER_LOADING[backend] if after_loading else torch.nn.Linear
    linears = {name: m for name, m in module.named_modules() if isinstance(m, kinds)}
    if patterns is not None:  # a text encoder: transformers' rules (torchao matches the parameter's name, the others
        # the module's: quantizer_torchao.py:111, integrations/quanto.py:87, integrations/bitsandbytes.py:185)
        by = (lambda n: n) if backend == "torchao" else (lambda n: n.rpartition(".")[0])
        skipped = {n for n, _ in module.named_parameters() if not converted(by(n), patterns)}
    else:
        skipped = set()
    if backend == "gguf":
        gguf = gguf if gguf is not None else gguf_file_types(module, kind)
    found, seen = [], set()
    for owner_name, owner in module.named_modules():
        prefix = f"{owner_name}." if owner_name else ""
        tensors = [*owner.named_parameters(recurse=False), *owner.named_buffers(recurse=False)]
        for local, tensor in tensors:
            if id(tensor) in seen:
                continue
            seen.add(id(tensor))
            name = prefix + local
            is_weight = owner_name in linears and local == "weight" and name not in skipped
            # quantized after loading, a layer is built at its own weight's dtype (quanto nn/qlinear.py:41)
            at = tensor.dtype if after_loading else dtype
            bias = getattr(owner, "bias", None) is not None
            found.append(_stored(name, tensor, is_weight, backend, kind, at, skip, gguf, kernels, bias))
        quantized = owner_name in linears and f"{prefix}weight" not in skipped
        if backend == "quanto" and quantized and not _quanto_skips(owner_name, skip):
            # QLinear's activation scales, scalars at the dtype the layer was built at (qmodule.py:139-141): the
            # run's, or float32 for a transformers model, replaced before its weights are cast (quanto.py:92-99);
            # after loading, its weight's
            size = owner.weight.element_size() if after_loading else 4 if patterns is not None else dtype.itemsize
            found += [Stored(prefix + s, size, False) for s in ("input_scale", "output_scale")]
    return found


def _stored(name, tensor, is_linear_weight, backend, kind, dtype, skip, gguf, kernels, bias) -> Stored:
    whole = Stored(name, tensor.numel() * tensor.element_size(), False)
    if backend == "gguf":
        stored = gguf.get(name, "F32")
        if stored in layouts.GGUF_WHOLE:
            return whole
        if any(part in skip for part in name.split(".")):  # dequantized to float32 (gguf_quantizer.py:124-136)
            return Stored(name, tensor.numel() * 4, False)
        # one output: the bias goes into F.linear with the dequantized weight, or is added in place after CUDA's
        # fused kernel (diffusers quantizers/gguf/utils.py:611-624)
        return Stored(name, layouts.gguf_bytes(tensor.shape, stored), True, tensor.numel() * dtype.itemsize)
    if not is_linear_weight:
        return whole
    # a convolution's weight as quanto's layer counts it (qmodule.py:122-123): output channels by the rest
    out_features, in_features = tensor.shape[0], tensor.numel() // tensor.shape[0]
    if backend == "quanto":
        if _quanto_skips(name.rpartition(".")[0], skip):
            return whole
        # at the dtype QLinear was built at, the run's, even in a keep-in-float32 module (quanto/utils.py:31-37)
        size = layouts.quanto_bytes(kind, out_features, in_features, dtype)
        in_flight = quanto_in_flight(kind, tensor.shape, dtype, kernels)
        held = tensor.numel() * dtype.itemsize if in_flight else 0  # the dequantized weight (qbytes_mm.py:25-33)
        return Stored(name, size, True, in_flight, held, quanto_outputs(kind, tensor.shape, dtype, kernels, bias))
    if skipped_by_path(name, skip):
        return whole
    if backend == "torchao":
        size = layouts.torchao_bytes(kind, out_features, in_features, tensor.dtype)
        if size is None:  # torchao's handler returns the weight as it was
            return whole
        in_flight = torchao_in_flight(kind, tensor.numel(), dtype)
        held = tensor.numel() * dtype.itemsize if in_flight else 0  # the weight at the activations' dtype
        return Stored(name, size, True, in_flight, held, *torchao_outputs(kind, out_features, dtype, bias))
    if backend == "bnb":
        size = layouts.bnb_bytes(kind, out_features, in_features)
        # one output: bitsandbytes passes the bias into F.linear or adds it in place (nn/modules.py:637 ->
        # autograd/_functions.py:424-425, 447; int8: :265)
        return Stored(name, size, True, tensor.numel() * dtype.itemsize if kind != "int8" else 0)
    raise ValueError(f"{backend}:{kind}: its stored layout is not predicted")


def sdnq_tensors(module: torch.nn.Module, kind: str, dtype: torch.dtype) -> list[Stored]:
    """SDNQ 0.2.8's layout, from its own rules run on the meta tensors (sdnq is imported here, not at import time):
    the skip keys it adds for the model class (keep-in-float32, tied weights, its table per class or its common keys:
    sdnq/utils.py:254-290, common.py), a weight quantized only if no key matches it and its layer is large enough
    (``check_quant_is_allowed``: 16384 weights, 32 channels), its type raised where the table says, and the tensors
    ``sdnq_quantize_layer_weight`` returns with ``SDNQConfig``'s defaults (groups, packing, float32 scales and zero
    points: sdnq/quantizer.py:90-355). Its linear layers dequantize the weight whole and multiply,
    the bias inside ``F.linear`` (one output: sdnq/layers/linear/forward.py:26-27). A transformers model's own skip
    keys (``tie_weights``) are not read."""
    import transformers

    if isinstance(module, transformers.PreTrainedModel):
        raise ValueError("sdnq on a transformers model: its tied-weight skips are not predicted")
    from sdnq import SDNQConfig
    from sdnq.quantizer import sdnq_quantize_layer_weight
    from sdnq.utils import add_module_skip_keys, check_param_name_in, check_quant_is_allowed, get_quant_kwargs

    _, config = add_module_skip_keys(module, SDNQConfig(weights_dtype=kind))
    found, seen = [], set()
    for owner_name, owner in module.named_modules():
        for local, tensor in [*owner.named_parameters(recurse=False), *owner.named_buffers(recurse=False)]:
            if id(tensor) in seen:
                continue
            seen.add(id(tensor))
            name = f"{owner_name}.{local}" if owner_name else local
            quantize = local == "weight" and check_param_name_in(name, config.modules_to_not_convert) is None
            if not (quantize and check_quant_is_allowed(type(owner).__name__, tensor, config)):
                found.append(Stored(name, tensor.numel() * tensor.element_size(), False))
                continue
            arguments = get_quant_kwargs(owner, config, torch_dtype=dtype, param_name=name)
            for placing in ("return_device", "quantization_device", "non_blocking", "use_dynamic_quantization"):
                arguments.pop(placing)
            _, made = sdnq_quantize_layer_weight(tensor, **arguments)
            size = sum(t.numel() * t.element_size() for t in made.values() if isinstance(t, torch.Tensor))
            found.append(Stored(name, size, True, tensor.numel() * dtype.itemsize))
    return found


def _quanto_skips(module_name: str, skip: list[str]) -> bool:
    return module_name.rpartition(".")[2] in skip


def checkpoint_types(backend: str, path) -> dict:
    """What a pre-quantized checkpoint says of its tensors: a GGUF or BFL file's types per tensor, a Nunchaku Lite or
    AutoRound folder's ``quantization_config``."""
    if backend == "bfl":
        return bfl_file_types(path)
    if backend in ("nunchaku", "autoround"):
        import json
        from pathlib import Path

        return json.loads((Path(path) / "config.json").read_text())["quantization_config"]
    return gguf_types(path)


def gguf_types(path) -> dict[str, str]:
    """Each tensor's stored type in a GGUF file, under the names diffusers loads it by (diffusers' own format)."""
    from gguf import GGUFReader

    return {tensor.name: tensor.tensor_type.name for tensor in GGUFReader(str(path)).tensors}


def footprint(
    module: torch.nn.Module,
    backend: str,
    kind: str,
    dtype: torch.dtype,
    gguf: dict | None = None,
    after_loading: bool = False,
    kernels: str = SM80,
):
    """Parameter and buffer bytes of ``module`` as the backend stores it (with its format's shared tables), the most
    a layer allocates for its weight while it runs on ``kernels`` (0: none), and, per layer key
    (``layer_levels.layer_key``: its weight's shape), the most a layer of it allocates for its weight while it runs,
    what of that stays live beside its output, how many outputs it holds at once and what beside them (``Stored``;
    the highest of each over the layers of that key; a tensor whose layer is not found by its name under
    ``UNPLACED``). Read where each allocates: diffusers gguf/utils.py:611-612 (``GGUFLinear.forward_native``),
    bitsandbytes autograd/_functions.py:446 (``MatMul4Bit``: NF4/FP4; LLM.int8() multiplies int8), optimum-quanto
    per device and dtype and torchao's weight-only casts (``quantized_kernels``), sdnq layers/linear/forward.py:26-27;
    torchao's int4 and float8 dynamic activations run fused kernels."""
    tensors = stored_tensors(module, backend, kind, dtype, gguf, after_loading, kernels)
    shared = layouts.shared_bytes(backend, kind) if any(t.quantized for t in tensors) else 0
    copies: dict[str, tuple[int, int, int, int]] = {}
    for tensor in tensors:
        if tensor.dequantized or tensor.outputs > 1:
            try:
                key = layer_key(module.get_submodule(tensor.name.rpartition(".")[0])) or UNPLACED
            except AttributeError:
                key = UNPLACED
            held = tensor.dequantized if tensor.held is None else tensor.held
            found = (tensor.dequantized, held, tensor.outputs, tensor.beside_outputs)
            copies[key] = tuple(map(max, copies.get(key, found), found))
    most = max((t.dequantized for t in tensors), default=0)
    return sum(t.bytes for t in tensors) + shared, most, copies


def quantized_bytes(module: torch.nn.Module, backend: str, kind: str, dtype: torch.dtype, gguf: dict | None = None):
    """Parameter and buffer bytes of ``module`` as the backend stores it, with its format's shared tables."""
    return footprint(module, backend, kind, dtype, gguf)[0]
