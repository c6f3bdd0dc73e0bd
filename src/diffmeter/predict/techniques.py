"""Peak memory under the memory techniques ``bench`` applies (optimize/), from one prediction's figures.

What each technique keeps resident while a call runs (the call's inputs, carried embeddings and
activations stay on the device in every case):

* none: every component (``pipe.to(device)``).
* ``offload-model`` (``enable_model_cpu_offload``): only the component running.
* ``offload-sequential`` / ``offload-group`` (leaf level): the running component's largest single
  layer, streamed in when called (a lower bound: buffers and prefetched layers add to it).
* ``vae-tiling`` / ``vae-slicing``: the VAE decode's activations as diffusers' tiled / sliced decode
  allocates them (tracked on fake tensors like any call).
* ``fp8-text-encoder``: the large text encoders' layers stored in float8 by diffusers'
  ``apply_layerwise_casting`` with ``optimize/fp8_text_encoder.py``'s skip patterns (applied on meta).
* ``quantize-int8`` / ``quantize-fp8`` (torchao weight-only, on the denoisers): every ``nn.Linear``
  weight stored in one byte per element plus a float32 scale per output row (int8 also an int8 zero
  point per row): torchao's ``Int8Tensor`` / ``Float8Tensor`` layouts, held to torchao by the tests.
* ``quantize-BACKEND-TYPE`` (``--quantize [NAME=]BACKEND:TYPE``, at load): the named components as the backend
  stores them, and what a quantized layer allocates itself (its weight dequantized, a second output) added where
  that layer runs in their calls (``predict.quantized_memory``, ``predict.quantized_formats``,
  ``predict.layer_levels``).
"""

from __future__ import annotations

import itertools

from diffmeter.predict.fit_formats import FASTER_MATMULS, offered, on_encoders
from diffmeter.predict.in_flight import in_flight_peak
from diffmeter.predict.memory_checks import TOLERANCE
from diffmeter.predict.schema import VAE_DECODE, MemoryPrediction, StageMemory, heaviest_calls
from diffmeter.predict.technique_names import format_parts

#: fastest first: what each costs in time, as its mechanism says (no roofline yet): quantized weights
#: dequantize in the matmul (small cost), model offload moves each component once per generation,
#: group (leaf-level, prefetched on a stream) and sequential offload move every layer at every call
OFFLOADS = ("none", "offload-model", "offload-group", "offload-sequential")
QUANTIZATIONS = ("none", "quantize-fp8", "quantize-int8")
VAE_MODES = ("none", "vae-slicing", "vae-tiling")


def stored_params(prediction: MemoryPrediction, techniques: tuple[str, ...]) -> dict[str, int]:
    """Each component's weight bytes as ``techniques`` store them (fp8 text encoders, quantized denoisers)."""
    params = dict(prediction.component_param_bytes)
    for name in prediction.large_text_encoders if "fp8-text-encoder" in techniques else ():
        params[name] = prediction.fp8_storage_bytes[name]
    quantized = {}
    for quantization in ("quantize-int8", "quantize-fp8"):
        if quantization in techniques:
            kind = quantization.removeprefix("quantize-")
            quantized.update({name: prediction.quantized_bytes[kind][name] for name in prediction.denoisers})
    for technique in formats(prediction, techniques):  # --quantize BACKEND:TYPE on the components it names
        quantized.update(prediction.quantized_bytes[technique])
    # the component's own weights as the format stores them, a LoRA's beside them unquantized
    params.update({name: bytes_ + prediction.adapter_bytes.get(name, 0) for name, bytes_ in quantized.items()})
    return params


def formats(prediction: MemoryPrediction, techniques: tuple[str, ...]) -> list[str]:
    """The ``--quantize BACKEND:TYPE`` techniques among ``techniques`` (``predict.quantized_memory``); one the
    prediction was not given is an error, not a silent unquantized figure."""
    found = [t for t in techniques if t.startswith("quantize-") and t not in ("quantize-int8", "quantize-fp8")]
    missing = [t for t in found if t not in prediction.quantized_bytes]
    if missing:
        raise ValueError(f"this prediction was made without {', '.join(missing)}: quantized_memory.with_formats")
    return found


def peak_under(prediction: MemoryPrediction, techniques: tuple[str, ...]) -> int:
    """Peak bytes of the generation with ``techniques`` applied (names as ``bench`` labels them)."""
    return max(stage_peaks_under(prediction, techniques).values(), default=0)


def short_of(prediction: MemoryPrediction, gpu, techniques: tuple[str, ...] = ()) -> int | None:
    """The bytes ``gpu`` lacks for the run under ``techniques`` (its CUDA context held back), or None where it fits
    or has no single memory size."""
    from diffmeter.predict.devices import CUDA_HOLDBACK_BYTES

    if gpu is None or not gpu.memory_bytes:
        return None
    held = CUDA_HOLDBACK_BYTES if gpu.kind == "cuda" else 0
    missing = peak_under(prediction, techniques) + held - gpu.memory_bytes
    return missing if missing > 0 else None


def stage_peaks_under(prediction: MemoryPrediction, techniques: tuple[str, ...]) -> dict[str, int]:
    """Each stage's peak bytes with ``techniques`` applied (``stages_under``)."""
    return {stage.stage: stage.peak_bytes for stage in stages_under(prediction, techniques)}


def stages_under(prediction: MemoryPrediction, techniques: tuple[str, ...]) -> list[StageMemory]:
    """Each stage's heaviest call with ``techniques`` applied: its resident weights, carried tensors and
    activations, in stage order. A component its pipeline casts for a call (SDXL's float16 VAE upcast to float32 for
    the decode, ``Call.dtype``) weighs what it does cast, as the plain prediction's stages count it."""
    params = stored_params(prediction, techniques)
    under = []
    for call in prediction.calls:
        loaded = prediction.component_param_bytes[call.component]
        cast = call.component_param_bytes - loaded  # 0 unless the call casts its component
        if "offload-model" in techniques:
            resident = params[call.component] + cast
        elif "offload-sequential" in techniques or "offload-group" in techniques:
            largest = prediction.largest_layer_bytes[call.component]
            resident = largest * call.component_param_bytes // loaded if loaded else largest
        else:
            resident = sum(params.values()) + cast
        activations = max(  # a layer's weight dequantized while it runs, where its layers run (layer_levels)
            [call.activation_bytes]
            + [
                in_flight_peak(call.layer_levels, copies, call.activation_bytes)
                for t in formats(prediction, techniques)
                if (copies := prediction.dequantized_layers[t].get(call.component))
            ]
        )
        if call.stage == VAE_DECODE and call.component == prediction.decoder:
            for mode in ("vae-tiling", "vae-slicing"):
                if mode in techniques and mode not in prediction.vae_activation_bytes:
                    raise ValueError(f"this prediction was made without {mode}: predict_memory(vae_modes=...)")
                if mode in techniques and prediction.vae_activation_bytes[mode] is not None:
                    activations = min(activations, prediction.vae_activation_bytes[mode])
        update = {
            "resident_param_bytes": resident,
            "component_param_bytes": params[call.component] + cast,
            "activation_bytes": activations,
            "peak_bytes": resident + call.carried_bytes + activations,
        }
        under.append(call.model_copy(update=update))
    return heaviest_calls(under)


def supported(prediction: MemoryPrediction) -> dict[str, bool]:
    """Which techniques this pipeline can take (the rest are left out of ``settings``)."""
    return {
        "fp8-text-encoder": bool(prediction.large_text_encoders),
        "vae-tiling": prediction.vae_activation_bytes.get("vae-tiling") is not None,
        "vae-slicing": prediction.vae_activation_bytes.get("vae-slicing") is not None,
    }


def settings(prediction: MemoryPrediction, fp8: bool = True) -> list[tuple[str, ...]]:
    """Every combination of at most one offload, one quantization, one VAE mode and one technique on the large text
    encoders (fp8 storage or a quantized format), fastest first (fewer and cheaper techniques first: the order of
    ``OFFLOADS`` ...); ``fp8``: whether the GPU has FP8 tensor cores (``quantize-fp8`` and the float8 formats need
    them). The quantizations are the ``--quantize BACKEND:TYPE`` formats the prediction holds (``fit_formats``), else
    ``QUANTIZATIONS``; a backend takes one type in a run, so an encoder format beside another type of its backend on
    the denoisers is left out."""
    can = supported(prediction)
    text = ("none", "fp8-text-encoder") if can["fp8-text-encoder"] else ("none",)
    text += on_encoders(prediction)
    vae = tuple(mode for mode in VAE_MODES if mode == "none" or can[mode])
    quantizations = ("none", *offered(prediction, fp8)) if offered(prediction) else QUANTIZATIONS
    quantizations = tuple(q for q in quantizations if fp8 or q != "quantize-fp8")
    found = []
    for offload, quantization, vae_mode, encoder in itertools.product(OFFLOADS, quantizations, vae, text):
        if not one_type_per_backend(quantization, encoder):
            continue
        chosen = tuple(t for t in (offload, quantization, vae_mode, encoder) if t != "none")
        cost = (OFFLOADS.index(offload), quantization != "none", len(chosen), quantizations.index(quantization))
        found.append((cost, chosen))
    return [chosen for _, chosen in sorted(found, key=lambda item: item[0])]


def one_type_per_backend(quantization: str, encoder: str) -> bool:
    """Whether a denoiser's format and an encoder's can run together: not one backend at two types (bench's
    ``--quantize`` takes one type per backend in a run)."""
    if not (quantization.startswith("quantize-") and encoder.startswith("quantize-")):
        return True
    mine, theirs = format_parts(quantization), format_parts(encoder)
    return mine[0] != theirs[0] or mine[1] == theirs[1]


def fitting(
    prediction: MemoryPrediction, memory_bytes: int, fp8: bool = True, timed: bool = False
) -> list[tuple[tuple[str, ...], int]]:
    """The settings whose peak fits ``memory_bytes``, fastest first, each with its peak; a setting that adds a
    technique to one that already fits is left out (it only costs time), unless ``timed`` (its time is predicted
    and ranks it) and what it adds can make it faster (``faster``: fp8 dynamic activation; weights stored smaller
    where it offloads), or the one it adds to fits only within the memory prediction's checked error (``borderline``)
    and it lowers the peak."""
    fits: list[tuple[tuple[str, ...], int]] = []
    for chosen in settings(prediction, fp8):
        peak = peak_under(prediction, chosen)
        if peak > memory_bytes:
            continue
        if any(
            set(kept) <= set(chosen)
            and not (borderline(kept_peak, memory_bytes) and peak < kept_peak)
            and not (timed and faster(set(chosen) - set(kept), kept))
            for kept, kept_peak in fits
        ):
            continue
        fits.append((chosen, peak))
    return fits


def borderline(peak: int, memory_bytes: int) -> bool:
    """Whether a peak is within the memory prediction's checked error (``memory_checks.TOLERANCE`` of the peak) of
    ``memory_bytes``, either way: one that fits may not in a real run, one short may fit."""
    return abs(memory_bytes - peak) < TOLERANCE * peak


def faster(added: set[str], kept: tuple[str, ...] = ()) -> bool:
    """Whether techniques added to the setting ``kept`` can make it faster: one runs the matmuls faster, or, where it
    offloads, one stores weights in fewer bytes, which then cross the host link (group and sequential offload move
    every layer at every call: FLUX.2-dev's transformer in NF4 moves 16.9 GiB a step in place of 60)."""
    smaller = any(name.startswith("quantize-") or name == "fp8-text-encoder" for name in added)
    return any(name in FASTER_MATMULS for name in added) or (smaller and any(t in OFFLOADS for t in kept))
