"""`profile --gpu` with --ulysses-degree/--ring-degree/--cfg-degree: one GPU's share of each denoiser call, counted by
running diffusers' own context parallelism and diffmeter's CFG layer on fake tensors over a fake process group
(no GPU: the fake group stands in for NCCL), held to rules derived apart from that run."""

import json
from math import prod

import pytest

from diffmeter.distributed.communication import offline
from diffmeter.distributed.rank_prediction import rank_calls
from diffmeter.families import get_family
from diffmeter.predict.devices import named_gpu, nvlinks
from diffmeter.predict.memory import DTYPES, settled_plan
from diffmeter.predict.operators import predict_memory_and_work
from diffmeter.predict.parallel import (
    LEFT_OUT,
    NOT_CALIBRATED,
    CommunicationFit,
    Link,
    communication_fit,
    communication_seconds,
    gpu_link,
    per_gpu_memory,
    per_gpu_work,
    range_claim,
    stored_communication_fit,
    with_communication,
)
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


@pytest.mark.parametrize(
    ("spec", "degrees"),
    [
        (FLUX, (2, 1, 1, 1)),
        (FLUX, (1, 2, 1, 1)),
        (FLUX, (1, 1, 1, 2)),
        (ProfileSpec(model="tiny-sd", dtype="float32"), (1, 1, 2, 1)),
    ],
)
def test_a_ranks_compiled_call_moves_its_own_fused_bytes(spec, degrees):
    """A rank's fusible chains and their fused bytes are counted in its own fake run and replace one GPU's: at least
    1/N of them (every rank runs at least its share of the activations, the weights whole) and fewer; compiled, its
    fused kernels move fewer bytes than one GPU's."""
    from diffmeter.predict.compiled_time import FUSED_KINDS, compiled_call

    memory, work, single, _ = _single(spec)
    (rank,), _ = rank_calls(spec, *degrees)
    gpus = prod(degrees)
    assert rank.fused_chains and single.fused_bytes / gpus < rank.fused_bytes < single.fused_bytes
    (mine,) = [c for c in per_gpu_work(work, memory.denoisers, [rank]).calls if c.stage == "denoising"]
    assert (mine.fused_chains, mine.fused_bytes) == (rank.fused_chains, rank.fused_bytes)

    def fused(call):
        return sum(g.bytes * g.calls for g in compiled_call(call, "default").operators if g.kind in FUSED_KINDS)

    assert fused(mine) < fused(single)


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
    fit = communication_fit()
    assert group["gpus"] == 2 and group["communication_calibrated"] is (fit is not None)
    assert found["peak_memory_bytes"] == group["per_gpu_peak_memory_bytes"] == found["memory"]["peak_bytes"]
    assert sum(group["received_by_collective"].values()) == group["bytes_received_per_gpu"]
    received, calls = group["received_by_collective"], group["calls_by_collective"]
    link = Link(**group["link"])
    assert group["communication_s"] == communication_seconds(received, calls, link, fit)
    assert LEFT_OUT in found["time_left_out"] and (NOT_CALIBRATED in found["time_left_out"]) is (fit is None)
    code, out, _ = cli("profile", "tiny-flux", "--gpu", "a100", "--ulysses-degree", "2")
    assert code == 0 and "= 2 GPUs; the memory below is per GPU" in out and "over NVLink 3 (12 links)" in out


def test_communication_is_priced_per_collective_with_ring_passing_overlapped():
    """Each collective's latency plus its bytes at the achieved share of the link's rate; ring attention's K/V
    all-gathers (and only they) with the fitted share hidden; without a fit the datasheet rate alone."""
    link = Link(name="test link", bytes_per_s=100e9, source="test")
    received = {"all_to_all_single": 40_000_000_000, "all_gather_into_tensor": 20_000_000_000}
    calls = {"all_to_all_single": 1000, "all_gather_into_tensor": 100}
    assert communication_seconds(received, calls, link, None) == pytest.approx(0.6)
    fit = CommunicationFit(bandwidth_fraction=0.5, latency_s=1e-4, ring_overlap=0.75)
    ulysses = 1000 * 1e-4 + 40e9 / 50e9
    ring = (100 * 1e-4 + 20e9 / 50e9) * 0.25
    assert communication_seconds(received, calls, link, fit) == pytest.approx(ulysses + ring)


def test_the_communication_fit_is_used_only_where_it_beats_the_datasheet_held_out():
    """The stored fit states the committed report's held-out figures, and the prediction uses it only if, held out a
    source at a time, it has at least the datasheet rate's coverage and at most its midpoint median error."""
    from pathlib import Path

    stored = stored_communication_fit()
    report = Path(__file__).parents[1] / "benchmarks" / "results" / "calibration_parallel.md"
    rows = {line.split(" | ")[0].strip("| "): line.split(" | ")[1:4] for line in report.read_text().splitlines()}
    runs, inside, error = rows["held out a source at a time"]
    _, before_inside, before_error = rows["datasheet rate (before)"]
    assert f"{inside.split(' ')[0]} of {runs} published multi-GPU runs inside" in stored.held_out
    assert f"midpoint median error {error}" in stored.held_out
    better = int(inside.split(" ")[0]) >= int(before_inside.split(" ")[0]) and float(error[:-1]) <= float(
        before_error[:-1]
    )
    assert stored.used is better and (communication_fit() is not None) is better
    assert 0.5 <= stored.bandwidth_fraction <= 1 and 0 <= stored.ring_overlap < 1


def test_every_excluded_published_run_carries_its_reason_in_the_calibration_json():
    from pathlib import Path

    import yaml

    root = Path(__file__).parents[1] / "benchmarks"
    published = yaml.safe_load((root / "published_parallel.yaml").read_text())["runs"]
    stored = {run["id"]: run for run in json.loads((root / "results" / "calibration_parallel.json").read_text())}
    assert stored.keys() == {run["id"] for run in published}
    for run in published:
        assert stored[run["id"]].get("excluded") == run.get("excluded")
        assert ("held_out" in stored[run["id"]]) is (not run.get("excluded") and run.get("ulysses", 1) * run.get(
            "ring", 1) * run.get("cfg", 1) * run.get("tp", 1) > 1)  # fmt: skip


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (["--ulysses-degree", "3"], "2 attention heads, not divisible by --ulysses-degree 3"),
        (["--ulysses-degree", "2", "--max-sequence-length", "33"], "'input.encoder_hidden_states' has 33 tokens"),
        (["--cfg-degree", "2"], "there is no half to split"),  # FLUX.1 is guidance-distilled
        (["--ulysses-degree", "2", "--offload", "model"], "offloading moves the denoiser between devices"),
        # bench's own refusal: native SDPA cannot return the log-sum-exp ring merges with, and the fix it names
        (["--ring-degree", "2"], "'native' attention backend cannot return (diffusers raises on return_lse); use"),
    ],
)
def test_a_split_diffusers_refuses_is_one_line(cli, settings, message):
    code, _, err = cli("profile", "tiny-flux", "--gpu", "a100", *settings)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1


def test_ring_is_predicted_with_the_backend_bench_takes_for_it(cli):
    code, out, _ = cli(
        "profile", "tiny-flux", "--gpu", "a100", "--ring-degree", "2", "--opt", "attention:backend=flash",
        "--dtype", "bfloat16", "--json",
    )  # fmt: skip
    assert code == 0 and json.loads(out)["parallel"]["gpus"] == 2
    code, _, err = cli("profile", "tiny-flux", "--ring-degree", "2")  # offline: the fix it names takes the backend
    assert code == 2 and "add --gpu NAME --opt attention:backend=flash" in err


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


def test_tensor_parallel_shards_the_denoisers_planned_layers_and_all_reduces_their_outputs():
    """diffusers' FLUX plan shards every Linear of both block kinds but the norms' (tiny FLUX: 1 + 1 blocks); a rank
    holds half of each sharded weight (and of each column-wise bias), every other tensor whole; it all-reduces the
    4 row-wise outputs of the double-stream block (attention and MLP, of the 64 image and of the 32 text tokens) and
    the single block's one (all 96 tokens), 32 channels each."""
    from diffusers.hooks.tensor_parallel import resolve_tp_shard_specs

    from diffmeter.predict.memory import fake_module

    memory, work, single, held = _single(FLUX)
    (rank,), extra = rank_calls(FLUX, 1, 1, 1, 2)
    entry, _, _ = settled_plan(FLUX)
    model = fake_module(entry.components["transformer"], DTYPES["float32"])
    sharded = resolve_tp_shard_specs(model, type(model)._tp_plan, 2)
    parameters = dict(model.named_parameters())
    halves = sum(parameters[name].nbytes // 2 for name, spec in sharded.items() if spec.dim is not None)
    assert rank.param_bytes == memory.component_param_bytes["transformer"] - halves and extra == 0
    assert rank.collectives == {"all_reduce": 5}
    tokens = 64 + 32 + 64 + 32 + 96
    assert rank.received_bytes == tokens * 32 * FP32 * 2 * (2 - 1) // 2  # a ring all-reduce over 2 ranks
    # half of each sharded layer's matmul, counted on the rank's shards; the embedders, the modulation and the output
    # projection (not in the plan) whole: a little over half of one GPU's
    assert (
        _flops(single.operators, "matmul") / 2
        < _flops(rank.operators, "matmul")
        < _flops(single.operators, "matmul") * 0.6
    )
    assert _flops(rank.operators, "attention") * 2 == _flops(single.operators, "attention")  # half of the heads
    mine = per_gpu_memory(memory, [rank])
    (step,) = [c for c in mine.calls if c.stage == "denoising step"]
    assert step.resident_param_bytes == held.resident_param_bytes - halves
    assert mine.component_param_bytes["transformer"] == rank.param_bytes
    assert mine.weight_read_bytes["transformer"] == memory.weight_read_bytes["transformer"] - halves
    for call, before in zip(mine.calls, memory.calls, strict=True):
        assert call.resident_param_bytes == before.resident_param_bytes - halves


def test_profile_gpu_predicts_a_tensor_parallel_group(cli):
    code, out, err = cli("profile", "tiny-flux", "--gpu", "a100", "--tp-degree", "2", "--json")
    assert code == 0, err
    found = json.loads(out)
    group = found["parallel"]
    assert (group["tp_degree"], group["gpus"]) == (2, 2) and group["collectives_per_generation"] == 2 * 5
    code, out, err = cli("profile", "tiny-flux", "--gpu", "a100", "--json")
    alone = json.loads(out)["memory"]
    saved = alone["component_param_bytes"]["transformer"] - found["memory"]["component_param_bytes"]["transformer"]
    assert saved > 0
    for stage, before in zip(found["memory"]["stages"], alone["stages"], strict=True):
        assert stage["resident_param_bytes"] == before["resident_param_bytes"] - saved, stage["stage"]
    assert any("tensor parallel" in line for line in group["assumptions"])


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (
            ["--tp-degree", "2", "--ulysses-degree", "2"],
            "context parallelism or tensor parallelism to a model, not both",
        ),
        (["--tp-degree", "4"], "2 attention heads, not divisible by --tp-degree 4"),
        (
            ["--tp-degree", "2", "--model", "tiny-wan"],
            "has no tensor-parallel plan (_tp_plan) in diffusers (FLUX, FLUX.2 "
            "and QwenImage have one); use --ulysses-degree or bench --data-parallel",
        ),
        # a UNet has no context-parallel plan either: only data parallelism is offered (a new user's trial was sent
        # to --ulysses-degree, refused, and to --data-parallel, which profile does not take)
        (["--tp-degree", "2", "--model", "tiny-sd"], "have one); use bench --data-parallel"),
        (["--tp-degree", "2", "--quantize", "int8"], "cannot shard quantized parameters"),
        (["--tp-degree", "0"], "GPU counts: 1 or more"),
    ],
)
def test_a_tensor_parallel_split_diffusers_refuses_is_one_line(cli, settings, message):
    if "--model" in settings:
        model = settings[settings.index("--model") + 1]
        settings = [s for s in settings if s not in ("--model", model)]
    else:
        model = "tiny-flux"
    code, _, err = cli("profile", model, "--gpu", "a100", *settings)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.slow
def test_each_tensor_parallel_ranks_predicted_weights_are_what_a_gloo_rank_holds(tmp_path):
    """Two real ranks over gloo, tiny FLUX at float32 sharded by diffusers' plan as bench shards it: the bytes of the
    denoiser each holds, and what each receives in its all-reduces over a generation, are the prediction's; every
    stage's peak within 2% of the rank's predicted one (the CPU's, without cuDNN's copies), as one process's is."""
    from parallel_runs import tensor_parallel_rank

    from diffmeter.distributed.launch import start

    ranks = start(2, tensor_parallel_rank, ("tiny-flux", 2), tmp_path)
    spec = ProfileSpec(model="tiny-flux", **ranks[0]["settings"])
    calls, _ = rank_calls(spec, 1, 1, 1, 2, on_cuda=False)
    one = predict_memory_and_work(spec, on_cuda=False)[0]
    mine = per_gpu_memory(one, calls)
    for rank in ranks.values():
        assert rank["held"] == calls[0].param_bytes < one.component_param_bytes["transformer"]
        for stage in mine.stages:
            assert stage.peak_bytes == pytest.approx(rank["stages"][stage.stage], rel=0.02), stage.stage
        assert rank["calls"] == {"all_reduce": sum(c.collectives["all_reduce"] * c.count for c in calls)}
        assert rank["bytes"] == sum(c.received_bytes * c.count for c in calls)


def test_a_groups_range_quotes_its_own_held_out_figure_not_one_gpus(cli):
    """The multi-GPU range's claim is the held-out test of multi-GPU runs (parallel_communication.json's
    ``claim``, with its misses' direction), not the single-GPU eager calibration's it is built on."""
    claim = stored_communication_fit().claim
    assert "published multi-GPU runs" in claim and "misses predicted too fast" in claim
    code, out, _ = cli("profile", "tiny-flux", "--gpu", "h100 sxm", "--json")
    one = json.loads(out)["time"]["calibration"]
    code, out, err = cli("profile", "tiny-flux", "--gpu", "h100 sxm", "--ulysses-degree", "2", "--json")
    assert code == 0, err
    time = json.loads(out)["time"]
    assert time["expected_s"] and time["calibration"] == range_claim() == claim and one not in time["calibration"]
    code, out, _ = cli("profile", "tiny-flux", "--gpu", "h100 sxm", "--ulysses-degree", "2")
    said = " ".join(out.split())
    assert code == 0 and f"Expected: {claim}" in said and one not in said
