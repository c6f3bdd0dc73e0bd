"""A tiny offline stand-in for the Llama 3.1 tokenizer (meta-llama/Llama-3.1-8B-Instruct).

HiDreamImagePipeline encodes with it as ``tokenizer_4`` (a ``PreTrainedTokenizerFast``): it sets
``pad_token = eos_token`` and calls ``tokenizer_4(prompt, padding="max_length", max_length=
min(max_sequence_length, model_max_length), truncation=True, add_special_tokens=True)`` on the raw
prompt, with no chat template. What decides the lengths, kept here:

- a byte-level BPE (Llama 3's scheme) whose whole words include the test prompts' words;
- Llama 3's post-processor: ``<|begin_of_text|>`` before every text, nothing after it;
- the Instruct tokenizer's ``eos_token`` ``<|eot_id|>`` (which the pipeline makes the pad token) and
  its ``model_max_length`` 131072.

The Llama 3 chat format (header tokens around each turn's role, ``<|eot_id|>`` after its content) is
given for pipelines that call ``apply_chat_template``; Llama 3.1's default system turn with its
knowledge-cutoff and date lines is left out.
"""

from __future__ import annotations

import transformers

from diffmeter.tiny.tokenizers import TEMPLATE_WORDS, WORDS, byte_level_bpe, tokenizer

#: Llama 3's control tokens (128000 ...), in their own order
SPECIAL_TOKENS = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
#: Llama 3.1 tokenizer_config.json model_max_length
MODEL_MAX_LENGTH = 131072
#: Llama 3's chat format, without 3.1's default system turn
LLAMA3_CHAT_TEMPLATE = (
    "{{- bos_token }}"
    "{%- for message in messages %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' }}"
    "{%- if message['content'] is string %}{{- message['content'] | trim }}"
    "{%- else %}{%- for part in message['content'] %}{{- part['text'] | trim }}{%- endfor %}{%- endif %}"
    "{{- '<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)


@tokenizer("llama")
def llama() -> transformers.PreTrainedTokenizerBase:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors

    words = [*WORDS, *TEMPLATE_WORDS]
    vocab, merges = byte_level_bpe([*words, *(" " + word for word in words), "\n\n"])
    for token in SPECIAL_TOKENS:
        vocab[token] = len(vocab)
    bpe = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.add_special_tokens(SPECIAL_TOKENS)
    bos = "<|begin_of_text|>"
    bpe.post_processor = processors.Sequence(
        [
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(
                single=f"{bos}:0 $A:0", pair=f"{bos}:0 $A:0 {bos}:1 $B:1", special_tokens=[(bos, vocab[bos])]
            ),
        ]
    )
    built = transformers.PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        bos_token=bos,
        eos_token="<|eot_id|>",
        model_max_length=MODEL_MAX_LENGTH,
        model_input_names=["input_ids", "attention_mask"],
    )
    built.chat_template = LLAMA3_CHAT_TEMPLATE
    return built


@tokenizer("llava-llama")
def llava_llama() -> transformers.PreTrainedTokenizerBase:
    """HunyuanVideo's tokenizer (llava-llama-3-8b's, a LlamaTokenizerFast): HunyuanVideoPipeline pads it to
    ``max_length`` without setting a pad token, so it has its own; which token it is (not read here) changes
    no length."""
    built = llama()
    built.pad_token = "<|end_of_text|>"
    return built
