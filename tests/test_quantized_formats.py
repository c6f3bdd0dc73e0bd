"""``--quantize BACKEND:TYPE`` predicted offline (predict/quantized_formats.py, quantized_layouts.py): the bytes of each
component as the backend stores it equal the bytes of the same component loaded quantized for real (tiny pipelines
through bench's loader, GGUF files written with the ``gguf`` package), counted by ``measure.stored_weights.
storages_bytes`` (what a measured run counts as its resident weights: every storage, a quantized tensor's inner ones
included); bitsandbytes, which diffusers loads only on a GPU, against its own CPU quantizers; GGUF files of catalog
models against their published sizes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml
from gguf_file import write_gguf

from diffmeter.catalog import resolve
from diffmeter.errors import DiffmeterError
from diffmeter.families import get_family
from diffmeter.loading import load_pipeline
from diffmeter.measure.stored_weights import storages_bytes
from diffmeter.optimize import Target, build, check
from diffmeter.predict.footprints import meta_module
from diffmeter.predict.gguf_city96 import file_bytes as gguf_file_bytes
from diffmeter.predict.quantized_formats import footprint, gguf_types, quantized_bytes
from diffmeter.predict.quantized_layouts import GGUF_BLOCKS, bnb_bytes, quanto_group, shared_bytes, torchao_bytes
from diffmeter.predict.schema import MemoryPrediction
from diffmeter.predict.techniques import stage_peaks_under
from diffmeter.quantization_spec import optimization_specs
from diffmeter.weights import locate_weights

PUBLISHED = Path(__file__).parent.parent / "benchmarks" / "published_quantized.yaml"


def loaded_component(model: str, value: str, dtype: str, weights: str | None = None):
    """The component ``value`` quantizes, loaded as bench loads it, and its name."""
    entry = resolve(model)
    target = Target(entry, get_family(entry.family), torch.device("cpu"), dtype, 2)
    optimizations = build(optimization_specs([value], weights))
    check(optimizations, target)
    configs = {name: config for o in optimizations for name, config in o.load_configs(target).items()}
    pipe = load_pipeline(entry, locate_weights(entry, False), target.device, dtype, quantization=configs)
    (name,) = configs
    return getattr(pipe, name), name


def predicted(model: str, name: str, value: str, dtype: str, gguf: dict | None = None) -> int:
    backend, kind = value.rpartition("=")[2].split(":")
    module = meta_module(resolve(model).components[name], getattr(torch, dtype))
    return quantized_bytes(module, backend, kind, getattr(torch, dtype), gguf)


@pytest.mark.parametrize(
    ("model", "value", "dtype"),
    [
        ("tiny-flux", "torchao:int8wo", "float32"),
        ("tiny-flux", "torchao:float8wo", "bfloat16"),
        ("tiny-flux", "quanto:int8", "float32"),
        ("tiny-flux", "quanto:int4", "float32"),
        ("tiny-flux", "quanto:int4", "bfloat16"),  # groups of 128 in bfloat16: tinygemm's layout on the CPU
        ("tiny-flux", "quanto:float8", "bfloat16"),
        ("tiny-sd", "torchao:int8wo", "bfloat16"),
        ("tiny-sd", "torchao:float8wo", "float32"),
        ("tiny-sd", "quanto:int8", "bfloat16"),
        ("tiny-sd", "quanto:int4", "float32"),
        ("tiny-sd", "text_encoder=torchao:int8wo", "float32"),  # transformers' own TorchAoConfig
        ("tiny-flux", "text_encoder_2=quanto:int8", "bfloat16"),  # T5: its float32 module "wo" left whole by quanto
        ("tiny-flux", "text_encoder_2=torchao:int8wo", "bfloat16"),  # ... and quantized by torchao (its name rule)
        ("tiny-wan", "torchao:int8wo", "bfloat16"),  # its keep-in-float32 modules left whole, in float32
        ("tiny-wan", "quanto:int8", "bfloat16"),  # quanto quantizes them all the same, at bfloat16
    ],
)
def test_the_predicted_bytes_are_the_loaded_bytes(model, value, dtype):
    module, name = loaded_component(model, value, dtype)
    assert storages_bytes([module]) == predicted(model, name, value, dtype)


@pytest.mark.parametrize(
    ("model", "kind", "dtype"),
    [
        ("tiny-flux", "Q8_0", "float32"),
        ("tiny-flux", "Q4_0", "float32"),
        ("tiny-flux", "Q5_0", "bfloat16"),
        ("tiny-flux", "Q5_1", "float32"),
        ("tiny-flux", "BF16", "float32"),
        ("tiny-flux", "F16", "float32"),  # city96's F16 files: weights in F16, biases and norms in F32
        ("tiny-flux", "Q4_K", "bfloat16"),  # K-quants: blocks of 256, random bytes (loaded, never run)
        ("tiny-flux", "Q6_K", "float32"),
        ("tiny-flux", "Q2_K", "float32"),
        ("tiny-sd", "Q4_1", "bfloat16"),
        ("tiny-wan", "Q8_0", "bfloat16"),  # its keep-in-float32 modules' tensors dequantized to float32
    ],
)
def test_a_gguf_file_predicts_the_bytes_it_loads_to(model, kind, dtype, tmp_path):
    from diffmeter.tiny import tiny_pipeline

    entry = resolve(model)
    denoiser = get_family(entry.family).denoiser
    file = tmp_path / f"{model}-{kind}.gguf"
    written = write_gguf(getattr(tiny_pipeline(entry), denoiser), file, kind)
    assert kind in written.values()
    module, name = loaded_component(model, f"gguf:{kind}", dtype, str(file))
    assert storages_bytes([module]) == predicted(model, name, f"gguf:{kind}", dtype, gguf_types(file))


def test_gguf_block_sizes_are_the_gguf_package_s():
    import gguf

    for kind, sizes in GGUF_BLOCKS.items():
        assert gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[kind]] == sizes, kind


@pytest.mark.parametrize("shape", [(96, 320), (33, 70), (3072, 64)])
@pytest.mark.parametrize("kind", ["nf4", "fp4"])
@pytest.mark.parametrize("double", [False, True])
def test_bnb_4bit_bytes_are_bitsandbytes_own(shape, kind, double):
    """diffusers refuses bitsandbytes without a GPU, so the layout is held to bitsandbytes' CPU quantizer: the packed
    weights, the absmax and the 4-bit code, and with the double quantization the nested absmax, its offset and the
    256-value map every tensor shares (counted once: ``shared_bytes``)."""
    import bitsandbytes.functional as F

    weight = torch.randn(shape, dtype=torch.bfloat16)
    packed, state = F.quantize_4bit(weight, blocksize=64, quant_type=kind, compress_statistics=double)
    tensors = [packed, state.absmax, state.code]
    if double:
        tensors += [state.state2.absmax, state.offset]
        assert shared_bytes("bnb", kind, double) == state.state2.code.nbytes
    assert sum(t.nbytes for t in tensors) == bnb_bytes(kind, *shape, double_quant=double)


def test_bnb_int8_bytes_are_bitsandbytes_own():
    import bitsandbytes.functional as F

    weight = torch.randn(40, 72, dtype=torch.float16)
    data, row_scales, _ = F.int8_vectorwise_quant(weight)
    assert data.nbytes + row_scales.nbytes == bnb_bytes("int8", 40, 72)


def test_bnb_linear_layers_quantize_in_blocks_of_64_without_double_quantization():
    """The two defaults the layout assumes: Params4bit's block and diffusers' BitsAndBytesConfig."""
    import bitsandbytes as bnb
    from diffusers import BitsAndBytesConfig

    assert bnb.nn.Linear4bit(64, 64).weight.blocksize == 64
    assert BitsAndBytesConfig(load_in_4bit=True).bnb_4bit_use_double_quant is False


@pytest.mark.parametrize("shape", [(64, 96), (40, 72)])
def test_torchao_float8_dynamic_layouts_are_torchao_s(shape):
    """Float8 dynamic activations need a GPU to quantize through diffusers; torchao's own tensor is made on the CPU
    here, and its rule that a weight with dimensions not multiples of 16 stays whole is torchao's function."""
    from torchao.quantization import PerRow, PerTensor
    from torchao.quantization.quantize_.workflows.float8.float8_tensor import Float8Tensor
    from torchao.quantization.utils import _fp8_mm_compat

    weight = torch.randn(shape, dtype=torch.bfloat16)
    for kind, granularity in (("float8dq-tensor", PerTensor()), ("float8dq-row", PerRow())):
        if not _fp8_mm_compat(weight):
            assert torchao_bytes(kind, *shape, torch.bfloat16) is None
            continue
        made = Float8Tensor.from_hp(weight, granularity=granularity)
        assert made.qdata.nbytes + made.scale.nbytes == torchao_bytes(kind, *shape, torch.bfloat16)


def test_quanto_int4_groups_are_quanto_s():
    from optimum.quanto import QLinear, qint4

    for features in (32, 256, 3072, 320, 200):
        assert QLinear(features, 16, weights=qint4).weight_group_size == quanto_group(features), features


def test_published_gguf_files_of_flux_are_predicted_within_half_a_percent():
    """city96's FLUX.1 files (helper-gathered published sizes, exact bytes): the tensor data as city96's tools lay it
    out, from the catalog's config alone."""
    if not PUBLISHED.exists():
        pytest.skip("benchmarks/published_quantized.yaml is not there")
    entries = yaml.safe_load(PUBLISHED.read_text())["file_sizes"]
    flux = [
        e
        for e in entries
        if e.get("format") == "gguf" and e.get("model") in ("flux-dev", "flux-schnell") and e["size"]["unit"] == "B"
    ]
    assert len(flux) >= 5
    modules = {m: meta_module(resolve(m).components["transformer"], torch.bfloat16) for m in {e["model"] for e in flux}}
    errors = {e["id"]: gguf_file_bytes(modules[e["model"]], e["quant_type"]) / e["size"]["value"] - 1 for e in flux}
    assert all(abs(error) < 0.005 for error in errors.values()), errors


def test_profile_predicts_a_backend_with_the_bytes_a_real_load_has(cli):
    """``profile --gpu`` on tiny-flux with quanto int8: the transformer's predicted bytes are those of the transformer
    loaded quantized; every stage's peak is the plain one's less the bytes saved, the denoising step's with a linear
    weight quanto dequantizes in its matmul (optimum/quanto library/qbytes_mm.py) where that layer runs: less than the
    largest one on top of the step's peak, which tiny-flux's largest layers (its timestep and guidance embedders' first)
    do not run at (tests/test_quantized_peaks.py holds the figure to real runs); the time leaves the technique out."""
    code, out, err = cli("profile", "tiny-flux", "--gpu", "h100", "--quantize", "quanto:int8", "--json")
    assert code == 0, err
    found = json.loads(out)
    technique = "quantize-quanto-int8"
    dtype = found["memory"]["dtype"]
    module, _ = loaded_component("tiny-flux", "quanto:int8", dtype)
    assert found["memory"]["quantized_bytes"][technique] == {"transformer": storages_bytes([module])}
    assert found["memory_techniques"] == [technique] and technique not in found["time_left_out"]  # timed
    code, out, err = cli("profile", "tiny-flux", "--gpu", "h100", "--json")
    assert code == 0, err
    plain = json.loads(out)["memory"]
    saved = plain["component_param_bytes"]["transformer"] - storages_bytes([module])
    largest = max(m.weight.numel() for m in module.modules() if isinstance(m, torch.nn.Linear))
    in_flight = largest * getattr(torch, dtype).itemsize
    expected = {s["stage"]: s["peak_bytes"] - saved for s in plain["stages"]}
    stages = stage_peaks_under(MemoryPrediction(**found["memory"]), (technique,))
    step, plain_step = stages.pop("denoising step"), expected.pop("denoising step")
    assert saved > 0 and stages == expected and plain_step <= step < plain_step + in_flight
    assert found["peak_memory_bytes"] == max(step, *stages.values())


def test_profile_says_a_gguf_type_is_predicted_as_city96s_files_are_made(cli):
    """No file is read for ``gguf:TYPE``: the memory table says whose rules lay the tensors out, and how to measure a
    file made otherwise; another backend's table does not."""
    code, out, err = cli("profile", "tiny-flux", "--gpu", "h100", "--quantize", "gguf:Q8_0")
    assert code == 0, err
    assert "GGUF: each tensor at the type city96's tools give it" in " ".join(out.split())
    code, out, err = cli("profile", "tiny-flux", "--gpu", "h100", "--quantize", "quanto:int8")
    assert code == 0 and "city96" not in out, err


def test_profile_refuses_sdnq_on_a_transformers_model_in_one_line(cli):
    code, _, err = cli("profile", "tiny-sd", "--gpu", "h100", "--quantize", "text_encoder=sdnq:int8")
    assert code == 2
    assert "sdnq:int8 on text_encoder: sdnq on a transformers model" in err and "\n" not in err.strip()


@pytest.mark.parametrize("kind", ["int8", "uint4", "int6", "uint3", "uint2", "float8_e4m3fn"])
def test_sdnq_bytes_are_the_loaded_bytes(kind, tmp_path):
    """A FLUX transformer with layers over SDNQ's 16384-weight minimum (tiny-flux's are all under it: its test below),
    saved and loaded with ``SDNQConfig`` as diffusers loads it; its class's own skip keys apply."""
    from diffusers import FluxTransformer2DModel, SDNQConfig

    config = dict(patch_size=1, in_channels=16, num_layers=1, num_single_layers=1, attention_head_dim=64)
    config |= dict(num_attention_heads=2, joint_attention_dim=96, pooled_projection_dim=48, axes_dims_rope=(16, 24, 24))
    FluxTransformer2DModel(**config).save_pretrained(tmp_path)
    loaded = FluxTransformer2DModel.from_pretrained(
        tmp_path, quantization_config=SDNQConfig(weights_dtype=kind), torch_dtype=torch.bfloat16
    )
    with torch.device("meta"):
        meta = FluxTransformer2DModel(**config).to(torch.bfloat16)
    assert any(type(m).__name__ == "SDNQLinear" for m in loaded.modules())
    assert storages_bytes([loaded]) == quantized_bytes(meta, "sdnq", kind, torch.bfloat16)


def test_sdnq_on_tiny_flux_quantizes_nothing_and_says_so():
    module, name = loaded_component("tiny-flux", "sdnq:uint4", "float32")
    assert storages_bytes([module]) == predicted("tiny-flux", name, "sdnq:uint4", "float32")
    assert storages_bytes([module]) == sum(t.nbytes for t in module.state_dict().values())


def test_one_type_on_two_components_predicts_both(cli):
    """``--quantize quanto:int8 --quantize text_encoder=quanto:int8``: one technique, the unet and the text encoder
    each as loaded quantized (the second component's figures do not replace the first's)."""
    code, out, err = cli(
        "profile", "tiny-sd", "--gpu", "h100", "--quantize", "quanto:int8", "--quantize", "text_encoder=quanto:int8",
        "--json",
    )  # fmt: skip
    assert code == 0, err
    found = json.loads(out)
    dtype = found["memory"]["dtype"]
    expected = {
        name: storages_bytes([loaded_component("tiny-sd", value, dtype)[0]])
        for name, value in (("unet", "quanto:int8"), ("text_encoder", "text_encoder=quanto:int8"))
    }
    assert found["memory"]["quantized_bytes"]["quantize-quanto-int8"] == expected
    assert found["memory_techniques"] == ["quantize-quanto-int8"]


def quantized_after_loading(model: str, name: str, value: str, dtype: str) -> torch.nn.Module:
    """The component loaded plain, then quantized as diffusers-torchao's scripts and the quanto blog do: torchao's
    ``quantize_`` or quanto's ``quantize`` + ``freeze`` on the loaded module."""
    entry = resolve(model)
    pipe = load_pipeline(entry, locate_weights(entry, False), torch.device("cpu"), dtype)
    module = getattr(pipe, name)
    backend, kind = value.split(":")
    if backend == "quanto":
        from optimum.quanto import freeze, qfloat8, qint4, qint8, quantize

        quantize(module, weights={"int8": qint8, "int4": qint4, "float8": qfloat8}[kind])
        freeze(module)
    else:
        from torchao.quantization import Int8WeightOnlyConfig, quantize_

        quantize_(module, Int8WeightOnlyConfig())
    return module


@pytest.mark.parametrize(
    ("model", "name", "value", "dtype"),
    [
        ("tiny-flux", "text_encoder_2", "quanto:int8", "bfloat16"),  # T5's float32 "wo" quantized, float32 scales
        ("tiny-sd", "unet", "quanto:int8", "float32"),  # its convolutions quantized too
        ("tiny-sd", "unet", "quanto:int4", "float32"),
        ("tiny-wan", "transformer", "torchao:int8wo", "bfloat16"),  # its keep-in-float32 modules quantized
    ],
)
def test_quantized_after_loading_predicts_the_bytes_it_leaves(model, name, value, dtype):
    """The quanto blog and the diffusers-torchao benchmarks quantize loaded modules: no skip list applies, so the
    at-load rules (T5's ``wo`` or Wan's float32 modules left whole) would over-count them."""
    module = quantized_after_loading(model, name, value, dtype)
    meta = meta_module(resolve(model).components[name], getattr(torch, dtype))
    backend, kind = value.split(":")
    assert storages_bytes([module]) == footprint(meta, backend, kind, getattr(torch, dtype), after_loading=True)[0]
    assert storages_bytes([module]) != footprint(meta, backend, kind, getattr(torch, dtype))[0]


def test_only_torchao_and_quanto_are_predicted_after_loading():
    meta = meta_module(resolve("tiny-flux").components["transformer"], torch.float32)
    with pytest.raises(ValueError, match="bnb after loading"):
        footprint(meta, "bnb", "nf4", torch.float32, after_loading=True)


def test_a_gguf_file_of_whole_f16_weights_is_f16s(tmp_path):
    """A file of F16 weights (F32 biases and norms), as the catalog's F16 files are: a new user's trial was told
    "holds F32 tensors, not BF16: say --quantize gguf:F32", a type that did not exist."""
    from diffmeter.tiny import tiny_pipeline

    entry = resolve("tiny-flux")
    write_gguf(tiny_pipeline(entry).transformer, tmp_path / "f16.gguf", "F16")
    (whole,) = build(optimization_specs(["gguf:BF16"], str(tmp_path / "f16.gguf")))
    target = Target(entry, get_family(entry.family), torch.device("cpu"), "float32", 2)
    with pytest.raises(DiffmeterError, match="f16.gguf holds F16 tensors, not BF16: say --quantize gguf:F16"):
        check([whole], target)
    (f16,) = build(optimization_specs(["gguf:F16"], str(tmp_path / "f16.gguf")))
    check([f16], target)
