"""The parallel layers composed on one model, over gloo on CPU: CFG parallelism (the two halves of each guided
step on two ranks; for pipelines that batch CFG and for those that call the denoiser twice, FLUX.1's true CFG
included; alone and with Ulysses) and tensor parallelism (each rank holding a shard of the denoiser); the
communication counted offline (`profile --ulysses-degree`/`--cfg-degree`) against closed forms."""

import json
import subprocess

import pytest
from parallel_runs import assert_same_images, cpu_spec, with_a_rank_fault

from diffmeter.errors import DiffmeterError
from diffmeter.execute import bench
from diffmeter.runs.prepared import prepare
from diffmeter.runs.storage import RESULTS, read_result


@pytest.mark.slow
def test_tensor_parallel_2_shards_the_denoiser_and_gives_the_one_process_images(tmp_path):
    """Two ranks over gloo, diffusers' sharding and collectives real (its device list extended to the CPU, which
    it leaves out: tests/rank_faults/sitecustomize.py): each rank holds less of the denoiser than the whole."""
    out = tmp_path / "out"
    environment = {**with_a_rank_fault(0, ""), "TP_ON_CPU": "1"}
    command = ["diffmeter", "bench", "tiny-flux", "--tp-degree", "2", "--steps", "2", "--iterations", "2"]
    done = subprocess.run([*command, "--out", str(out)], env=environment, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    (stored,) = out.glob(f"*tp-2*/{RESULTS}")
    result = read_result(stored.parent)
    reference, _ = bench(cpu_spec("tiny-flux", steps=2, iterations=2), out=tmp_path / "one")
    assert_same_images(result, reference)
    whole = sum(parameter.nbytes for parameter in _denoiser(reference).parameters())
    held = [rank.denoiser_parameter_bytes for rank in result.parallel.ranks]
    assert len(held) == 2 and held[0] == held[1] and 0 < held[0] < whole, (held, whole)


def _denoiser(result):
    from diffmeter.catalog import resolve
    from diffmeter.tiny import tiny_pipeline

    return tiny_pipeline(resolve(result.spec.model)).transformer


@pytest.mark.slow
@pytest.mark.parametrize(
    ("model", "settings", "processes"),
    [
        ("tiny-sd", {"cfg_degree": 2}, 2),  # batched CFG: each rank one half of the stacked batch
        ("tiny-wan", {"cfg_degree": 2, "height": 32, "width": 32}, 2),  # two denoiser calls per step
        ("tiny-wan", {"cfg_degree": 2, "ulysses_degree": 2, "height": 32, "width": 32}, 4),  # composed with Ulysses
        ("tiny-flux", {"cfg_degree": 2, "true_cfg_scale": 2.5}, 2),  # FLUX.1's true CFG: a second call per step
        ("tiny-flux", {"cfg_degree": 2, "true_cfg_scale": 2.5, "ulysses_degree": 2}, 4),
    ],
    ids=["sd", "wan", "wan-ulysses", "flux-true-cfg", "flux-true-cfg-ulysses"],
)
def test_cfg_parallel_gives_the_one_process_images(model, settings, processes, tmp_path):
    alone = {k: v for k, v in settings.items() if k in ("height", "width", "true_cfg_scale")}
    reference, _ = bench(cpu_spec(model, **alone), out=tmp_path)
    result, _ = bench(cpu_spec(model, **settings), out=tmp_path)
    assert_same_images(result, reference)
    assert result.parallel.world_size == processes and result.parallel.cfg_degree == 2
    assert result.parallel.images_identical_across_ranks is True
    assert result.summary.flops["denoising"] == reference.summary.flops["denoising"] // processes  # per GPU
    denoiser_calls = {call.denoiser_calls for call in result.iterations}
    assert denoiser_calls == {call.denoiser_calls for call in reference.iterations}  # every call made, half skipped
    communication = result.parallel.communication  # counted offline: the other half's prediction each step
    assert communication.cfg_degree == 2 and communication.cfg_bytes_per_step > 0
    assert result.parallel.scaling.one_device_run is not None  # the one-process run under the same --out


def test_cfg_parallel_is_refused_where_there_is_no_half_to_split():
    with pytest.raises(DiffmeterError, match="tiny-flux runs one denoiser call of its own batch per step"):
        prepare(cpu_spec("tiny-flux", cfg_degree=2))
    with pytest.raises(DiffmeterError, match="--guidance-scale 1 or less"):
        prepare(cpu_spec("tiny-sd", cfg_degree=2, guidance_scale=1.0))
    with pytest.raises(DiffmeterError, match="a guided step has two halves"):
        prepare(cpu_spec("tiny-sd", cfg_degree=4))
    with pytest.raises(DiffmeterError, match="PipeFusion .* run it with xDiT"):
        prepare(cpu_spec("tiny-sd", pipefusion_degree=2))


def test_offline_cfg_volume_is_the_other_halfs_prediction():
    """tiny-sd at 32 px: its UNet predicts 4 channels at 16 x 16 latents in float32: with CFG parallelism each
    GPU receives the other rank's prediction for the step's one image, 4 x 16 x 16 x 4 bytes."""
    from diffmeter.catalog import resolve
    from diffmeter.distributed.communication import offline
    from diffmeter.families import get_family

    run = prepare(cpu_spec("tiny-sd", cfg_degree=2))
    entry = resolve("tiny-sd")
    config = entry.components["unet"].config
    latent = 32 // 2 ** (len(entry.components["vae"].config["block_out_channels"]) - 1)
    moved = offline(entry, get_family(entry.family), run.spec.profile_spec().with_defaults(entry.defaults), 1, 1, 2)
    assert moved.cfg_bytes_per_step == config["out_channels"] * latent * latent * 4
    assert moved.bytes_per_step == moved.cfg_bytes_per_step and moved.bytes_per_denoiser_call == 0


def test_profile_counts_cfg_parallelism_per_gpu(cli):
    code, out, _ = cli("profile", "tiny-sd", "--cfg-degree", "2", "--json")
    split = json.loads(out)["context_parallel_per_gpu_step"]
    assert code == 0 and split["cfg_degree"] == 2 and split["flops_per_step_per_gpu"] * 2 == split["flops_per_step"]
    assert split["bytes_received_per_step_per_gpu"] == split["cfg_bytes_per_step"] == 4 * 16 * 16 * 4
    code, _, err = cli("profile", "tiny-flux", "--cfg-degree", "2")
    assert code == 2 and "no half to split" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(
    "model, extra", [("tiny-lumina2", ("--cfg-trunc-ratio", "1")), ("tiny-hunyuanimage", ())], ids=str
)
def test_offline_cfg_count_runs_a_denoiser_that_needs_its_meta_preparation(cli, model, extra):
    """Lumina 2 reads its caption lengths and HunyuanImage its masks as values: the offline count prepares them on
    meta as the MACs count does (``Call.prepare``); it raised "Cannot copy out of meta tensor"."""
    code, out, err = cli("profile", model, "--cfg-degree", "2", *extra, "--json")
    assert code == 0, err
    split = json.loads(out)["context_parallel_per_gpu_step"]
    assert split["bytes_received_per_step_per_gpu"] == split["cfg_bytes_per_step"] > 0


def test_offline_ulysses_volume_matches_its_closed_form(cli):
    """tiny-flux, 32 px, float32, Ulysses 2: each of its 1 + 1 blocks sends Q, K, V and the attention
    output through an all-to-all (each rank keeps half of its 48 of 64 + 32 tokens x 2 heads x 16
    channels), and the output projection's all-gather receives the other rank's 32 tokens x 16 channels."""
    code, out, _ = cli("profile", "tiny-flux", "--ulysses-degree", "2", "--json")
    split = json.loads(out)["context_parallel_per_gpu_step"]
    tokens, channels, blocks, fp32 = 64 + 32, 2 * 16, 1 + 1, 4
    per_block = 4 * (tokens // 2) * channels // 2 * fp32
    assert code == 0 and split["bytes_received_per_step_per_gpu"] == blocks * per_block + 32 * 16 * fp32
    assert split["collectives_per_denoiser_call"] == {"all_to_all_single": 8, "all_gather_into_tensor": 1}
    assert split["flops_per_step_per_gpu"] * 2 == split["flops_per_step"]


def test_offline_ulysses_volume_counts_the_text_tokens_asked(cli):
    """--max-sequence-length reaches the offline count: tiny-flux with 16 text tokens (its default 32) sends 64 + 16
    tokens through each all-to-all; the output projection's all-gather (image tokens only) is unchanged."""
    code, out, _ = cli("profile", "tiny-flux", "--ulysses-degree", "2", "--max-sequence-length", "16", "--json")
    split = json.loads(out)["context_parallel_per_gpu_step"]
    tokens, channels, blocks, fp32 = 64 + 16, 2 * 16, 1 + 1, 4
    per_block = 4 * (tokens // 2) * channels // 2 * fp32
    assert code == 0 and split["bytes_received_per_step_per_gpu"] == blocks * per_block + 32 * 16 * fp32


def test_profile_refuses_a_split_the_model_cannot_take(cli):
    code, _, err = cli("profile", "tiny-sd", "--ulysses-degree", "2")
    assert code == 2 and "no context-parallel plan" in err and len(err.strip().splitlines()) == 1
