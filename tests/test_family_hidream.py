"""HiDream-I1: what the generic tests do not reach, held to the real pipeline.

HiDreamImagePipeline rescales every request to its pixel budget and pads a non-square latent's image
sequence to the transformer's max_seq; pads the CLIPs to min(max_sequence_length, 218) and T5 / Llama to
max_sequence_length; encodes the default negative prompt at batch 1; and routes each token of every MoE
layer to 2 of 4 experts, data dependently. Each test runs the real tiny pipeline under the counter and
compares with the offline profile, exactly."""

import pytest
import torch
from tiny_runs import PROMPT, TINY

from diffmeter import profile
from diffmeter.catalog import resolve
from diffmeter.families import get_family
from diffmeter.flops.analytic import FORMULAS
from diffmeter.flops.counter import count_flops
from diffmeter.tiny import tiny_pipeline

ENTRY = next(e for e in TINY if e.name == "tiny-hidream")
FAMILY = get_family("hidream")
ENCODERS = ("text_encoder", "text_encoder_2", "text_encoder_3", "text_encoder_4")


def run(batch=1, guidance_scale=5.0, height=None, width=None, scheduler=None, steps=None, **call):
    """The real pipeline's per-component MACs, and what its encoders, transformer and MoE layers got."""
    pipe = tiny_pipeline(ENTRY)
    if scheduler is not None:
        pipe.scheduler = scheduler
    seen = {name: [] for name in ENCODERS}
    seen.update(transformer=[], routed=[], image_tokens=[])
    for name in ENCODERS:
        getattr(pipe, name).register_forward_pre_hook(
            lambda module, args, kwargs, name=name: seen[name].append(
                tuple((args[0] if args else kwargs["input_ids"]).shape)
            ),
            with_kwargs=True,
        )
    pipe.transformer.register_forward_pre_hook(
        lambda module, args, kwargs: seen["transformer"].append(tuple(kwargs["hidden_states"].shape)), with_kwargs=True
    )
    pipe.transformer.x_embedder.register_forward_hook(
        lambda module, args, out: seen["image_tokens"].append(out.shape[1])
    )
    for block in pipe.transformer.single_stream_blocks:
        moe = block.block.ff_i
        moe.register_forward_pre_hook(lambda module, args: seen["routed"].append(["tokens", args[0].shape[:2].numel()]))
        for expert in moe.experts:
            expert.register_forward_pre_hook(lambda module, args: seen["routed"][-1].append(args[0].shape[0]))
    components = {name: getattr(pipe, name) for name in ENTRY.components}
    with torch.no_grad(), count_flops(components) as counts:
        pipe(
            [PROMPT] * batch,
            height=height or ENTRY.defaults.height,
            width=width or ENTRY.defaults.width,
            num_inference_steps=steps or ENTRY.defaults.steps,
            guidance_scale=guidance_scale,
            output_type="np",
            **call,
        )
    macs = {name: sum(counts.by_module.get(name, {}).values()) // 2 for name in ENTRY.components}
    return pipe, macs, seen


def offline(**settings):
    return {c.name: c.macs for c in profile("tiny-hidream", **settings).components}


@pytest.mark.slow
def test_clip_takes_at_most_218_tokens_and_the_negative_prompt_runs_at_batch_one():
    """max_sequence_length 240: the CLIPs get min(240, 218), T5 and Llama 240; with CFG at batch 2 each
    encoder runs the prompts at batch 2 and the default negative prompt '' at batch 1."""
    _, real, seen = run(batch=2, max_sequence_length=240)
    assert seen["text_encoder"] == seen["text_encoder_2"] == [(2, 218), (1, 218)]
    assert seen["text_encoder_3"] == seen["text_encoder_4"] == [(2, 240), (1, 240)]
    assert offline(batch_size=2, guidance_scale=5.0, max_sequence_length=240) == real


def test_every_token_runs_two_routed_experts_whatever_the_routing():
    """moe_infer runs each routed expert on the tokens routed to it: the split is data dependent, the
    total (tokens x num_activated_experts rows) is not, and the offline count, which splits evenly, agrees."""
    _, real, seen = run(guidance_scale=1.0)
    top_k = ENTRY.components["transformer"].config["num_activated_experts"]
    assert seen["routed"]
    for _, tokens, *rows in seen["routed"]:
        assert sum(rows) == top_k * tokens
    assert any(len(set(rows)) > 1 for _, _, *rows in seen["routed"])  # the real split is uneven
    assert offline(guidance_scale=1.0) == real


@pytest.mark.slow
@pytest.mark.parametrize("height,width", [(100, 400), (200, 180)], ids=["4-to-1", "near-square"])
def test_a_request_is_rescaled_to_the_pixel_budget_and_a_non_square_latent_is_padded(height, width):
    _, real, seen = run(height=height, width=width, guidance_scale=1.0)
    made_height, made_width, note = FAMILY.pipeline_size(ENTRY, height, width)
    assert note and "rescales every request" in note
    scale = FAMILY.vae_scale(ENTRY)
    assert seen["transformer"][0][-2:] == (made_height // scale, made_width // scale)
    config = ENTRY.components["transformer"].config
    max_seq = config["max_resolution"][0] * config["max_resolution"][1] // config["patch_size"] ** 2
    assert set(seen["image_tokens"]) == {max_seq}  # non-square: padded, every padded token computed
    result = profile("tiny-hidream", height=height, width=width, guidance_scale=1.0)
    assert (result.height, result.width) == (made_height, made_width)
    assert any("padded to the transformer's max_seq" in n for n in result.notes)
    assert {c.name: c.macs for c in result.components} == real


@pytest.mark.slow
def test_the_full_models_unipc_flow_scheduler_runs_one_call_per_step():
    """HiDream-I1-Full samples with UniPC over flow sigmas (the pipeline's UniPCMultistepScheduler branch),
    Dev and Fast with flow-matching Euler: either way one transformer call per step."""
    from diffusers import UniPCMultistepScheduler

    unipc = UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=3.0)
    _, real, seen = run(scheduler=unipc, steps=3)
    assert len(seen["transformer"]) == 3 and seen["transformer"][0][0] == 2  # CFG batched
    assert offline(steps=3, guidance_scale=5.0) == real


def test_llama_tokenizer_prepends_bos_and_pads_with_eos():
    pipe = tiny_pipeline(ENTRY)
    tokenizer = pipe.tokenizer_4
    assert tokenizer.pad_token == tokenizer.eos_token == "<|eot_id|>"  # set by the pipeline
    ids = tokenizer(PROMPT, padding="max_length", max_length=16, truncation=True).input_ids
    assert ids[0] == tokenizer.bos_token_id and len(ids) == 16
    assert len(tokenizer(PROMPT).input_ids) == 1 + len(PROMPT.split())  # one token per word


@pytest.mark.parametrize(
    "name,height,width,length", [("hidream-i1-full", 1024, 1024, 128), ("hidream-i1-dev", 768, 1360, 256)]
)
def test_closed_form_matches_counted_denoiser_call(name, height, width, length):
    """The pipeline always generates about 1 MP, so the two cases differ in aspect (a non-square latent is
    padded to max_seq tokens) and in max_sequence_length."""
    entry = resolve(name)
    result = profile(name, height=height, width=width, guidance_scale=1.0, max_sequence_length=length)
    counted = next(c for c in result.components if c.role == "denoiser").macs_per_call
    config = entry.components["transformer"].config
    tokens = (result.height // 16) * (result.width // 16)  # 8x VAE, 2x2 patches
    max_seq = config["max_resolution"][0] * config["max_resolution"][1] // config["patch_size"] ** 2
    image = tokens if result.height == result.width else max_seq
    assert image == 4096 and tokens <= max_seq
    closed = FORMULAS["hidream"](config, image, length)
    assert abs(closed - counted) / counted < 0.01
