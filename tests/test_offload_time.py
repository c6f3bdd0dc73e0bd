"""Offloading's host transfers inside the expected time (``predict.offload_time``): the bytes each mode moves over the
card's host link at the achieved share of its datasheet rate that published runs of the mode imply
(``data/offload_rates.json``, written by benchmarks/calibrate_offload.py)."""

from __future__ import annotations

import json

import pytest
import torch

from diffmeter import units
from diffmeter.catalog import resolve
from diffmeter.predict.gpu_spec import chosen_gpu
from diffmeter.predict.offload_time import (
    MEMORY,
    OFFLOADS,
    call_order,
    computing_shares,
    lower_s,
    model_offload_moves,
    moved_bytes,
    rates,
    untimed_lower_s,
    why_untimed,
    with_offload,
    with_transfer_bound,
)
from diffmeter.predict.operators import predict_memory_and_work
from diffmeter.predict.roofline import predict_time
from diffmeter.predict.schema import CacheSkip
from diffmeter.spec import ProfileSpec
from diffmeter.tiny import tiny_pipeline


@pytest.fixture(scope="module")
def tiny_flux_on_l4():
    spec = ProfileSpec(model="tiny-flux", steps=3)
    memory, work = predict_memory_and_work(spec, True, ())
    gpu = chosen_gpu("L4", None)
    return memory, predict_time(work, gpu, weights=memory.weight_read_bytes), gpu


def test_the_fitted_shares_are_shares_of_the_datasheet_rate_with_their_runs_named():
    fitted = rates()
    assert set(fitted) <= set(OFFLOADS) and "offload-model" in fitted
    for mode, found in fitted.items():
        assert 0 < found["low"] <= found["midpoint"] <= found["high"] <= 1
        assert found["memory"] == MEMORY[mode] and "held out by source" in found["calibration"]


def test_model_offload_adds_its_transfers_at_the_fitted_shares_to_the_range(tiny_flux_on_l4):
    memory, time, gpu = tiny_flux_on_l4
    fitted, moved = rates()["offload-model"], moved_bytes(memory, ("offload-model",))
    assert moved == 2 * sum(memory.component_param_bytes[c] for c in {call.component for call in memory.calls})
    found = with_offload(time, memory, ("offload-model",), gpu.host_link, gpu.host_link_bytes_per_s)
    rate = gpu.host_link_bytes_per_s  # PCIe Gen4 x16: 32 GB/s per direction
    assert rate == 32e9 and found.offload.link == "PCIe Gen4 x16" and not found.offload.overlapped
    assert found.expected_s == pytest.approx(
        (time.expected_s[0] + moved / (rate * fitted["high"]), time.expected_s[1] + moved / (rate * fitted["low"]))
    )
    assert found.lower_s == pytest.approx(time.lower_s + moved / rate)  # the datasheet rate: still a lower bound
    assert found.stages == time.stages and found.energy is None and "host link" in found.energy_left_out


@pytest.fixture(scope="module")
def tiny_sd3():
    memory, _ = predict_memory_and_work(ProfileSpec(model="tiny-sd3", steps=2), True, ())
    return memory


def test_model_offload_moves_sd3s_clip_encoders_twice_as_accelerates_chain_does(tiny_sd3):
    """SD3 with CFG encodes the prompt through CLIP-L, CLIP-G and T5, then the negative prompt through all three
    again: CLIP-L comes back (its hook has no predecessor), CLIP-G's hook sends it out, T5's sends CLIP-G out, and T5,
    still on the GPU, stays: the CLIP encoders move in and out twice, T5 once."""
    encoders = ["text_encoder", "text_encoder_2", "text_encoder_3"]
    assert model_offload_moves(tiny_sd3) == [*encoders, *encoders[:2], "transformer", "vae"]
    params = tiny_sd3.component_param_bytes
    twice = 2 * (params["text_encoder"] + params["text_encoder_2"])
    once = params["text_encoder_3"] + params["transformer"] + params["vae"]
    assert moved_bytes(tiny_sd3, ("offload-model",)) == 2 * (twice + once)


def test_an_image_encoding_vae_stays_on_the_gpu_through_the_denoiser_as_its_hook_follows_the_denoisers():
    """FLUX.1 Kontext encodes its input image with the VAE before denoising, but the VAE's hook follows the
    transformer's in ``model_cpu_offload_seq``: the transformer's hook offloads the T5 encoder, not the VAE, which
    is still on the GPU to decode: every component moves once."""
    spec = ProfileSpec(model="tiny-flux-kontext", steps=2, image_sizes=((32, 32),))
    memory, _ = predict_memory_and_work(spec, True, ())
    assert call_order(memory) == ["text_encoder", "text_encoder_2", "vae", "transformer", "vae"]
    assert model_offload_moves(memory) == ["text_encoder", "text_encoder_2", "vae", "transformer"]


def test_the_offload_call_order_is_the_real_sd3_pipelines(tiny_sd3):
    """The order the moves are simulated in is the one the real pipeline calls its components in (consecutive
    calls of one component need no move: collapsed)."""
    pipe = tiny_pipeline(resolve("tiny-sd3"))
    seen = []
    names = ("text_encoder", "text_encoder_2", "text_encoder_3", "transformer")
    handles = [getattr(pipe, n).register_forward_pre_hook(lambda *_, n=n: seen.append(n)) for n in names]
    decode = pipe.vae.decode
    pipe.vae.decode = lambda *args, **kwargs: (seen.append("vae"), decode(*args, **kwargs))[1]
    with torch.no_grad():
        pipe("a cat", num_inference_steps=2, height=32, width=32, output_type="np")
    for handle in handles:
        handle.remove()

    def collapsed(order):
        return [name for i, name in enumerate(order) if i == 0 or order[i - 1] != name]

    assert collapsed(seen) == collapsed(call_order(tiny_sd3))
    assert seen.count("text_encoder") == 2  # the negative prompt encoded apart: the pipeline's default guidance


def test_group_offload_overlaps_its_transfers_with_the_compute(tiny_flux_on_l4, monkeypatch):
    """With a stream the copies run beside the compute: the longer of the two (what a fitted share would give)."""
    memory, time, gpu = tiny_flux_on_l4
    share = {"low": 1e-6, "high": 1.0, "midpoint": 1e-3, "memory": "pinned", "calibration": "held out by source: test"}
    monkeypatch.setitem(rates(), "offload-group", share)
    found = with_offload(time, memory, ("offload-group",), gpu.host_link, gpu.host_link_bytes_per_s)
    slow = moved_bytes(memory, ("offload-group",)) / (gpu.host_link_bytes_per_s * 1e-6)
    assert found.offload.overlapped and found.expected_s == (max(time.expected_s[0], found.offload.transfer_s[0]), slow)


def test_an_untimed_offloads_transfers_bound_a_cached_setting_by_the_calls_that_compute_in_full(tiny_flux_on_l4):
    """One rule for profile and fit: a skipped call onloads only the blocks it runs, so a cache's transfers are at
    least its computing calls' weights (at the most skipped share) and every other component's. The bound held none
    with a cache: FLUX.1-dev on an RTX 4070, 121.55 s under sequential offload alone, 36.88 s with a first-block
    cache, its compute alone."""
    memory, time, gpu = tiny_flux_on_l4
    chosen, rate = ("offload-sequential",), gpu.host_link_bytes_per_s
    with_transfers = lower_s(time.lower_s, memory, chosen, rate)
    assert untimed_lower_s(time, memory, chosen, rate) == with_transfers > time.lower_s
    assert with_transfer_bound(time, memory, chosen, gpu.host_link, rate).lower_s == with_transfers
    skip = CacheSkip(
        technique="first-block-cache", components=["transformer"], skipped_share=(0.2, 0.5), calls=3,
        kept_share=0.1, how="test",
    )  # fmt: skip
    cached = time.model_copy(update={"cache": skip})
    params = memory.component_param_bytes
    others = sum(c.count * params[c.component] for c in memory.calls if c.component != "transformer")
    denoiser = sum(c.count * params[c.component] for c in memory.calls if c.component == "transformer")
    least = others + denoiser * 0.5  # half the transformer's calls compute in full at the most skipped share
    assert moved_bytes(memory, chosen, computing_shares(cached)) == round(least)
    bound = with_transfer_bound(cached, memory, chosen, gpu.host_link, rate)
    assert untimed_lower_s(cached, memory, chosen, rate) == bound.lower_s == pytest.approx(time.lower_s + least / rate)
    assert time.lower_s < bound.lower_s < with_transfers
    assert "the transformer's of the 50% of its calls that compute in full alone" in bound.calibration


def test_a_mode_without_published_runs_or_a_card_without_a_link_is_left_out_with_why():
    for mode in set(OFFLOADS) - set(rates()):
        assert why_untimed((mode,), 32e9).startswith(f"{mode}: no published run of it on a named GPU")
    assert "no host link figure" in why_untimed(("offload-model",), None)
    assert why_untimed(("vae-tiling",), None) is None


def test_profile_gpu_carries_model_offload_inside_the_time_and_leaves_it_out_of_time_left_out(cli):
    code, out, err = cli("profile", "tiny-flux", "--gpu", "L4", "--steps", "3", "--offload", "model", "--json")
    assert code == 0, err
    offloaded = json.loads(out)
    code, out, _ = cli("profile", "tiny-flux", "--gpu", "L4", "--steps", "3", "--json")
    plain = json.loads(out)["time"]
    time = offloaded["time"]
    assert offloaded["time_left_out"] == [] and time["offload"]["technique"] == "offload-model"
    fast, slow = time["offload"]["transfer_s"]
    assert time["expected_s"] == pytest.approx([plain["expected_s"][0] + fast, plain["expected_s"][1] + slow])
    code, out, _ = cli("profile", "tiny-flux", "--gpu", "L4", "--steps", "3", "--offload", "model")
    said = " ".join(out.split())  # the line as printed, wrapped at the terminal's width
    # both ways: a new user's trial read twice the weights as the quantization ignored
    both = "moved per generation (each component to the GPU for its calls and back to the host after) over the PCIe"
    assert code == 0 and "offload-model: " in said and both in said
    assert "│ offload-model transfers │" in said  # a row of the time table, its expected range beside the stages


def test_an_untimed_offloads_transfers_are_a_row_so_the_lower_bound_column_adds_up(cli):
    """Sequential offload on FLUX.1-dev: its stages' lower bounds summed to 84.05 s under a whole generation of
    121.55 s, the transfers in the prose alone (a new user's trial)."""
    code, out, err = cli("profile", "tiny-flux", "--gpu", "RTX 4070", "--offload", "sequential", "--json")
    assert code == 0, err
    time = json.loads(out)["time"]
    beyond = time["lower_s"] - sum(stage["lower_s"] for stage in time["stages"])
    assert beyond > 0 and time["offload"] is None
    code, out, _ = cli("profile", "tiny-flux", "--gpu", "RTX 4070", "--offload", "sequential")
    (row,) = [line for line in out.splitlines() if "offload transfers beyond compute" in line]
    assert units.seconds(beyond) in row
    code, out, _ = cli("profile", "tiny-flux", "--gpu", "RTX 4070")
    assert code == 0 and "offload transfers beyond compute" not in out


def test_benchs_stored_prediction_of_a_model_offload_run_holds_its_transfers(monkeypatch):
    """A CUDA run's stored prediction (``bench_prediction.predict_run``) takes the offload into its time as profile
    does. The GPU's name cannot be asked here: the run's device figures are the L4's table row (a stand-in for
    ``torch.cuda.get_device_name``)."""
    import diffmeter.predict.bench_prediction as stored
    from diffmeter.runs.results import AppliedOptimization
    from diffmeter.runs.spec import BenchSpec

    monkeypatch.setattr(stored, "run_device", lambda device, *dtypes: chosen_gpu("L4", None))
    spec = BenchSpec(model="tiny-flux", steps=3, device="cuda", dtype="bfloat16", predict=False)
    offload = AppliedOptimization(
        name="offload", label="offload", kind="memory", lossless=True, params={"mode": "model"}
    )
    found = stored.predict_run(spec, [offload], None)
    assert found.time.offload.technique == "offload-model" and found.time_left_out == []
    plain = stored.predict_run(spec, [], None)
    moved = found.time.offload.moved_bytes
    assert found.time.lower_s == pytest.approx(plain.time.lower_s + moved / 32e9)
