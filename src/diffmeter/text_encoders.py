"""Which of a pipeline's text encoders the memory techniques on text encoders take, by class name (torch-free: ``fit``
answers from its disk cache without loading a library)."""

from __future__ import annotations

#: text encoders big enough for fp8 storage to matter (T5-XXL, UMT5, Gemma, ...): ``fp8-text-encoder``'s
LARGE_TEXT_ENCODERS = ("T5EncoderModel", "UMT5EncoderModel", "Gemma2Model", "Gemma2ForCausalLM", "Qwen2_5_VLModel")
#: language models a pipeline uses as its text encoder, billions of parameters each (FLUX.2's Mistral 3, Qwen-Image's
#: Qwen2.5-VL, HiDream's Llama 3.1, Z-Image's Qwen3, LTX-2's Gemma 3, CogView4's GLM): with ``LARGE_TEXT_ENCODERS``,
#: those ``fit`` offers a quantized format on, as diffusers' docs load them in 4 or 8 bits
LANGUAGE_MODEL_ENCODERS = (
    "GemmaModel",
    "Gemma3ForConditionalGeneration",
    "GlmModel",
    "LlamaForCausalLM",
    "LlamaModel",
    "Mistral3ForConditionalGeneration",
    "Qwen2_5_VLForConditionalGeneration",
    "Qwen2_5_VLTextModel",
    "Qwen3ForCausalLM",
    "Qwen3Model",
    "Qwen3VLForConditionalGeneration",
)
#: the text encoders ``fit`` offers a quantized format on
QUANTIZABLE = (*LARGE_TEXT_ENCODERS, *LANGUAGE_MODEL_ENCODERS)


def text_encoders_of(entry, family, classes: tuple[str, ...] = LARGE_TEXT_ENCODERS) -> list[str]:
    """The names of ``entry``'s text encoders (its ``family``'s) of ``classes``: those ``fp8-text-encoder`` stores in
    float8 by default; with ``QUANTIZABLE``, those ``fit`` offers a quantized format on."""
    return [n for n in family.text_encoders if n in entry.components and entry.components[n].class_name in classes]
