"""A tiny offline stand-in for the Mistral Small 3.x processor that FLUX.2 [dev] encodes prompts with.

Flux2Pipeline calls ``tokenizer.apply_chat_template(conversations, tokenize=True, return_dict=True,
padding="max_length", truncation=True, max_length=...)`` on a PixtralProcessor. The processor's text
path renders its chat template and tokenizes the result with its Tekken tokenizer (a byte-level BPE);
the image processor is never reached for text prompts. PixtralProcessor itself requires torchvision,
so the tiny kind is the tokenizer alone: a real ``PreTrainedTokenizerFast`` that takes the same call
(batched conversations, text-part contents) and renders Mistral Small 3.1's chat format,
``<s>[SYSTEM_PROMPT]...[/SYSTEM_PROMPT][INST]...[/INST]``. Its vocabulary holds the words of the
pipeline's system message, so the template costs one token per word as with Tekken.
"""

from __future__ import annotations

import transformers

from diffmeter.tiny.tokenizers import TEMPLATE_WORDS, WORDS, byte_level_bpe, tokenizer

#: the system message Flux2Pipeline passes (diffusers.pipelines.flux2.system_messages.SYSTEM_MESSAGE)
FLUX2_SYSTEM_WORDS = (
    "You are an AI that reasons about image descriptions. You give structured responses focusing on "
    "object relationships, object\nattribution and actions without speculation."
)

#: Mistral Small 3.1's chat format (mistralai/Mistral-Small-3.1-24B-Instruct-2503, the processor FLUX.2 [dev]
#: ships): BOS, one system turn (the default one when none is given), then [INST] user [/INST] turns whose
#: content is a string or a list of text/image parts. The real default system message names today's date;
#: the pipeline always passes its own, so the tiny default is a short constant.
MISTRAL_SMALL_CHAT_TEMPLATE = (
    "{%- set default_system_message = 'You are Mistral Small 3, a Large Language Model (LLM) created by Mistral AI.' %}"
    "{{- bos_token }}"
    "{%- if messages[0]['role'] == 'system' %}"
    "{%- if messages[0]['content'] is string %}{%- set system_message = messages[0]['content'] %}"
    "{%- else %}{%- set system_message = messages[0]['content'][0]['text'] %}{%- endif %}"
    "{%- set loop_messages = messages[1:] %}"
    "{%- else %}{%- set system_message = default_system_message %}{%- set loop_messages = messages %}{%- endif %}"
    "{{- '[SYSTEM_PROMPT]' + system_message + '[/SYSTEM_PROMPT]' }}"
    "{%- for message in loop_messages %}"
    "{%- if message['role'] == 'user' %}"
    "{%- if message['content'] is string %}{{- '[INST]' + message['content'] + '[/INST]' }}"
    "{%- else %}{{- '[INST]' }}"
    "{%- for block in message['content'] %}"
    "{%- if block['type'] == 'text' %}{{- block['text'] }}"
    "{%- elif block['type'] in ['image', 'image_url'] %}{{- '[IMG]' }}"
    "{%- else %}{{- raise_exception('Only text and image blocks are supported in message content!') }}{%- endif %}"
    "{%- endfor %}{{- '[/INST]' }}{%- endif %}"
    "{%- elif message['role'] == 'system' %}"
    "{%- if message['content'] is string %}{{- '[SYSTEM_PROMPT]' + message['content'] + '[/SYSTEM_PROMPT]' }}"
    "{%- else %}{{- '[SYSTEM_PROMPT]' + message['content'][0]['text'] + '[/SYSTEM_PROMPT]' }}{%- endif %}"
    "{%- elif message['role'] == 'assistant' %}"
    "{%- if message['content'] is string %}{{- message['content'] + eos_token }}"
    "{%- else %}{{- message['content'][0]['text'] + eos_token }}{%- endif %}"
    "{%- else %}{{- raise_exception('Only user, system and assistant roles are supported!') }}{%- endif %}"
    "{%- endfor %}"
)
#: Tekken's control tokens the chat format and the image path use
SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "[INST]", "[/INST]", "[IMG]", "<pad>", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]"]


@tokenizer("mistral")
def mistral() -> transformers.PreTrainedTokenizerBase:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    words = [*WORDS, *TEMPLATE_WORDS]
    vocab, merges = byte_level_bpe([*words, *(" " + word for word in words), FLUX2_SYSTEM_WORDS])
    bpe = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    built = transformers.PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        additional_special_tokens=[token for token in SPECIAL_TOKENS if token not in ("<unk>", "<s>", "</s>", "<pad>")],
        model_max_length=131072,
    )
    built.chat_template = MISTRAL_SMALL_CHAT_TEMPLATE
    return built
