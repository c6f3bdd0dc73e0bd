"""FLUX.2 [dev] and [klein]: what the generic exactness tests do not reach.

Every real run below is the diffusers pipeline itself (tiny random weights, offline tokenizers),
counted with diffmeter's counter and compared with the meta-device profile.
"""

import pytest
import torch
from tiny_runs import TINY, run_tiny

from diffmeter import profile
from diffmeter.catalog import resolve
from diffmeter.flops.analytic import FORMULAS
from diffmeter.flops.counter import count_flops
from diffmeter.tiny import tiny_pipeline

PROMPT = "a photo of a cat riding a horse"


def _tiny(name):
    return next(entry for entry in TINY if entry.name == name)


def _real_run(entry, pipe, **call):
    """Per-component MACs and per-module FLOPs of one real generation."""
    components = {name: getattr(pipe, name) for name in entry.components}
    arguments = dict(
        prompt=PROMPT,
        height=entry.defaults.height,
        width=entry.defaults.width,
        num_inference_steps=entry.defaults.steps,
        output_type="np",
        generator=torch.Generator().manual_seed(0),
        **entry.extra["runtime"].get("call", {}),
    )
    arguments.update(call)
    with torch.no_grad(), count_flops(components) as counts:
        pipe(**arguments)
    macs = {name: sum(counts.by_module.get(name, {}).values()) // 2 for name in entry.components}
    return macs, counts


# ---- FLUX.2 [dev] --------------------------------------------------------------------------


def test_dev_prompt_is_the_system_turn_plus_prompt_padded_to_max_sequence_length():
    """Flux2Pipeline renders [system: SYSTEM_MESSAGE, user: prompt] with the Mistral chat format and pads
    to max_sequence_length: the text encoder always sees exactly that many tokens, whatever the prompt."""
    from diffusers.pipelines.flux2.pipeline_flux2 import format_input
    from diffusers.pipelines.flux2.system_messages import SYSTEM_MESSAGE

    entry = _tiny("tiny-flux2")
    pipe = tiny_pipeline(entry)
    length = entry.extra["runtime"]["call"]["max_sequence_length"]
    rendered = pipe.tokenizer.apply_chat_template(format_input([PROMPT]), tokenize=False)[0]
    assert rendered == f"<s>[SYSTEM_PROMPT]{SYSTEM_MESSAGE}[/SYSTEM_PROMPT][INST]{PROMPT}[/INST]"
    inputs = pipe.tokenizer.apply_chat_template(
        format_input([PROMPT, "a cat"]),
        add_generation_prompt=False,
        tokenize=True,
        return_dict=True,
        return_tensors="pt",
        padding="max_length",
        truncation=True,
        max_length=length,
    )
    assert inputs["input_ids"].shape == (2, length)
    template = len(pipe.tokenizer.apply_chat_template(format_input([""]), tokenize=True)[0])
    # one token per system-message word (and punctuation), as with the real Tekken tokenizer
    assert template == 2 + len(pipe.tokenizer(SYSTEM_MESSAGE, add_special_tokens=False).input_ids) + 3
    # a longer max_sequence_length, counted both ways
    macs, _ = _real_run(entry, pipe, max_sequence_length=2 * length)
    offline = profile(entry.name, max_sequence_length=2 * length)
    assert {c.name: c.macs for c in offline.components} == macs
    assert macs["text_encoder"] > run_tiny(entry)[1]["text_encoder"]


def test_dev_text_encoder_runs_every_layer_and_lm_head_and_stacks_layers_10_20_30():
    """output_hidden_states=True reads hidden_states[10], [20], [30]: the full Mistral forward runs, logits
    included; the stacked states are 3 x hidden wide, the transformer's joint_attention_dim."""
    entry = _tiny("tiny-flux2")
    pipe = tiny_pipeline(entry)
    text = entry.components["text_encoder"].config["text_config"]
    embeds, text_ids = pipe.encode_prompt(PROMPT, max_sequence_length=entry.text_max_length["text_encoder"])
    assert embeds.shape == (1, entry.text_max_length["text_encoder"], 3 * text["hidden_size"])
    assert embeds.shape[-1] == entry.components["transformer"].config["joint_attention_dim"]
    assert text_ids.shape == (1, entry.text_max_length["text_encoder"], 4)
    macs, counts = _real_run(entry, pipe)
    layers = {path for path in counts.by_module if path.startswith("text_encoder.model.language_model.layers.")}
    assert {path.split(".")[4] for path in layers} == {str(i) for i in range(text["num_hidden_layers"])}
    lm_head = sum(counts.by_module["text_encoder.lm_head"].values()) // 2
    assert lm_head == entry.text_max_length["text_encoder"] * text["hidden_size"] * text["vocab_size"]
    assert not any(path.startswith("text_encoder.model.vision_tower") for path in counts.by_module)
    offline = profile(entry.name, depth=1)
    encoder = next(c for c in offline.components if c.name == "text_encoder")
    assert encoder.macs == macs["text_encoder"]


def test_dev_guidance_is_embedded_never_cfg():
    """Flux2Pipeline has no CFG: one transformer call per step at any guidance scale, the guidance value
    going through the transformer's guidance embedder (counted)."""
    entry = _tiny("tiny-flux2")
    pipe = tiny_pipeline(entry)
    low, counts = _real_run(entry, pipe, guidance_scale=1.0)
    high, _ = _real_run(entry, pipe, guidance_scale=7.0)
    assert low == high
    embedder = counts.by_module["transformer.time_guidance_embed.guidance_embedder"]
    assert sum(embedder.values()) > 0
    for scale in (1.0, 7.0):
        offline = profile(entry.name, guidance_scale=scale)
        assert not offline.cfg
        assert {c.name: c.macs for c in offline.components} == low
    real = profile("flux2-dev", steps=2)
    assert not real.cfg and next(c for c in real.components if c.name == "transformer").calls == 2


@pytest.mark.parametrize("name", ["flux2-dev", "flux2-klein-4b", "flux2-klein-9b"])
@pytest.mark.parametrize("size", [512, 1024])
def test_closed_form_matches_counted_transformer_call(name, size):
    entry = resolve(name)
    counted = next(
        c for c in profile(name, height=size, width=size, guidance_scale=1.0).components if c.role == "denoiser"
    ).macs_per_call
    closed = FORMULAS[entry.family](
        entry.components["transformer"].config, (size // 16) ** 2, entry.text_max_length["text_encoder"]
    )
    assert abs(closed - counted) / counted < 0.01


# ---- FLUX.2 [klein] ------------------------------------------------------------------------


def test_klein_prompt_is_the_qwen3_chat_turn_without_thinking_padded_to_max_sequence_length():
    """Flux2KleinPipeline: apply_chat_template([user: prompt], add_generation_prompt=True, enable_thinking=False)
    (no system turn), then tokenizer(padding="max_length", truncation=True): always max_sequence_length tokens."""
    entry = _tiny("tiny-flux2-klein-base")
    pipe = tiny_pipeline(entry)
    rendered = pipe.tokenizer.apply_chat_template(
        [{"role": "user", "content": PROMPT}], tokenize=False, add_generation_prompt=True, enable_thinking=False
    )
    assert rendered == f"<|im_start|>user\n{PROMPT}<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    length = entry.text_max_length["text_encoder"]
    embeds, text_ids = pipe.encode_prompt([PROMPT, "a cat " * 200], max_sequence_length=length)
    assert embeds.shape[:2] == (2, length) and text_ids.shape == (2, length, 4)
    macs, _ = _real_run(entry, pipe, max_sequence_length=length // 2)
    offline = profile(entry.name, max_sequence_length=length // 2)
    assert {c.name: c.macs for c in offline.components} == macs


@pytest.mark.parametrize("name", ["tiny-flux2-klein", "tiny-flux2-klein-base"])
def test_klein_text_encoder_runs_every_layer_and_lm_head_and_stacks_layers_9_18_27(name):
    entry = _tiny(name)
    pipe = tiny_pipeline(entry)
    config = entry.components["text_encoder"].config
    length = entry.text_max_length["text_encoder"]
    embeds, _ = pipe.encode_prompt(PROMPT, max_sequence_length=length)
    assert (
        embeds.shape[-1] == 3 * config["hidden_size"] == entry.components["transformer"].config["joint_attention_dim"]
    )
    macs, counts = _real_run(entry, pipe, guidance_scale=1.0)
    layers = {path.split(".")[3] for path in counts.by_module if path.startswith("text_encoder.model.layers.")}
    assert layers == {str(i) for i in range(config["num_hidden_layers"])}
    lm_head = sum(counts.by_module["text_encoder.lm_head"].values()) // 2  # tied or not, the logits are computed
    assert lm_head == length * config["hidden_size"] * config["vocab_size"]
    assert {c.name: c.macs for c in profile(entry.name, guidance_scale=1.0).components} == macs


def test_klein_base_runs_real_cfg_as_two_transformer_calls_and_encodes_the_empty_negative_prompt():
    entry = _tiny("tiny-flux2-klein-base")
    pipe = tiny_pipeline(entry)
    guided, _ = _real_run(entry, pipe, guidance_scale=4.0)
    plain, _ = _real_run(entry, pipe, guidance_scale=1.0)
    assert guided["transformer"] == 2 * plain["transformer"]
    assert guided["text_encoder"] == 2 * plain["text_encoder"]  # "" padded to the same length
    assert guided["vae"] == plain["vae"]
    offline = profile(entry.name, guidance_scale=4.0)
    assert offline.cfg and {c.name: c.macs for c in offline.components} == guided
    transformer = next(c for c in offline.components if c.name == "transformer")
    assert (transformer.calls, transformer.batch_per_call) == (2 * entry.defaults.steps, 1)
    real = profile("flux2-klein-base-4b", steps=2)
    assert real.cfg and next(c for c in real.components if c.name == "transformer").calls == 4


def test_klein_distilled_ignores_guidance_scale():
    """is_distilled (model_index.json) turns CFG off whatever guidance_scale says; the pipeline only warns."""
    entry = _tiny("tiny-flux2-klein")
    assert entry.extra["pipeline_init"] == {"is_distilled": True}
    pipe = tiny_pipeline(entry)
    assert pipe.config.is_distilled
    guided, _ = _real_run(entry, pipe, guidance_scale=4.0)
    plain, _ = _real_run(entry, pipe, guidance_scale=1.0)
    assert guided == plain
    offline = profile(entry.name, guidance_scale=4.0)
    assert not offline.cfg and {c.name: c.macs for c in offline.components} == guided
    assert any("ignores guidance_scale" in note for note in offline.notes)
    real = profile("flux2-klein-4b", guidance_scale=4.0, steps=4)
    assert not real.cfg and next(c for c in real.components if c.name == "transformer").calls == 4


def test_klein_local_folder_reads_is_distilled_from_its_model_index(tmp_path):
    from diffmeter.catalog import resolve as resolve_model

    for name, distilled in (("tiny-flux2-klein", True), ("tiny-flux2-klein-base", False)):
        folder = tmp_path / name
        tiny_pipeline(_tiny(name)).save_pretrained(folder)
        local = resolve_model(str(folder))
        assert local.family == "flux2_klein" and local.origin == "local"
        assert bool(local.extra["pipeline_init"].get("is_distilled")) == distilled
        counted = profile(str(folder), height=32, width=32, steps=2, guidance_scale=4.0)
        assert counted.cfg == (not distilled)
