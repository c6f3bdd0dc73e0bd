"""SDPA's default attention kernel as part of the stack a time is for: cuDNN's on Hopper from torch 2.11, timed at
its published ratio over the flash kernel the calibration's runs used, where that ratio was measured."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from diffmeter.predict.attention_kernels import CUDNN_OVER_FLASH, attention_speedup, head_dim, sdpa_default
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
        ("blackwell", "2.13.0", "flash"),  # preferred there, but no measured ratio: timed as the calibration's
        (None, "2.13.0", "flash"),
    ],
)
def test_sdpa_picks_cudnn_on_hopper_from_torch_2_11(architecture, torch_version, kernel):
    assert sdpa_default(architecture, torch_version) == kernel


def counted_attention(head: int, dtype=torch.bfloat16) -> OperatorGroup:
    query = torch.randn(1, 2, 16, head, dtype=dtype)
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
    code, out, _ = cli("profile", "tiny-sd", "--gpu", "h100", "--torch-version", "2.11", "--json")
    assert code == 0 and json.loads(out)["time"]["stack"] == "torch 2.11, SDPA on cudnn"
    code, out, _ = cli("profile", "tiny-sd", "--gpu", "a100", "--torch-version", "2.11", "--json")
    assert code == 0 and json.loads(out)["time"]["stack"] == "torch 2.11, SDPA on flash"
    flash = ("profile", "tiny-sd", "--gpu", "h100", "--torch-version", "2.11", "--opt", "sdpa-kernel:kernel=flash")
    code, out, _ = cli(*flash, "--dtype", "float16", "--json")
    assert code == 0 and json.loads(out)["time"]["stack"] == "torch 2.11, SDPA on flash"
    code, _, err = cli(*flash)  # refused as bench refuses it: flash takes 16-bit inputs
    assert code == 2 and "the flash SDPA kernel takes float16/bfloat16 inputs only" in err
    code, _, err = cli("profile", "tiny-sd", "--gpu", "h100", "--torch-version", "two")
    assert code == 2 and "is not a torch version" in err and "Traceback" not in err
