"""The settings a profile took from the catalog (a model card's) said against what the pipeline's own bare call runs
(a new user's trial: `profile flux-dev` ran 50 steps, FluxPipeline.__call__ 28, and nothing said so)."""

import inspect

import diffusers

from diffmeter.cli.call_settings import settings_line
from diffmeter.spec import ProfileSpec


def test_a_setting_taken_from_the_model_card_is_said_against_the_bare_call():
    steps = inspect.signature(diffusers.FluxPipeline.__call__).parameters["num_inference_steps"].default
    said = settings_line(ProfileSpec(model="flux-dev"))
    assert f"a bare FluxPipeline(prompt) call runs {steps} steps" in said and steps != 50
    assert settings_line(ProfileSpec(model="flux-dev", steps=28)) is None  # asked for: nothing to say
    # QwenImagePipeline runs true CFG only with a negative prompt, which a bare call does not pass
    assert "guidance 1 (no CFG)" in settings_line(ProfileSpec(model="qwen-image"))
    assert "guidance 1" not in settings_line(ProfileSpec(model="qwen-image", guidance_scale=4.0))
    assert settings_line(ProfileSpec(model="sdxl")) is None  # the card's settings are the call's
    assert settings_line(ProfileSpec(model="tiny-flux")) is None
