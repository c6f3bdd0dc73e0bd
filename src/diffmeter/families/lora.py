"""LoRA on the denoiser, counted as peft runs it: an unfused adapter adds ``lora_B(lora_A(x)) * scaling`` to every
adapted linear layer (peft 0.21 ``tuners/lora/layer.py``, ``Linear.forward``: two bias-free ``nn.Linear``, dropout
the identity at inference), so a layer of ``in`` -> ``out`` features adds ``r * (in + out)`` MACs per token; a fused
one (diffusers' ``fuse_lora``) folds ``B @ A`` into the base weight and adds nothing per call.

Adapted layers are named as peft names its ``target_modules``: a module matches a target when its path equals it
or ends with ``"." + target``; only ``nn.Linear`` layers are adapted here (the targets of the trainers' defaults)."""

from __future__ import annotations

import contextlib
from dataclasses import replace

import torch
import torch.nn.functional as F

from diffmeter.errors import DiffmeterError
from diffmeter.stages import DENOISER

#: what diffusers' LoRA trainers adapt when given no --lora_layers, read at huggingface/diffusers 58eb52c0
#: (examples/dreambooth/train_dreambooth_lora_<name>.py, lines cited per family); families without a trainer there
#: (Wan, HunyuanVideo, LTX, CogVideoX, PixArt, ...) take the attention projections most of those scripts adapt
ATTENTION_PROJECTIONS = ("to_k", "to_q", "to_v", "to_out.0")  # also qwen_image (1281-1284), z_image, lumina2, sdxl
FLUX = (  # train_dreambooth_lora_flux.py 1254-1270
    "attn.to_k",
    "attn.to_q",
    "attn.to_v",
    "attn.to_out.0",
    "attn.add_k_proj",
    "attn.add_q_proj",
    "attn.add_v_proj",
    "attn.to_add_out",
    "ff.net.0.proj",
    "ff.net.2",
    "ff_context.net.0.proj",
    "ff_context.net.2",
)
FLUX_KONTEXT = (*FLUX, "proj_mlp")  # train_dreambooth_lora_flux_kontext.py 1439-1456
SD3 = FLUX[4:8] + ("attn.to_k", "attn.to_out.0", "attn.to_q", "attn.to_v")  # train_dreambooth_lora_sd3.py 1248-1265
SD_UNET = (*ATTENTION_PROJECTIONS, "add_k_proj", "add_v_proj")  # train_dreambooth_lora.py 940-947
SANA = ("to_k", "to_q", "to_v")  # train_dreambooth_lora_sana.py 1042-1045
HIDREAM = ("to_k", "to_q", "to_v", "to_out")  # train_dreambooth_lora_hidream.py 1160-1163

#: the child module name an adapted layer holds its low-rank pair under while a call is counted
ADAPTER = "diffmeter_lora"


def flux2(single_blocks: int) -> tuple[str, ...]:
    """train_dreambooth_lora_flux2.py 1291-1300 (``range(48)``) and _flux2_klein.py 1294-1303 (``range(24)``)."""
    return (
        *ATTENTION_PROJECTIONS,
        "to_qkv_mlp_proj",
        *(f"single_transformer_blocks.{i}.attn.to_out" for i in range(single_blocks)),
    )


def target_names(family, entry, given) -> tuple[str, ...]:
    """The layers a LoRA of a given rank adapts: those named (``--lora-targets``), else the family's trainer's."""
    return tuple(given) or family.lora_targets(entry)


def targets_of(family, entry, spec) -> tuple[tuple[str, int], ...]:
    """The (target, rank) pairs the spec's LoRA adapts on the denoiser: a LoRA file's own layers, else
    ``--lora-targets`` or the family's trainer default, each at ``--lora-rank``; none without a LoRA. Refused
    where diffusers cannot run it: a denoiser without peft's adapters, a pipeline without LoRA loading or fusing."""
    if spec.lora_layers:
        targets = spec.lora_layers
    elif spec.lora_rank is not None:
        targets = tuple((target, spec.lora_rank) for target in target_names(family, entry, spec.lora_targets))
    else:
        return ()
    _check_runnable(family, entry, spec)
    return targets


def _check_runnable(family, entry, spec) -> None:
    """A LoRA bench can run through diffusers: ``add_adapter`` (PeftAdapterMixin) on the denoiser's class, and the
    pipeline's ``load_lora_weights`` for a file and ``fuse_lora`` to fuse."""
    import diffusers

    from diffmeter.pipelines import component_class

    denoiser = entry.components[family.denoiser].class_name
    pipeline = getattr(diffusers, entry.pipeline_class, None)
    missing = [
        f"{denoiser} has no LoRA adapters in diffusers (no add_adapter)"
        if not hasattr(component_class(denoiser), "add_adapter")
        else None,
        f"{entry.pipeline_class} loads no LoRA file"
        if spec.lora_layers and not hasattr(pipeline, "load_lora_weights")
        else None,
        f"{entry.pipeline_class} cannot fuse a LoRA" if spec.fuse_lora and not hasattr(pipeline, "fuse_lora") else None,
    ]
    if any(missing):
        raise DiffmeterError(f"{entry.name}: {'; '.join(m for m in missing if m)}: drop the LoRA options")


def _listed(names: list[str], shown: int) -> str:
    """The first ``shown`` names, and "..." when there are more."""
    return ", ".join(names[:shown]) + (", ..." if len(names) > shown else "")


def _ranks(targets: tuple[tuple[str, int], ...]) -> str:
    return "/".join(map(str, sorted({rank for _, rank in targets})))


def described(targets: tuple[tuple[str, int], ...], spec) -> str:
    """One note: which LoRA, and what it costs per call."""
    ranks = _ranks(targets)
    names = [target for target, _ in targets]
    named = "a LoRA file's layers" if spec.lora_layers else f"{len(names)} target names ({_listed(names, 3)})"
    if spec.fuse_lora:
        return (
            f"LoRA rank {ranks} on {named}, fused (fuse_lora): no extra compute; its weights stay loaded (diffusers "
            "keeps them to unfuse) and are counted in the memory prediction"
        )
    return (
        f"LoRA rank {ranks} on {named}, unfused: two extra matmuls per adapted linear layer and call, "
        "r x (in + out) MACs per token; --fuse-lora counts it folded into the weights"
    )


def matches(path: str, target: str) -> bool:
    """peft's rule (``check_target_module_exists`` for a list of names): the path is the target or ends with it."""
    return path == target or path.endswith("." + target)


def adapted_layers(module: torch.nn.Module, targets: tuple[tuple[str, int], ...]) -> dict[str, tuple[int, int, int]]:
    """Each adapted linear layer's path -> (rank, in features, out features); the first target it matches sets its
    rank (a LoRA file names every layer itself). A target naming another kind of layer (a convolution, which peft
    also adapts, or a container peft refuses) is refused: its cost is not modelled."""
    found, other = {}, []
    for path, layer in module.named_modules():
        rank = next((rank for target, rank in targets if matches(path, target)), None)
        if rank is None:
            continue
        if isinstance(layer, torch.nn.Linear):
            found[path] = (rank, layer.in_features, layer.out_features)
        else:
            other.append(f"{path} ({type(layer).__name__})")
    if other:
        raise DiffmeterError(
            f"the LoRA adapts {len(other)} layer{'s' if len(other) > 1 else ''} diffmeter counts only when linear: "
            f"{_listed(other, 3)}; name linear layers with --lora-targets"
        )
    return found


class _Adapter(torch.nn.Module):
    """An adapted layer's low-rank pair, a child of the layer: a block's structure (``flops.counter.block_structure``)
    then tells an adapted block, and its rank, from a plain one, so the counter never replays one for the other. Its
    tensors are plain attributes, neither parameters nor buffers (``adapter_params`` counts them)."""

    def __init__(self, down: torch.Tensor, up: torch.Tensor) -> None:
        super().__init__()
        self.down, self.up = down, up

    def extra_repr(self) -> str:
        return f"rank={self.down.shape[0]}, in_features={self.down.shape[1]}, out_features={self.up.shape[0]}"


class _Unfused:
    """Forward hooks adding each adapted layer's two low-rank matmuls to its output, the adapter's weights made
    once, beside the layer's own (on the meta device in a count; fake tensors in a memory prediction)."""

    def __init__(self, module: torch.nn.Module, targets: tuple[tuple[str, int], ...]) -> None:
        self.handles, self.layers = [], []
        layers = dict(module.named_modules())
        for path, (rank, features_in, features_out) in adapted_layers(module, targets).items():
            layer = layers[path]
            adapter = _Adapter(_like(layer.weight, (rank, features_in)), _like(layer.weight, (features_out, rank)))
            layer.add_module(ADAPTER, adapter)
            self.layers.append(layer)
            self.handles.append(layer.register_forward_hook(self._adding(adapter)))

    @staticmethod
    def _adding(adapter: _Adapter):
        def hook(_layer, args, output):
            return output + F.linear(F.linear(args[0], adapter.down), adapter.up)

        return hook

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
        for layer in self.layers:
            delattr(layer, ADAPTER)


def _like(weight: torch.Tensor, shape: tuple[int, int]) -> torch.Tensor:
    """An adapter weight beside ``weight``: on its device, at its dtype, fake where it is (a memory prediction's
    module), made outside any tracking (the adapter's bytes are resident, counted with the parameters)."""
    mode = getattr(weight, "fake_mode", None)
    with mode if mode is not None else contextlib.nullcontext():
        return torch.empty(shape, dtype=weight.dtype, device=weight.device)


def with_lora(calls: list, targets: tuple[tuple[str, int], ...], fused: bool, denoiser: str) -> list:
    """The ``denoiser``'s calls of a plan with the adapter's matmuls added (unfused); a fused LoRA changes no call.
    Only the family's main denoiser: diffusers loads a LoRA into ``transformer`` alone (Wan 2.2's ``transformer_2``
    only with ``load_into_transformer_2=True``, WanLoraLoaderMixin.load_lora_weights, diffusers 0.42.1)."""
    if not targets or fused:
        return calls
    label = f"LoRA rank {_ranks(targets)}, unfused"

    def prepare(module: torch.nn.Module) -> _Unfused:
        unfused = _Unfused(module, targets)
        if not unfused.handles:
            raise DiffmeterError(
                f"the LoRA adapts no linear layer of {type(module).__name__}: its targets "
                f"({_listed([target for target, _ in targets], 4)}) name none"
            )
        return unfused

    prepare.key = ("lora", targets)  # told apart from other adapters by the counter's memo (flops.profile)
    adapted = []
    for call in calls:
        if call.role != DENOISER or call.component != denoiser:
            adapted.append(call)
            continue
        note = f"{call.note}; {label}" if call.note else label
        adapted.append(replace(call, prepare=_both(call.prepare, prepare) if call.prepare else prepare, note=note))
    return adapted


class _Handles:
    def __init__(self, *handles) -> None:
        self.handles = handles

    def remove(self) -> None:
        for handle in reversed(self.handles):
            handle.remove()


def _both(first, then):
    """A call's own hooks (HiDream's routing) and the adapter's, installed and removed together."""

    def prepare(module: torch.nn.Module) -> _Handles:
        return _Handles(first(module), then(module))

    prepare.key = (getattr(first, "key", None), then.key)
    return prepare


def refuse_foreign_layers(module: torch.nn.Module, layers: tuple[tuple[str, int], ...], name: str) -> None:
    """A LoRA file's layers that ``module`` (the component ``name``) lacks: another model's file, which diffusers
    would load in part, warning of unexpected keys (a new user's SD3 LoRA on FLUX loaded 4 of its 30 layers)."""
    paths = [path for path, _ in module.named_modules()]
    foreign = [layer for layer, _ in layers if not any(matches(path, layer) for path in paths)]
    if foreign:
        raise DiffmeterError(
            f"the LoRA file names {len(foreign)} of its {len(layers)} layers that {type(module).__name__} ({name}) "
            f"does not have ({_listed(foreign, 3)}): it was made for another model; pass one trained on this one"
        )


def adapter_params(module: torch.nn.Module, targets: tuple[tuple[str, int], ...]) -> int:
    """Parameters the adapter adds: ``r * (in + out)`` per adapted layer."""
    return sum(rank * (i + o) for rank, i, o in adapted_layers(module, targets).values())
