"""`profile --gpu` with --ulysses-degree/--ring-degree/--cfg-degree: one GPU's share of each denoiser call, counted by
running diffusers' own context parallelism and diffmeter's CFG layer on fake tensors over a fake process group
(no GPU: the fake group stands in for NCCL), held to rules derived apart from that run."""

import json

import pytest

from diffmeter.distributed.communication import offline
from diffmeter.distributed.rank_prediction import rank_calls
from diffmeter.families import get_family
from diffmeter.predict.devices import named_gpu, nvlinks
from diffmeter.predict.memory import settled_plan
from diffmeter.predict.operators import predict_memory_and_work
from diffmeter.predict.parallel import NOT_CALIBRATED, gpu_link, per_gpu_memory, per_gpu_work, with_communication
from diffmeter.predict.roofline import predict_time
from diffmeter.spec import ProfileSpec

FLUX = ProfileSpec(model="tiny-flux", dtype="float32")  # 64 image + 32 text tokens, 2 heads of 16, 1 + 1 blocks
FP32 = 4


def _single(spec):
    memory, work = predict_memory_and_work(spec)
    (call,) = [c for c in work.calls if c.stage == "denoising"]
    (held,) = [c for c in memory.calls if c.stage == "denoising step"]
    return memory, work, call, held


def _flops(operators, kind=None):
    return sum(g.flops * g.calls for g in operators if kind in (None, g.kind))


@pytest.mark.parametrize(("ulysses", "ring"), [(2, 1), (1, 2), (2, 2)])
def test_each_rank_attends_its_share_and_holds_the_whole_weights(ulysses, ring):
    """Ulysses gives a rank H/N heads over the whole sequence, ring S/N queries over every key: either way a rank
    computes 1/N of the attention scores; weights and the pipeline's inputs are every rank's, its activations less."""
    memory, work, single, held = _single(FLUX)
    (rank,), extra = rank_calls(FLUX, ulysses, ring, 1)
    gpus = ulysses * ring
    assert extra == 0 and rank.count == single.count
    assert _flops(rank.operators, "attention") * gpus == _flops(single.operators, "attention")
    assert sum(g.scores * g.calls for g in rank.operators) * gpus == sum(g.scores * g.calls for g in single.operators)
    assert rank.activation_bytes < held.activation_bytes
    mine = per_gpu_memory(memory, [rank])
    (step,) = [c for c in mine.calls if c.stage == "denoising step"]
    assert (step.resident_param_bytes, step.carried_bytes) == (held.resident_param_bytes, held.carried_bytes)
    assert step.peak_bytes == held.resident_param_bytes + held.carried_bytes + rank.activation_bytes
    assert mine.peak_bytes == max(c.peak_bytes for c in mine.calls)
    share = per_gpu_work(work, memory.denoisers, [rank])
    assert [c.operators for c in share.calls if c.stage != "denoising"] == [
        c.operators for c in work.calls if c.stage != "denoising"
    ]  # every rank runs the text encoders and the VAE whole


def test_ulysses_bytes_are_the_offline_count_that_a_gloo_run_measures():
    """The same all-to-alls as ``communication.offline``, whose count tests/test_multigpu.py holds to a real
    2-process gloo run's measured bytes."""
    entry, settled, _ = settled_plan(FLUX)
    (rank,), _ = rank_calls(FLUX, 2, 1, 1)
    counted = offline(entry, get_family(entry.family), settled, 2, 1)
    assert rank.received_bytes == counted.bytes_per_denoiser_call
    assert rank.collectives == counted.collectives_per_denoiser_call


def test_ring_gathers_every_ranks_keys_and_values():
    """diffusers' ring (TemplatedRingAttention) all-gathers K and V of the other rank in each of the 1 + 1 blocks
    (48 of 96 tokens x 2 heads x 16 channels each), and proj_out's gather the other rank's 32 tokens x 16 channels."""
    (rank,), _ = rank_calls(FLUX, 1, 2, 1)
    per_block = 2 * (96 // 2) * 2 * 16 * FP32
    assert rank.received_bytes == 2 * per_block + 32 * 16 * FP32
    assert rank.collectives == {"all_gather_into_tensor": 3}


def test_ring_leaves_diffusers_active_attention_backend_as_it_found_it():
    """Ring sets the flash backend on the rank's fake model, which diffusers also makes the process-wide default:
    every model counted afterwards (an LTX-2 passing masks, which flash refuses) must dispatch as before."""
    from diffusers.models.attention_dispatch import _AttentionBackendRegistry

    before = _AttentionBackendRegistry._active_backend
    rank_calls(FLUX, 1, 2, 1)
    assert _AttentionBackendRegistry._active_backend == before


def test_cfg_parallel_halves_the_batched_call_and_receives_the_other_half():
    spec = ProfileSpec(model="tiny-sd", dtype="float32")
    _, _, single, held = _single(spec)
    (rank,), extra = rank_calls(spec, 1, 1, 2)
    assert single.operators and _flops(rank.operators) * 2 == _flops(single.operators)  # batch 2 -> 1 per rank
    assert extra == 0 and rank.collectives == {"all_gather": 1}
    prediction = 4 * 16 * 16 * FP32  # one image's noise prediction: 4 latent channels at 32 px / 2 (two VAE levels)
    assert rank.received_bytes == prediction and rank.activation_bytes < held.activation_bytes


def test_the_link_is_nvlink_where_the_table_has_it_else_pcie():
    a100, l40s, a40 = named_gpu("a100"), named_gpu("l40s"), named_gpu("a40")
    assert gpu_link(a100, 4).bytes_per_s == nvlinks()[a100.name]["gb_s"] / 2 * 1e9  # both directions summed there
    assert gpu_link(l40s, 2).bytes_per_s == l40s.host_link_bytes_per_s and "no NVLink" in gpu_link(l40s, 2).name
    assert gpu_link(a40, 2).name.startswith("NVLink") and "bridge joins 2, not 4" in gpu_link(a40, 4).name


def test_communication_waits_on_the_gpu_side_of_the_denoising_stage():
    memory, work, _, _ = _single(FLUX)
    time = predict_time(work, named_gpu("a100"), weights=memory.weight_read_bytes)
    later = with_communication(time, 0.5)
    (before,), (after,) = ([s for s in t.stages if s.stage == "denoising"] for t in (time, later))
    assert after.lower_s == before.lower_s + 0.5 and later.lower_s == time.lower_s + 0.5
    gpu = before.gpu_s or before.expected_s
    assert after.expected_s == (max(gpu[0] + 0.5, before.host_s[0]), max(gpu[1] + 0.5, before.host_s[1]))
    assert later.expected_s[1] - time.expected_s[1] == pytest.approx(after.expected_s[1] - before.expected_s[1])
    assert later.energy is None and "several GPUs" in later.energy_left_out


def test_profile_gpu_predicts_each_gpu_of_a_group(cli):
    code, out, err = cli("profile", "tiny-flux", "--gpu", "a100", "--ulysses-degree", "2", "--json")
    assert code == 0, err
    found = json.loads(out)
    group = found["parallel"]
    assert group["gpus"] == 2 and group["communication_calibrated"] is False
    assert found["peak_memory_bytes"] == group["per_gpu_peak_memory_bytes"] == found["memory"]["peak_bytes"]
    assert group["communication_s"] == group["bytes_received_per_gpu"] / group["link"]["bytes_per_s"]
    assert NOT_CALIBRATED in found["time_left_out"]
    code, out, _ = cli("profile", "tiny-flux", "--gpu", "a100", "--ulysses-degree", "2")
    assert code == 0 and "= 2 GPUs; the memory below is per GPU" in out and "over NVLink 3 (12 links)" in out


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (["--ulysses-degree", "3"], "2 attention heads, not divisible by --ulysses-degree 3"),
        (["--ulysses-degree", "2", "--max-sequence-length", "33"], "'input.encoder_hidden_states' has 33 tokens"),
        (["--cfg-degree", "2"], "there is no half to split"),  # FLUX.1 is guidance-distilled
        (["--ulysses-degree", "2", "--offload", "model"], "offloading moves the denoiser between devices"),
    ],
)
def test_a_split_diffusers_refuses_is_one_line(cli, settings, message):
    code, _, err = cli("profile", "tiny-flux", "--gpu", "a100", *settings)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1


def test_a_plan_splitting_every_block_is_read_at_the_first(cli):
    """QwenImage's plan splits inputs of "transformer_blocks.*" (every block): the sequence check reads block 0."""
    code, out, err = cli("profile", "tiny-qwenimage", "--gpu", "a100", "--ulysses-degree", "2", "--cfg-degree", "2",
                         "--json")  # fmt: skip
    assert code == 0, err
    group = json.loads(out)["parallel"]
    assert group["gpus"] == 4 and any("CFG parallel" in line for line in group["assumptions"])


@pytest.mark.slow
def test_each_gpus_predicted_peaks_equal_a_real_ranks_profiler_timeline(tmp_path):
    """Two real ranks over gloo, tiny FLUX at float32 with diffusers' Ulysses: every stage's peak on each rank within
    2% of one GPU's prediction (the CPU's, without cuDNN's copies), as one process's is held. Ring cannot run here:
    PyTorch's flash kernel, the one returning the log-sum-exp ring needs, has no CPU implementation."""
    ulysses, ring = 2, 1
    from parallel_runs import rank_stage_peaks

    from diffmeter.distributed.launch import start
    from diffmeter.predict.memory import predict_memory

    ranks = start(2, rank_stage_peaks, ("tiny-flux", ulysses, ring), tmp_path)
    spec = ProfileSpec(model="tiny-flux", **ranks[0]["settings"])
    mine = per_gpu_memory(predict_memory(spec, on_cuda=False), rank_calls(spec, ulysses, ring, 1, on_cuda=False)[0])
    one = predict_memory(spec, on_cuda=False)
    for rank in ranks.values():
        for stage in mine.stages:
            assert stage.peak_bytes == pytest.approx(rank["stages"][stage.stage], rel=0.02), stage.stage
    (alone,), (split,) = ([s for s in m.stages if s.stage == "denoising step"] for m in (one, mine))
    assert split.peak_bytes < alone.peak_bytes  # the split is seen: a rank holds less than one GPU alone
