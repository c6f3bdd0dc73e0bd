"""SDPA's default attention kernel as part of the stack a time is for: cuDNN's on Hopper from torch 2.11, timed at
its published ratio over the flash kernel the calibration's runs used, where that ratio was measured."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from diffmeter.predict.attention_kernels import (
    CUDNN_OVER_FLASH,
    attention_speedup,
    head_dim,
    sdpa_default,
    with_kernel,
)
from diffmeter.predict.calibration import Calibration
from diffmeter.predict.devices import named_gpu
from diffmeter.predict.operators import OperatorTally
from diffmeter.predict.roofline import predict_time
from diffmeter.predict.schema import CallWork, OperatorGroup, OperatorWork

sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks"))
from published_runs import stack_attention  # noqa: E402


@pytest.mark.parametrize(
    ("architecture", "torch_version", "kernel"),
    [
        ("hopper", "2.11.0", "cudnn"),
        ("hopper", "2.13.0+cu130", "cudnn"),
        ("hopper", "2.10.0", "flash"),  # its bundled cuDNN is older than the 9.15 SDPA requires
        ("hopper", "2.9.1", "flash"),
        ("hopper", None, "flash"),  # a source that does not say: the calibration's kernel
        ("ampere", "2.13.0", "flash"),  # SDPA prefers cuDNN on sm90 and sm100 only
        ("blackwell", "2.13.0", "cudnn"),  # sm100 prefers it too (its ratio measured on a B200)
        ("blackwell", "2.10.0", "flash"),
        ("rtx-blackwell", "2.13.0", "flash"),  # sm120: not 9.x or 10.x
        ("turing", "2.13.0", "efficient"),  # flash and cuDNN take sm80 to sm121 only
        ("volta", "2.9.1", "efficient"),
        (None, "2.13.0", "flash"),
    ],
)
def test_sdpa_picks_cudnn_on_hopper_and_sm100_from_torch_2_11_and_efficient_before_sm80(
    architecture, torch_version, kernel
):
    assert sdpa_default(architecture, torch_version) == kernel


@pytest.mark.parametrize(
    ("architecture", "dtype", "kernel"),
    [
        ("turing", "float16", "efficient"),
        ("turing", "bfloat16", "math"),  # the memory-efficient kernel takes float16 and float32 only below sm80
        ("turing", "float32", "efficient"),
        ("hopper", "float32", "efficient"),  # flash and cuDNN take 16-bit inputs only
        ("hopper", "bfloat16", "cudnn"),
        ("ampere", "bfloat16", "flash"),
    ],
)
def test_sdpa_default_follows_the_dtype(architecture, dtype, kernel):
    assert sdpa_default(architecture, "2.13.0", dtype) == kernel


def attention_work(dtype: str) -> OperatorWork:
    attention = counted_attention(64, getattr(torch, dtype), tokens=2048).model_copy(update={"calls": 1000})
    call = CallWork(stage="denoising", component="unet", count=1, operators=[attention], dispatched=0, modules=0)
    return OperatorWork(dtype=dtype, calls=[call])


def test_a_t4_times_the_kernel_its_stack_names():
    """float16 on the memory-efficient kernel, timed as the calibration's attention; bfloat16 on the math path, its
    score matrix's passes in the bytes (the lower bound grows) as when the math kernel is asked for by name."""
    t4 = named_gpu("t4")
    half = predict_time(attention_work("float16"), t4, torch_version="2.13.0")
    assert half.stack == "torch 2.13.0, SDPA on efficient"
    t4 = t4.model_copy(update={"tflops": {**t4.tflops, "bf16": 65.0}})  # the table gives a T4 no bfloat16 peak
    bf16 = predict_time(attention_work("bfloat16"), t4, torch_version="2.13.0")
    asked = predict_time(attention_work("bfloat16"), t4, torch_version="2.13.0", attention="flash")
    math = predict_time(with_kernel(attention_work("bfloat16"), "math"), t4, torch_version="2.13.0", attention="math")
    assert bf16.stack == "torch 2.13.0, SDPA on math"
    assert bf16.stages[0].bytes == math.stages[0].bytes > asked.stages[0].bytes
    assert bf16.lower_s == math.lower_s > asked.lower_s


def counted_attention(head: int, dtype=torch.bfloat16, tokens: int = 16) -> OperatorGroup:
    query = torch.randn(1, 2, tokens, head, dtype=dtype)
    with torch.no_grad(), OperatorTally() as counted:
        torch.nn.functional.scaled_dot_product_attention(query, query, query)
    return next(group for group in counted.operators() if group.kind == "attention")


def test_the_head_dimension_is_read_from_a_counted_attentions_flops_and_scores():
    assert head_dim(counted_attention(128)) == 128
    assert head_dim(counted_attention(64)) == 64


def test_cudnn_is_faster_only_where_its_ratio_was_measured():
    d128, d64 = counted_attention(128), counted_attention(64)
    assert attention_speedup("cudnn", "hopper", d128, "bfloat16") == pytest.approx(631.338 / 329.483)
    assert attention_speedup("cudnn", "hopper", d64, "bfloat16") == 1.0  # not measured at 64
    assert attention_speedup("cudnn", "hopper", d128, "float32") == 1.0  # cuDNN's attention is half precision
    assert attention_speedup("cudnn", "ampere", d128, "bfloat16") == 1.0
    assert attention_speedup("flash", "hopper", d128, "bfloat16") == 1.0
    # a B200's own ratio: one cudnn-frontend run timing both through torch's SDPA (855.7 against 324.9 TFLOP/s)
    assert attention_speedup("cudnn", "blackwell", d128, "bfloat16") == pytest.approx(855.7 / 324.9)
    assert attention_speedup("flash-attn-3", "blackwell", d128, "bfloat16") == 1.0  # FlashAttention-3 is Hopper's


@pytest.mark.slow
def test_a_b200_is_predicted_faster_than_an_h100_on_the_same_stack():
    """On torch 2.11+ both run SDPA's cuDNN kernel; with its ratio applied on Hopper alone, Wan 2.1 14B at 720p was
    predicted slower on a B200 (1094-1641 s) than on an H100 (966-1449 s), though the ML.ENERGY data the calibration
    holds measured the B200 faster (334 s against 467 s at 480p) and so does the prediction on their torch 2.9."""
    from diffmeter.predict.operators import operator_work
    from diffmeter.predict.roofline import predict_time
    from diffmeter.spec import ProfileSpec

    work = operator_work(ProfileSpec(model="wan21-t2v-14b", steps=4))
    for version in ("2.9.1", "2.13.0"):
        h100, b200 = (predict_time(work, named_gpu(card), torch_version=version) for card in ("h100", "b200"))
        assert all(map(float.__lt__, b200.expected_s, h100.expected_s)), (version, b200.expected_s, h100.expected_s)


def test_a_hopper_run_on_torch_2_11_has_its_attention_timed_as_cudnns_and_its_bounds_unchanged():
    """The calibrated attention time (bound and per-score cost) divides by the ratio; the lower bound does not: cuDNN
    cannot beat the card's peak."""
    h100 = named_gpu("h100")
    attention = counted_attention(128).model_copy(update={"calls": 1000})
    matmul = OperatorGroup(kind="matmul", flops=10**12, bytes=10**8, calls=1)
    work = OperatorWork(
        dtype="bfloat16",
        calls=[
            CallWork(
                stage="denoising",
                component="transformer",
                count=1,
                operators=[attention, matmul],
                dispatched=0,
                modules=0,
            )
        ],
    )
    calibration = Calibration(source="t", fractions={"other": (0.5, 0.5)}, overhead_s=(0, 0), score_s=(1e-12, 1e-12))
    flash = predict_time(work, h100, calibration=calibration, torch_version="2.10.0")
    cudnn = predict_time(work, h100, calibration=calibration, torch_version="2.11.0")
    assert cudnn.lower_s == flash.lower_s
    bound = attention.flops * attention.calls / (h100.tflops["bf16"] * 1e12)
    attention_s = bound / 0.5 + attention.scores * attention.calls * 1e-12
    assert flash.expected_s[0] - cudnn.expected_s[0] == pytest.approx(attention_s * (1 - 1 / CUDNN_OVER_FLASH))
    assert (flash.stack, cudnn.stack) == ("torch 2.10.0, SDPA on flash", "torch 2.11.0, SDPA on cudnn")
    explicit = predict_time(work, h100, calibration=calibration, torch_version="2.11.0", attention="flash")
    assert explicit.expected_s == flash.expected_s  # a kernel asked for by name wins over the default


def test_a_published_figure_runs_the_kernel_its_stack_names():
    assert stack_attention({"torch": "2.11.0", "attention": "sdpa"}, "hopper") == "cudnn"
    assert stack_attention({"torch": "2.11.0", "attention": "flash-attn-2"}, "hopper") == "flash"
    assert stack_attention({"torch": "2.9.1"}, "hopper") == "flash"
    assert stack_attention({}, "hopper") == "flash"


def test_profile_says_which_stack_its_range_is_for_and_takes_the_users(cli):
    code, out, _ = cli("profile", "tiny-sd", "--gpu", "h100", "--torch-version", "2.11", "--dtype", "float16", "--json")
    assert code == 0 and json.loads(out)["time"]["stack"] == "torch 2.11, SDPA on cudnn"
    code, out, _ = cli("profile", "tiny-sd", "--gpu", "h100", "--torch-version", "2.11", "--json")
    assert code == 0 and json.loads(out)["time"]["stack"] == "torch 2.11, SDPA on efficient"  # float32
    code, out, _ = cli("profile", "tiny-sd", "--gpu", "a100", "--torch-version", "2.11", "--dtype", "float16", "--json")
    assert code == 0 and json.loads(out)["time"]["stack"] == "torch 2.11, SDPA on flash"
    code, out, _ = cli("profile", "tiny-sd", "--gpu", "t4", "--dtype", "float16", "--json")
    assert code == 0 and json.loads(out)["time"]["stack"].endswith("SDPA on efficient")  # flash needs sm80
    code, out, _ = cli("profile", "tiny-sd", "--gpu", "b200", "--torch-version", "2.11", "--dtype", "float16", "--json")
    assert code == 0 and json.loads(out)["time"]["stack"] == "torch 2.11, SDPA on cudnn"
    flash = ("profile", "tiny-sd", "--gpu", "h100", "--torch-version", "2.11", "--opt", "sdpa-kernel:kernel=flash")
    code, out, _ = cli(*flash, "--dtype", "float16", "--json")
    assert code == 0 and json.loads(out)["time"]["stack"] == "torch 2.11, SDPA on flash"
    code, _, err = cli(*flash)  # refused as bench refuses it: flash takes 16-bit inputs
    assert code == 2 and "the flash SDPA kernel takes float16/bfloat16 inputs only" in err
    code, _, err = cli("profile", "tiny-sd", "--gpu", "h100", "--torch-version", "two")
    assert code == 2 and "is not a torch version" in err and "Traceback" not in err
