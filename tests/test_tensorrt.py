"""The tensorrt technique: refused here (no CUDA, no torch_tensorrt) with its reasons; its backend
settings and rules. Building engines needs an NVIDIA GPU: benchmarks/gpu_validation.py is where it runs."""

import pytest
import torch

from diffmeter.catalog import resolve
from diffmeter.errors import DiffmeterError, MissingPackage
from diffmeter.families import get_family
from diffmeter.optimize import OptimizationSpec, Target, build, check


def _target(device: str, dtype: str = "float16") -> Target:
    """A CUDA target is only a description: support is decided before anything touches a device."""
    entry = resolve("tiny-sd")
    return Target(entry, get_family(entry.family), torch.device(device), dtype, 3)


def test_refused_on_cpu_with_the_reason():
    (technique,) = build([OptimizationSpec(name="tensorrt")])
    assert "NVIDIA GPUs; this run is on cpu" in technique.supports(_target("cpu", "float32"))
    with pytest.raises(DiffmeterError, match="cannot be used with"):
        check([technique], _target("cpu", "float32"))


def test_on_cuda_only_the_package_is_missing_here():
    (technique,) = build([OptimizationSpec(name="tensorrt")])
    assert technique.supports(_target("cuda")) is None
    if technique.missing_package() is None:
        pytest.skip("torch_tensorrt is installed here")
    with pytest.raises(MissingPackage, match=r"torch_tensorrt.*diffmeter\[tensorrt\]"):
        check([technique], _target("cuda"))


def test_backend_settings_follow_the_run_and_the_config():
    (technique,) = build([OptimizationSpec(name="tensorrt", params={"min_block_size": 3, "optimization_level": 5})])
    assert technique.options(_target("cuda", "bfloat16")) == {
        "enabled_precisions": {torch.bfloat16},
        "min_block_size": 3,
        "optimization_level": 5,
    }
    assert "optimization_level" not in build([OptimizationSpec(name="tensorrt")])[0].options(_target("cuda"))
    with pytest.raises(DiffmeterError, match="optimization_level"):
        build([OptimizationSpec(name="tensorrt", params={"optimization_level": 6})])


@pytest.mark.parametrize(("other", "clash"), [("offload", "own copy of the weights"), ("quantize", "torchao")])
def test_what_cannot_run_with_it(other, clash):
    built = build([OptimizationSpec(name="tensorrt"), OptimizationSpec(name=other)])
    technique, added = sorted(built, key=lambda technique: technique.name != "tensorrt")
    assert clash in technique.clashes([added])
    with pytest.raises(DiffmeterError, match="pick one"):
        check(build([OptimizationSpec(name="compile"), OptimizationSpec(name="tensorrt")]), _target("cuda"))


def test_listed(cli):
    code, out, _ = cli("optimizations")
    assert code == 0 and "tensorrt" in out
