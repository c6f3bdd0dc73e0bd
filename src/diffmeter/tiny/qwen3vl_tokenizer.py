"""Qwen3-VL's processor, built offline: a tiny byte-level BPE tokenizer with Qwen3-VL's special
tokens and chat format, plus a Qwen2-VL image processor at Qwen3-VL's patch size (no video processor: text-to-image
never reads one).

QwenImage21Pipeline takes a ``processor`` (not a tokenizer): it tokenizes its raw template string
through ``processor(text=...)`` and derives the number of leading system tokens it drops from
``processor.apply_chat_template`` of the system message. The template's words are whole words of
this vocabulary except "Comprehend", which Qwen's BPE splits into three ("Com", "preh", "end"; here
"Comp", "reh", "end"), so
the system turn costs 14 tokens and the whole template 22, as with the real tokenizer.
"""

from __future__ import annotations

import transformers

from diffmeter.tiny.tokenizers import TEMPLATE_WORDS, WORDS, byte_level_bpe, tokenizer

#: words of QwenImage21Pipeline's system prompt "Comprehend and analyze the provided prompt."
QWENIMAGE21_WORDS = "analyze provided prompt Comp reh end".split()

#: Qwen3-VL-Instruct's chat format: no default system turn; text parts and image placeholders
QWEN3VL_CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message.role }}\n"
    "{% if message.content is string %}{{ message.content }}"
    "{% else %}{% for part in message.content %}"
    "{% if part.type == 'image' or 'image' in part %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif 'text' in part %}{{ part.text }}{% endif %}"
    "{% endfor %}{% endif %}"
    "<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

#: Qwen3-VL's special tokens, in their real order after <|endoftext|>
SPECIAL = [
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
]


@tokenizer("qwenvl")
def qwen3vl_tokenizer() -> transformers.PreTrainedTokenizerBase:
    """Qwen's vision-language special tokens and chat format on the tiny vocabulary (QwenImageEditPipeline's
    ``tokenizer``; the processors' tokenizer)."""
    words = [*WORDS, *TEMPLATE_WORDS, *QWENIMAGE21_WORDS]
    vocab, merges = byte_level_bpe([*words, *(" " + word for word in words), "\n\n"])
    built = transformers.Qwen2Tokenizer(vocab=vocab, merges=merges)
    built.add_special_tokens({"eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>"})
    built.add_special_tokens({"additional_special_tokens": SPECIAL})
    built.chat_template = QWEN3VL_CHAT_TEMPLATE
    return built


@tokenizer("qwen3vl")
def qwen3vl_processor() -> transformers.ProcessorMixin:
    """A Qwen3VLProcessor (the pipeline's ``processor`` slot)."""
    from transformers import Qwen2VLImageProcessorPil, Qwen3VLProcessor

    class TextOnlyQwen3VLProcessor(Qwen3VLProcessor):
        """Qwen3VLProcessor without a video processor (Qwen3-VL's needs torchvision): the class
        check is skipped for that one slot, every method is Qwen3VLProcessor's own."""

        def check_argument_for_proper_class(self, argument_name, argument):
            if argument_name == "video_processor" and argument is None:
                return None
            return super().check_argument_for_proper_class(argument_name, argument)

    # the PIL image processor (the default one needs torchvision); text-to-image never calls it
    return TextOnlyQwen3VLProcessor(
        image_processor=Qwen2VLImageProcessorPil(patch_size=16, merge_size=2, temporal_patch_size=2),
        tokenizer=qwen3vl_tokenizer(),
        video_processor=None,
        chat_template=QWEN3VL_CHAT_TEMPLATE,
    )


#: the tiny processor's pixel bound (the tiny catalog entries' "processor" values say the same)
TINY_MAX_PIXELS = 112 * 112


@tokenizer("qwen2vl")
def qwen2vl_processor() -> transformers.ProcessorMixin:
    """A Qwen2VLProcessor (QwenImageEditPipeline's ``processor`` slot): the same tokenizer, and Qwen2.5-VL's image
    processor settings (patch 14, merge 2, from 3,136 pixels: Qwen2.5-VL's preprocessor_config.json) but at most
    112 x 112 pixels (Qwen2.5-VL's: 12,845,056), so the tiny vision tower reads 64 patches, not the 5,476 of the
    1024 x 1024 image the pipeline hands it, and the tests exercise the processor's downscaling."""
    from transformers import Qwen2VLImageProcessorPil, Qwen2VLProcessor

    class ImageOnlyQwen2VLProcessor(Qwen2VLProcessor):
        """Qwen2VLProcessor without a video processor (its default needs torchvision); every method is its own."""

        def check_argument_for_proper_class(self, argument_name, argument):
            if argument_name == "video_processor" and argument is None:
                return None
            return super().check_argument_for_proper_class(argument_name, argument)

    image_processor = Qwen2VLImageProcessorPil(
        patch_size=14, merge_size=2, temporal_patch_size=2, min_pixels=3136, max_pixels=TINY_MAX_PIXELS
    )
    return ImageOnlyQwen2VLProcessor(
        image_processor=image_processor, tokenizer=qwen3vl_tokenizer(), video_processor=None
    )
