"""LoRA on the denoiser: the offline count against the real tiny pipelines with a real peft adapter (diffusers'
``add_adapter``), unfused and fused; a LoRA file's layers read from its header; memory; refusals."""

import pytest
import torch
from peft import LoraConfig
from peft.utils import get_peft_model_state_dict
from tiny_runs import TINY, quick_or_slow, tiny_call, token_settings

from diffmeter import profile
from diffmeter.errors import DiffmeterError
from diffmeter.families import get_family, lora
from diffmeter.flops.counter import count_flops
from diffmeter.lora_file import lora_layers
from diffmeter.predict.memory import predict_memory
from diffmeter.spec import ProfileSpec

# MMDiT (FLUX.1, SD3, FLUX.2 with its single-block targets), UNet, mixture-of-experts routing hooks (HiDream)
MODELS = ["tiny-flux", "tiny-sd3", "tiny-flux2", "tiny-sd", "tiny-hidream"]


def _tiny(name):
    return next(entry for entry in TINY if entry.name == name)


def counted(entry, pipe, call) -> dict[str, int]:
    components = {name: getattr(pipe, name) for name in entry.components}
    with torch.no_grad(), count_flops(components) as counts:
        call()
    return {name: sum(counts.by_module.get(name, {}).values()) // 2 for name in entry.components}


def adapted(name: str, rank: int, targets=None):
    """The real tiny pipeline with a peft LoRA on its denoiser (the family's trainer targets unless named)."""
    entry = _tiny(name)
    pipe, call, settings = tiny_call(entry)
    family = get_family(entry.family)
    config = LoraConfig(r=rank, lora_alpha=rank, target_modules=list(targets or family.lora_targets(entry)))
    getattr(pipe, family.denoiser).add_adapter(config)
    return entry, pipe, call, {**settings, **token_settings(entry, pipe)}


@pytest.mark.parametrize("name", quick_or_slow(MODELS))
def test_an_unfused_lora_counts_what_peft_runs_and_a_fused_one_the_base(name):
    entry, pipe, call, settings = adapted(name, 16)
    adapted_profile = profile(name, lora_rank=16, **settings)
    assert counted(entry, pipe, call) == {c.name: c.macs for c in adapted_profile.components}
    # the parameters peft added are in the row and the total (the parameter line's GiB), fused or not
    loaded = {name: sum(p.numel() for p in getattr(pipe, name).parameters()) for name in entry.components}
    assert {c.name: c.params for c in adapted_profile.components} == loaded
    assert adapted_profile.params == sum(loaded.values())
    base = {c.name: c.macs for c in profile(name, **settings).components}
    denoiser = get_family(entry.family).denoiser
    pipe.fuse_lora(components=[denoiser])
    assert counted(entry, pipe, call) == base
    fused = profile(name, lora_rank=16, fuse_lora=True, **settings)
    assert {c.name: c.macs for c in fused.components} == base
    assert fused.params == sum(sum(p.numel() for p in getattr(pipe, n).parameters()) for n in entry.components)
    unfused = {c.name: c.macs for c in profile(name, lora_rank=16, **settings).components}
    assert unfused[denoiser] > base[denoiser]
    assert {k: v for k, v in unfused.items() if k != denoiser} == {k: v for k, v in base.items() if k != denoiser}


@pytest.mark.parametrize(
    ("name", "targets"),
    [("tiny-wan", ("blocks.0.attn1.to_q",)), ("tiny-wan", ("blocks.1.attn1.to_k",))],
)
def test_a_lora_on_one_block_counts_that_block_alone(name, targets):
    """A LoRA on one block of a stack was counted on every block (the counter replayed the adapted block's count for
    the plain ones, or the plain one's for a later adapted block: +0), a new user's trial; peft's run is the truth."""
    entry, pipe, call, settings = adapted(name, 4, targets)
    assert counted(entry, pipe, call) == {c.name: c.macs for c in profile(name, lora_rank=4, lora_targets=targets,
                                                                          **settings).components}  # fmt: skip


def test_the_extra_is_rank_times_in_plus_out_per_token_and_layer():
    """tiny-flux at rank 16 on two targets: the extra MACs per call are r x (in + out) x tokens per adapted
    layer, tokens being the image tokens for an image-stream layer and image + text for a single block's."""
    targets = ("attn.to_q", "attn.to_add_out")
    entry = _tiny("tiny-flux")
    extra = {}
    for rank in (16, 32):
        with_lora = profile("tiny-flux", lora_rank=rank, lora_targets=targets, steps=1)
        base = profile("tiny-flux", steps=1)
        extra[rank] = with_lora.denoiser_macs_per_step - base.denoiser_macs_per_step
    assert extra[32] == 2 * extra[16] > 0  # linear in the rank
    config = entry.components["transformer"].config
    inner = config["num_attention_heads"] * config["attention_head_dim"]
    image = (entry.defaults.height // 2 // 2) * (entry.defaults.width // 2 // 2)
    text = entry.text_max_length["text_encoder_2"]
    # to_q: inner -> inner on the image tokens in a joint block, on image + text in a single one; to_add_out (joint
    # blocks only): inner -> inner on the text tokens
    joint = config["num_layers"] * (image + text) * (inner + inner)
    single = config["num_single_layers"] * (image + text) * (inner + inner)
    assert extra[16] == 16 * (joint + single)


def test_a_lora_file_is_read_from_its_header(tmp_path):
    """A LoRA saved by diffusers (save_lora_weights): its layers and ranks from the header equal the adapter's, and
    the count from the file equals the count from the same rank and targets."""
    entry, pipe, call, settings = adapted("tiny-flux", 4, targets=["attn.to_q", "attn.to_k", "proj_out"])
    type(pipe).save_lora_weights(tmp_path, transformer_lora_layers=get_peft_model_state_dict(pipe.transformer))
    layers, notes = lora_layers(tmp_path, "transformer")
    assert notes == [] and {rank for _, rank in layers} == {4}
    adapters = {path for path, _ in layers}
    assert adapters == {path for path, m in pipe.transformer.named_modules() if hasattr(m, "lora_A")}
    from_file = profile("tiny-flux", lora_layers=layers, **settings)
    assert counted(entry, pipe, call) == {c.name: c.macs for c in from_file.components}


def test_a_lora_file_made_for_another_model_is_refused_not_half_loaded(tmp_path, cli):
    """A new user's SD3 LoRA on FLUX: diffusers would load the layers both have and warn of the rest (a warning
    diffmeter's quiet libraries hide), and profile counted 4 of its layers. Its foreign layers are named, exit 2."""
    _, pipe, _, _ = adapted("tiny-sd3", 4)
    type(pipe).save_lora_weights(tmp_path, transformer_lora_layers=get_peft_model_state_dict(pipe.transformer))
    layers, _ = lora_layers(tmp_path, "transformer")
    with pytest.raises(DiffmeterError, match=f"names [0-9]+ of its {len(layers)} layers that FluxTransformer2DModel"):
        profile("tiny-flux", lora_layers=layers)
    code, _, err = cli("profile", "tiny-flux", "--lora", tmp_path)
    assert code == 2 and "it was made for another model" in err and len(err.strip().splitlines()) == 1
    assert profile("tiny-sd3", lora_layers=layers).components  # on its own model, every layer is found


def test_the_adapter_weights_are_resident_in_the_memory_prediction():
    spec = ProfileSpec(model="tiny-flux", lora_rank=8)
    base = predict_memory(ProfileSpec(model="tiny-flux"), on_cuda=False, vae_modes=())
    with_lora = predict_memory(spec, on_cuda=False, vae_modes=())
    entry = _tiny("tiny-flux")
    from diffmeter.predict.memory import meta_module

    module = meta_module(entry.components["transformer"], torch.float32)
    added = lora.adapter_params(module, tuple((t, 8) for t in lora.FLUX)) * 4
    assert added > 0
    assert with_lora.component_param_bytes["transformer"] - base.component_param_bytes["transformer"] == added
    step = next(s for s in with_lora.stages if s.stage == "denoising step")
    plain = next(s for s in base.stages if s.stage == "denoising step")
    assert step.resident_param_bytes - plain.resident_param_bytes == added


def test_a_quantized_denoisers_adapter_stays_beside_its_quantized_weights():
    """With --quantize the LoRA's weights dropped out of the prediction (FLUX.1-dev's bnb:nf4 peak 17.88 GiB with and
    without a rank-64 LoRA): a format stores the denoiser's own weights; peft's layers keep the adapter beside them
    at the run's dtype (a new user measured tiny-flux under quanto:int8 with a rank-4 LoRA: 21,504 bytes more, its
    5,376 parameters in float32), so each format's stored bytes gain the adapter's, as the unquantized ones do."""
    from diffmeter.predict.quantized_memory import split_values, with_formats
    from diffmeter.predict.techniques import peak_under, stored_params

    plain, adapted = ProfileSpec(model="tiny-flux"), ProfileSpec(model="tiny-flux", lora_rank=4)
    base, with_lora = predict_memory(plain, on_cuda=False, vae_modes=()), predict_memory(adapted, False, ())
    for value in ("quanto:int8", "bnb:nf4"):
        _, formats = split_values([value])
        base, with_lora = with_formats(base, plain, formats), with_formats(with_lora, adapted, formats)
    added = with_lora.adapter_bytes["transformer"]
    assert added == 5_376 * 4
    for technique in ("quantize-quanto-int8", "quantize-bnb-nf4", "quantize-int8"):
        grew = stored_params(with_lora, (technique,))["transformer"] - stored_params(base, (technique,))["transformer"]
        assert grew == added, technique
        assert peak_under(with_lora, (technique,)) - peak_under(base, (technique,)) == added


def test_only_the_main_denoiser_is_adapted():
    """diffusers loads a LoRA into ``transformer`` alone (Wan 2.2's low-noise expert only when asked), so the count
    and the memory adapt it alone."""
    plain = {c.name: c.macs for c in profile("tiny-wan22", steps=2).components}
    adapted_count = {c.name: c.macs for c in profile("tiny-wan22", steps=2, lora_rank=4).components}
    assert adapted_count["transformer"] > plain["transformer"]
    assert adapted_count["transformer_2"] == plain["transformer_2"]


def test_refusals():
    with pytest.raises(DiffmeterError, match="--lora-rank must be a positive integer"):
        profile("tiny-flux", lora_rank=0)
    with pytest.raises(DiffmeterError, match="--fuse-lora needs a LoRA"):
        profile("tiny-flux", fuse_lora=True)
    with pytest.raises(DiffmeterError, match="adapts no linear layer"):
        profile("tiny-flux", lora_rank=4, lora_targets=("no_such_layer",))
    with pytest.raises(DiffmeterError, match="has no LoRA adapters in diffusers"):
        profile("tiny-pixart", lora_rank=4)
    with pytest.raises(DiffmeterError, match="counts only when linear: .*conv1 \\(Conv2d\\)"):
        profile("tiny-sd", lora_rank=4, lora_targets=("to_q", "conv1"))


def test_a_dora_file_is_refused(tmp_path):
    """DoRA's magnitude vectors add work per call (peft's lora_variant.forward) that the count leaves out."""
    from safetensors.torch import save_file

    save_file(
        {
            "transformer.x.lora_A.weight": torch.zeros(4, 8),
            "transformer.x.lora_B.weight": torch.zeros(8, 4),
            "transformer.x.lora_magnitude_vector": torch.zeros(8),
        },
        str(tmp_path / "pytorch_lora_weights.safetensors"),
    )
    with pytest.raises(DiffmeterError, match="a DoRA"):
        lora_layers(tmp_path, "transformer")
