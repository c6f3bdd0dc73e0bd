"""Small real tokenizers built offline from an in-memory vocabulary, one builder per kind.

Tiny pipelines name a kind per tokenizer slot (``"clip"``, ``"qwen2"`` ...). The vocabularies
hold whole words for the prompts the tests use and for the words of the pipelines' own prompt
templates, so a template costs as many tokens as with the real tokenizer (Qwen-Image's system
prefix is 34 tokens with either); everything else falls back to characters or bytes.
"""

from __future__ import annotations

import json
import string
from collections.abc import Callable

import transformers

#: words of the test prompts
WORDS = (
    "a an the of in on with and photo painting portrait cat dog horse astronaut riding red blue "
    "green city night forest mountain river sunset castle robot flower ocean"
).split()
#: words of the prompt templates the LLM-encoder pipelines wrap prompts in
TEMPLATE_WORDS = (
    "system user assistant You are helpful Describe describe image video by detailing color shape size "
    "texture quantity text spatial relationships objects background main content theme Actions events "
    "behaviors temporal physical movement changes environment light style atmosphere camera angles "
    "movements transitions used think"
).split()

TOKENIZERS: dict[str, Callable[[], transformers.PreTrainedTokenizerBase]] = {}


def tokenizer(kind: str):
    """Decorator: register a builder of the ``kind`` tokenizer."""

    def register(build):
        TOKENIZERS[kind] = build
        return build

    return register


def byte_level_bpe(texts: list[str]) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """(vocab, merges) of a byte-level BPE trained on ``texts`` until each of their pre-tokens
    (a word and its leading space) is one token: the GPT-2 scheme of Qwen, Llama 3, Mistral's
    Tekken and GLM, at a tiny size."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=100_000, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    bpe.train_from_iterator(texts, trainer)
    state = json.loads(bpe.to_str())["model"]
    return state["vocab"], [tuple(merge) for merge in state["merges"]]


@tokenizer("clip")
def clip() -> transformers.PreTrainedTokenizerBase:
    vocab = {"<|startoftext|>": 0, "<|endoftext|>": 1}
    for piece in [*WORDS, *string.ascii_lowercase]:
        vocab.setdefault(piece + "</w>", len(vocab))
        vocab.setdefault(piece, len(vocab))
    return transformers.CLIPTokenizer(vocab=vocab, merges=[], model_max_length=77)


@tokenizer("t5")
def t5() -> transformers.PreTrainedTokenizerBase:
    pieces = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("▁", -5.0)]
    pieces += [("▁" + word, -1.0) for word in WORDS]
    pieces += [(char, -3.0) for char in string.ascii_lowercase + string.punctuation]
    return transformers.T5TokenizerFast(vocab=pieces, extra_ids=0)


@tokenizer("gemma")
def gemma() -> transformers.PreTrainedTokenizerBase:
    vocab = {"<pad>": 0, "<eos>": 1, "<bos>": 2, "<unk>": 3}
    for piece in ["▁", *("▁" + word for word in WORDS), *string.ascii_letters, *string.punctuation, " "]:
        vocab.setdefault(piece, len(vocab))
    built = transformers.GemmaTokenizerFast(vocab=vocab, merges=[], add_bos_token=True)
    built.padding_side = "right"
    return built


@tokenizer("bert")
def bert() -> transformers.PreTrainedTokenizerBase:
    vocab = {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, "[MASK]": 4}
    for piece in [*WORDS, *string.ascii_lowercase]:
        vocab.setdefault(piece, len(vocab))
    return transformers.BertTokenizerFast(vocab=vocab)


@tokenizer("byt5")
def byt5() -> transformers.PreTrainedTokenizerBase:
    return transformers.ByT5Tokenizer()  # bytes need no vocabulary file


#: Qwen2.5's chat format (a default system turn when none is given); string or text-part contents
QWEN2_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and message.role != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    "{% endif %}"
    "<|im_start|>{{ message.role }}\n"
    "{% if message.content is string %}{{ message.content }}"
    "{% else %}{% for part in message.content %}{{ part.text }}{% endfor %}{% endif %}"
    "<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
#: Qwen3's chat format: no default system turn; an empty think block when thinking is off
QWEN3_CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}"
    "{% endif %}"
)


def _qwen(chat_template: str) -> transformers.PreTrainedTokenizerBase:
    words = [*WORDS, *TEMPLATE_WORDS]
    vocab, merges = byte_level_bpe([*words, *(" " + word for word in words), "\n\n"])
    built = transformers.Qwen2Tokenizer(vocab=vocab, merges=merges)
    built.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>", "<think>", "</think>"]})
    built.chat_template = chat_template
    return built


@tokenizer("qwen2")
def qwen2() -> transformers.PreTrainedTokenizerBase:
    return _qwen(QWEN2_CHAT_TEMPLATE)


@tokenizer("qwen3")
def qwen3() -> transformers.PreTrainedTokenizerBase:
    return _qwen(QWEN3_CHAT_TEMPLATE)
