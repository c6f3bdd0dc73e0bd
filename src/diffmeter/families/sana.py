"""SANA: linear-attention DiT over Gemma-2 tokens, decoded by a 32x DC-AE."""

import math

import torch

from diffmeter.families import lora
from diffmeter.families.base import TEXT_ENCODER, Call, Family, Shapes, latents, register, timesteps


@register
class Sana(Family):
    name = "sana"
    flow_matching = True
    masks_attention = True
    text_encoders = ("text_encoder",)
    sequence_encoder = "text_encoder"

    def lora_targets(self, entry) -> tuple[str, ...]:
        return lora.SANA

    bin_tables = (
        "diffusers.pipelines.sana.pipeline_sana",
        {
            128: "ASPECT_RATIO_4096_BIN",
            64: "ASPECT_RATIO_2048_BIN",
            32: "ASPECT_RATIO_1024_BIN",
            16: "ASPECT_RATIO_512_BIN",
        },
    )

    def vae_scale(self, entry) -> int:
        return 2 ** (len(entry.components[self.decoder].config["encoder_block_out_channels"]) - 1)

    def size_multiple(self, entry) -> int:
        return math.lcm(32, self.pixel_multiple(entry))  # SanaPipeline.check_inputs: multiples of 32

    def text_calls(self, shapes: Shapes) -> list[Call]:
        # the prompt is prefixed with the "complex human instruction" and padded to
        # instruction tokens + max_sequence_length - 2; the negative prompt is not.
        batch = shapes.spec.batch_size
        length = shapes.text_tokens["text_encoder"]
        instruction = self.instruction_tokens(shapes)
        prompt_length = length + instruction - 2 if instruction else length
        estimate = shapes.entry.extra.get("instruction_tokens", {})
        if shapes.spec.instruction_tokens is None and estimate.get("value") and "ESTIMATE" in estimate.get("note", ""):
            shapes.note(
                f"the complex-human-instruction length ({instruction} tokens) is an estimate; "
                "--instruction-tokens N sets the true Gemma token count"
            )
        calls = [
            Call(
                "text_encoder",
                TEXT_ENCODER,
                batch,
                1,
                self._token_builder(batch, prompt_length),
                note=f"prompt: {prompt_length} tokens incl. {instruction}-token instruction"
                if instruction
                else f"prompt: {prompt_length} tokens, no instruction",
            )
        ]
        if shapes.cfg:
            calls.append(
                Call(
                    "text_encoder",
                    TEXT_ENCODER,
                    batch,
                    1,
                    self._token_builder(batch, length),
                    note=f"negative prompt: {length} tokens",
                )
            )
        return calls

    def prompt_settings(self, pipe, prompts: list[str]) -> dict[str, int]:
        """The complex human instruction the pipeline prepends by default, counted exactly."""
        import inspect

        instruction = inspect.signature(type(pipe).__call__).parameters["complex_human_instruction"].default
        return {"instruction_tokens": len(pipe.tokenizer.encode("\n".join(instruction)))} if instruction else {}

    def instruction_tokens(self, shapes: Shapes) -> int:
        """Tokens of the instruction: the spec's, else the catalog's (Gemma tokenizer count)."""
        if shapes.spec.instruction_tokens is not None:
            return shapes.spec.instruction_tokens
        return shapes.entry.extra.get("instruction_tokens", {}).get("value", 0)

    def denoiser_inputs(self, shapes: Shapes, batch: int, device):
        config = shapes.config(self.denoiser)
        tokens = shapes.text_tokens["text_encoder"]
        return {
            "hidden_states": latents(batch, config["in_channels"], shapes.latent_height, shapes.latent_width, device),
            "encoder_hidden_states": torch.zeros(batch, tokens, config["caption_channels"]),
            "encoder_attention_mask": torch.ones(batch, tokens),
            "timestep": timesteps(batch, device),
            "return_dict": False,
        }
