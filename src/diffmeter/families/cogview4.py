"""CogView4: a joint-attention DiT over GLM-4 hidden states, with SDXL-style size conditioning.

CogView4Pipeline (diffusers) tokenizes each prompt with GLM-4's tokenizer (``[gMASK]<sop>`` in
front, padded to the longest prompt, truncated at ``max_sequence_length``), LEFT-pads the ids to a
multiple of 16 and runs GlmModel on all of them without a mask (``hidden_states[-2]``: every layer
runs). The transformer sees that padded length too. With guidance the negative prompt is encoded on
its own, at its own length, and each step calls the transformer twice: cond, then uncond.
"""

import math

import torch

from diffmeter.families.base import DENOISER, TEXT_ENCODER, Call, Family, Shapes, latents, register, timesteps

#: CogView4Pipeline._get_glm_embeds pads the token ids to a multiple of this
PAD_MULTIPLE = 16


def padded(tokens: int, limit: int) -> int:
    """The length the pipeline encodes: truncated at ``max_sequence_length``, then left-padded to 16."""
    return math.ceil(min(tokens, limit) / PAD_MULTIPLE) * PAD_MULTIPLE


@register
class CogView4(Family):
    name = "cogview4"
    reads_prompt_tokens = True
    flow_matching = True
    text_encoders = ("text_encoder",)
    sequence_encoder = "text_encoder"
    cfg_mode = "separate"

    def size_multiple(self, entry) -> int:
        return 16  # CogView4Pipeline.check_inputs: height and width divisible by 16

    def prompt_settings(self, pipe, prompts: list[str]) -> dict[str, int]:
        """Tokens as the pipeline's own tokenizer counts them, special tokens included; the default
        negative prompt is the empty string."""
        return {
            "prompt_tokens": max(len(pipe.tokenizer(prompt).input_ids) for prompt in prompts),
            "negative_prompt_tokens": len(pipe.tokenizer("").input_ids),
        }

    def lengths(self, shapes: Shapes) -> dict[str, int]:
        """The padded lengths of the prompt and of the negative prompt."""
        limit = shapes.text_tokens["text_encoder"]
        spec = shapes.spec
        if spec.prompt_tokens is None:
            shapes.note_prompt_upper_bound(
                f"prompts are padded to the longest one's GLM tokens, rounded up to a multiple of {PAD_MULTIPLE}; "
                f"assumed the full {padded(limit, limit)} tokens"
            )
        else:
            shapes.note(
                f"prompt: {spec.prompt_tokens} GLM tokens ([gMASK]<sop> included), left-padded to "
                f"{padded(spec.prompt_tokens, limit)}"
            )
        # GLM-4's tokenizer prefixes [gMASK]<sop>: the empty negative prompt is 2 tokens (catalog extra)
        empty = shapes.entry.extra.get("empty_negative_prompt_tokens", {}).get("value", 2)
        if shapes.cfg and spec.negative_prompt_tokens is None:
            shapes.note(
                f"the negative prompt is the default empty one: {empty} GLM tokens ([gMASK]<sop>), "
                f"padded to {padded(empty, limit)}"
            )
        return {
            "cond": padded(spec.prompt_tokens or limit, limit),
            "uncond": padded(spec.negative_prompt_tokens or empty, limit),
        }

    def text_calls(self, shapes: Shapes) -> list[Call]:
        batch = shapes.spec.batch_size
        lengths = self.lengths(shapes)
        labels = [("cond", "prompt")] + ([("uncond", "negative prompt")] if shapes.cfg else [])
        return [
            Call(
                "text_encoder",
                TEXT_ENCODER,
                batch,
                1,
                self._token_builder(batch, lengths[key]),
                note=f"{label}: {lengths[key]} tokens",
            )
            for key, label in labels
        ]

    def denoiser_calls(self, shapes: Shapes) -> list[Call]:
        steps, batch = shapes.spec.steps, shapes.spec.batch_size
        lengths = self.lengths(shapes)
        branches = ["cond", "uncond"] if shapes.cfg else ["cond"]
        return [
            Call(
                self.denoiser,
                DENOISER,
                batch,
                steps,
                self._builder(shapes, batch, lengths[branch]),
                note=f"{branch}: {lengths[branch]} text tokens" + (", CFG: separate calls" if shapes.cfg else ""),
            )
            for branch in branches
        ]

    def _builder(self, shapes: Shapes, batch: int, tokens: int):
        def build(device):
            return self.denoiser_inputs(shapes, batch, device, tokens)

        return build

    def denoiser_inputs(self, shapes: Shapes, batch: int, device, tokens: int | None = None):
        config = shapes.config(self.denoiser)
        tokens = tokens if tokens is not None else self.lengths(shapes)["cond"]
        size = torch.tensor([[shapes.spec.height, shapes.spec.width]], dtype=torch.float32, device=device)
        return {
            "hidden_states": latents(batch, config["in_channels"], shapes.latent_height, shapes.latent_width, device),
            "encoder_hidden_states": torch.zeros(batch, tokens, config["text_embed_dim"], device=device),
            "timestep": timesteps(batch, device),
            "original_size": size.repeat(batch, 1),
            "target_size": size.repeat(batch, 1),
            "crop_coords": torch.zeros(batch, 2, device=device),
            "return_dict": False,
        }
