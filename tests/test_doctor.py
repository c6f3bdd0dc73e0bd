"""`diffmeter doctor`: what this machine can measure, found by probing, never failing."""

import json

import pytest
import torch


def _hf_cache_with(tmp_path, repo_id: str):
    """A local HF cache holding ``repo_id`` with (tiny) weights for every component."""
    from diffmeter.catalog import resolve
    from diffmeter.tiny import tiny_pipeline

    repo = tmp_path / "hub" / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / "0123456789abcdef"
    tiny_pipeline(resolve("tiny-sd")).save_pretrained(snapshot)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0123456789abcdef")
    return tmp_path / "hub"


def test_doctor_reports_this_machine_and_exits_0(cli, tmp_path, monkeypatch):
    import huggingface_hub.constants as constants

    from diffmeter.catalog import resolve

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(_hf_cache_with(tmp_path, resolve("sd15").id)))
    code, out, err = cli("doctor", "--json")
    assert code == 0, err
    found = json.loads(out)
    assert found["torch"] == torch.__version__
    if not torch.cuda.is_available():
        assert found["build"] == "CPU only" and found["gpus"] == [] and found["device"] == "cpu"
        assert "no CUDA GPU" in found["energy"]["gpu"]
    sdpa = {kernel["name"]: kernel for kernel in found["sdpa_kernels"]}
    assert sdpa["math"]["dtypes"]["float32"] is None and sdpa["math"]["masks"] is True  # it really ran
    backends = {backend["name"]: backend for backend in found["attention_backends"]}
    assert backends["native"]["dtypes"]["bfloat16"] is None
    packages = {package["name"]: package for package in found["packages"]}
    assert packages["zeus"]["version"] and packages["zeus"]["install"] == "pip install 'diffmeter[energy]'"
    assert found["cached_models"] == ["sd15"] and found["catalog_models"] > 20


def test_doctor_table_names_every_section_and_keeps_install_hints_whole(cli, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "zeus" else real(name, *a))
    code, out, _ = cli("doctor")
    assert code == 0
    for text in ("torch ", "timing:", "energy, GPU:", "SDPA kernels", "attention backends", "optional packages"):
        assert text in out
    assert "Hugging Face cache:" in out
    assert "pip install 'diffmeter[energy]'" in out  # brackets are not read as console markup


def test_doctor_lists_every_optional_package_an_extra_installs():
    """Each package of the extras (energy, quant, report, parquet, onnx, ...) is in doctor's list with that
    extra as its install hint: a package added to pyproject.toml and forgotten here fails."""
    from pathlib import Path

    from diffmeter.doctor import PACKAGES

    tomllib = pytest.importorskip("tomllib")  # Python 3.11+

    extras = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    listed = {name.lower(): install for name, _, install, _ in PACKAGES}
    for extra, requirements in extras.items():
        if extra in ("test", "all", "compare"):  # the test suite's, everything, the case study's peers
            continue
        for requirement in requirements:
            name = requirement.split(">")[0].split("=")[0].split("<")[0].strip().lower()
            assert name in listed, f"doctor does not list {name} (extra {extra})"
            assert f"diffmeter[{extra}]" in listed[name], f"doctor's hint for {name} is not diffmeter[{extra}]"
