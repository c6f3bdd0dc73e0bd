"""Qwen-Image: a 60-block MMDiT over 2x2-packed latents, conditioned on Qwen2.5-VL hidden states.

QwenImagePipeline (diffusers 0.42.1) wraps every prompt in a chat template, runs the text encoder
over the templated prompt unpadded (a batch is padded to its longest prompt), reads the last
hidden state, drops the template's first 34 tokens (``prompt_template_encode_start_idx``) and
keeps at most ``max_sequence_length`` of the rest for the transformer. True CFG runs only with a
negative prompt and ``true_cfg_scale > 1``: the negative prompt is encoded on its own (a string:
batch 1) and the transformer runs a second, separate call per step on that text.
"""

import torch

from diffmeter.catalog.controlnets import CONTROLNET
from diffmeter.families import controlnet
from diffmeter.families.base import DENOISER, TEXT_ENCODER, Call, Family, Shapes, register, timesteps
from diffmeter.families.control_image import ControlImage

#: QwenImagePipeline.prompt_template_encode_start_idx: leading template tokens dropped after encoding
DROPPED_TOKENS = 34
#: QwenImagePipeline.tokenizer_max_length: the tokenizer truncates at this + the dropped tokens
TOKENIZER_MAX_LENGTH = 1024


@register
class QwenImage(ControlImage, Family):
    name = "qwenimage"
    reads_prompt_tokens = True
    flow_matching = True
    text_encoders = ("text_encoder",)
    #: max_sequence_length caps the text tokens the transformer gets (encode_prompt slices the embeddings)
    sequence_encoder = "text_encoder"
    max_sequence_limit = TOKENIZER_MAX_LENGTH  # check_inputs refuses more
    default_sample_size = 128  # QwenImagePipeline.default_sample_size
    cfg_mode = "separate"
    #: the transformer gets a text mask when the prompts of one batch differ in length (encode_prompt
    #: drops an all-ones mask): kernels that refuse masks would fail on such a batch
    masks_attention = True
    #: check_inputs only warns; prepare_latents floors each side to a multiple of vae_scale_factor * 2
    size_rounding = "down"
    decoder_arg = "z"

    # ---- prompts -----------------------------------------------------------------------
    def prompt_settings(self, pipe, prompts: list[str]) -> dict[str, int]:
        """The template's tokens and the longest prompt's own tokens, with the pipeline's tokenizer and
        its own template (the negative prompt's count is the catalog's: it is per checkpoint)."""
        template = pipe.prompt_template_encode
        around = len(pipe.tokenizer(template.format("")).input_ids)
        longest = max(len(pipe.tokenizer(template.format(prompt)).input_ids) for prompt in prompts)
        return {"template_tokens": around, "prompt_tokens": longest - around}

    def guidance_arguments(self, entry, guidance_scale: float) -> dict:
        """Guidance is ``true_cfg_scale``, and it only runs with a negative prompt: the model card's."""
        arguments = {"true_cfg_scale": guidance_scale}
        if guidance_scale > 1.0:
            arguments["negative_prompt"] = entry.extra["negative_prompt"]["value"]
        return arguments

    def called_guidance(self, entry, call_defaults: dict) -> float | None:
        """A bare call passes no negative prompt, so true_cfg_scale runs no CFG whatever its value."""
        return 1.0

    # ---- sizes -------------------------------------------------------------------------
    def vae_scale(self, entry) -> int:
        return 2 ** len(entry.components[self.decoder].config["temperal_downsample"])

    def latent_channels(self, entry) -> int:
        return entry.components[self.decoder].config["z_dim"]

    def patch(self, entry) -> int:
        return 2  # the pipeline packs latents in 2x2 patches

    def size_multiple(self, entry) -> int:
        return self.pixel_multiple(entry)  # vae_scale_factor * 2

    # ---- text lengths ------------------------------------------------------------------
    def _template(self, shapes: Shapes) -> int:
        if shapes.spec.template_tokens is not None:
            return shapes.spec.template_tokens
        return shapes.entry.extra["template_tokens"]["value"]

    def encoder_tokens(self, shapes: Shapes, negative: bool = False) -> int:
        """Tokens the text encoder runs over: the templated prompt, truncated at 1024 + 34."""
        limit = TOKENIZER_MAX_LENGTH + DROPPED_TOKENS
        if negative:
            own = shapes.spec.negative_prompt_tokens
            if own is None:
                own = shapes.entry.extra["negative_prompt_tokens"]["value"]
        else:
            own = shapes.spec.prompt_tokens
            if own is None:
                shapes.note_prompt_upper_bound(
                    f"the text encoder runs over the templated prompt unpadded; assumed the longest the pipeline "
                    f"keeps ({limit} tokens, {min(limit - DROPPED_TOKENS, shapes.text_tokens['text_encoder'])} "
                    "for the transformer)"
                )
                return limit
        return min(self._template(shapes) + own, limit)

    def negative_prompt_tokens(self, shapes: Shapes) -> int:
        """The negative prompt's own tokens, the template's left out."""
        return self.encoder_tokens(shapes, True) - self._template(shapes)

    def transformer_tokens(self, shapes: Shapes, negative: bool = False) -> int:
        """Text tokens the transformer gets: the encoded ones minus the 34 dropped, capped at
        max_sequence_length."""
        return min(self.encoder_tokens(shapes, negative) - DROPPED_TOKENS, shapes.text_tokens["text_encoder"])

    def _negative_note(self, shapes: Shapes) -> None:
        negative = shapes.entry.extra["negative_prompt"]["value"]
        tokens = self.negative_prompt_tokens(shapes)
        shapes.note(
            f"CFG runs as true_cfg_scale {shapes.spec.guidance_scale:g} with the model card's negative prompt "
            f"{negative!r} ({tokens} token{'' if tokens == 1 else 's'}), encoded once "
            "at batch 1; --guidance-scale 1 runs without it"
        )

    # ---- the call plan -------------------------------------------------------------------
    def text_calls(self, shapes: Shapes) -> list[Call]:
        batch = shapes.spec.batch_size
        length = self.encoder_tokens(shapes)
        calls = [
            Call(
                "text_encoder",
                TEXT_ENCODER,
                batch,
                1,
                self._token_builder(batch, length),
                note=f"prompt: {length} tokens incl. the chat template",
            )
        ]
        if shapes.cfg:
            self._negative_note(shapes)
            negative = self.encoder_tokens(shapes, negative=True)
            calls.append(
                Call(
                    "text_encoder",
                    TEXT_ENCODER,
                    1,
                    1,
                    self._token_builder(1, negative),
                    note=f"negative prompt: {negative} tokens incl. the chat template",
                )
            )
        return calls

    def denoiser_calls(self, shapes: Shapes) -> list[Call]:
        steps, batch = shapes.spec.steps, shapes.spec.batch_size
        cond = self.transformer_tokens(shapes)
        calls = [
            Call(
                self.denoiser,
                DENOISER,
                batch,
                steps,
                self._builder(shapes, batch, batch, cond),
                note=f"cond: {cond} text tokens",
            )
        ]
        if shapes.cfg:
            uncond = self.transformer_tokens(shapes, negative=True)
            calls.append(
                Call(
                    self.denoiser,
                    DENOISER,
                    batch,
                    steps,
                    # the negative prompt is one string: its embeddings (batch 1) broadcast in the blocks
                    self._builder(shapes, batch, 1, uncond),
                    note=f"uncond (separate call): {uncond} text tokens",
                )
            )
        return calls

    def _builder(self, shapes: Shapes, batch: int, text_batch: int, text_tokens: int):
        def build(device):
            config = shapes.config(self.denoiser)
            height, width = shapes.latent_height // 2, shapes.latent_width // 2
            return {
                "hidden_states": torch.zeros(batch, height * width, config["in_channels"], device=device),
                "timestep": timesteps(batch, device),
                "encoder_hidden_states": torch.zeros(
                    text_batch, text_tokens, config["joint_attention_dim"], device=device
                ),
                "encoder_hidden_states_mask": None,
                "img_shapes": [[(1, height, width)]] * batch,
                "guidance": None,
                "return_dict": False,
            }

        return build

    def controlnet_plan(self, shapes: Shapes, calls: list[Call]) -> list[Call]:
        """QwenImageControlNetPipeline (diffusers 0.42.1, pipeline_qwenimage_controlnet.py 711-748 and 864-910): the
        control image at the output size, repeated per output, VAE-encoded once per call as a one-frame video and
        packed like the latents; the ControlNet runs once per step on the prompt, and the negative prompt's
        transformer call reuses its block samples."""
        config, batch = shapes.config(CONTROLNET), shapes.spec.batch_size
        tokens = (shapes.latent_height // 2) * (shapes.latent_width // 2)
        size = (shapes.spec.height, shapes.spec.width)
        cond = self._builder(shapes, batch, batch, self.transformer_tokens(shapes))

        def build(device):
            inputs = {name: value for name, value in cond(device).items() if name != "guidance"}
            channels = config["in_channels"] + config.get("extra_condition_channels", 0)
            return {**inputs, "controlnet_cond": torch.zeros(batch, tokens, channels, device=device)}

        width = config["num_attention_heads"] * config["attention_head_dim"]

        def residuals(call_batch, device):
            return {"controlnet_block_samples": [torch.zeros(call_batch, tokens, width)] * config["num_layers"]}

        encode = controlnet.control_image_encoding(self.decoder, batch, size, "once per output", video=True)
        detail = f"runs once per step at batch {batch}, on the prompt alone"
        return controlnet.steered(
            shapes, calls, self.denoiser, build, residuals, detail, batch, shapes.spec.steps, encode
        )

    def decoder_inputs(self, shapes: Shapes, batch: int, device):
        """The VAE is causal-3D: one frame of latents, (batch, z_dim, 1, h, w)."""
        channels = self.latent_channels(shapes.entry)
        height, width = shapes.latent_height // 2 * 2, shapes.latent_width // 2 * 2
        return {"z": torch.zeros(batch, channels, 1, height, width, device=device), "return_dict": False}

    def denoiser_inputs(self, shapes: Shapes, batch: int, device):
        return self._builder(shapes, batch, batch, self.transformer_tokens(shapes))(device)
