"""Qwen-Image 2.1: a single-stream block-causal DiT over unpatched 16x latents, conditioned on
Qwen3-VL hidden states, with a prefix KV cache across denoising steps.

QwenImage21Pipeline (diffusers 0.42.1), text to image:

* ``_get_qwen_prompt_embeds`` wraps each prompt in a raw chat-template string (an empty prompt
  becomes " "), tokenizes it through the Qwen3VLProcessor with ``padding=True`` (the longest prompt
  of the batch, left padding, no truncation and no ``max_sequence_length``), runs
  ``Qwen3VLForConditionalGeneration`` (all decoder layers, the final norm made an identity by a hook,
  and ``lm_head`` over every position: ``logits_to_keep=0``), and keeps the hidden states after the
  system turn: ``_drop_idx`` = the tokens of the system message alone (14).
* The transformer's joint sequence is [text tokens, target image tokens]; with
  ``use_kv_cache=True`` (the default) and ``causal_condition`` the first step prefills the whole
  sequence and caches the text keys/values ("extract"), and every later step runs only the image
  tokens through the blocks, attending to [cached text, image] ("cached"). The text projection
  ``txt_in`` still runs on the text every step.
* True CFG runs only with ``true_cfg_scale > 1`` and a negative prompt: the negative prompt is
  encoded on its own and the transformer runs a separate call per step with its own KV cache.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from diffmeter.families.base import DENOISER, TEXT_ENCODER, Call, Shapes, register, timesteps
from diffmeter.families.host_masks import host_values, to_device_of
from diffmeter.families.qwenimage import QwenImage

#: QwenImage21Pipeline.__call__: ``output_resolution`` (1024) sets both sides when none is given
OUTPUT_RESOLUTION = 1024
#: QwenImage21Pipeline.vae_scale_factor, hard-coded
VAE_SCALE_FACTOR = 16


def _extra(shapes: Shapes, key: str):
    return shapes.entry.extra[key]["value"]


@register
class QwenImage21(QwenImage):
    name = "qwenimage21"
    #: no max_sequence_length: the processor pads to the longest prompt and never truncates
    sequence_encoder = None
    max_sequence_limit = None
    default_sample_size = None
    cfg_mode = "separate"
    #: the block-causal prefill passes a causal mask to SDPA for the text segment (and a padding
    #: mask whenever the prompts of one batch differ in length)
    masks_attention = True
    #: check_inputs only warns; __call__ floors each side to a multiple of vae_scale_factor * 2
    size_rounding = "down"

    # ---- prompts -----------------------------------------------------------------------
    def prompt_settings(self, pipe, prompts: list[str]) -> dict[str, int]:
        """The template's tokens and the longest prompt's own tokens, with the pipeline's processor
        and its own text-to-image template (an empty prompt is encoded as " ")."""
        template = pipe.prompt_template_t2i
        tokenizer = pipe.processor.tokenizer
        around = len(tokenizer(template.format("")).input_ids)
        longest = max(len(tokenizer(template.format(prompt or " ")).input_ids) for prompt in prompts)
        return {"template_tokens": around, "prompt_tokens": longest - around}

    def guidance_arguments(self, entry, guidance_scale: float) -> dict:
        """Guidance is ``true_cfg_scale``, and it only runs with a negative prompt."""
        arguments = {"true_cfg_scale": guidance_scale}
        if guidance_scale > 1.0:
            arguments["negative_prompt"] = entry.extra["negative_prompt"]["value"]
        return arguments

    # ---- sizes -------------------------------------------------------------------------
    def vae_scale(self, entry) -> int:
        return VAE_SCALE_FACTOR

    def patch(self, entry) -> int:
        return entry.components[self.denoiser].config.get("patch_size") or 1  # 1: latents go in unpatched

    def size_multiple(self, entry) -> int:
        return VAE_SCALE_FACTOR * 2  # __call__: multiple_of = vae_scale_factor * 2

    def default_size(self, entry) -> tuple[int, int]:
        return OUTPUT_RESOLUTION, OUTPUT_RESOLUTION

    def shapes(self, entry, spec):
        """A pipeline configured with ``sample_sigmas`` (model_index.json) runs one step per sigma
        whatever ``num_inference_steps`` says."""
        shapes = super().shapes(entry, spec)
        sigmas = (entry.extra.get("pipeline_init") or {}).get("sample_sigmas")
        if sigmas and len(sigmas) != shapes.spec.steps:
            shapes.note(
                f"{entry.pipeline_class} is configured with {len(sigmas)} sample_sigmas: it runs {len(sigmas)} steps "
                f"whatever num_inference_steps ({shapes.spec.steps}) says"
            )
            shapes.spec = replace(shapes.spec, steps=len(sigmas))
        return shapes

    # ---- text lengths ------------------------------------------------------------------
    def encoder_tokens(self, shapes: Shapes, negative: bool = False) -> int:
        """Tokens the text encoder runs over: the templated prompt, unpadded and untruncated."""
        template, dropped = self._template(shapes), _extra(shapes, "template_drop_tokens")
        if negative:
            own = shapes.spec.negative_prompt_tokens
            if own is None:
                own = _extra(shapes, "negative_prompt_tokens")
            return template + own
        own = shapes.spec.prompt_tokens
        if own is None:
            limit = _extra(shapes, "text_token_limit")
            shapes.note_prompt_upper_bound(
                f"{shapes.entry.pipeline_class} neither truncates nor caps the prompt; assumed the longest the "
                f"transformer's RoPE table places ({limit} text tokens for the transformer, {limit + dropped} "
                "for the text encoder)"
            )
            return limit + dropped
        return template + own

    def transformer_tokens(self, shapes: Shapes, negative: bool = False) -> int:
        """Text tokens the transformer gets: the encoded ones after the dropped system turn."""
        return self.encoder_tokens(shapes, negative) - _extra(shapes, "template_drop_tokens")

    def _negative_note(self, shapes: Shapes) -> None:
        negative = shapes.entry.extra["negative_prompt"]["value"]
        tokens = self.encoder_tokens(shapes, True) - self._template(shapes)
        batch = shapes.spec.batch_size
        shapes.note(
            f"CFG runs as true_cfg_scale {shapes.spec.guidance_scale:g} with the negative prompt {negative!r} "
            f"({tokens} token{'' if tokens == 1 else 's'}); Qwen recommends no guidance"
            + (
                f"; at batch {batch} the pipeline needs one negative prompt per prompt (a single string fails "
                "in the transformer), so it is counted encoded and denoised at the prompts' batch"
                if batch > 1
                else ""
            )
        )

    def _cached(self, shapes: Shapes) -> bool:
        """__call__'s ``use_kv_cache`` (True by default) only caches with ``causal_condition``."""
        return bool(shapes.config(self.denoiser).get("causal_condition", True))

    # ---- the call plan -------------------------------------------------------------------
    def text_calls(self, shapes: Shapes) -> list[Call]:
        batch = shapes.spec.batch_size
        length = self.encoder_tokens(shapes)
        note = "the text encoder's lm_head runs over every position (logits_to_keep=0)"
        calls = [
            Call(
                "text_encoder",
                TEXT_ENCODER,
                batch,
                1,
                self._token_builder(batch, length),
                note=f"prompt: {length} tokens incl. the chat template; {note}",
            )
        ]
        if shapes.cfg:
            self._negative_note(shapes)
            negative = self.encoder_tokens(shapes, negative=True)
            calls.append(
                Call(
                    "text_encoder",
                    TEXT_ENCODER,
                    batch,
                    1,
                    self._token_builder(batch, negative),
                    note=f"negative prompt: {negative} tokens incl. the chat template",
                )
            )
        return calls

    def denoiser_calls(self, shapes: Shapes) -> list[Call]:
        steps, batch = shapes.spec.steps, shapes.spec.batch_size
        branches = [("cond", self.transformer_tokens(shapes))]
        if shapes.cfg:
            branches.append(("uncond (separate call)", self.transformer_tokens(shapes, negative=True)))
        image = (shapes.latent_height // 2 * 2) * (shapes.latent_width // 2 * 2)
        calls = []
        if self._cached(shapes):
            shapes.note(
                "prefix KV cache (use_kv_cache=True, the default): the first step runs text + image tokens "
                "through every block and caches the text keys/values; later steps run only the "
                f"{image} image tokens, attending to the cached text"
            )
            for label, text in branches:
                calls.append(
                    Call(
                        self.denoiser,
                        DENOISER,
                        batch,
                        1,
                        self._builder(shapes, batch, text, "extract"),
                        note=f"{label}, step 1 (prefill, caches the text): {text} text + {image} image tokens",
                        prepare=_meta_masks,
                        reads_values=True,
                    )
                )
                calls.append(
                    Call(
                        self.denoiser,
                        DENOISER,
                        batch,
                        steps - 1,
                        self._builder(shapes, batch, text, "cached"),
                        note=f"{label}, later steps: {image} image tokens over {text} cached text tokens",
                        prepare=_meta_masks,
                        reads_values=True,
                    )
                )
        else:
            for label, text in branches:
                calls.append(
                    Call(
                        self.denoiser,
                        DENOISER,
                        batch,
                        steps,
                        self._builder(shapes, batch, text, None),
                        note=f"{label}: {text} text + {image} image tokens (no KV cache: causal_condition is off)",
                        prepare=_meta_masks,
                        reads_values=True,
                    )
                )
        return calls

    def _builder(self, shapes: Shapes, batch: int, text_tokens: int, mode: str | None):
        def build(device):
            from diffusers.models.transformers.transformer_qwenimage21 import QwenImage21KVCache

            config = shapes.config(self.denoiser)
            height, width = shapes.latent_height // 2 * 2, shapes.latent_width // 2 * 2
            image = height * width
            cache = None
            if mode is not None:
                cache = QwenImage21KVCache(config["num_layers"])
            if mode == "cached":  # the cached keys and values at the transformer's dtype, as the extract call made them
                heads, head_dim = config["num_attention_heads"], config["attention_head_dim"]
                dtype = getattr(torch, shapes.spec.dtype_of(self.denoiser))
                for layer in cache.layer_caches:
                    layer.store(
                        torch.zeros(batch, text_tokens, heads, head_dim, dtype=dtype, device=device),
                        torch.zeros(batch, text_tokens, heads, head_dim, dtype=dtype, device=device),
                    )
            # the pipeline's image_pad_mask: the text slots, then one slot per 2x2 group of target latents;
            # the transformer reads it with .tolist() and nonzero(), so it stays on the CPU
            img_mask = host_values(
                lambda: torch.cat(
                    [
                        torch.zeros(batch, text_tokens, dtype=torch.bool),
                        torch.ones(batch, image // 4, dtype=torch.bool),
                    ],
                    dim=1,
                )
            )
            return {
                "hidden_states": torch.zeros(batch, image, config["in_channels"], device=device),
                "timestep": timesteps(batch, device),
                "encoder_hidden_states": torch.zeros(batch, text_tokens, config["context_in_dim"], device=device),
                "encoder_hidden_states_mask": None,
                "img_shapes": [[(1, height, width)]] * batch,
                "img_mask": img_mask,
                "kv_cache": cache,
                "kv_cache_mode": mode,
                "return_dict": False,
            }

        return build

    def denoiser_inputs(self, shapes: Shapes, batch: int, device):
        mode = "extract" if self._cached(shapes) else None
        return self._builder(shapes, batch, self.transformer_tokens(shapes), mode)(device)


class _Handles:
    def __init__(self, handles):
        self.handles = handles

    def remove(self):
        for handle in self.handles:
            handle.remove()


def _meta_masks(transformer):
    """The transformer derives its token masks from the CPU ``img_mask`` (data-dependent ops the meta
    device cannot run); the blocks and the final norm then mix them with activations in ``torch.where``:
    hand those modules the masks where their activations are (``to_device_of``). Shapes are unchanged."""
    modules = [*transformer.transformer_blocks, transformer.norm_out]
    return _Handles([module.register_forward_pre_hook(to_device_of(module), with_kwargs=True) for module in modules])
