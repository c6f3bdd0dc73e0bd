"""Z-Image (Tongyi-MAI): a single-stream S3-DiT over Qwen3 hidden states, FLUX.1's 16-channel VAE.

What ZImagePipeline (diffusers 0.42.1) does, and this family with it:

- ``_encode_prompt`` wraps each prompt in Qwen3's chat template (``enable_thinking=True``: no think
  block), pads it to ``max_sequence_length`` (512) and runs the Qwen3Model on all of it; it reads
  ``hidden_states[-2]`` (every layer still runs) and keeps only the real tokens of each prompt
  (``prompt_embeds[i][mask[i]]``): a list of variable-length embeddings.
- CFG is on when the pipeline's ``guidance_scale`` w > 0; the negative prompt ("" by default) is
  encoded in a second call, and each step runs ONE transformer call on the list ``[cond..., uncond...]``.
- The transformer takes lists of per-image latents and captions, pads each caption and each image
  token run to a multiple of 32 with learned pad tokens, then pads the batch to its longest sample.
"""

from __future__ import annotations

import json
from dataclasses import replace

import torch
from torch._subclasses.fake_tensor import FakeTensor

from diffmeter.catalog.controlnets import CONTROLNET
from diffmeter.families import controlnet
from diffmeter.families.base import DENOISER, Call, Family, Shapes, register
from diffmeter.families.control_image import ControlImage
from diffmeter.pipelines import build_component

#: ZImageTransformer2DModel pads caption and image token runs to multiples of this (SEQ_MULTI_OF)
SEQ_MULTI_OF = 32


def chat_prompt(tokenizer, prompt: str) -> str:
    """The string ZImagePipeline._encode_prompt tokenizes for ``prompt``."""
    messages = [{"role": "user", "content": prompt}]
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, enable_thinking=True)


@register
class ZImage(ControlImage, Family):
    name = "z_image"
    reads_prompt_tokens = True
    flow_matching = True
    text_encoders = ("text_encoder",)
    sequence_encoder = "text_encoder"
    cfg_mode = "batched"
    #: captions are padded to multiples of 32 per sample and masked when a batch (a CFG pair included)
    #: lands in different multiples: kernels that refuse masks would fail on such a batch
    masks_attention = True

    # ---- sizes ---------------------------------------------------------------------------
    def patch(self, entry) -> int:
        return entry.components[self.denoiser].config["all_patch_size"][0]  # the pipeline calls patch_size=2

    def size_multiple(self, entry) -> int:
        return self.vae_scale(entry) * 2  # __call__: height and width must divide by vae_scale_factor * 2

    def default_size(self, entry) -> tuple[int, int]:
        return 1024, 1024  # __call__: height = height or 1024, width = width or 1024

    # ---- guidance and prompts --------------------------------------------------------------
    def guidance_arguments(self, entry, guidance_scale: float) -> dict:
        """ZImagePipeline computes cond + w * (cond - uncond) and guides whenever w > 0: that is the usual
        CFG scale s = w + 1, so diffmeter's s (CFG when s > 1) is passed as w = s - 1 (0 when s <= 1)."""
        return {"guidance_scale": max(guidance_scale - 1.0, 0.0)}

    def called_guidance(self, entry, call_defaults: dict) -> float | None:
        """The pipeline's w guides when above 0: diffmeter's scale is w + 1 (1, no CFG, for w = 0)."""
        w = call_defaults.get("guidance_scale")
        return None if w is None else (w + 1.0 if w > 0 else 1.0)

    def prompt_settings(self, pipe, prompts: list[str]) -> dict[str, int]:
        """The chat template costs what the empty default negative prompt costs; each prompt costs the
        rest of its templated length, both read with the pipeline's own tokenizer."""
        tokenizer = pipe.tokenizer
        template = len(tokenizer(chat_prompt(tokenizer, "")).input_ids)
        longest = max(len(tokenizer(chat_prompt(tokenizer, prompt)).input_ids) for prompt in prompts)
        if longest == template:  # empty prompts only
            return {"prompt_tokens": template, "template_tokens": 0}
        return {"prompt_tokens": longest - template, "template_tokens": template}

    def template_tokens(self, shapes: Shapes) -> int:
        if shapes.spec.template_tokens is not None:
            return shapes.spec.template_tokens
        return shapes.entry.extra["template_tokens"]["value"]

    def caption_lengths(self, shapes: Shapes) -> tuple[int, int | None]:
        """Real tokens the transformer gets per prompt and per negative prompt (None without CFG):
        the templated prompt's tokens, truncated at max_sequence_length."""
        limit = shapes.text_tokens["text_encoder"]
        template = self.template_tokens(shapes)
        spec = shapes.spec
        if spec.prompt_tokens is None:
            cond = limit
            shapes.note_prompt_upper_bound(
                f"the transformer gets each prompt's real tokens (chat template included); assumed all {limit}"
            )
        else:
            cond = min(limit, spec.prompt_tokens + template)
        if not shapes.cfg:
            return cond, None
        if spec.negative_prompt_tokens is None:
            shapes.note(f"the negative prompt is the pipeline's default empty one: {template} chat-template tokens")
        uncond = min(limit, (spec.negative_prompt_tokens or 0) + template)
        return cond, uncond

    # ---- the denoiser ----------------------------------------------------------------------
    def denoiser_calls(self, shapes: Shapes) -> list[Call]:
        steps = shapes.spec.steps
        cond, uncond = self.caption_lengths(shapes)
        lengths = self.caption_batch(shapes)
        padded = [-(-n // SEQ_MULTI_OF) * SEQ_MULTI_OF for n in (cond, uncond) if n is not None]
        if uncond is None:
            note = f"no CFG; {cond} caption tokens (padded to {padded[0]})"
        else:
            note = (
                f"CFG batched: cond + uncond in one call; {cond} + {uncond} caption tokens "
                f"(padded to {padded[0]} and {padded[1]}, the batch to {max(padded)})"
            )
            shapes.note(
                f"ZImagePipeline is called with guidance_scale {shapes.spec.guidance_scale - 1:g}: its w is "
                "diffmeter's CFG scale minus 1"
            )

        def build(device):
            return {**self.inputs(shapes, lengths, device), "return_dict": False}

        return [Call(self.denoiser, DENOISER, len(lengths), steps, build, note=note)]

    def caption_batch(self, shapes: Shapes) -> list[int]:
        """The caption tokens of each sample of a transformer call: the prompts', then the negatives' with CFG."""
        cond, uncond = self.caption_lengths(shapes)
        batch = shapes.spec.batch_size
        return [cond] * batch + ([uncond] * batch if uncond is not None else [])

    def inputs(self, shapes: Shapes, lengths: list[int], device) -> dict:
        """The per-sample lists the transformer (and its ControlNet) take: latents, timesteps, captions."""
        config = shapes.config(self.denoiser)
        height, width = shapes.latent_height, shapes.latent_width
        return {
            "x": [torch.zeros(config["in_channels"], 1, height, width, device=device) for _ in lengths],
            "t": torch.zeros(len(lengths), device=device),
            "cap_feats": [torch.zeros(n, config["cap_feat_dim"], device=device) for n in lengths],
        }

    # ---- the ControlNet --------------------------------------------------------------------
    def controlnet_plan(self, shapes: Shapes, calls: list[Call]) -> list[Call]:
        """ZImageControlNetPipeline (diffusers 0.42.1, pipeline_z_image_controlnet.py 553-577 and 649-675): the control
        image VAE-encoded once per call at the prompt batch (its 16 latent channels zero-padded to ``control_in_dim``);
        each step the ControlNet takes the transformer's inputs, repeated for CFG, and runs the transformer's own
        embedders and refiners (``from_transformer``, controlnet_z_image.py 519-530) before its control blocks; the
        transformer adds one hint to each layer ``control_layers_places`` names."""
        config, lengths = shapes.config(CONTROLNET), self.caption_batch(shapes)
        height, width = shapes.latent_height, shapes.latent_width

        def build(device):
            control = [torch.zeros(config["control_in_dim"], 1, height, width, device=device) for _ in lengths]
            return {**self.inputs(shapes, lengths, device), "control_context": control}

        image = -(-(height // 2) * (width // 2) // SEQ_MULTI_OF) * SEQ_MULTI_OF
        unified = image + max(-(-n // SEQ_MULTI_OF) * SEQ_MULTI_OF for n in lengths)
        dim = config["dim"]

        def residuals(batch, device):
            return {
                "controlnet_block_samples": {
                    i: torch.zeros(batch, unified, dim) for i in config["control_layers_places"]
                }
            }

        size, batch = (shapes.spec.height, shapes.spec.width), shapes.spec.batch_size
        encode = controlnet.control_image_encoding(self.decoder, batch, size, "once per call")
        detail = (
            f"runs every step at the transformer's batch ({len(lengths)}), through the transformer's own embedders and "
            "refiners (their weights are the transformer's)"
        )
        always = "ZImageControlNetPipeline takes no control_guidance_start/end: it runs every step"
        planned = controlnet.steered(
            shapes, calls, self.denoiser, build, residuals, detail, encode=encode, step_range=always
        )
        lend = lent_transformer(shapes.entry.components[self.denoiser])
        return [replace(call, prepare=lend) if call.component == CONTROLNET else call for call in planned]


def lent_transformer(component):
    """A ``Call.prepare`` hook giving a ZImageControlNetModel, built from its config alone, the transformer modules
    its pipeline lends it (``ZImageControlNetModel.from_transformer``): built from the transformer's config on the
    ControlNet's own device, fake tensors included (the memory prediction), and taken back after the call, so the
    ControlNet's parameters stay its own."""
    from diffusers import ZImageControlNetModel

    def prepare(module):
        lender = build_component(component, "meta")
        held = next(module.parameters())
        if isinstance(held, FakeTensor):
            with held.fake_mode:
                lender._apply(lambda t: torch.empty(t.shape, dtype=held.dtype if t.is_floating_point() else t.dtype))
        else:
            lender.to(held.device, held.dtype)
        ZImageControlNetModel.from_transformer(module, lender)
        return _Lent(module)

    prepare.key = ("lent transformer", json.dumps(component.config, sort_keys=True))
    return prepare


class _Lent:
    """Takes the lent transformer modules back from the ControlNet."""

    def __init__(self, module) -> None:
        self.module = module

    def remove(self) -> None:
        for name in LENT:
            setattr(self.module, name, None)


#: what ZImageControlNetModel.from_transformer sets (controlnet_z_image.py 519-530)
LENT = (
    "t_scale",
    "t_embedder",
    "all_x_embedder",
    "cap_embedder",
    "rope_embedder",
    "noise_refiner",
    "context_refiner",
    "x_pad_token",
    "cap_pad_token",
)
