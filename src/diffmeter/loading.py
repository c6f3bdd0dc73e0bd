"""Runnable pipelines for measured runs: pretrained weights from a local directory or the
HF cache, or random weights (tiny catalog entries, or real-size ones from catalog configs).

Where the weights come from is decided first, from the disk alone (``weights.locate_weights``), so a missing
checkpoint is reported before anything is written or loaded.
"""

from __future__ import annotations

import collections
import contextlib
import inspect
from pathlib import Path

import diffusers
import torch
import transformers

from diffmeter.catalog import all_entries
from diffmeter.catalog.controlnets import CONTROLNET, controlnet_of
from diffmeter.catalog.entry import PipelineEntry
from diffmeter.errors import DiffmeterError
from diffmeter.quantized_loading import pretrained_arguments, quantize_built
from diffmeter.quiet import quiet_libraries
from diffmeter.random_weights import build_random
from diffmeter.tiny import assemble, tiny_pipeline
from diffmeter.weights import WeightsSource, controlnet_root


def load_pipeline(
    entry: PipelineEntry,
    source: WeightsSource,
    device: torch.device,
    dtype: str,
    seed: int = 0,
    held: tuple[str, ...] = (),
    component_dtypes: dict[str, str] | None = None,
    quantization: dict | None = None,
) -> diffusers.DiffusionPipeline:
    """The pipeline on ``device`` at ``dtype`` (``component_dtypes``: components at another), progress bar off;
    the ``held`` components stay on the CPU (whoever holds them back places them: tensor parallelism moves
    each rank's shard only); ``quantization``: component -> config, quantized as it loads (``quantized_loading``)."""
    torch_dtype = getattr(torch, dtype)
    own = {name: getattr(torch, value) for name, value in (component_dtypes or {}).items()}
    if source.kind == "pretrained":  # already at its dtype, fp32-only modules kept
        pipe = _pretrained(entry, source, {"default": torch_dtype, **own} if own else torch_dtype, quantization)
    else:
        if source.kind == "tiny-random":
            with default_dtype(torch_dtype):  # as from_pretrained builds (a component at another dtype aside)
                pipe = tiny_pipeline(entry, "cpu", seed)
        else:
            pipe = random_pipeline(entry, device, torch_dtype, seed, held, own)
        for name, component in pipe.components.items():
            if isinstance(component, torch.nn.Module):
                cast_as_loaded(component, own.get(name, torch_dtype))
        if quantization:
            quantize_built(pipe, quantization, {name: own.get(name, torch_dtype) for name in quantization})
    if held:
        for name, component in pipe.components.items():
            if isinstance(component, torch.nn.Module) and name not in held:
                component.to(device)
    else:
        pipe.to(device)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def fp32_module_names(module: torch.nn.Module, dtype: torch.dtype) -> set[str]:
    """What the model class keeps in float32 when loaded at ``dtype``, by the loader's own rule: diffusers
    keeps ``_keep_in_fp32_modules`` at any dtype; transformers only at float16 (its
    ``_get_dtype_plan``), and ``_keep_in_fp32_modules_strict`` at float16 and bfloat16 (T5's ``wo``
    is bfloat16 in a bfloat16 FLUX, float32 in a float16 one)."""
    import transformers

    if not isinstance(module, transformers.PreTrainedModel):
        return set(getattr(module, "_keep_in_fp32_modules", None) or [])
    keep = set()
    if dtype == torch.float16:
        keep |= set(module._keep_in_fp32_modules or [])
    if dtype in (torch.float16, torch.bfloat16):
        keep |= set(module._keep_in_fp32_modules_strict or [])
    return keep


@contextlib.contextmanager
def default_dtype(dtype: torch.dtype):
    """Build under ``dtype`` as torch's default, as both loaders instantiate a model at its ``torch_dtype``
    (diffusers models/modeling_utils.py ``_set_default_torch_dtype``, transformers modeling_utils.py
    ``local_torch_dtype``)."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def cast_as_loaded(module: torch.nn.Module, dtype: torch.dtype) -> None:
    """What ``from_pretrained`` leaves at ``dtype``: the floating tensors a checkpoint stores (parameters,
    persistent buffers) cast to it; non-persistent buffers as the class made them while it was built (a table it
    builds in float32 explicitly, such as PixArt's or CogVideoX's positional embedding, stays float32: no
    checkpoint value replaces it); the class's float32 modules kept in float32."""
    stored = {id(tensor) for tensor in module.state_dict(keep_vars=True).values()}
    for owner in module.modules():
        for parameter in owner.parameters(recurse=False):
            if parameter.is_floating_point() and id(parameter) in stored:
                parameter.data = parameter.data.to(dtype)
        for name, buffer in list(owner.named_buffers(recurse=False)):
            if buffer.is_floating_point() and id(buffer) in stored:
                setattr(owner, name, buffer.to(dtype))
    keep_fp32_modules(module, dtype)


def keep_fp32_modules(module: torch.nn.Module, dtype: torch.dtype) -> None:
    """Put back in float32 what the model class keeps there at ``dtype``, matching parameter and
    buffer names part by part as from_pretrained does (``scale_shift_table`` is a bare parameter)."""
    keep = fp32_module_names(module, dtype)
    if not keep:
        return
    for name, tensor in [*module.named_parameters(), *module.named_buffers()]:
        if tensor.is_floating_point() and any(part in keep for part in name.split(".")):
            tensor.data = tensor.data.float()


def _pretrained(entry: PipelineEntry, source: WeightsSource, torch_dtype, quantization: dict | None = None):
    """diffusers' ``from_pretrained``; ``torch_dtype`` a dtype, or {"default": dtype, component: dtype}."""
    pipeline_class = getattr(diffusers, entry.pipeline_class, diffusers.DiffusionPipeline)
    extra = {}
    if "safety_checker" in inspect.signature(pipeline_class.__init__).parameters:
        extra["safety_checker"] = None  # benchmarks time the model, not the NSFW filter
    diffusers.utils.logging.disable_progress_bar()  # the bench's own progress is enough
    transformers.utils.logging.disable_progress_bar()
    try:
        with quiet_libraries():
            steering = controlnet_of(entry)
            if steering:  # from its own repository, handed to the ControlNet pipeline as from_pipe would
                model = getattr(diffusers, entry.components[CONTROLNET].class_name)
                own = torch_dtype
                if isinstance(torch_dtype, dict):
                    own = torch_dtype.get(CONTROLNET, torch_dtype["default"])
                root = controlnet_root(entry)
                extra[CONTROLNET] = model.from_pretrained(root, torch_dtype=own, local_files_only=True)
            if quantization:
                extra.update(pretrained_arguments(source.path, quantization, torch_dtype))
            return pipeline_class.from_pretrained(
                source.path, torch_dtype=torch_dtype, variant=source.variant, local_files_only=True, **extra
            )
    except (OSError, ValueError) as error:
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise DiffmeterError(f"cannot load {entry.id} from {source.path}: {first_line}") from None


def random_pipeline(
    entry: PipelineEntry,
    device: torch.device,
    dtype: torch.dtype,
    seed: int = 0,
    held: tuple[str, ...] = (),
    own: dict[str, torch.dtype] | None = None,
):
    """Real-size components with random weights, built straight on ``device`` at ``dtype`` (``own``: components
    at another; ``held`` ones on the CPU, filled without torch's serial CPU generator: ``random_weights``).

    Tokenizers come from the family's tiny entry (token ids stay inside every real vocabulary, and
    padded lengths follow the pipeline's own settings); the scheduler too, unless the entry ships one.
    """
    template = next((e for e in all_entries() if e.is_tiny and e.family == entry.family), None)
    if template is None:
        raise DiffmeterError(f"no tiny {entry.family} entry to borrow tokenizers and a scheduler from")
    torch.manual_seed(seed)
    parts = {}
    for name, component in entry.components.items():
        with default_dtype((own or {}).get(name, dtype)):
            parts[name] = build_random(component, torch.device("cpu") if name in held else device, seed)
    runtime = dict(template.extra["runtime"])
    if isinstance(entry.extra.get("scheduler"), dict):  # the entry's own: SD 1.5's PNDM makes steps + 1 UNet calls
        runtime["scheduler"] = entry.extra["scheduler"]
    return assemble(entry.pipeline_class, parts, runtime, entry.extra.get("pipeline_init", {}))


def loaded_dtypes(pipe) -> dict[str, str]:
    """Each model component's dtype as loaded: the one most of its floating-point parameters hold (modules a
    model keeps in float32, such as Wan's time embedder, aside)."""
    found = {}
    for name, component in pipe.components.items():
        if isinstance(component, torch.nn.Module):
            counts = collections.Counter()
            for parameter in component.parameters():
                if parameter.is_floating_point():
                    counts[parameter.dtype] += parameter.numel()
            if counts:
                found[name] = str(counts.most_common(1)[0][0]).removeprefix("torch.")
    return found


def attach_lora(pipe, denoiser: str, targets: tuple[str, ...], rank: int | None, path: str | None, fuse: bool) -> None:
    """The run's LoRA on the loaded pipeline, through diffusers and peft: a file with ``load_lora_weights``, or a
    fresh adapter of ``rank`` on ``targets`` (peft's own initialization; the timing does not depend on the values)
    with the denoiser's ``add_adapter``; then ``fuse_lora`` when asked."""
    if rank is None and path is None:
        return
    try:
        from peft import LoraConfig
    except ImportError:
        raise DiffmeterError(
            "a LoRA runs through peft, which is not installed: pip install 'diffmeter[lora]'"
        ) from None
    if path is not None:
        try:
            pipe.load_lora_weights(str(Path(path).expanduser()))
        except (KeyError, ValueError, RuntimeError, TypeError, AttributeError) as error:
            # diffusers' loader reads the denoiser's own state dict: a quantized one (optimum-quanto's QLinear) may
            # not hold the keys it looks for ('...to_k.weight')
            quantized = getattr(getattr(pipe, denoiser), "hf_quantizer", None) is not None
            first = (str(error).splitlines() or [""])[0]
            fix = (
                "load it on the unquantized denoiser, or try another --quantize backend"
                if quantized
                else "check the file is a diffusers LoRA of this model"
            )
            raise DiffmeterError(
                f"--lora {path}: diffusers' load_lora_weights failed on this pipeline"
                + (" (its denoiser quantized at load)" if quantized else "")
                + f": {type(error).__name__}: {first}; {fix}"
            ) from None
    else:
        config = LoraConfig(r=rank, lora_alpha=rank, target_modules=list(targets))
        getattr(pipe, denoiser).add_adapter(config)
    if fuse:
        pipe.fuse_lora(components=[denoiser])
