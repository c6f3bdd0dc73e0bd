"""Lumina-Next and Lumina-Image-2.0: Next-DiT over Gemma tokens, with RoPE."""

import math

import torch

from diffmeter.families.base import DENOISER, Call, Family, Shapes, latents, register, timesteps


@register
class LuminaNext(Family):
    name = "lumina_next"
    reads_prompt_tokens = True
    flow_matching = True
    masks_attention = True
    text_encoders = ("text_encoder",)
    sequence_encoder = "text_encoder"

    def vae_scale(self, entry) -> int:
        return 8  # both Lumina pipelines fix vae_scale_factor = 8

    def size_multiple(self, entry) -> int:
        return self.vae_scale(entry) * 2  # both Lumina pipelines: vae_scale_factor * 2

    def prompt_settings(self, pipe, prompts: list[str]) -> dict[str, int]:
        return {"prompt_tokens": max(len(pipe.tokenizer(prompt).input_ids) for prompt in prompts)}

    def shapes(self, entry, spec):
        shapes = super().shapes(entry, spec)
        # prompts are padded to the longest one, rounded up to a multiple of 8
        limit = shapes.text_tokens["text_encoder"]
        if spec.prompt_tokens is None:
            shapes.note_prompt_upper_bound(f"prompts are padded to the longest one; assumed the full {limit} tokens")
        else:
            shapes.text_tokens["text_encoder"] = min(limit, math.ceil(spec.prompt_tokens / 8) * 8)
        return shapes

    def denoiser_inputs(self, shapes: Shapes, batch: int, device):
        from diffusers.models.embeddings import get_2d_rotary_pos_embed_lumina

        config = shapes.config(self.denoiser)
        tokens = shapes.text_tokens["text_encoder"]
        head_dim = config["hidden_size"] // config["num_attention_heads"]
        scaling = math.sqrt(shapes.spec.height * shapes.spec.width / 1024**2)
        linear, ntk = (scaling, 1.0) if scaling <= 1.0 else (1.0, scaling)
        return {
            "hidden_states": latents(batch, config["in_channels"], shapes.latent_height, shapes.latent_width, device),
            "timestep": timesteps(batch, device),
            "encoder_hidden_states": torch.zeros(batch, tokens, config["cross_attention_dim"]),
            "encoder_mask": torch.ones(batch, tokens),
            "image_rotary_emb": get_2d_rotary_pos_embed_lumina(
                head_dim, 384, 384, linear_factor=linear, ntk_factor=ntk
            ),
            "cross_attention_kwargs": {},
            "return_dict": False,
        }


@register
class Lumina2(Family):
    name = "lumina2"
    reads_prompt_tokens = True
    max_sequence_limit = 512  # the pipeline's check_inputs refuses longer prompts
    flow_matching = True
    masks_attention = True
    vae_scale = LuminaNext.vae_scale
    size_multiple = LuminaNext.size_multiple
    text_encoders = ("text_encoder",)
    sequence_encoder = "text_encoder"
    cfg_mode = "separate"
    truncates_cfg = True

    def prompt_settings(self, pipe, prompts: list[str]) -> dict[str, int]:
        """The pipeline prefixes its system prompt; the default negative prompt is empty."""
        template = pipe.system_prompt + " <Prompt Start> "
        return {
            "prompt_tokens": max(len(pipe.tokenizer(template + prompt).input_ids) for prompt in prompts),
            "negative_prompt_tokens": len(pipe.tokenizer("").input_ids),
        }

    def denoiser_calls(self, shapes: Shapes) -> list[Call]:
        """The joint sequence is as long as each prompt's real tokens, so cond and uncond differ; the uncond call
        runs on the steps ``cfg_trunc_ratio`` leaves guided (``guided_steps``)."""
        steps, batch = shapes.spec.steps, shapes.spec.batch_size
        padded = shapes.text_tokens["text_encoder"]
        prompt = min(shapes.spec.prompt_tokens or padded, padded)
        if shapes.spec.prompt_tokens is None:
            shapes.note_prompt_upper_bound(
                f"the joint sequence holds each prompt's real tokens; assumed all {padded} for the prompt "
                "and 1 (<bos>) for the default empty negative prompt"
            )
        lengths = [("cond", prompt, steps)]
        guided = guided_steps(steps, shapes.spec.cfg_trunc_ratio)
        if shapes.cfg and guided < steps:
            shapes.note(
                f"CFG on the first {guided} of {steps} steps: cfg_trunc_ratio {shapes.spec.cfg_trunc_ratio:g} skips "
                "the unconditional call after them (--cfg-trunc-ratio 1 guides every step)"
            )
        if shapes.cfg and guided:
            # the default negative prompt is "" without the system prompt: just <bos>
            lengths.append(("uncond", min(shapes.spec.negative_prompt_tokens or 1, padded), guided))
        return [
            Call(
                self.denoiser,
                DENOISER,
                batch,
                count,
                self._builder(shapes, batch),
                note=f"{label}: {tokens} caption tokens",
                prepare=_caption_lengths(batch, padded, tokens),
                reads_values=True,
            )
            for label, tokens, count in lengths
        ]

    def _builder(self, shapes: Shapes, batch: int):
        def build(device):
            config = shapes.config(self.denoiser)
            padded = shapes.text_tokens["text_encoder"]
            return {
                "hidden_states": latents(
                    batch, config["in_channels"], shapes.latent_height, shapes.latent_width, device
                ),
                "timestep": timesteps(batch, device),
                "encoder_hidden_states": torch.zeros(batch, padded, config["cap_feat_dim"]),
                "encoder_attention_mask": torch.ones(batch, padded, dtype=torch.long),
                "return_dict": False,
            }

        return build


def guided_steps(steps: int, cfg_trunc_ratio: float | None) -> int:
    """The steps Lumina2Pipeline runs its unconditional call on: step i skips it once ``(i + 1) / steps >
    cfg_trunc_ratio`` (pipeline_lumina2.py:671 and 687, diffusers 0.42.1; None: its default 1.0, every step). The
    float comparison is the pipeline's own. ``cfg_normalization`` only rescales the guided prediction by norms
    (lines 698-701): elementwise work, no matmul."""
    ratio = 1.0 if cfg_trunc_ratio is None else cfg_trunc_ratio
    return sum(1 for i in range(steps) if not (i + 1) / steps > ratio)


def _caption_lengths(batch: int, padded: int, tokens: int):
    """The RoPE embedder reads real caption lengths with ``.tolist()``: hand it a CPU mask
    holding ``tokens`` ones per row; every other use of the mask only needs its shape."""

    def prepare(transformer):
        mask = torch.zeros(batch, padded, dtype=torch.long, device="cpu")
        mask[:, :tokens] = 1

        def with_real_mask(module, args, kwargs):
            hidden_states = args[0] if args else kwargs["hidden_states"]
            return (hidden_states, mask), {}

        return transformer.rope_embedder.register_forward_pre_hook(with_real_mask, with_kwargs=True)

    return prepare
