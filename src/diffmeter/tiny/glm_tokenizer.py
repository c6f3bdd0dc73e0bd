"""A tiny offline stand-in for the GLM-4 tokenizer that CogView4 encodes prompts with.

CogView4Pipeline._get_glm_embeds calls ``tokenizer(prompt, padding="longest", max_length=...,
truncation=True, add_special_tokens=True)`` with no chat template, then LEFT-pads the ids with
``pad_token_id`` to a multiple of 16. What decides the lengths, kept here:

- a byte-level BPE (GLM-4's scheme) whose whole words include the test prompts' words;
- the post-processor of the converted GLM-4 tokenizers (transformers' ``convert_glm_weights_to_hf``
  with the post-processor on): every text is prefixed with ``[gMASK]<sop>``, so even the default
  empty negative prompt costs 2 tokens;
- ``<|endoftext|>`` as the pad token (GLM-4's ``pad_token_id`` 151329) and padding on the left
  (GLM-4's ``padding_side``).
"""

from __future__ import annotations

import transformers

from diffmeter.tiny.tokenizers import WORDS, byte_level_bpe, tokenizer

#: GLM-4's control tokens, in its own order (151329 ...)
SPECIAL_TOKENS = ["<|endoftext|>", "[MASK]", "[gMASK]", "[sMASK]", "<sop>", "<eop>"]


@tokenizer("glm")
def glm() -> transformers.PreTrainedTokenizerBase:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors

    vocab, merges = byte_level_bpe([*WORDS, *(" " + word for word in WORDS)])
    for token in SPECIAL_TOKENS:
        vocab[token] = len(vocab)
    bpe = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.add_special_tokens(SPECIAL_TOKENS)
    bpe.post_processor = processors.Sequence(
        [
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(
                single="[gMASK]:0 <sop>:0 $A:0",
                pair="[gMASK]:0 <sop>:0 $A:0 $B:1",
                special_tokens=[("[gMASK]", vocab["[gMASK]"]), ("<sop>", vocab["<sop>"])],
            ),
        ]
    )
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        eos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
        padding_side="left",
        model_input_names=["input_ids", "attention_mask"],
    )
