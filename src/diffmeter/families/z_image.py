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

import torch

from diffmeter.families.base import DENOISER, Call, Family, Shapes, register

#: ZImageTransformer2DModel pads caption and image token runs to multiples of this (SEQ_MULTI_OF)
SEQ_MULTI_OF = 32


def chat_prompt(tokenizer, prompt: str) -> str:
    """The string ZImagePipeline._encode_prompt tokenizes for ``prompt``."""
    messages = [{"role": "user", "content": prompt}]
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, enable_thinking=True)


@register
class ZImage(Family):
    name = "z_image"
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
        steps, batch = shapes.spec.steps, shapes.spec.batch_size
        cond, uncond = self.caption_lengths(shapes)
        lengths = [cond] * batch + ([uncond] * batch if uncond is not None else [])
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
            config = shapes.config(self.denoiser)
            height, width = shapes.latent_height, shapes.latent_width
            return {
                "x": [torch.zeros(config["in_channels"], 1, height, width, device=device) for _ in lengths],
                "t": torch.zeros(len(lengths), device=device),
                "cap_feats": [torch.zeros(n, config["cap_feat_dim"], device=device) for n in lengths],
                "return_dict": False,
            }

        return [Call(self.denoiser, DENOISER, len(lengths), steps, build, note=note)]
