"""`diffmeter bench` with a LoRA: a fresh peft adapter of a rank, a diffusers LoRA file, fused or not; the traced
call's operator FLOPs equal the stored profile's, so what ran is what was counted."""

import pytest
from peft import LoraConfig
from peft.utils import get_peft_model_state_dict

from diffmeter.catalog import resolve
from diffmeter.errors import DiffmeterError
from diffmeter.measure.ops import OpsTable
from diffmeter.measure.trace import OPS_FILE
from diffmeter.runs.lifecycle import bench
from diffmeter.runs.spec import BenchSpec
from diffmeter.tiny import tiny_pipeline


def traced_denoising_flops(folder) -> int:
    table = OpsTable.model_validate_json((folder / OPS_FILE).read_text())
    denoising = next(stage for stage in table.stages if stage.stage == "denoising")
    return sum(row.flops for row in denoising.rows if row.flops)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("lora")
    pipe = tiny_pipeline(resolve("tiny-flux"))
    pipe.transformer.add_adapter(LoraConfig(r=4, lora_alpha=4, target_modules=["attn.to_q", "proj_out"]))
    files = tmp_path_factory.mktemp("file")
    type(pipe).save_lora_weights(files, transformer_lora_layers=get_peft_model_state_dict(pipe.transformer))
    specs = {
        "plain": BenchSpec(model="tiny-flux", iterations=1, trace=True),
        "rank": BenchSpec(model="tiny-flux", lora_rank=8, iterations=1, trace=True),
        "fused": BenchSpec(model="tiny-flux", lora_rank=8, fuse_lora=True, iterations=1, trace=True),
        "file": BenchSpec(model="tiny-flux", lora=str(files), iterations=1, trace=True),
    }
    return {name: bench(spec, out=out) for name, spec in specs.items()}


@pytest.mark.parametrize("name", ["plain", "rank", "fused", "file"])
def test_what_ran_is_what_was_counted(runs, name):
    result, folder = runs[name]
    assert result.status == "complete"
    assert traced_denoising_flops(folder) == result.summary.flops["denoising"]


def test_an_unfused_lora_adds_compute_a_fused_one_none(runs):
    flops = {name: result.summary.flops["denoising"] for name, (result, _) in runs.items()}
    assert flops["rank"] > flops["file"] > flops["plain"] == flops["fused"]
    names = {name: folder.name for name, (_, folder) in runs.items()}
    assert "lora-r8" in names["rank"] and "lora-r8-fused" in names["fused"] and "lora-file-" in names["file"]
    assert "lora" not in names["plain"]


def test_bad_lora_input_is_refused(tmp_path):
    with pytest.raises(DiffmeterError, match="no such file"):
        BenchSpec(model="tiny-flux", lora=str(tmp_path / "missing.safetensors")).profile_spec()
    with pytest.raises(DiffmeterError, match="drop --lora-rank"):
        BenchSpec(model="tiny-flux", lora=str(tmp_path), lora_rank=4).profile_spec()


def test_without_peft_the_extra_is_named(monkeypatch):
    """peft absent (made so here: it is installed with the test extra): one line naming diffmeter[lora]."""
    import sys

    from diffmeter.loading import attach_lora

    pipe = tiny_pipeline(resolve("tiny-flux"))
    monkeypatch.setitem(sys.modules, "peft", None)
    with pytest.raises(DiffmeterError, match=r"pip install 'diffmeter\[lora\]'"):
        attach_lora(pipe, "transformer", ("attn.to_q",), 4, None, False)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--fuse-lora"], "--fuse-lora needs a LoRA"),
        (["--lora-rank", "0"], "--lora-rank must be a positive integer"),
        (["--lora", "missing.safetensors"], "no such file"),
        (["--lora-rank", "4", "--lora-targets", "nothing_here"], "adapts no linear layer"),
    ],
)
def test_bad_lora_options_are_one_line_exit_2(cli, tmp_path, monkeypatch, args, message):
    monkeypatch.chdir(tmp_path)
    for command in ("profile", "bench"):
        code, _, err = cli(command, "tiny-flux", *args, *(["--out", tmp_path / "out"] if command == "bench" else []))
        assert code == 2 and message in err and len(err.strip().splitlines()) == 1, (command, err)
    assert not (tmp_path / "out").exists()


def test_a_lora_file_diffusers_cannot_load_on_a_quantized_denoiser_is_one_line(cli, tmp_path):
    """diffusers' loader reads the denoiser's state dict for '...to_k.weight', which optimum-quanto's layers do not
    hold: a whole KeyError traceback, exit 1 (a new user's trial). One line naming the file and the quantization."""
    pipe = tiny_pipeline(resolve("tiny-flux"))
    pipe.transformer.add_adapter(LoraConfig(r=4, lora_alpha=4, target_modules=["attn.to_k"]))
    type(pipe).save_lora_weights(tmp_path / "lora", transformer_lora_layers=get_peft_model_state_dict(pipe.transformer))
    code, _, err = cli(
        "bench", "tiny-flux", "--quantize", "quanto:int8", "--lora", tmp_path / "lora", "--steps", "1",
        "--iterations", "1", "--out", tmp_path / "out",
    )  # fmt: skip
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert "load_lora_weights failed on this pipeline (its denoiser quantized at load): KeyError" in err
    assert not (tmp_path / "out").exists()
