"""diffusers' attention backends and SDPA's kernels in the expected time (``predict.attention_kernels``): each
backend as the kernel it runs, FlashAttention-3 timed at its measured ratio where it was measured and nowhere else,
the kernels with no published measurement named with their reason, and the published runs held out per technique
(benchmarks/calibrate_techniques.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from diffmeter.predict.attention_kernels import (
    CUDNN_OVER_FLASH,
    FLASH3_OVER_FLASH,
    asked_kernel,
    attention_speedup,
    kernel_of,
)
from diffmeter.predict.devices import named_gpu
from diffmeter.predict.operators import OperatorTally
from diffmeter.predict.roofline import predict_time
from diffmeter.predict.schema import CallWork, OperatorWork
from diffmeter.predict.timed_techniques import why_untimed

sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks"))
from calibrate_techniques import technique_of  # noqa: E402
from published_runs import stack_attention  # noqa: E402


def counted_attention(head: int, dtype=torch.bfloat16):
    query = torch.randn(1, 2, 16, head, dtype=dtype)
    with torch.no_grad(), OperatorTally() as counted:
        torch.nn.functional.scaled_dot_product_attention(query, query, query)
    return next(group for group in counted.operators() if group.kind == "attention")


@pytest.mark.parametrize(
    ("backend", "kernel"),
    [
        ("native", "sdpa"),
        ("_native_cudnn", "cudnn"),
        ("_native_math", "math"),
        ("flash", "flash-attn"),
        ("flash_hub", "flash-attn"),
        ("flash_varlen", "flash-attn"),
        ("_flash_3", "flash-attn-3"),
        ("_flash_3_hub", "flash-attn-3"),
        ("_flash_varlen_3", "flash-attn-3"),
        ("xformers", "xformers"),
        ("sage", None),
        ("_sage_qk_int8_pv_fp8_cuda_sm90", None),
        ("flex", None),
        ("flash_4_hub", None),
    ],
)
def test_each_diffusers_backend_is_the_kernel_it_runs_or_none(backend, kernel):
    assert kernel_of("attention", {"backend": backend}) == kernel


def test_flash_attention_3_is_faster_only_where_its_ratio_was_measured():
    d128, d64 = counted_attention(128), counted_attention(64)
    assert FLASH3_OVER_FLASH == pytest.approx(631.827 / 329.483)
    assert attention_speedup("flash-attn-3", "hopper", d128, "bfloat16") == pytest.approx(1.9176, rel=1e-4)
    assert attention_speedup("flash-attn-3", "hopper", d64, "bfloat16") == 1.0  # not measured at 64
    assert attention_speedup("flash-attn-3", "hopper", d128, "float32") == 1.0
    assert attention_speedup("flash-attn-3", "ampere", d128, "bfloat16") == 1.0
    assert attention_speedup("cudnn", "hopper", d128, "bfloat16") == pytest.approx(CUDNN_OVER_FLASH)
    for same in ("flash", "flash-attn", "xformers", "efficient"):
        assert attention_speedup(same, "hopper", d128, "bfloat16") == 1.0


def test_a_flash_3_backend_divides_the_attention_time_on_an_h100():
    attention = counted_attention(128).model_copy(update={"calls": 2000})
    call = CallWork(stage="denoising", component="transformer", count=1, operators=[attention], dispatched=0, modules=0)
    work = OperatorWork(dtype="bfloat16", calls=[call])
    h100 = named_gpu("h100")
    kernel = asked_kernel([("attention", {"backend": "_flash_3"})])
    flash = predict_time(work, h100, torch_version="2.9.1")
    flash3 = predict_time(work, h100, torch_version="2.9.1", attention=kernel)
    assert kernel == "flash-attn-3" and flash3.lower_s == flash.lower_s
    assert flash3.expected_s[1] < flash.expected_s[1]


@pytest.mark.parametrize(
    ("backend", "reason"),
    [
        ("sage", "SageAttention"),
        ("sage_hub", "SageAttention"),
        ("flex", "flex_attention"),
        ("flash_4_hub", "FlashAttention-4"),
    ],
)
def test_a_backend_without_a_published_measurement_is_named_with_its_reason(backend, reason):
    why = why_untimed("attention", {"backend": backend})
    assert why is not None and reason in why
    assert why_untimed("attention", {"backend": "_flash_3"}) is None


def test_a_published_stack_names_the_kernel_with_a_measured_ratio():
    assert stack_attention({"attention": "flash-attn-3"}, "hopper") == "flash-attn-3"
    assert stack_attention({"attention": "cudnn"}, "hopper") == "cudnn"
    assert stack_attention({"attention": "xformers"}, "hopper") == "flash"
    assert stack_attention({"attention": "flash-attn-2"}, "ampere") == "flash"


def figure(stack: dict, techniques=()) -> dict:
    return {"kind": "latency", "model": "sd15", "techniques": list(techniques), "stack": stack}


def test_published_runs_are_held_out_per_attention_technique():
    assert technique_of(figure({"attention": "xformers"}))[0].startswith("attention xformers / flash-attn")
    assert technique_of(figure({"attention": "flash-attn-2"}))[0].startswith("attention xformers / flash-attn")
    assert technique_of(figure({"attention": "flash-attn-3"}))[0] == "attention flash-attn-3 (its measured ratio)"
    assert technique_of(figure({"attention": "eager"}))[0] == "attention math (scores materialized)"
    assert technique_of(figure({"attention": "sdpa"})) is None  # an eager run: the eager fit's
    assert technique_of(figure({"attention": "xformers"}, ["offload-model"])) is None
