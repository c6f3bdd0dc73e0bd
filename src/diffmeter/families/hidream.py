"""HiDream-I1 (Full, Dev, Fast): a sparse mixture-of-experts DiT over CLIP-L, CLIP-G, T5 and Llama 3.1.

What ``HiDreamImagePipeline`` (diffusers 0.42.1) runs, as modelled here:

- **Size.** ``__call__`` rescales every request to the pixel budget ``(default_sample_size 128 *
  vae_scale_factor)^2`` (1024x1024), keeping the aspect ratio and flooring each side to a multiple of
  ``vae_scale_factor * 2``: 512x512 is generated at 1024x1024. The transformer pads a non-square
  latent's image sequence to ``max_seq`` tokens (4096), a square one is not padded.
- **Text.** Each encoder pads to its own length: both CLIPs to ``min(max_sequence_length, 218)``, T5
  and Llama to ``min(max_sequence_length, tokenizer.model_max_length)`` (128 by default). The
  negative prompt ('' unless given) is encoded once per encoder at batch 1 and repeated. Llama runs as
  ``LlamaForCausalLM`` with ``output_hidden_states=True``: every layer and the ``lm_head`` logits run.
- **Transformer.** One call per step, on twice the batch under CFG. Each block's image FFN (double
  blocks) and joint FFN (single blocks) is a MoE: a shared expert on every token plus, in inference
  (``moe_infer``), each routed expert on the tokens routed to it, so every token runs exactly
  ``num_activated_experts`` routed experts whatever the routing. The meta device cannot route
  (``bincount().cpu()``); a ``Call.prepare`` hook hands the same number of tokens to the experts.
"""

from __future__ import annotations

import math
from dataclasses import replace

import torch

from diffmeter.errors import DiffmeterError
from diffmeter.families import lora
from diffmeter.families.base import TEXT_ENCODER, Call, Family, Shapes, latents, register, timesteps

#: HiDreamImagePipeline.default_sample_size (hard-coded; the pixel budget is its square times the VAE scale)
DEFAULT_SAMPLE_SIZE = 128
#: _get_clip_prompt_embeds pads the CLIP tokens to min(max_sequence_length, 218)
CLIP_LIMIT = 218
CLIP_ENCODERS = ("text_encoder", "text_encoder_2")


@register
class HiDream(Family):
    name = "hidream"
    flow_matching = True
    text_encoders = ("text_encoder", "text_encoder_2", "text_encoder_3", "text_encoder_4")
    #: max_sequence_length sets every encoder's length (see ``shapes``); T5 is the one it sets first
    sequence_encoder = "text_encoder_3"
    default_sample_size = DEFAULT_SAMPLE_SIZE

    def lora_targets(self, entry) -> tuple[str, ...]:
        return lora.HIDREAM

    def patch(self, entry) -> int:
        return 2  # HiDreamImagePipeline: latents packed in 2x2 patches (image_processor at vae_scale_factor * 2)

    # ---- sizes -------------------------------------------------------------------------
    def pipeline_size(self, entry, height: int, width: int) -> tuple[int, int, str | None]:
        """HiDreamImagePipeline.__call__: scale to the (128 * vae_scale_factor)^2 pixel budget at the
        requested aspect ratio, flooring each side to a multiple of vae_scale_factor * 2 (same float
        expressions as the pipeline)."""
        scale_factor = self.vae_scale(entry)
        division = scale_factor * 2
        budget = (DEFAULT_SAMPLE_SIZE * scale_factor) ** 2
        scale = math.sqrt(budget / (width * height))
        made_width, made_height = int(width * scale // division * division), int(height * scale // division * division)
        if made_height == 0 or made_width == 0:
            raise DiffmeterError(
                f"{entry.pipeline_class} rescales {width}x{height} (WxH) to {budget} pixels, leaving a side under "
                f"{division} pixels for {entry.name}; pick a less extreme aspect ratio"
            )
        if (made_height, made_width) == (height, width):
            return height, width, None
        return (
            made_height,
            made_width,
            (
                f"{entry.pipeline_class} generates {width}x{height} (WxH) at {made_width}x{made_height}: it rescales "
                f"every request to about {budget} pixels ((128 x {scale_factor})^2) at the requested aspect ratio, "
                f"flooring each side to a multiple of {division}"
            ),
        )

    def image_tokens(self, shapes: Shapes) -> int:
        """Tokens of the image stream: a square latent's patches; a non-square latent is padded to max_seq."""
        patch = self.patch(shapes.entry)
        config = shapes.config(self.denoiser)
        tokens = (shapes.latent_height // patch) * (shapes.latent_width // patch)
        if shapes.latent_height == shapes.latent_width:
            return tokens
        return config["max_resolution"][0] * config["max_resolution"][1] // patch**2

    def shapes(self, entry, spec) -> Shapes:
        shapes = super().shapes(entry, spec)
        if spec.max_sequence_length is not None:
            limits = entry.extra.get("tokenizer_max_length", {}).get("value", {})
            for encoder in self.text_encoders:
                limit = CLIP_LIMIT if encoder in CLIP_ENCODERS else limits.get(encoder)
                shapes.text_tokens[encoder] = min(spec.max_sequence_length, limit or spec.max_sequence_length)
        if shapes.latent_height != shapes.latent_width:
            patch = self.patch(entry)
            real = (shapes.latent_height // patch) * (shapes.latent_width // patch)
            shapes.note(
                f"a non-square latent's {real} image tokens are padded to the transformer's max_seq of "
                f"{self.image_tokens(shapes)}, and every padded token is computed"
            )
        return shapes

    # ---- text encoders -------------------------------------------------------------------
    def text_calls(self, shapes: Shapes) -> list[Call]:
        """Each encoder runs the prompts at the batch; with CFG, the default negative prompt '' runs
        once more at batch 1 (encode_prompt repeats its embeddings over the batch)."""
        calls = []
        batch = shapes.spec.batch_size
        for encoder in self.text_encoders:
            length = shapes.text_tokens[encoder]
            calls.append(
                Call(
                    encoder,
                    TEXT_ENCODER,
                    batch,
                    1,
                    self._encoder_builder(encoder, batch, length),
                    note=f"{length} tokens",
                )
            )
            if shapes.cfg:
                calls.append(
                    Call(
                        encoder,
                        TEXT_ENCODER,
                        1,
                        1,
                        self._encoder_builder(encoder, 1, length),
                        note=f"negative prompt: {length} tokens, batch 1",
                    )
                )
        return calls

    def _encoder_builder(self, encoder: str, batch: int, length: int):
        def build(device: torch.device) -> dict:
            inputs = self.text_inputs(batch, length, device)
            inputs["output_hidden_states"] = True  # as the pipeline calls the CLIPs and Llama
            if encoder == "text_encoder_3":
                del inputs["output_hidden_states"]
            if encoder == "text_encoder_4":
                inputs["output_attentions"] = True
            return inputs

        return build

    # ---- the denoiser ----------------------------------------------------------------------
    def denoiser_calls(self, shapes: Shapes) -> list[Call]:
        calls = super().denoiser_calls(shapes)
        return [replace(call, prepare=_meta_routing(shapes, self.patch(shapes.entry))) for call in calls]

    def denoiser_inputs(self, shapes: Shapes, batch: int, device):
        config = shapes.config(self.denoiser)
        t5_channels, llama_channels = config["caption_channels"]
        llama_states = shapes.config("text_encoder_4")["num_hidden_layers"]  # hidden_states[1:], stacked
        return {
            "hidden_states": latents(batch, config["in_channels"], shapes.latent_height, shapes.latent_width, device),
            "timesteps": timesteps(batch, device),
            "encoder_hidden_states_t5": torch.zeros(batch, shapes.text_tokens["text_encoder_3"], t5_channels),
            "encoder_hidden_states_llama3": torch.zeros(
                llama_states, batch, shapes.text_tokens["text_encoder_4"], llama_channels
            ),
            "pooled_embeds": torch.zeros(batch, config["text_emb_dim"]),
            "return_dict": False,
        }


class _Handles:
    def __init__(self, undo: list) -> None:
        self.undo = undo

    def remove(self) -> None:
        for action in self.undo:
            action()


def _meta_routing(shapes: Shapes, patch: int):
    """What the meta device cannot run, given the same shapes: each MoE layer's ``moe_infer`` (it
    reads ``bincount`` on the CPU) hands ``tokens * num_activated_experts`` rows to the routed experts,
    split evenly (linear layers cost the same however the rows are split); ``unpatchify`` gets the
    patch grid as integers (it slices with the sizes tensor)."""
    grid = (shapes.latent_height // patch, shapes.latent_width // patch)

    def prepare(transformer):
        from diffusers.models.transformers.transformer_hidream_image import MOEFeedForwardSwiGLU

        undo = []
        for module in transformer.modules():
            if isinstance(module, MOEFeedForwardSwiGLU):
                module.moe_infer = _even_routing(module)
                undo.append(lambda module=module: delattr(module, "moe_infer"))
        unpatchify = transformer.unpatchify

        def with_grid(x, img_sizes, is_training):
            return unpatchify(x, [grid] * x.shape[0], is_training)

        transformer.unpatchify = with_grid
        undo.append(lambda: delattr(transformer, "unpatchify"))
        return _Handles(undo)

    return prepare


def _even_routing(moe):
    def moe_infer(x, flat_expert_indices, flat_expert_weights):
        rows = x.shape[0] * moe.num_activated_experts
        experts = len(moe.experts)
        for index, expert in enumerate(moe.experts):
            share = rows // experts + (index < rows % experts)
            if share:
                expert(x.new_zeros(share, x.shape[-1]))
        return torch.zeros_like(x)

    return moe_infer
