"""A family: how one kind of pipeline calls its components, as data plus input builders.

The profile asks a family for its *call plan* (which component runs how often, at which batch) and for the inputs of
each call. Inputs are built from shapes alone, so they work on the meta device. The plan mirrors the real diffusers
pipeline exactly: the tests run the real pipeline under the FLOP counter and compare."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

import torch

from diffmeter.catalog.controlnets import CONTROLNET
from diffmeter.catalog.entry import PipelineEntry
from diffmeter.errors import DiffmeterError
from diffmeter.families import binning, call_options, lora, schedule
from diffmeter.spec import ProfileSpec
from diffmeter.stages import DENOISER, IMAGE_ENCODER, TEXT_ENCODER, VAE_DECODER  # noqa: F401 (re-exported)


@dataclass(frozen=True)
class Call:
    """``count`` identical calls of one component; ``build`` makes its inputs on ``device``."""

    component: str
    role: str
    batch: int
    count: int
    build: Callable[[torch.device], dict[str, Any]]
    method: str = "forward"
    note: str = ""
    #: optional hook installer for the meta run, returning a removable handle
    prepare: Callable[[torch.nn.Module], Any] | None = None
    #: submodules called once per frame whose repeated calls (same input shapes, same cache state
    #: in their arguments) may be replayed instead of run again: a causal video VAE's decoder
    replayed: tuple[str, ...] = ()
    #: the model reads the values of small host tensors it is given (masks it turns into lengths, made with
    #: ``host_masks.host_values``): the memory prediction's fake-tensor run keeps them (``predict/fake_run.py``)
    reads_values: bool = False
    #: an image encoding whose input the pipeline keeps to the end of ``__call__`` (FLUX.1 Kontext's preprocessed
    #: image); False: freed once encoded (Wan I2V's video, a local of ``prepare_latents``)
    keeps_input: bool = True
    #: what of the call's output the pipeline keeps (the CLIP hidden state Wan I2V reads), else all of it
    kept: Callable[[Any], Any] | None = None
    #: the dtype the pipeline casts the component to for this call (SDXL's float32 decode), else the component's
    dtype: str | None = None


@dataclass
class Shapes:
    """Everything an input builder needs: settled spec, configs and derived sizes."""

    entry: PipelineEntry
    spec: ProfileSpec
    latent_height: int
    latent_width: int
    latent_frames: int | None
    text_tokens: dict[str, int] = field(default_factory=dict)
    #: the input images' (height, width) as the pipeline resizes them before encoding, in its order
    images: list[tuple[int, int]] = field(default_factory=list)
    #: modelling assumptions worth telling the reader (binning, estimates, prompt lengths)
    notes: list[str] = field(default_factory=list)
    #: the frames asked where the pipeline makes others (``pipeline_frames``): LTX-2's audio lasts as long as asked
    asked_frames: int | None = None

    def config(self, component: str) -> dict[str, Any]:
        return self.entry.components[component].config

    def note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)

    def note_prompt_upper_bound(self, what: str) -> None:
        self.note(f"{what} (an upper bound); --prompt-tokens N counts a real prompt")

    @property
    def cfg(self) -> bool:
        return self.spec.guidance_scale > 1.0


class Family:
    """Base description; subclasses set the class attributes and the denoiser inputs."""

    name: ClassVar[str]
    denoiser: ClassVar[str] = "transformer"
    decoder: ClassVar[str] = "vae"
    text_encoders: ClassVar[tuple[str, ...]] = ()
    #: "batched": uncond and cond in one call of twice the batch; "separate": two calls;
    #: "never": guidance-distilled or unguided.
    cfg_mode: ClassVar[str] = "batched"
    encodes_negative: ClassVar[bool] = True  #: the negative prompt goes through the text encoders when CFG is on
    true_cfg: ClassVar[bool] = False  #: the pipeline takes ``true_cfg_scale`` beside an embedded guidance (FLUX.1)
    truncates_cfg: ClassVar[bool] = False  #: it takes ``cfg_trunc_ratio``: CFG on the first steps only (Lumina 2)
    is_video: ClassVar[bool] = False
    #: input images the pipeline takes (``--image-size``): 0 for text-to-image, None where it sets no limit
    max_images: ClassVar[int | None] = 0
    flow_matching: ClassVar[bool] = False  #: the denoiser predicts a flow velocity (flow-matching samplers), not noise
    #: the denoiser passes a text padding mask to SDPA (PixArt, SANA, Kandinsky 3, Lumina): mask-less kernels cannot
    masks_attention: ClassVar[bool] = False
    reads_prompt_tokens: ClassVar[bool] = False  #: its text length follows the prompt's (``--prompt-tokens``)
    #: the text encoder whose padded length the pipeline's ``max_sequence_length`` sets
    sequence_encoder: ClassVar[str | None] = None
    #: the largest ``max_sequence_length`` the pipeline's check_inputs accepts (None: no limit)
    max_sequence_limit: ClassVar[int | None] = None
    #: a pipeline's hard-coded ``default_sample_size`` (FLUX, Chroma, Qwen-Image: 128), not the denoiser's
    default_sample_size: ClassVar[int | None] = None
    decoder_arg: ClassVar[str] = "z"  #: name of the latents argument of the decoder's ``decode``
    decoder_kwargs: ClassVar[dict[str, Any]] = {}
    #: PixArt/SANA's binning by aspect ratio: the diffusers module of the tables, the table per ``sample_size``
    bin_tables: ClassVar[tuple[str, dict[int, str]] | None] = None
    #: a binning pipeline resizes the image back to the requested size (PixArt, SANA; not HunyuanDiT)
    restores_binned_size: ClassVar[bool] = True
    #: what the pipeline does with a size that is not a multiple of ``size_multiple``: "refuse"
    #: (its check_inputs raises), or generate at the multiple just "down" (FLUX) or "up" (Kandinsky 3)
    size_rounding: ClassVar[str] = "refuse"

    # ---- prompts -----------------------------------------------------------------------
    def prompt_settings(self, pipe, prompts: list[str]) -> dict[str, int]:
        """ProfileSpec fields that depend on the real prompts, read with the loaded pipeline's own
        tokenizer (the longest prompt counts); empty for families whose compute does not depend
        on them (padded encoders)."""
        return {}

    def guidance_arguments(self, entry: PipelineEntry, guidance_scale: float) -> dict[str, Any]:
        """The pipeline's own ``__call__`` arguments for diffmeter's guidance scale: most pipelines
        call it ``guidance_scale``; some guide under another name or only with a negative prompt."""
        return {"guidance_scale": guidance_scale}

    def true_cfg_arguments(self, true_cfg_scale: float | None, batch_size: int) -> dict[str, Any]:
        """The ``__call__`` arguments of ``--true-cfg-scale`` (only families with ``true_cfg`` take one): an empty
        negative prompt per output, since the pipeline runs true CFG only with one and encodes a string at batch
        1, which its unconditional call could not pair with a batch."""
        if not self.true_cfg or true_cfg_scale is None:
            return {}
        return {"true_cfg_scale": true_cfg_scale, "negative_prompt": [""] * batch_size}

    def cfg_of(self, shapes: Shapes) -> str:
        """How this generation guides: ``cfg_mode`` when CFG is on, else "never". A ``true_cfg`` family
        (FluxPipeline, HunyuanVideoPipeline.__call__, diffusers 0.42.1: ``do_true_cfg = true_cfg_scale > 1 and
        has_neg_prompt``) encodes the negative prompt with every encoder and runs the denoiser a second time per
        step on it, after the conditional call; the embedded guidance stays on both."""
        if self.true_cfg:
            return "separate" if shapes.spec.true_cfg_scale is not None else "never"
        return self.cfg_mode if shapes.cfg else "never"

    def guided(self, shapes: Shapes) -> bool:
        return self.cfg_of(shapes) != "never"

    def prepare_pipeline(self, pipe, guidance_scale: float, batch_size: int) -> None:
        """Set on a loaded pipeline what it takes outside ``__call__`` (a guider component holding
        the guidance scale), before it runs; ``bench`` and the tests call it. Nothing by default."""

    # ---- sizes -------------------------------------------------------------------------
    def called_guidance(self, entry: PipelineEntry, call_defaults: dict[str, Any]) -> float | None:
        """diffmeter's guidance scale (CFG when > 1) for a pipeline called with its ``__call__`` defaults
        alone: the inverse of ``guidance_arguments``; None when the signature does not say."""
        return call_defaults.get("guidance_scale")

    def vae_scale(self, entry: PipelineEntry) -> int:
        """Pixels per latent pixel; KL VAEs downsample once per block after the first."""
        config = entry.components[self.decoder].config
        return 2 ** (len(config["block_out_channels"]) - 1)

    def latent_channels(self, entry: PipelineEntry) -> int:
        return entry.components[self.decoder].config["latent_channels"]

    def patch(self, entry: PipelineEntry) -> int:
        """Latent pixels per token side: the denoiser's ``patch_size``, 1 for UNets (which have none)."""
        return entry.components[self.denoiser].config.get("patch_size") or 1

    def pixel_multiple(self, entry: PipelineEntry) -> int:
        """Pixels per latent token side: what the VAE and the patching need to divide."""
        return self.vae_scale(entry) * self.patch(entry)

    def size_multiple(self, entry: PipelineEntry) -> int:
        """Pixels per side the pipeline requires: most pipelines check for multiples of 8 whatever
        the VAE; never less than the latent grid needs."""
        return math.lcm(8, self.pixel_multiple(entry))

    def pipeline_size(self, entry: PipelineEntry, height: int, width: int) -> tuple[int, int, str | None]:
        """The size the pipeline generates at for a request, with a note when it differs; a size the
        pipeline refuses is refused here, in one line naming its rule."""
        return binning.rounded_size(entry, height, width, self.size_multiple(entry), self.size_rounding)

    def default_size(self, entry: PipelineEntry) -> tuple[int, int]:
        """(height, width) the pipeline makes when called without a size: most pipelines take the
        denoiser's ``sample_size`` times the VAE's scale."""
        sample_size = self.default_sample_size or entry.components[self.denoiser].config["sample_size"]
        side = sample_size * self.vae_scale(entry)
        return side, side

    def default_frames(self, entry: PipelineEntry) -> int | None:
        """Frames the pipeline makes when ``__call__`` names no default (None: images, or ``__call__`` does)."""
        return None

    def pipeline_frames(self, entry: PipelineEntry, num_frames: int) -> tuple[int, str | None]:
        """The frames the pipeline makes of ``num_frames``, with a note where they differ (``frames``)."""
        return num_frames, None

    def bins(self, entry: PipelineEntry, spec: ProfileSpec) -> bool:
        """Whether the pipeline snaps this request to an aspect-ratio bin (and resizes the image back)."""
        return bool(spec.resolution_binning) and self.binned_size(entry, spec.height, spec.width) is not None

    def binned_size(self, entry: PipelineEntry, height: int, width: int) -> tuple[int, int] | None:
        """The size the pipeline really generates at when it bins resolutions; None if it does not."""
        if self.bin_tables is None:
            return None
        return binning.binned_size(entry, self.denoiser, self.bin_tables, height, width)

    def shapes(self, entry: PipelineEntry, spec: ProfileSpec) -> Shapes:
        notes = []
        spec.check_components(entry.name, list(entry.components))
        call_options.refuse_unsupported(self, entry, spec)
        if not self.is_video and spec.num_frames is not None:
            raise DiffmeterError(f"{entry.name} makes images; --num-frames is for video models (Wan, LTX...): drop it")
        if spec.prompt_tokens is not None and not self.reads_prompt_tokens:
            raise DiffmeterError(f"{entry.name} pads every prompt to one length: --prompt-tokens does nothing; drop it")
        binned = self.binned_size(entry, spec.height, spec.width) if spec.resolution_binning else None
        if binned and binned != (spec.height, spec.width):
            notes.append(
                f"resolution binning: {spec.width}x{spec.height} (WxH) requested, the pipeline generates at "
                f"{binned[1]}x{binned[0]} and resizes the image (--no-resolution-binning to count the request)"
            )
            spec = replace(spec, height=binned[0], width=binned[1])
        height, width, rounded = self.pipeline_size(entry, spec.height, spec.width)
        if rounded:
            notes.append(rounded)
            spec = replace(spec, height=height, width=width)
        made, floored = self.pipeline_frames(entry, spec.num_frames) if spec.num_frames else (None, None)
        asked = spec.num_frames if floored else None
        if floored:
            notes.append(floored)
            spec = replace(spec, num_frames=made)
        scale = self.vae_scale(entry)
        lengths = dict(entry.text_max_length)
        if spec.max_sequence_length is not None:
            if self.sequence_encoder is None:
                raise DiffmeterError(
                    f"{entry.name}'s pipeline ({entry.pipeline_class}) takes no max_sequence_length; drop the option"
                )
            if self.max_sequence_limit is not None and spec.max_sequence_length > self.max_sequence_limit:
                raise DiffmeterError(
                    f"--max-sequence-length {spec.max_sequence_length}: {entry.pipeline_class} refuses more than "
                    f"{self.max_sequence_limit} tokens; use at most {self.max_sequence_limit}"
                )
            lengths[self.sequence_encoder] = spec.max_sequence_length
        frames = self.latent_frames(entry, spec)
        images = self.input_images(entry, spec, notes)
        return Shapes(entry, spec, spec.height // scale, spec.width // scale, frames, lengths, images, notes, asked)

    def input_images(self, entry: PipelineEntry, spec: ProfileSpec, notes: list[str]) -> list[tuple[int, int]]:
        """The input images' (height, width) as the pipeline resizes them, with a note on each resize; a
        text-to-image pipeline takes none."""
        if spec.image_sizes:
            raise DiffmeterError(
                f"{entry.name} ({entry.pipeline_class}) generates from text alone and takes no input image: "
                "drop --image or --image-size"
            )
        return []

    def latent_frames(self, entry: PipelineEntry, spec: ProfileSpec) -> int | None:
        return None

    # ---- the call plan -------------------------------------------------------------------
    def plan(self, shapes: Shapes) -> list[Call]:
        calls = [
            *self.text_calls(shapes),
            *self.image_calls(shapes),
            *self.denoiser_calls(shapes),
            *self.decoder_calls(shapes),
        ]
        if CONTROLNET in shapes.entry.components:
            calls = self.controlnet_plan(shapes, calls)
        adapter = lora.targets_of(self, shapes.entry, shapes.spec)
        if adapter:
            shapes.note(lora.described(adapter, shapes.spec))
        return lora.with_lora(calls, adapter, shapes.spec.fuse_lora, self.denoiser)

    def lora_targets(self, entry: PipelineEntry) -> tuple[str, ...]:
        """The denoiser layers a LoRA adapts by default (``families.lora``): diffusers' trainer's for the family."""
        return lora.ATTENTION_PROJECTIONS

    def image_calls(self, shapes: Shapes) -> list[Call]:
        """The calls that encode the input images (none without any)."""
        return []

    def controlnet_plan(self, shapes: Shapes, calls: list[Call]) -> list[Call]:
        """The plan with a ControlNet (``families.controlnet``): its calls before the denoiser's, and the residuals
        it hands the denoiser; only families whose pipelines diffusers runs with a ControlNet have one."""
        raise DiffmeterError(f"{shapes.entry.pipeline_class} runs no ControlNet in diffmeter: drop --controlnet")

    def text_calls(self, shapes: Shapes) -> list[Call]:
        calls = []
        negative = self.guided(shapes) and self.encodes_negative
        for encoder in self.text_encoders:
            if encoder not in shapes.entry.components:
                continue
            length = shapes.text_tokens[encoder]
            batch = shapes.spec.batch_size
            calls.append(
                Call(
                    encoder,
                    TEXT_ENCODER,
                    batch,
                    2 if negative else 1,
                    self._token_builder(batch, length),
                    note=f"{length} tokens" + (", prompt + negative prompt" if negative else ""),
                )
            )
        return calls

    def _token_builder(self, batch: int, length: int):
        def build(device: torch.device) -> dict[str, Any]:
            return self.text_inputs(batch, length, device)

        return build

    def text_inputs(self, batch: int, length: int, device: torch.device) -> dict[str, Any]:
        """Token ids only: a padding mask changes no matmul shape, and reading one is a
        data-dependent branch in transformers that the meta device cannot take."""
        return {"input_ids": torch.zeros(batch, length, dtype=torch.long, device=device)}

    def denoisers(self, entry: PipelineEntry) -> tuple[str, ...]:
        """The denoiser components a generation calls: the denoiser, and any expert the pipeline
        switches to between steps. Stage timing and the optimizations act on each of them."""
        return (self.denoiser,)

    def step_components(self, entry: PipelineEntry) -> tuple[str, ...]:
        """What runs inside each denoising step: the denoisers, and a ControlNet before them (bench's stage timer
        opens a step at the first of their calls)."""
        return (*self.denoisers(entry), *((CONTROLNET,) if CONTROLNET in entry.components else ()))

    def denoiser_calls(self, shapes: Shapes) -> list[Call]:
        steps, batch = schedule.denoiser_steps(shapes.entry, shapes.spec), shapes.spec.batch_size
        mode = self.cfg_of(shapes)
        if mode == "never":
            count, call_batch, note = steps, batch, "no CFG"
        elif mode == "batched":
            count, call_batch, note = steps, 2 * batch, "CFG batched: uncond + cond in one call"
        else:
            count, call_batch, note = 2 * steps, batch, "CFG: separate uncond and cond calls"
        return [
            Call(
                self.denoiser,
                DENOISER,
                call_batch,
                count,
                lambda device: self.denoiser_inputs(shapes, call_batch, device),
                note=note,
            )
        ]

    def denoiser_inputs(self, shapes: Shapes, batch: int, device: torch.device) -> dict[str, Any]:
        raise NotImplementedError

    def decoder_calls(self, shapes: Shapes) -> list[Call]:
        batch = shapes.spec.batch_size
        return [
            Call(
                self.decoder,
                VAE_DECODER,
                batch,
                1,
                lambda device: self.decoder_inputs(shapes, batch, device),
                method="decode",
            )
        ]

    def decoder_inputs(self, shapes: Shapes, batch: int, device: torch.device) -> dict[str, Any]:
        channels = self.latent_channels(shapes.entry)
        z = latents(batch, channels, shapes.latent_height, shapes.latent_width, device)
        return {self.decoder_arg: z, **self.decoder_kwargs}


def latents(batch: int, channels: int, height: int, width: int, device: torch.device) -> torch.Tensor:
    return torch.zeros(batch, channels, height, width, device=device)


def timesteps(batch: int, device: torch.device) -> torch.Tensor:
    return torch.zeros(batch, device=device)


FAMILIES: dict[str, Family] = {}


def register(cls: type[Family]) -> type[Family]:
    """Class decorator: add a family to the registry under its ``name``."""
    FAMILIES[cls.name] = cls()
    return cls


def get_family(name: str) -> Family:
    try:
        return FAMILIES[name]
    except KeyError:
        raise DiffmeterError(f"unknown family '{name}'; known: {', '.join(sorted(FAMILIES))}") from None
