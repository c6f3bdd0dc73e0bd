"""Peak memory of a generation, predicted without weights or a device.

Each call of the profile's plan (``Family.plan``) runs once on fake tensors (``FakeTensorMode``: shapes,
dtypes and devices, no data) under PyTorch's own live-tensor tracker, ``torch.distributed._tools.
mem_tracker.MemTracker``: parameters and buffers are tracked from the module, the call's inputs as
"other", everything the call allocates as activations, and its peak is the largest total of live
storages at any operator. Fake tensors sit on ``cpu``, so operators decompose as they do on CPU (the
CPU flash-attention kernel's output and log-sum-exp, no CUDA workspaces) and sizes are not rounded to
the CUDA caching allocator's blocks. One CUDA transient is added for a run on CUDA (``on_cuda``), because it
moves a peak: cuDNN holds a copy of a convolution's input, weight and output while it runs (``ConvolutionCopies``).

A stage's peak adds what the pipeline holds while the call runs: every loaded component's parameters
(a plain ``pipe.to(device)`` keeps them all resident), the call's inputs, and the outputs of the
calls before it in the same stage (the prompt's embeddings while the negative prompt is encoded).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.distributed._tools.mem_tracker import MemTracker
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from diffmeter import cache
from diffmeter.catalog import ComponentEntry, entry_of
from diffmeter.errors import DiffmeterError
from diffmeter.families import DENOISER, IMAGE_ENCODER, TEXT_ENCODER, VAE_DECODER, Call, get_family, lora
from diffmeter.predict.cached import cache_key, cached_memory
from diffmeter.predict.convolution_copies import CPU, TOTAL, ConvolutionCopies
from diffmeter.predict.fake_run import fake_run
from diffmeter.predict.footprints import (
    fp8_storage_bytes,
    largest_layer_bytes,
    meta_module,
    quantized_bytes,
    weight_read_bytes,
)
from diffmeter.predict.layer_levels import LayerLevels
from diffmeter.predict.memory_checks import memory_check
from diffmeter.predict.replay import module_list_blocks, replayed_calls
from diffmeter.predict.schema import (
    DENOISING_STEP,
    IMAGE_ENCODING,
    TEXT_ENCODING,
    VAE_DECODE,
    MemoryPrediction,
    StageMemory,
    heaviest_calls,
)
from diffmeter.predict.vae_decode import DECODE_SWITCHES, VAE_MODES, decode_units
from diffmeter.spec import ProfileSpec
from diffmeter.stages import VAE_ROLES
from diffmeter.text_encoders import text_encoders_of

STAGE_OF_ROLE = {
    TEXT_ENCODER: TEXT_ENCODING,
    IMAGE_ENCODER: IMAGE_ENCODING,
    DENOISER: DENOISING_STEP,
    VAE_DECODER: VAE_DECODE,
}
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class CallMemory:
    """One call's memory on fake tensors (bytes)."""

    param_bytes: int
    input_bytes: int
    #: tensors the call allocated, live at its peak
    activation_bytes: int
    #: what the call returns (held by the pipeline afterwards)
    output_bytes: int
    #: per weight shape, its layers' highest activations as they start, with their output and with two outputs
    layer_levels: dict[str, tuple[int, int, int]]


class PeakTracker(MemTracker):
    """MemTracker keeping only what a call's peak needs: the live storages at every operator. Its
    per-module snapshots are switched off: they refuse a submodule called twice outside its root's
    ``forward`` (a video VAE's ``decode`` runs its decoder once per frame), and refresh every tracked
    module's statistics at each operator."""

    def _pre_fw_hook(self, module, inputs) -> None:
        pass

    def _post_fw_hook(self, module, inputs, outputs) -> None:
        pass

    # A replay recorder (``replay.Recorder``): the block's peak above its entry, per category. It reads and
    # resets MemTracker's running peak (``_curr_mem_snap``, ``_peak_mem``, ``_peak_mem_snap``, kept per device
    # by ``_update_peak_stats``: torch/distributed/_tools/mem_tracker.py, lines 502-523 in torch 2.13).
    def begin(self) -> tuple:
        entry = dict(self._curr_mem_snap.get(CPU, {}))
        saved = (self._peak_mem.get(CPU, 0), self._peak_mem_snap.get(CPU))
        self._peak_mem[CPU], self._peak_mem_snap[CPU] = entry.get(TOTAL, 0), dict(entry)
        return entry, saved

    def end(self, begun: tuple) -> dict:
        entry, (peak, snapshot) = begun
        inside = self._peak_mem_snap[CPU]
        if peak >= self._peak_mem[CPU]:
            self._peak_mem[CPU], self._peak_mem_snap[CPU] = peak, snapshot
        return {key: inside.get(key, 0) - entry.get(key, 0) for key in inside.keys() | entry.keys()}

    def current_total(self) -> int:
        return self._curr_mem_snap.get(CPU, {}).get(TOTAL, 0)

    def current(self) -> dict:
        """Live bytes now, per category (MemTracker's ``_MemRefType``) and ``TOTAL``."""
        return self._curr_mem_snap.get(CPU, {})

    def apply(self, effect: dict) -> None:
        current = self._curr_mem_snap.get(CPU, {})
        reached = {key: current.get(key, 0) + change for key, change in effect.items()}
        if reached[TOTAL] > self._peak_mem.get(CPU, 0):
            self._peak_mem[CPU], self._peak_mem_snap[CPU] = reached[TOTAL], reached


def storage_bytes(tensors) -> int:
    """Bytes of the distinct storages behind ``tensors`` (views and tied weights counted once)."""
    seen = {}
    for tensor in tensors:
        if isinstance(tensor, torch.Tensor):
            storage = tensor.untyped_storage()
            seen[storage._cdata] = storage.nbytes()
    return sum(seen.values())


def fake_copy(module: torch.nn.Module) -> torch.nn.Module:
    """``module`` with its meta parameters and buffers replaced by fake CPU tensors of the same dtypes."""
    made: dict[int, torch.Tensor] = {}  # tied weights (T5's embeddings) stay one tensor

    def fake(tensor: torch.Tensor) -> torch.Tensor:
        if id(tensor) not in made:
            made[id(tensor)] = torch.empty(tensor.shape, dtype=tensor.dtype, device="cpu")
        return made[id(tensor)]

    with FakeTensorMode(allow_non_fake_inputs=True):
        module._apply(fake)
    return module


def fake_module(component: ComponentEntry, dtype: torch.dtype) -> torch.nn.Module:
    """The component on fake CPU tensors at ``dtype``, as bench loads it."""
    return fake_copy(meta_module(component, dtype))


def param_bytes(module: torch.nn.Module) -> int:
    """Parameters and buffers (persistent or not): what loading the component keeps resident."""
    return storage_bytes([*module.parameters(), *module.buffers()])


def cast_floating(value, dtype: torch.dtype):
    """Floating-point tensors at ``dtype`` (latents and embeddings arrive at the run's dtype)."""
    if isinstance(value, torch.Tensor) and value.is_floating_point():
        return value.to(dtype)
    if isinstance(value, (list, tuple)):
        return type(value)(cast_floating(item, dtype) for item in value)
    if isinstance(value, dict):
        return {key: cast_floating(item, dtype) for key, item in value.items()}
    return value


def track_call(
    module: torch.nn.Module,
    call: Call,
    dtype: torch.dtype,
    on_cuda: bool = True,
    also: TorchDispatchMode | None = None,
    replay: bool = True,
) -> CallMemory:
    """Run ``call`` once on fake tensors under MemTracker; its peak split into parameters, inputs and
    activations (the tracker's categories at the peak; ``on_cuda``: with cuDNN's convolution copies). ``also``:
    another mode, and replay recorder, that sees the same run's operators (``operators.OperatorTally``: one run
    for both passes). ``replay``: repeated blocks run once (``replay.replayed_calls``), except in VAE
    decoders and encoders, whose blocks may carry state between calls (as the FLOPs counter does); a decoder's
    units are its decode of one slice and its run on one tile (``decode_units``)."""
    handle = call.prepare(module) if call.prepare else None
    unhook = None
    try:
        with fake_run(call.reads_values):
            with torch.device("cpu"):
                inputs = cast_floating(call.build(torch.device("cpu")), dtype)
            tracker = PeakTracker()
            tracker.track_external(module, *(leaf for leaf in tree_leaves(inputs) if isinstance(leaf, torch.Tensor)))
            convolutions = ConvolutionCopies(tracker) if on_cuda else contextlib.nullcontext()
            layers = LayerLevels(tracker, convolutions if on_cuda else None)
            unhook = layers.hooked(module)
            recorders = [tracker, *([convolutions] if on_cuda else []), *([also] if also else []), layers]
            live = tracker.current_total
            units = module_list_blocks(module) if call.role not in VAE_ROLES else []
            units = decode_units(module) if call.role == VAE_DECODER else units
            replayed = replayed_calls(units, recorders, live) if replay else contextlib.nullcontext()
            with tracker, convolutions, also or contextlib.nullcontext(), replayed:
                output = getattr(module, call.method)(**inputs)
            peak = tracker.get_tracker_snapshot("peak")[torch.device("cpu")]
    finally:
        if unhook is not None:
            unhook()
        if handle is not None:
            handle.remove()
    by_kind = {str(kind.value) if hasattr(kind, "value") else str(kind): size for kind, size in peak.items()}
    during_convolution = max(0, convolutions.peak - peak["Total"]) if on_cuda else 0  # the CPU holds no copies
    return CallMemory(
        param_bytes=by_kind["Parameter"] + by_kind["Buffer"],
        input_bytes=by_kind["Other"],
        activation_bytes=by_kind["Activation"] + by_kind["Temp"] + during_convolution,
        output_bytes=storage_bytes(_tensors_of(tree_leaves(call.kept(output) if call.kept else output))),
        layer_levels=layers.levels,
    )


def _tensors_of(leaves) -> list:
    """The tensors among an output's leaves, and those a VAE's ``latent_dist`` (DiagonalGaussianDistribution, not a
    pytree node) holds: its ``parameters``, whose storage its ``mode()`` latents keep alive."""
    return [leaf.parameters if hasattr(leaf, "parameters") and hasattr(leaf, "mode") else leaf for leaf in leaves]


def predict_memory(spec: ProfileSpec, on_cuda: bool = True, vae_modes: tuple[str, ...] = VAE_MODES) -> MemoryPrediction:
    """The peak memory of one generation at ``spec`` on a CUDA device (``on_cuda=False``: on the CPU, without
    cuDNN's convolution copies), with the decode's activations under each of ``vae_modes`` (a tiled decode of a
    video runs every tile of every frame: ask only for what is used): from the disk cache (same configs,
    settings, libraries and diffmeter source) or tracked on fake tensors and remembered."""
    found = cached_memory(spec, on_cuda, vae_modes)
    if found is not None:
        return found
    found = predict_tracked(spec, on_cuda, vae_modes)
    cache.store("memory", cache_key(spec, on_cuda, vae_modes), found.model_dump(mode="json"))
    return found


def settled_plan(spec: ProfileSpec):
    """The entry, the settled spec and the call plan, exactly as the profile makes them."""
    entry = entry_of(spec)
    family = get_family(entry.family)
    spec = spec.with_defaults(entry.defaults)
    if family.is_video and spec.num_frames is None:
        spec = replace(spec, num_frames=1)
    shapes = family.shapes(entry, spec)
    return entry, shapes.spec, family.plan(shapes)


def weight_reads(spec: ProfileSpec) -> dict[str, int]:
    """Each component's least weight read per call (``MemoryPrediction.weight_read_bytes``), from its configs
    alone: no call is run."""
    entry, spec, _ = settled_plan(spec)
    return {
        name: weight_read_bytes(meta_module(component, DTYPES[spec.dtype_of(name)]))
        for name, component in entry.components.items()
    }


def predict_tracked(
    spec: ProfileSpec,
    on_cuda: bool,
    vae_modes: tuple[str, ...],
    watch: Callable[[Call], TorchDispatchMode] | None = None,
) -> MemoryPrediction:
    """The prediction, tracked; ``watch(call)`` gives a mode to run beside the tracker in each call of the plan
    (not in the decode-mode reruns)."""
    entry, spec, plan = settled_plan(spec)
    family = get_family(entry.family)
    dtype_of = {name: DTYPES[spec.dtype_of(name)] for name in entry.components}
    metas = {name: meta_module(component, dtype_of[name]) for name, component in entry.components.items()}
    largest = {name: largest_layer_bytes(module) for name, module in metas.items()}
    weights = {name: weight_read_bytes(module) for name, module in metas.items()}
    quantized = {kind: {name: quantized_bytes(m, kind) for name, m in metas.items()} for kind in ("int8", "fp8")}
    modules = {name: fake_copy(module) for name, module in metas.items()}
    params = {name: param_bytes(module) for name, module in modules.items()}
    adapter = lora.targets_of(family, entry, spec)  # a LoRA's weights, beside the denoisers' own, fused or not
    adapter_bytes = {}
    if adapter:  # on the main denoiser alone, as diffusers loads it (families.lora.with_lora)
        adapter_bytes[family.denoiser] = (
            lora.adapter_params(metas[family.denoiser], adapter) * dtype_of[family.denoiser].itemsize
        )
        params[family.denoiser] += adapter_bytes[family.denoiser]
    resident = sum(params.values())
    calls: list[StageMemory] = []
    decoded: dict[str, int | None] = {}
    text_outputs = one_prompt = image_outputs = 0
    for call in plan:
        if not call.count:
            continue
        also = watch(call) if watch else None
        module, own = modules[call.component], params[call.component]
        dtype = DTYPES[spec.dtype_of(call.component, call.dtype)]  # as the pipeline casts it for the call
        cast = dtype != dtype_of[call.component]
        if cast:  # for this call alone (SDXL's float32 decode)
            module = fake_module(entry.components[call.component], dtype)
            own = param_bytes(module)
        held = resident - params[call.component] + own  # the other components' parameters, and this one's as cast
        memory = _tracked(entry, module, call, dtype, on_cuda, also)
        # the text embeddings stay live to the end of the call (the prompt's while the negative prompt is
        # encoded, both through denoising and decoding), beside the copies a call's inputs make of them
        # (a denoiser called at the prompt batch gets the prompt's embeddings themselves, not a copy); so do
        # the input images, preprocessed, and their latents, every output's, from their encoding on (the pipelines
        # keep the preprocessed image in a local of __call__ to its end)
        if call.role == TEXT_ENCODER:
            earlier = text_outputs + memory.output_bytes * (call.count - 1)
            text_outputs = earlier + memory.output_bytes
            one_prompt += memory.output_bytes
        elif call.role == IMAGE_ENCODER:
            earlier = text_outputs + image_outputs + memory.output_bytes * (call.count - 1)
            image_outputs += memory.input_bytes * call.keeps_input + memory.output_bytes * call.count
        elif call.role == DENOISER and call.batch == spec.batch_size:
            earlier = text_outputs - one_prompt + image_outputs
        else:
            earlier = text_outputs + image_outputs
        carried = memory.input_bytes + earlier
        calls.append(
            StageMemory(
                stage=STAGE_OF_ROLE[call.role],
                component=call.component,
                batch=call.batch,
                count=call.count,
                cast_to=str(dtype).removeprefix("torch.") if cast else None,
                resident_param_bytes=held,
                component_param_bytes=own,
                carried_bytes=carried,
                activation_bytes=memory.activation_bytes,
                peak_bytes=held + carried + memory.activation_bytes,
                layer_levels=memory.layer_levels,
            )
        )
        if call.role == VAE_DECODER and call.component == family.decoder:  # not LTX-2's audio decoder
            decoded = _vae_modes(entry, module, call, dtype, on_cuda, vae_modes)
    ordered = heaviest_calls(calls)
    top = max(ordered, key=lambda s: s.peak_bytes)
    encoders = text_encoders_of(entry, family)
    return MemoryPrediction(
        dtype=spec.dtype,
        height=spec.height,
        width=spec.width,
        num_frames=spec.num_frames if family.is_video else None,
        on_cuda=on_cuda,
        stages=ordered,
        component_param_bytes=params,
        peak_bytes=top.peak_bytes,
        peak_stage=top.stage,
        calls=calls,
        denoisers=[name for name in family.denoisers(entry) if name in entry.components],
        largest_layer_bytes=largest,
        weight_read_bytes=weights,
        quantized_bytes=quantized,
        adapter_bytes=adapter_bytes,
        large_text_encoders=encoders,
        fp8_storage_bytes={name: fp8_storage_bytes(entry.components[name], dtype_of[name]) for name in encoders},
        vae_activation_bytes=decoded,
        decoder=family.decoder,
        checked=memory_check(entry.family, editing=bool(spec.image_sizes)),
    )


def _tracked(
    entry, module: torch.nn.Module, call: Call, dtype: torch.dtype, on_cuda: bool, also: TorchDispatchMode | None = None
) -> CallMemory:
    try:
        return track_call(module, call, dtype, on_cuda, also)
    except (RuntimeError, NotImplementedError, TypeError) as error:
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise DiffmeterError(
            f"{entry.name}: the memory of its {call.component} ({entry.components[call.component].class_name}) "
            f"cannot be predicted on fake tensors: {first}"
        ) from None


def _vae_modes(
    entry, vae: torch.nn.Module, call: Call, dtype: torch.dtype, on_cuda: bool, modes: tuple[str, ...]
) -> dict[str, int | None]:
    """The decode's activations with each of diffusers' tiled and sliced decoding in ``modes`` (None: the VAE
    has no such mode)."""
    found: dict[str, int | None] = {}
    for mode, (method, flag) in DECODE_SWITCHES.items():
        if mode not in modes:
            continue
        try:
            getattr(vae, method)()
        except (AttributeError, NotImplementedError):  # ModelMixin's own enable_tiling raises for VAEs without it
            found[mode] = None
            continue
        try:
            found[mode] = _tracked(entry, vae, call, dtype, on_cuda).activation_bytes
        finally:
            setattr(vae, flag, False)
    return found
