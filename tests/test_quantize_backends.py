"""``--quantize [NAME=]BACKEND:TYPE``: the grammar and its one-line refusals, each backend loading real tiny pipelines
quantized as users load them (in memory, from a saved folder, from a GGUF file), bench measuring it against the
unquantized images, the refusals where a backend cannot run, and what ``optimizations`` and ``profile`` say."""

from __future__ import annotations

import json

import pytest
import torch
from gguf_file import write_gguf

from diffmeter.catalog import resolve
from diffmeter.errors import DiffmeterError, MissingPackage
from diffmeter.families import get_family
from diffmeter.loading import load_pipeline
from diffmeter.optimize import OptimizationSpec, Target, build, check
from diffmeter.optimize.options import from_flags
from diffmeter.quantization_spec import known, optimization_specs, parse
from diffmeter.runs.storage import RESULTS
from diffmeter.weights import locate_weights

QUICK = ("--steps", "2", "--iterations", "1", "-q")


def target(model: str, device: str = "cpu") -> Target:
    entry = resolve(model)
    return Target(entry, get_family(entry.family), torch.device(device), "float32", 2)


def loaded(model: str, *values: str, weights: str | None = None):
    """The tiny pipeline as bench loads it with ``--quantize values`` (checked first, as bench checks)."""
    t = target(model)
    optimizations = build(optimization_specs(list(values), weights))
    check(optimizations, t)
    configs = {name: config for o in optimizations for name, config in o.load_configs(t).items()}
    entry = t.entry
    return load_pipeline(entry, locate_weights(entry, False), t.device, "float32", quantization=configs)


def test_the_grammar_resolves_backend_type_and_component():
    assert parse("bnb:nf4").component is None
    assert parse("text_encoder_2=torchao:float8dq-row").component == "text_encoder_2"
    assert parse("gguf:q4_k_m").type == "Q4_K_M"  # a file's own spelling, whatever the case
    specs = optimization_specs(["quanto:int8", "text_encoder=quanto:int8", "vae=torchao:int8wo"])
    assert specs == [
        OptimizationSpec(name="quanto", params={"type": "int8", "components": ["denoiser", "text_encoder"]}),
        OptimizationSpec(name="torchao", params={"type": "int8wo", "components": ["vae"]}),
    ]


def test_the_old_names_are_the_technique_applied_after_loading_as_before():
    """``--quantize int8`` was OptimizationSpec(quantize, weights=int8): the same spec, so its prediction is kept."""
    assert from_flags(quantize="int8") == [OptimizationSpec(name="quantize", params={"weights": "int8"})]
    assert from_flags(quantize=["fp8"]) == [OptimizationSpec(name="quantize", params={"weights": "fp8"})]


def test_fp8dq_is_short_for_torchaos_float8_dynamic_activations():
    """``--quantize fp8dq`` (per tensor) and ``fp8dq-row`` are torchao's float8dq types at load, on any component."""
    assert optimization_specs(["fp8dq"]) == [OptimizationSpec(name="torchao", params={"type": "float8dq-tensor"})]
    assert parse("transformer=FP8DQ-row") == parse("transformer=torchao:float8dq-row")
    assert "fp8dq|fp8dq-row" in known()


def test_fp8dq_is_refused_on_this_cpu_in_one_line_with_torchaos_rule(cli, tmp_path):
    """torchao asserts compute capability 8.9 (float8/inference.py:297-305): bench says so before loading."""
    code, out, err = cli("bench", "tiny-flux", "--quantize", "fp8dq", "--steps", "1", "--out", tmp_path)
    said = (out + err).strip().splitlines()
    assert code != 0 and len(said) == 1 and "Traceback" not in out + err
    assert "compute capability 8.9+" in said[0] and "on cpu" in said[0] and "torchao:int8wo" in said[0]


def test_int4wo_on_this_cpu_says_its_kernels_are_cudas_not_to_install_them(cli, tmp_path):
    """It said "pip install mslk", CUDA kernels that would not run here either (a new user's trial)."""
    code, out, err = cli("bench", "tiny-flux", "--quantize", "torchao:int4wo", "--steps", "1", "--out", tmp_path)
    assert code == 2 and "run on CUDA, not cpu" in err and "pip install" not in err, err


@pytest.mark.parametrize("rows", [8, 16])
def test_quanto_int4_at_bfloat16_packs_only_rows_of_16_on_a_cpu(rows):
    """The rule quanto's int4 refusal states, on the real library: a bfloat16 weight in groups of 128 is packed for
    tinygemm, which this CPU does for 16 output rows and raises for 8."""
    from optimum.quanto import freeze, qint4, quantize

    model = torch.nn.Sequential(torch.nn.Linear(256, rows, dtype=torch.bfloat16))
    quantize(model, weights=qint4)
    if rows % 16:
        with pytest.raises(RuntimeError, match="dividable by 16"):
            freeze(model)
    else:
        freeze(model)
        assert type(model[0].qweight).__name__ == "TinyGemmWeightQBitsTensor"


def test_quanto_int4_at_bfloat16_is_refused_on_a_cpu_naming_the_layer(cli, tmp_path):
    """tiny-sana's timestep embedder has 8 output rows: one line before loading, the layer and the fix named."""
    code, out, err = cli(
        "bench", "tiny-sana", "--quantize", "quanto:int4", "--dtype", "bfloat16", "--steps", "1", "--out", tmp_path
    )
    said = (out + err).strip().splitlines()
    assert code != 0 and len(said) == 1 and "Traceback" not in out + err
    assert "transformer.time_embed.emb.timestep_embedder.linear_1 has 8" in said[0] and "--dtype float32" in said[0]
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize(
    ("values", "weights", "says"),
    [
        (["nope:x"], None, "unknown backend 'nope'; known: bnb:nf4|fp4|int8; gguf:"),
        (["torchao:int9"], None, "torchao has no type 'int9'; its types: int8wo, int4wo, float8wo"),
        (["nf4"], None, "write BACKEND:TYPE; known: bnb:nf4"),
        (["=bnb:nf4"], None, "name the component before '='"),
        (["text_encoder=int8"], None, "for text_encoder write text_encoder=torchao:int8wo"),
        (["bnb:nf4", "bnb:int8"], None, "names the denoiser twice (bnb:nf4, bnb:int8)"),
        (["bnb:nf4", "text_encoder=bnb:int8"], None, "asks bnb for two types"),
        (["gguf:Q8_0"], None, "add --weights FILE"),
        ([], "x.gguf", "a GGUF file is read with --quantize gguf:TYPE"),
    ],
)
def test_a_bad_quantize_value_is_one_line(values, weights, says):
    with pytest.raises(DiffmeterError, match=None) as error:
        optimization_specs(values, weights)
    assert says in str(error.value) and "\n" not in str(error.value)


def test_two_backends_on_one_component_are_refused_before_loading():
    t = target("tiny-sd")  # the denoiser is the unet: named or by default, it is the same module
    for values in (["torchao:int8wo", "unet=quanto:int8"], ["int8", "unet=quanto:int8"]):
        with pytest.raises(DiffmeterError, match="both quantize unet: keep one"):
            check(build(optimization_specs(values)), t)


@pytest.mark.parametrize(
    "spec",
    [
        OptimizationSpec(name="quanto", params={"type": "int8", "components": ["unet"]}),
        OptimizationSpec(name="quantize", params={"weights": "int8", "components": ["unet"]}),
    ],
)
def test_a_component_the_model_lacks_is_refused_naming_the_ones_it_has(spec):
    """bench said "it has no component unet" and stopped; profile named the components: both do now."""
    with pytest.raises(DiffmeterError) as error:
        check(build([spec]), target("tiny-flux"))
    said = str(error.value)
    assert "it has no component unet; its components: transformer, text_encoder, text_encoder_2, vae" in said


def test_a_missing_backend_names_its_extra(monkeypatch, tmp_path):
    """An uninstalled package cannot exist here otherwise: find_spec is told gguf is absent."""
    import importlib.util

    from diffmeter.tiny import tiny_pipeline

    write_gguf(tiny_pipeline(resolve("tiny-flux")).transformer, tmp_path / "t.gguf")
    found = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "gguf" else found(name, *a))
    (gguf,) = build([OptimizationSpec(name="gguf", params={"type": "Q8_0", "file": str(tmp_path / "t.gguf")})])
    assert "pip install 'diffmeter[gguf]'" in gguf.missing_package()
    with pytest.raises(MissingPackage):
        check([gguf], target("tiny-flux"))


def test_bitsandbytes_is_refused_on_a_cpu_with_diffusers_reason(tmp_path):
    from diffmeter.tiny import tiny_pipeline

    for kind in ("nf4", "fp4", "int8"):
        (bnb,) = build(optimization_specs([f"bnb:{kind}"]))
        with pytest.raises(DiffmeterError, match="diffusers quantizes with bitsandbytes only on a GPU"):
            check([bnb], target("tiny-flux"))
    transformer = tiny_pipeline(resolve("tiny-flux")).transformer
    transformer.save_pretrained(tmp_path)
    with pytest.raises(RuntimeError, match="No GPU found"):  # the rule the refusal repeats: diffusers' own
        type(transformer).from_pretrained(tmp_path, quantization_config=bnb.config_for(target("tiny-flux"), False))


@pytest.mark.parametrize(
    ("model", "value", "layer", "kind"),
    [
        ("tiny-flux", "torchao:int8wo", "transformer_blocks.0.attn.to_q", "Int8Tensor"),
        ("tiny-flux", "torchao:float8wo", "transformer_blocks.0.attn.to_q", "Float8Tensor"),
        ("tiny-sd", "quanto:int8", "down_blocks.1.attentions.0.transformer_blocks.0.attn1.to_q", "WeightQBytesTensor"),
        ("tiny-flux", "quanto:int4", "transformer_blocks.0.attn.to_q", "WeightQBitsTensor"),
    ],
)
def test_the_denoiser_loads_quantized_and_the_rest_does_not(model, value, layer, kind):
    pipe = loaded(model, value)
    denoiser = getattr(pipe, get_family(resolve(model).family).denoiser)
    assert type(denoiser.get_submodule(layer).weight).__name__ == kind
    for name, component in pipe.components.items():
        if isinstance(component, torch.nn.Module) and component is not denoiser:
            assert {type(p).__name__ for p in component.parameters()} == {"Parameter"}, name


def test_torchao_at_load_leaves_inductor_settings_as_it_found_them():
    """torchao's transforms set its recommended inductor flags process-wide as diffusers loads the component
    (quant_api.py:783): nothing put them back, so a later compiled run in the process inherited them."""
    import torch._inductor.config as inductor

    before = inductor.get_config_copy()
    t = target("tiny-flux")
    (technique,) = build(optimization_specs(["torchao:int8wo"]))
    configs = technique.load_configs(t)
    load_pipeline(t.entry, locate_weights(t.entry, False), t.device, "float32", quantization=configs)
    assert inductor.get_config_copy() != before
    technique.restore(None, t)
    assert inductor.get_config_copy() == before


def test_a_text_encoder_is_quantized_by_transformers_own_config():
    pipe = loaded("tiny-sd", "text_encoder=torchao:int8wo")
    linears = [m for m in pipe.text_encoder.modules() if isinstance(m, torch.nn.Linear)]
    assert linears and {type(m.weight).__name__ for m in linears} == {"Int8Tensor"}
    assert {type(p).__name__ for p in pipe.unet.parameters()} == {"Parameter"}


def test_sdnq_keeps_the_tiny_layers_whole_as_its_default_says():
    """SDNQ's minimum_allowed_numel (16384): every linear layer of tiny-flux is smaller, so none is quantized; the
    run's note says so in so many words (it said "most layers of a tiny pipeline", and the run read as a lossy
    technique with a speed-up), and counts what a real model keeps whole."""
    pipe = loaded("tiny-flux", "sdnq:uint4")
    linears = [m for m in pipe.transformer.modules() if isinstance(m, torch.nn.Linear)]
    assert linears and all(m.weight.numel() < 16384 and m.weight.dtype == torch.float32 for m in linears)
    (sdnq,) = build(optimization_specs(["sdnq:uint4"]))
    assert sdnq.note(target("tiny-flux")) == (
        f"sdnq quantizes none of the {len(linears)} linear and convolution layers here (its rules keep those under "
        "16384 weights or 32 channels whole): this run measures the unquantized pipeline"
    )
    assert sdnq.note(target("flux-dev")).startswith("sdnq keeps 11 of 504 linear and convolution layers whole")


def test_a_gguf_file_loads_through_from_single_file(tmp_path):
    """A Q8_0 file written from tiny-flux's transformer with the gguf package: its linear weights load as GGUF
    parameters of that type, and dequantize to the written weights within Q8_0's step (absmax / 127 per block of
    32; the step itself is stored in float16, so the bound is one step, not half)."""
    from diffusers.quantizers.gguf.utils import GGUFParameter, dequantize_gguf_tensor

    from diffmeter.tiny import tiny_pipeline

    plain = tiny_pipeline(resolve("tiny-flux")).transformer
    file = tmp_path / "tiny-flux-Q8_0.gguf"
    stored = write_gguf(plain, file, "Q8_0")
    pipe = loaded("tiny-flux", "gguf:Q8_0", weights=str(file))
    weight = pipe.transformer.transformer_blocks[0].attn.to_q.weight
    assert isinstance(weight, GGUFParameter) and weight.quant_type.name == "Q8_0"
    assert stored["transformer_blocks.0.attn.to_q.weight"] == "Q8_0"
    original = plain.transformer_blocks[0].attn.to_q.weight.detach()
    step = original.abs().reshape(-1, 32).amax(dim=1).max() / 127
    error = (dequantize_gguf_tensor(weight).float() - original).abs().max()
    assert 0 < error <= step


def test_a_gguf_file_of_another_type_is_refused(tmp_path):
    from diffmeter.tiny import tiny_pipeline

    file = tmp_path / "q4.gguf"
    write_gguf(tiny_pipeline(resolve("tiny-flux")).transformer, file, "Q4_0")
    (gguf,) = build(optimization_specs(["gguf:Q8_0"], str(file)))
    with pytest.raises(DiffmeterError, match="q4.gguf holds Q4_0 tensors, not Q8_0: say --quantize gguf:Q4_0"):
        check([gguf], target("tiny-flux"))
    (missing,) = build(optimization_specs(["gguf:Q8_0"], str(tmp_path / "none.gguf")))
    with pytest.raises(DiffmeterError, match="no GGUF file"):
        check([missing], target("tiny-flux"))


def test_a_gguf_file_for_the_wrong_component_or_model_is_one_line(cli, tmp_path):
    """A new user's trial: a text encoder (transformers: no from_single_file) raised KeyError '_class_name' from
    diffusers, and tiny-flux's file given to tiny-sd's UNet or tiny-flux's VAE raised SingleFileComponentError, each
    a traceback with exit 1. Now one line, exit 2, nothing stored; profile refuses the text encoder alike."""
    from diffmeter.tiny import tiny_pipeline

    file = tmp_path / "flux.gguf"
    write_gguf(tiny_pipeline(resolve("tiny-flux")).transformer, file, "Q8_0")
    out = tmp_path / "runs"
    for model, value, says in (
        ("tiny-flux", "text_encoder_2=gguf:Q8_0", "text_encoder_2 is a T5EncoderModel, which loads no single file"),
        ("tiny-sd", "gguf:Q8_0", "diffusers found no UNet2DConditionModel weights in it (the unet of this model)"),
        ("tiny-flux", "vae=gguf:Q8_0", "diffusers found no AutoencoderKL weights in it"),
        # its keys converted by another model's mapping: IndexError in diffusers' FLUX conversion (a tiny-sd3 file)
        ("tiny-sd3", "gguf:Q8_0", "could not load it as this model's transformer (SD3Transformer2DModel"),
    ):
        code, _, err = cli("bench", model, *QUICK, "--quantize", value, "--weights", file, "--out", out)
        assert code == 2 and says in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert not list(out.glob(f"*/{RESULTS}"))
    code, _, err = cli("profile", "flux-dev", "--gpu", "rtx4090", "--quantize", "text_encoder_2=gguf:Q8_0")
    assert code == 2 and "loads no single file" in err, err


def test_a_lora_fused_into_gguf_blocks_is_refused_before_loading(cli, tmp_path):
    """peft merges the adapter into the weight, which GGUF keeps packed (Q8_0: 34 bytes a 32 weights): bench raised
    "The size of tensor a (34) must match the size of tensor b (32)" after loading, and profile predicted it. Both
    refuse it in one line, naming the fix; unfused, the adapter runs beside the layers and is allowed."""
    from diffmeter.tiny import tiny_pipeline

    file = tmp_path / "flux.gguf"
    write_gguf(tiny_pipeline(resolve("tiny-flux")).transformer, file, "Q8_0")
    fused = ("--lora-rank", "4", "--fuse-lora", "--quantize", "gguf:Q8_0")
    code, _, err = cli("bench", "tiny-flux", *QUICK, *fused, "--weights", file, "--out", tmp_path / "runs")
    assert code == 2 and "--fuse-lora: peft cannot merge a LoRA into GGUF's packed blocks" in err, err
    assert "drop --fuse-lora" in err and len(err.strip().splitlines()) == 1 and not list(tmp_path.glob("runs/*/*"))
    code, _, err = cli("profile", "flux-dev", "--gpu", "h100", *fused)
    assert code == 2 and "peft cannot merge a LoRA into GGUF's packed blocks" in err
    code, _, err = cli("profile", "flux-dev", "--gpu", "h100", "--lora-rank", "4", "--quantize", "gguf:Q8_0")
    assert code == 0, err


def test_bench_measures_a_backend_against_the_unquantized_images(cli, tmp_path):
    code, _, err = cli(
        "bench", "tiny-flux", *QUICK, "--quantize", "torchao:int8wo", "--compare-baseline", "--out", tmp_path
    )
    assert code == 0, err
    folders = sorted(p.name for p in tmp_path.iterdir())
    assert len(folders) == 2 and folders[1].endswith("+opt-torchao-int8wo")
    result = json.loads((tmp_path / folders[1] / RESULTS).read_text())
    assert result["optimizations"][0]["params"] == {"type": "int8wo", "components": []}
    assert not result["optimizations"][0]["lossless"]
    assert 20 < result["quality"]["mean_psnr_db"] < 100 and result["quality"]["identical"] == 0
    assert result["prediction"]["memory_techniques"] == ["quantize-torchao-int8wo"]  # predict/quantized_memory.py
    assert "torchao-int8wo" in result["prediction"]["time_left_out"]


def test_a_saved_folder_is_quantized_by_pipeline_quantization_config(cli, saved, tmp_path):
    """From a checkpoint folder the pipeline's from_pretrained gets PipelineQuantizationConfig(quant_mapping=...)."""
    from diffmeter.tiny import tiny_pipeline

    folder, entry, _ = saved(tiny_pipeline(resolve("tiny-flux")))
    t = Target(entry, get_family(entry.family), torch.device("cpu"), "float32", 2)
    optimizations = build(optimization_specs(["quanto:int8"]))
    check(optimizations, t)
    configs = optimizations[0].load_configs(t)
    pipe = load_pipeline(entry, locate_weights(entry, False), t.device, "float32", quantization=configs)
    assert type(pipe.transformer.transformer_blocks[0].attn.to_q.weight).__name__ == "WeightQBytesTensor"
    assert pipe.transformer.config.quantization_config.weights_dtype == "int8"  # diffusers recorded its config
    code, out, err = cli("bench", folder, *QUICK, "--quantize", "quanto:int8", "--out", tmp_path / "runs")
    assert code == 0, err


def test_optimizations_lists_every_backend_with_its_cpu_and_extra():
    from diffmeter.optimize.quantization_backends import backend_rows

    rows = {row.name: row for row in backend_rows()}
    assert set(rows) == {"bnb", "gguf", "torchao", "quanto", "sdnq", "nunchaku", "bfl", "autoround", "modelopt"}
    assert rows["autoround"].folder and rows["autoround"].not_on_cpu == {}  # auto-round's torch layers run on a CPU
    assert set(rows["nunchaku"].not_on_cpu) == {"int4", "nvfp4", "awq-int4"} and rows["bfl"].not_on_cpu == {}
    assert rows["nunchaku"].folder and rows["bfl"].single_file and not rows["modelopt"].installed
    assert set(rows["modelopt"].not_on_cpu) == set(rows["modelopt"].types)
    assert set(rows["bnb"].not_on_cpu) == {"nf4", "fp4", "int8"}
    assert rows["quanto"].not_on_cpu == {} and rows["gguf"].not_on_cpu == {} and rows["sdnq"].not_on_cpu == {}
    assert set(rows["torchao"].not_on_cpu) >= {"float8dq-tensor", "float8dq-row"}
    assert "int8wo" not in rows["torchao"].not_on_cpu
    assert {row.extra for row in rows.values()} == {
        "bnb",
        "gguf",
        "quant",
        "quanto",
        "sdnq",
        "nunchaku",
        "bfl",
        "autoround",
        "modelopt",
    }


def test_a_refusal_on_this_cpu_names_a_fix_that_runs_here(cli):
    """modelopt's refusal on a CPU named torchao:float8dq-row and bnb:nf4, both refused there too; nunchaku's said
    "--device cuda", which profile does not take."""
    code, _, err = cli("profile", "tiny-flux", "--gpu", "cpu", "--quantize", "modelopt:fp8")
    assert code == 2 and err.rstrip().endswith("use quanto:int8 or torchao:int8wo"), err
    for value in ("quanto:int8", "torchao:int8wo"):
        assert cli("profile", "tiny-flux", "--gpu", "cpu", "--quantize", value)[0] == 0
    code, _, err = cli("profile", "tiny-flux", "--gpu", "cpu", "--quantize", "nunchaku:int4")
    assert code == 2 and "(bench --device cuda, profile --gpu NAME)" in err, err


def test_a_quantize_variable_is_named_and_read_with_its_file(cli, monkeypatch, tmp_path):
    """DIFFMETER_QUANTIZE's bad value is named by the variable; DIFFMETER_WEIGHTS is read with --quantize gguf:TYPE
    (each variable was checked alone: a file without its --quantize was refused)."""
    from diffmeter.tiny import tiny_pipeline

    monkeypatch.setenv("DIFFMETER_QUANTIZE", "nope:1")
    code, _, err = cli("bench", "tiny-flux", *QUICK, "--out", tmp_path)
    assert code == 2 and "DIFFMETER_QUANTIZE=nope:1: --quantize 'nope:1': unknown backend 'nope'" in err
    monkeypatch.delenv("DIFFMETER_QUANTIZE")
    write_gguf(tiny_pipeline(resolve("tiny-flux")).transformer, tmp_path / "t.gguf")
    monkeypatch.setenv("DIFFMETER_WEIGHTS", str(tmp_path / "t.gguf"))
    code, _, err = cli("bench", "tiny-flux", *QUICK, "--quantize", "gguf:Q8_0", "--out", tmp_path / "runs")
    assert code == 0, err
    assert [p.name.rpartition("+")[2] for p in (tmp_path / "runs").iterdir()] == ["opt-gguf-Q8_0-t"]


def test_a_backend_under_a_missing_parent_package_is_missing_not_a_crash(monkeypatch):
    """quanto imports as optimum.quanto: without optimum, find_spec raised ModuleNotFoundError instead of answering."""
    from diffmeter.optimize.quantize_quanto import Quanto

    monkeypatch.setattr(Quanto, "package", ("no_such_parent_package.quanto", "quanto"))
    assert Quanto.missing_package() == (
        "quanto needs the no_such_parent_package.quanto package: pip install 'diffmeter[quanto]'"
    )
