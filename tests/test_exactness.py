"""The offline profile equals what the real diffusers pipeline does, per component, exactly.

Each tiny entry is built with random weights and real tokenizers and schedulers, run
for real on CPU under the FLOP counter, and compared with the meta-device profile of
the same config at the same size, steps, batch and guidance.
"""

import pytest
from tiny_runs import TINY, macs_by_name, quick_or_slow, run_tiny

from diffmeter import profile
from diffmeter.errors import DiffmeterError


@pytest.mark.parametrize("entry", quick_or_slow(TINY))
def test_offline_profile_equals_real_pipeline(entry):
    _, real, settings = run_tiny(entry)
    offline = profile(entry.name, **settings)
    assert macs_by_name(offline) == real
    assert offline.total_macs == sum(real.values())


#: pipelines that make one output per call (QwenImageEditPipeline and its Plus resize a single call's images)
ONE_OUTPUT = {"qwenimage_edit", "qwenimage_edit_plus"}


@pytest.mark.parametrize("guidance_scale", [None, 1.0], ids=["default-guidance", "no-guidance"])
@pytest.mark.parametrize("entry", quick_or_slow([e for e in TINY if e.family not in ONE_OUTPUT]))
def test_exact_at_batch_two_with_and_without_guidance(entry, guidance_scale):
    _, real, settings = run_tiny(entry, batch_size=2, guidance_scale=guidance_scale)
    offline = profile(entry.name, **settings)
    assert macs_by_name(offline) == real
    if guidance_scale == 1.0:
        assert not offline.cfg


@pytest.mark.parametrize("entry", [e for e in TINY if e.family in ONE_OUTPUT], ids=lambda e: e.name)
def test_one_output_pipelines_refuse_a_batch_as_diffusers_fails_one(entry):
    """diffmeter refuses batch 2 for them in one line, and the real pipeline indeed cannot run it."""
    with pytest.raises(DiffmeterError, match="use --batch-size 1"):
        profile(entry.name, batch_size=2)
    with pytest.raises((ValueError, IndexError, TypeError, AttributeError)):
        run_tiny(entry, batch_size=2)


@pytest.mark.parametrize(
    "name,length", [("tiny-flux", 16), ("tiny-sd3", 100), ("tiny-pixart-sigma", 64), ("tiny-wan", 40)]
)
def test_exact_at_another_max_sequence_length(name, length):
    entry = next(e for e in TINY if e.name == name)
    _, real, settings = run_tiny(entry, max_sequence_length=length)
    offline = profile(entry.name, **settings)
    assert macs_by_name(offline) == real


def test_sana_without_its_complex_human_instruction_is_a_valid_call():
    """``complex_human_instruction=None`` is how SanaPipeline runs a bare prompt: --instruction-tokens 0."""
    import torch

    from diffmeter.families import get_family
    from diffmeter.flops.counter import count_flops
    from diffmeter.tiny import tiny_pipeline

    entry = next(e for e in TINY if e.name == "tiny-sana")
    pipe = tiny_pipeline(entry)
    components = {name: getattr(pipe, name) for name in entry.components}
    with torch.no_grad(), count_flops(components) as counts:
        pipe(
            "a red cat",
            height=32,
            width=32,
            num_inference_steps=2,
            complex_human_instruction=None,
            output_type="np",
            **entry.extra["runtime"]["call"],
        )
    real = {name: sum(counts.by_module.get(name, {}).values()) // 2 for name in entry.components}
    offline = profile("tiny-sana", instruction_tokens=0)
    assert macs_by_name(offline) == real
    instruction = get_family("sana").prompt_settings(pipe, ["a red cat"])["instruction_tokens"]
    with_instruction = {c.name: c.macs for c in profile("tiny-sana", instruction_tokens=instruction).components}
    assert with_instruction["text_encoder"] > real["text_encoder"]  # the instruction costs compute
