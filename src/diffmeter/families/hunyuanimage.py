"""HunyuanImage 2.1: a 20 dual-stream + 40 single-stream MMDiT over 32x-compressed latents, conditioned
on Qwen2.5-VL hidden states and, for quoted text in the prompt, on a ByT5 glyph encoder.

HunyuanImagePipeline (diffusers 0.42.1), line by line:

- ``_get_qwen_prompt_embeds`` wraps each prompt in a chat template, pads it to 1000 + 34 tokens
  (``padding="max_length"``), runs Qwen2_5_VLForConditionalGeneration (``lm_head`` included) with
  ``output_hidden_states=True``, reads ``hidden_states[-3]`` and drops the first 34 tokens: the
  transformer gets 1000 Qwen tokens whatever the prompt.
- ``encode_prompt`` runs ByT5 (``text_encoder_2``) once per prompt that quotes text ('...', "...",
  ‘...’, “...”), at batch 1 and 128 padded tokens; a prompt quoting nothing gets 128 zero
  embeddings and no ByT5 run. The transformer always gets the 128 ByT5 positions.
- Guidance is a guider *component* (AdaptiveProjectedMixGuidance), not a call argument: when it is
  enabled and its ``guidance_scale`` is not 1 it has two conditions, so the negative prompt (default
  ``""`` for every prompt) is encoded at the prompt's batch and the transformer runs a second,
  separate forward per step. APG only changes the arithmetic. A prompt with quoted text switches to
  ``ocr_guider`` (same forwards). The guidance-distilled checkpoint ships no guider: the pipeline
  builds a disabled one, one forward per step, and takes ``distilled_guidance_scale`` (embedded).
- ``prepare_latents`` floors each side to a multiple of the VAE's 32 (check_inputs only warns).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import torch

from diffmeter.families.base import DENOISER, TEXT_ENCODER, Call, Family, Shapes, register
from diffmeter.families.host_masks import host_values, to_device_of

#: HunyuanImagePipeline.prompt_template_encode_start_idx: template tokens dropped after encoding
DROPPED_TOKENS = 34
#: the quoted spans ``extract_glyph_text`` looks for
QUOTES = (r"\'(.*?)\'", r"\"(.*?)\"", r"‘(.*?)’", r"“(.*?)”")


def glyph_text(prompt: str) -> str | None:
    """What HunyuanImagePipeline gives ByT5 for ``prompt`` (``extract_glyph_text``), None when the prompt
    quotes nothing."""
    texts = [text for pattern in QUOTES for text in re.findall(pattern, prompt)]
    return ". ".join(f'Text "{text}"' for text in texts) + ". " if texts else None


@dataclass
class GuiderShapes(Shapes):
    """Shapes whose CFG is what the pipeline's guider decides, not ``guidance_scale > 1``."""

    guided: bool = False

    @property
    def cfg(self) -> bool:
        return self.guided


@register
class HunyuanImage(Family):
    name = "hunyuanimage"
    flow_matching = True
    masks_attention = True  # the joint text mask reaches attention
    text_encoders = ("text_encoder", "text_encoder_2")
    cfg_mode = "separate"
    default_sample_size = 64  # HunyuanImagePipeline.default_sample_size
    size_rounding = "down"  # prepare_latents: int(height) // vae_scale_factor
    decoder_arg = "z"
    decoder_kwargs = {"return_dict": False}

    # ---- guidance ----------------------------------------------------------------------
    @staticmethod
    def distilled(entry) -> bool:
        return bool(entry.components["transformer"].config.get("guidance_embeds"))

    @staticmethod
    def guider(entry) -> dict | None:
        """The guider's config as model_index.json/guider holds it; None: the pipeline builds a disabled one."""
        guider = entry.extra.get("pipeline_init", {}).get("guider")
        return guider["config"] if guider else None

    def guider_scale(self, entry, guidance_scale: float) -> float | None:
        """The guidance scale the guider runs at: diffmeter's scale for the CFG model (set on the guider),
        the guider's own for a guidance-distilled one (whose scale is ``distilled_guidance_scale``)."""
        config = self.guider(entry)
        if config is None:
            return None
        return config.get("guidance_scale", 3.5) if self.distilled(entry) else guidance_scale

    def _guides(self, entry, guidance_scale: float) -> bool:
        """The guider is enabled and its scale is not the neutral one (1, or 0 in the original formulation)."""
        config, scale = self.guider(entry), self.guider_scale(entry, guidance_scale)
        if config is None or not config.get("enabled", True):
            return False
        return not math.isclose(scale, 0.0 if config.get("use_original_formulation", False) else 1.0)

    def uncond_steps(self, entry, guidance_scale: float, steps: int) -> int:
        """Steps whose guider has two conditions (``_is_cfg_enabled``): guiding, and the step in [start, stop)."""
        if not self._guides(entry, guidance_scale):
            return 0
        config = self.guider(entry)
        first, stop = int(config.get("start", 0.0) * steps), int(config.get("stop", 1.0) * steps)
        return sum(1 for step in range(steps) if first <= step < stop)

    def encodes_negative_prompt(self, entry, guidance_scale: float) -> bool:
        """Checked before the loop on a fresh guider (no step range set yet): guiding is enough."""
        return self._guides(entry, guidance_scale)

    def guidance_arguments(self, entry, guidance_scale: float) -> dict:
        """Only the guidance-distilled checkpoint takes a guidance call argument; the CFG model's scale is
        the guider's (``set_guidance``)."""
        return {"distilled_guidance_scale": guidance_scale} if self.distilled(entry) else {}

    def set_guidance(self, pipe, guidance_scale: float) -> None:
        """diffusers' own way to change the CFG model's scale: ``pipe.guider = pipe.guider.new(guidance_scale=...)``
        (and the ocr_guider a prompt with quoted text switches to); the distilled model takes it as a call argument.
        tests/tiny_runs.py reaches it through ``prepare_pipeline``."""
        if pipe.transformer.config.guidance_embeds:
            return
        for name in ("guider", "ocr_guider"):
            guider = getattr(pipe, name, None)
            if guider is not None:
                setattr(pipe, name, guider.new(guidance_scale=guidance_scale))

    def prepare_pipeline(self, pipe, guidance_scale: float, batch_size: int) -> None:
        """The guiders take the guidance scale (the pipeline's ``__call__`` has no such argument)."""
        self.set_guidance(pipe, guidance_scale)

    def called_guidance(self, entry, call_defaults: dict) -> float | None:
        if self.distilled(entry):
            return call_defaults.get("distilled_guidance_scale")
        config = self.guider(entry)
        return config.get("guidance_scale", 3.5) if config and config.get("enabled", True) else 1.0

    # ---- prompts -----------------------------------------------------------------------
    def prompt_settings(self, pipe, prompts: list[str]) -> dict[str, bool]:
        """``glyph_text``: whether a prompt quotes text, which the pipeline gives ByT5 (else ByT5 does not run)."""
        return {"glyph_text": any(glyph_text(prompt) is not None for prompt in prompts)}

    # ---- sizes -------------------------------------------------------------------------
    def vae_scale(self, entry) -> int:
        return entry.components[self.decoder].config["spatial_compression_ratio"]

    def patch(self, entry) -> int:
        return entry.components[self.denoiser].config["patch_size"][0]

    def size_multiple(self, entry) -> int:
        return self.pixel_multiple(entry)  # the latents are floored to multiples of the VAE's factor

    def shapes(self, entry, spec) -> GuiderShapes:
        base = super().shapes(entry, spec)
        guided = self.uncond_steps(entry, base.spec.guidance_scale, base.spec.steps) > 0
        return GuiderShapes(**{name: getattr(base, name) for name in base.__dataclass_fields__}, guided=guided)

    # ---- the call plan -------------------------------------------------------------------
    def glyph_calls(self, shapes: Shapes) -> int:
        """ByT5 runs: one per prompt quoting text; without a count, every prompt (the upper bound)."""
        if shapes.spec.glyph_text is False:
            return 0
        if shapes.spec.glyph_text is None:
            shapes.note(
                "ByT5 (text_encoder_2) runs once per prompt that quotes text ('...', \"...\"); assumed every prompt "
                "does (an upper bound); --no-glyph-text counts prompts without quoted text"
            )
        return shapes.spec.batch_size

    def text_calls(self, shapes: Shapes) -> list[Call]:
        entry, spec = shapes.entry, shapes.spec
        batch, length = spec.batch_size, shapes.text_tokens["text_encoder"]
        negative = self.encodes_negative_prompt(entry, spec.guidance_scale)
        calls = [
            Call(
                "text_encoder",
                TEXT_ENCODER,
                batch,
                2 if negative else 1,
                self._token_builder(batch, length),
                note=f"{length} tokens (padded, chat template incl.)"
                + (", prompt + empty negative prompt" if negative else ""),
            )
        ]
        glyphs, glyph_length = self.glyph_calls(shapes), shapes.text_tokens["text_encoder_2"]
        calls.append(
            Call(
                "text_encoder_2",
                TEXT_ENCODER,
                1,
                glyphs,
                self._token_builder(1, glyph_length),
                note=f"{glyph_length} tokens, one call per prompt with quoted text"
                if glyphs
                else "not run: no quoted text (the transformer gets 128 zero glyph embeddings)",
            )
        )
        if negative:
            shapes.note(
                "CFG is the guider's (AdaptiveProjectedMixGuidance): the default empty negative prompt is encoded "
                "by Qwen and the transformer runs a separate uncond forward per step"
            )
        return calls

    def denoiser_calls(self, shapes: Shapes) -> list[Call]:
        steps, batch = shapes.spec.steps, shapes.spec.batch_size
        uncond = self.uncond_steps(shapes.entry, shapes.spec.guidance_scale, steps)
        build = self._builder(shapes, batch)
        calls = [
            Call(self.denoiser, DENOISER, batch, steps, build, note="cond", prepare=_meta_masks, reads_values=True)
        ]
        if uncond:
            calls.append(
                Call(
                    self.denoiser,
                    DENOISER,
                    batch,
                    uncond,
                    build,
                    note="uncond (separate call)",
                    prepare=_meta_masks,
                    reads_values=True,
                )
            )
        return calls

    def text_lengths(self, shapes: Shapes) -> tuple[int, int]:
        """Qwen tokens after the 34 dropped, and ByT5's padded length."""
        return shapes.text_tokens["text_encoder"] - DROPPED_TOKENS, shapes.text_tokens["text_encoder_2"]

    def _builder(self, shapes: Shapes, batch: int):
        def build(device):
            config = shapes.config(self.denoiser)
            qwen, byt5 = self.text_lengths(shapes)
            inputs = {
                "hidden_states": torch.zeros(
                    batch, config["in_channels"], shapes.latent_height, shapes.latent_width, device=device
                ),
                "timestep": torch.zeros(batch, device=device),
                "encoder_hidden_states": torch.zeros(batch, qwen, config["text_embed_dim"], device=device),
                # masks on the CPU with their values: the transformer reorders its text tokens with boolean
                # indexing, which the meta device cannot size (_meta_masks moves them back where they are read)
                "encoder_attention_mask": host_values(lambda: torch.ones(batch, qwen, dtype=torch.long)),
                "encoder_hidden_states_2": torch.zeros(batch, byt5, config["text_embed_2_dim"], device=device),
                "encoder_attention_mask_2": host_values(lambda: torch.zeros(batch, byt5, dtype=torch.long)),
                "return_dict": False,
            }
            if config.get("use_meanflow"):
                inputs["timestep_r"] = torch.zeros(batch, device=device)
            if config.get("guidance_embeds"):
                inputs["guidance"] = torch.zeros(batch, device=device)
            return inputs

        return build

    def denoiser_inputs(self, shapes: Shapes, batch: int, device):
        return self._builder(shapes, batch)(device)


def _meta_masks(transformer):
    """The builder hands the transformer CPU masks, so that its boolean reordering of the text tokens
    (valid first) can size its pieces; every module reading a mask afterwards gets it where its activations
    are (``to_device_of``). The reordering moves no FLOPs and keeps every token."""
    modules = [transformer.context_embedder, *transformer.transformer_blocks, *transformer.single_transformer_blocks]
    handles = [module.register_forward_pre_hook(to_device_of(module), with_kwargs=True) for module in modules]
    return _Handles(handles)


class _Handles:
    def __init__(self, handles) -> None:
        self.handles = handles

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
