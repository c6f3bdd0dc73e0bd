"""What `diffmeter profile --gpu` refuses before predicting, in bench's words: a technique bench would refuse for
the model, a format its backend cannot run or load, a float8 format on a card without FP8 tensor cores."""

from __future__ import annotations

from diffmeter.errors import DiffmeterError


def refuse_inapplicable(built: list, specs, results, formats=(), on_cpu: bool = False) -> None:
    """Each technique refused where bench refuses it for the model (``optimize.check`` on a CUDA GPU, or on this
    CPU for ``--gpu cpu``: DeepCache without a UNet, a diffusers cache hook without a CacheMixin denoiser, offload
    or a CUDA-only kernel on a CPU, clashing pairs), in bench's one line; on this CPU also a ``--quantize
    BACKEND:TYPE`` format its backend cannot run there (its ``cannot_run``, as bench and ``diffmeter optimizations``
    ask it); on any device a component the format cannot load into (its ``component_refusal``: a GGUF file for a
    text encoder). A package missing here is not refused: the predicted run's machine may have it."""
    import torch

    from diffmeter.catalog import entry_of
    from diffmeter.families import get_family
    from diffmeter.optimize import REGISTRY, Target, check
    from diffmeter.quantization_spec import DENOISER

    device = torch.device("cpu" if on_cpu else "cuda")
    for spec, found in zip(specs, results, strict=True):
        entry = entry_of(spec)
        images = bool(found.input_images)
        target = Target(
            entry, get_family(entry.family), device, found.dtype, found.steps, images=images, fused_lora=spec.fuse_lora
        )
        check(built, target, missing_ok=True)
        for found_format in formats:
            technique = REGISTRY[found_format.backend]
            named = [name for name in found_format.components if name != DENOISER]
            backend = technique(technique.Config(type=found_format.type, components=named))
            reason = backend.component_refusal(target) or (backend.cannot_run(target) if on_cpu else None)
            if reason:
                raise DiffmeterError(f"{technique.name} cannot be used with {entry.name}: {reason}")


def refuse_without_fp8(found, chosen) -> None:
    """A float8 matmul format on a card the table gives no fp8 peak (no FP8 tensor cores): one line saying so."""
    if chosen is not None and chosen.tflops and chosen.peak_tflops("float8_e4m3fn") is None:
        raise DiffmeterError(
            f"--quantize {found.backend}:{found.type} runs its matmuls on FP8 tensor cores (CUDA, compute capability "
            f"8.9 and up), which the {chosen.name} lacks (no fp8 peak in the table): use torchao:int8wo"
        )
