"""Tiny random-weight pipelines, built offline: real diffusers pipeline classes, real
schedulers, and small real tokenizers made from an in-memory vocabulary."""

from __future__ import annotations

import string

import diffusers
import torch
import transformers

from diffmeter.catalog.entry import PipelineEntry
from diffmeter.errors import DiffmeterError
from diffmeter.pipelines import build_component

_WORDS = (
    "a an the of in on with and photo painting portrait cat dog horse astronaut riding red blue "
    "green city night forest mountain river sunset castle robot flower ocean"
).split()


def _clip_tokenizer() -> transformers.PreTrainedTokenizerBase:
    vocab = {"<|startoftext|>": 0, "<|endoftext|>": 1}
    for piece in [*_WORDS, *string.ascii_lowercase]:
        vocab.setdefault(piece + "</w>", len(vocab))
        vocab.setdefault(piece, len(vocab))
    return transformers.CLIPTokenizer(vocab=vocab, merges=[], model_max_length=77)


def _t5_tokenizer() -> transformers.PreTrainedTokenizerBase:
    pieces = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("▁", -5.0)]
    pieces += [("▁" + word, -1.0) for word in _WORDS]
    pieces += [(char, -3.0) for char in string.ascii_lowercase + string.punctuation]
    return transformers.T5TokenizerFast(vocab=pieces, extra_ids=0)


def _gemma_tokenizer() -> transformers.PreTrainedTokenizerBase:
    vocab = {"<pad>": 0, "<eos>": 1, "<bos>": 2, "<unk>": 3}
    for piece in ["▁", *("▁" + word for word in _WORDS), *string.ascii_letters, *string.punctuation, " "]:
        vocab.setdefault(piece, len(vocab))
    tokenizer = transformers.GemmaTokenizerFast(vocab=vocab, merges=[], add_bos_token=True)
    tokenizer.padding_side = "right"
    return tokenizer


def _bert_tokenizer() -> transformers.PreTrainedTokenizerBase:
    vocab = {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, "[MASK]": 4}
    for piece in [*_WORDS, *string.ascii_lowercase]:
        vocab.setdefault(piece, len(vocab))
    return transformers.BertTokenizerFast(vocab=vocab)


TOKENIZERS = {"clip": _clip_tokenizer, "t5": _t5_tokenizer, "gemma": _gemma_tokenizer, "bert": _bert_tokenizer}


def tiny_pipeline(entry: PipelineEntry, device: str = "cpu", seed: int = 0) -> diffusers.DiffusionPipeline:
    """The real diffusers pipeline of a tiny catalog entry, with seeded random weights."""
    if not entry.is_tiny:
        raise DiffmeterError(f"'{entry.name}' is not a tiny random entry; pick one of the tiny-* models")
    torch.manual_seed(seed)
    parts = {name: build_component(component, device) for name, component in entry.components.items()}
    return assemble(entry.pipeline_class, parts, entry.extra["runtime"])


def assemble(pipeline_class_name: str, parts: dict, runtime: dict) -> diffusers.DiffusionPipeline:
    """A pipeline from built components plus a runtime (offline tokenizers, a scheduler config)."""
    parts = dict(parts)
    for name, kind in runtime["tokenizers"].items():
        parts[name] = TOKENIZERS[kind]()
    scheduler = runtime["scheduler"]
    parts["scheduler"] = getattr(diffusers, scheduler["class"]).from_config(scheduler["config"])
    pipeline_class = getattr(diffusers, pipeline_class_name)
    expected = set(pipeline_class._get_signature_keys(pipeline_class)[0])
    parts.update({name: None for name in expected - set(parts)})
    pipeline = pipeline_class(**{name: part for name, part in parts.items() if name in expected})
    pipeline.set_progress_bar_config(disable=True)
    return pipeline
