"""`fit` combining the speed-ups with the memory settings as bench can, ranked by the expected time
(``runs/fit_speedups.py``): the command's JSON and table on tiny-flux, and a setting whose time is not modelled
named and kept out of the ranking."""

from __future__ import annotations

import json

import pytest
import torch
from diffusers.hooks import FirstBlockCacheConfig

from diffmeter import units
from diffmeter.catalog import resolve
from diffmeter.optimize import OptimizationSpec, build
from diffmeter.optimize.options import parse_opt
from diffmeter.predict.compiled_time import compiled_work
from diffmeter.predict.devices import named_gpu
from diffmeter.predict.operators import predict_memory_and_work
from diffmeter.predict.roofline import predict_time
from diffmeter.runs.fit_speedups import SettingWork, Timed, quicker_borderline, rank_key, ranked, timed
from diffmeter.spec import ProfileSpec


def middle(pair):
    return (pair[0] * pair[1]) ** 0.5


@pytest.fixture(scope="module")
def tiny():
    spec = ProfileSpec(model="tiny-flux", steps=2)
    memory, work = predict_memory_and_work(spec)
    return spec, memory, work, SettingWork(work, memory, spec, tuple(memory.denoisers))


def test_fit_offers_compile_and_the_cache_and_ranks_by_expected_time(cli):
    # bfloat16: torchao's per-row float8 quantizes only bfloat16 weights (quantize_torchao.BFLOAT16_ONLY)
    code, out, err = cli("fit", "tiny-flux", "--gpu", "h100", "--json", "--steps", "2", "--dtype", "bfloat16")
    assert code == 0, err
    fits = json.loads(out)["fits"]
    found = {tuple(row["techniques"]): row for row in fits}
    compiled = ("compile",), ("compile-reduce-overhead",)
    speedups = {(), *compiled, ("first-block-cache",), ("compile", "first-block-cache")}
    # fp8 matmuls on an H100's FP8 tensor cores: a memory saving listed only where predicted faster than without
    fp8dq = "quantize-torchao-float8dq-row"
    assert speedups <= set(found) <= speedups | {(fp8dq, *chosen) for chosen in speedups}
    faster = [c[1:] for c in found if c[:1] == (fp8dq,)]
    assert all(middle(found[(fp8dq, *c)]["expected_s"]) < middle(found[c]["expected_s"]) for c in faster)
    middles = [middle(row["expected_s"]) for row in fits]
    assert middles == sorted(middles) and all(row["not_ranked"] is None for row in fits)
    assert middle(found[("compile",)]["expected_s"]) < middle(found[()]["expected_s"])
    assert found[("first-block-cache",)]["quality"] == "not measured" and found[("compile",)]["quality"] == "lossless"
    # CUDA graphs' pool not counted
    assert all(row["peak_bytes"] == found[(fp8dq,) if fp8dq in row["techniques"] else ()]["peak_bytes"] for row in fits)
    refused = [tuple(r["techniques"]) for r in json.loads(out)["refused_by_bench"]]
    assert ("compile-reduce-overhead", "first-block-cache") not in found and not refused  # bench refuses the pair
    code, out, _ = cli("fit", "tiny-flux", "--gpu", "h100", "--steps", "2")
    assert code == 0 and "setting (by expected time)" in out and "compile:mode=reduce-overhead" in out
    assert "tiny-flux (32x32 px (WxH), 2 steps, batch 1) on H100 SXM" in out  # the settings the times are of


def test_fit_names_each_speed_up_with_the_parameters_bench_runs_it_with(cli):
    """The cache's threshold (diffusers' own default) and compile's mode, in the table and in --json as bench's
    --opt takes them."""
    threshold = FirstBlockCacheConfig().threshold
    code, out, err = cli("fit", "tiny-flux", "--gpu", "h100", "--json", "--steps", "2")
    assert code == 0, err
    asked = {tuple(row["techniques"]): [parse_opt(o) for o in row["optimizations"]] for row in json.loads(out)["fits"]}
    assert asked[()] == []
    assert asked[("compile-reduce-overhead",)] == [OptimizationSpec(name="compile", params={"mode": "reduce-overhead"})]
    assert asked[("compile", "first-block-cache")] == [
        OptimizationSpec(name="compile", params={"mode": "default"}),
        OptimizationSpec(name="first-block-cache", params={"threshold": threshold}),
    ]
    (compiled, cached) = build(asked[("compile", "first-block-cache")])  # bench takes them, as its defaults
    assert compiled.config == type(compiled.config)() and cached.config == type(cached.config)()
    code, out, _ = cli("fit", "tiny-flux", "--gpu", "h100", "--steps", "2")
    assert code == 0 and f"compile:mode=default + first-block-cache:threshold={threshold}" in " ".join(out.split())


def test_a_compiled_settings_time_is_profiles(tiny):
    """The time fit gives a compiled setting is the plain work compiled, as `profile --opt compile` times it."""
    spec, memory, work, setting_work = tiny
    h100 = named_gpu("H100 SXM")
    found = timed(setting_work, ("compile-reduce-overhead",), h100)
    direct = predict_time(
        compiled_work(work, ("transformer",), "reduce-overhead"), h100, weights=memory.weight_read_bytes
    )
    assert found.time.expected_s == direct.expected_s and found.why is None


def test_a_setting_whose_time_is_not_modelled_says_why_and_follows_the_ranked(tiny):
    spec, memory, work, setting_work = tiny
    h100 = named_gpu("H100 SXM")
    untimed = timed(setting_work, ("quantize-bnb-int8",), h100)  # LLM.int8's outlier decomposition: not modelled
    assert untimed.time is None and untimed.midpoint is None and "quantize-bnb-int8" in untimed.why
    plain, compiled = timed(setting_work, (), h100), timed(setting_work, ("compile",), h100)
    times = {(): plain, ("compile",): compiled, ("quantize-bnb-int8",): untimed}
    rows = [(("quantize-bnb-int8",), 1, 0.0), ((), 1, plain.time.lower_s), (("compile",), 1, compiled.time.lower_s)]
    order = [row[0] for row in ranked(rows, times)]
    assert order == [("compile",), (), ("quantize-bnb-int8",)]  # the smallest lower bound, yet not ranked
    assert Timed(why="x").midpoint is None
    # a faster setting whose peak is within the memory prediction's checked error of what is left may not fit in a
    # real run: the slower one with room to spare ranks first, and the count of such faster ones hidden is said
    usable = 100 * 2**30
    close, roomy = (("compile",), usable - 2**20, compiled.time.lower_s), ((), usable // 2, plain.time.lower_s)
    assert [row[0] for row in ranked([close, roomy], times, usable)] == [(), ("compile",)]
    assert [row[0] for row in ranked([close, roomy], times)] == [("compile",), ()]  # no memory: by time alone
    assert quicker_borderline([close], (), times, usable) == 1 and quicker_borderline([roomy], (), times, usable) == 0
    # a borderline setting with a range still ranks before one with room to spare and none (the not-ranked follow)
    spare_untimed = (("quantize-bnb-int8",), usable // 2, 0.0)
    assert [row[0] for row in ranked([spare_untimed, close], times, usable)] == [("compile",), ("quantize-bnb-int8",)]
    # the leaderboard's setting and fastest rank by the same key
    assert rank_key(usable // 2, usable, 9.0, None) < rank_key(usable - 2**20, usable, 1.0, None)
    assert rank_key(usable - 2**20, usable, 9.0, None) < rank_key(usable // 2, usable, None, 1.0)


def test_fit_quotes_the_held_out_figure_of_every_range_it_shows_as_profile_does(cli):
    """Every expected range fit printed came with no held-out figure (profile --gpu prints each beside its time):
    the eager calibration's, compile's and the cache's, in the table and in --json."""
    code, out, err = cli("fit", "tiny-flux", "--gpu", "h100", "--json", "--steps", "2", "--dtype", "bfloat16")
    assert code == 0, err
    claims, fits = json.loads(out)["held_out"], json.loads(out)["fits"]
    fp8dq = any("quantize-torchao-float8dq-row" in row["techniques"] for row in fits)  # shown where it is faster
    code, out, _ = cli("profile", "tiny-flux", "--gpu", "h100", "--steps", "2", "--json", "--opt", "compile")
    eager = json.loads(out)["time"]["calibration"]
    marker = "held out a source at a time"
    assert eager.count(marker) == 1  # profile's claim, quoted from there on
    # whose fit it is stays beside the figure (an RTX 4070's line read as the figure of all 225 runs)
    assert "published eager runs on hopper GPUs" in eager
    assert claims[0] == f"the eager range (hopper GPUs' fit): {eager[eager.index(marker) :]}"
    named = ["compile", "first-block-cache"] + ["torchao:float8dq-row"] * fp8dq
    assert [claim.split(": ")[0] for claim in claims[1:]] == named
    assert "calibration_techniques.md" in claims[1] and "calibration_caches.md" in claims[2]
    code, out, _ = cli("fit", "tiny-flux", "--gpu", "h100", "--steps", "2")
    said = " ".join(out.split())
    assert code == 0 and "Held out: the eager range (hopper GPUs' fit): held out a source at a time (" in said


def test_an_untimed_offloads_bound_holds_the_settings_speed_ups_as_profile_bounds_it(cli):
    """Group offload has no fitted link rate: fit bounded "offload-group + compile" (and + first-block-cache) by the
    plain pipeline's compute, which compile's fusion and a cache's skipped calls beat (flux-dev on an RTX 4070:
    84.05 s for group offload with the cache); now by the setting's own work, as `profile --gpu` bounds it."""
    card = "2GB,5TFLOPS,0.1TB/s,arch=ampere,link=32GB/s"  # sd15 needs offload; compute outlasts the transfers
    code, out, err = cli("fit", "sd15", "--gpu-spec", card, "--steps", "4", "--all-settings", "--json")
    assert code == 0, err
    found = {tuple(row["techniques"]): row for row in json.loads(out)["fits"]}
    compiled, plain = found[("offload-group", "compile")], found[("offload-group",)]
    assert compiled["expected_s"] is None and "offload-group: " in compiled["not_ranked"]
    code, out, _ = cli("profile", "sd15", "--gpu-spec", card, "--steps", "4", "--offload", "group", "--opt", "compile",
                       "--json")  # fmt: skip
    assert code == 0 and compiled["lower_s"] == json.loads(out)["time"]["lower_s"] < plain["lower_s"]


def test_a_cached_setting_with_an_untimed_offload_is_bounded_by_its_computing_calls_transfers():
    """A skipped call onloads only the blocks it runs: every call's transfers would overstate the bound, none (its
    compute alone) understate it: the text encoders', the decoder's and the denoiser's calls that compute in full at
    the most skipped share still move their weights."""
    from diffmeter.predict.offload_time import computing_shares, lower_s
    from diffmeter.runs.fitting import plain_time

    spec = ProfileSpec(model="tiny-flux", steps=28)  # at diffusers' default threshold, up to 8 of 28 calls skip
    memory, work = predict_memory_and_work(spec)
    setting_work = SettingWork(work, memory, spec, tuple(memory.denoisers))
    gpu = named_gpu("RTX 4070")
    chosen = ("offload-group", "first-block-cache")
    found = timed(setting_work, chosen, gpu)
    cached, _ = setting_work.of(chosen)
    assert found.time is None and found.why.startswith("offload-group: ")
    plain = plain_time(cached, memory, gpu)
    assert plain.cache.skipped_share[1] == pytest.approx(8 / 28)
    every_call = lower_s(plain.lower_s, memory, chosen, gpu.host_link_bytes_per_s)  # tiny: the transfers outlast it
    computing = lower_s(plain.lower_s, memory, chosen, gpu.host_link_bytes_per_s, computing_shares(plain))
    assert plain.lower_s < found.lower == computing < every_call


def test_the_fp8_text_encoders_casts_are_timed_and_its_settings_ranked_in_fit_as_in_profile(cli):
    """Settings with the fp8 text encoder had a lower bound and no range, so fit ranked them after every timed one:
    on an RTX 4080 the only settings that fit FLUX.1-dev without offload came 39th of 75, below offloaded ones (a
    new user's finding). Each encoder call now casts its hooked layers to the compute dtype and back, as diffusers'
    LayerwiseCastingHook does: two copies of each float8 parameter, each charged the compute dtype's width per
    element for its operand and its output; the setting is ranked by its range, the same in fit and profile."""
    from diffusers.hooks import apply_layerwise_casting

    from diffmeter.pipelines import FP8_SKIP_MODULES_PATTERN
    from diffmeter.predict.devices import CUDA_HOLDBACK_BYTES
    from diffmeter.predict.memory import predict_memory
    from diffmeter.predict.techniques import peak_under
    from diffmeter.tiny import tiny_pipeline

    memory = predict_memory(ProfileSpec(model="tiny-flux", steps=2))
    between = (peak_under(memory, ("fp8-text-encoder",)) + memory.peak_bytes) // 2  # fits only with it
    card = f"{(CUDA_HOLDBACK_BYTES + between) / 2**30:.9f}GB,100TFLOPS,1TB/s,arch=hopper,link=64GB/s"
    code, out, err = cli("fit", "tiny-flux", "--steps", "2", "--json", "--gpu-spec", card)
    assert code == 0, err
    fits = json.loads(out)["fits"]  # without offloading: under it the encoder's smaller weights may be faster too
    rows = {tuple(r["techniques"]): r for r in fits if r["techniques"][:1] == ["fp8-text-encoder"]}
    with_it = ("fp8-text-encoder",)
    assert set(rows) >= {with_it, (*with_it, "compile"), (*with_it, "first-block-cache")}
    assert all(r["expected_s"] and r["not_ranked"] is None for r in rows.values())
    stages = {}
    for flags in ((), ("--fp8-text-encoder",)):
        code, out, _ = cli("profile", "tiny-flux", "--steps", "2", "--json", "--gpu-spec", card, *flags)
        time = json.loads(out)["time"]
        stages[flags] = {stage["stage"]: stage["bytes"] for stage in time["stages"]}
    assert time["expected_s"] == pytest.approx(rows[with_it]["expected_s"], rel=1e-9)
    # the casts' bytes, from the real tiny pipeline's encoder as bench stores it (optimize/fp8_text_encoder.py)
    encoder = tiny_pipeline(resolve("tiny-flux")).text_encoder_2
    apply_layerwise_casting(encoder, torch.float8_e4m3fn, torch.float32, skip_modules_pattern=FP8_SKIP_MODULES_PATTERN)
    hooked = sum(p.numel() for p in encoder.parameters() if p.dtype == torch.float8_e4m3fn)
    assert hooked > 0
    plain, cast = stages[()], stages[("--fp8-text-encoder",)]
    assert cast["text_encoding"] - plain["text_encoding"] == hooked * 2 * 2 * 4  # 2 casts, operand + output, fp32
    assert {k: v for k, v in cast.items() if k != "text_encoding"} == {
        k: v for k, v in plain.items() if k != "text_encoding"
    }


def test_a_run_that_fits_says_why_no_memory_saving_setting_is_listed(cli):
    """On an H100 flux-dev fits as it is and fit listed bf16 and fp8 matmuls only, silent on GGUF, NF4 and offload
    (a new user took the table for every format); it says they only cost time there, and names where to ask."""
    code, out, _ = cli("fit", "tiny-flux", "--gpu", "h100", "--steps", "2", "--json")
    fits = [row["techniques"] for row in json.loads(out)["fits"]]
    assert code == 0 and [] in fits
    assert not [t for row in fits for t in row if t.startswith("offload") or t == "quantize-bnb-nf4"]
    code, out, _ = cli("fit", "tiny-flux", "--gpu", "h100", "--steps", "2")
    said = " ".join(out.split())
    assert "it fits, so the settings that only save memory (offload, tiling, slicing, the quantized formats" in said


def test_fit_json_holds_the_generation_as_fitted_beside_as_asked(cli):
    """--json's settings left height, width and steps null (the model's defaults): a reader had to look them up."""
    code, out, _ = cli("fit", "flux-dev", "--gpu", "h100", "--json")
    found = json.loads(out)
    assert code == 0 and found["settings"]["steps"] is None
    resolved = found["resolved"]
    assert (resolved["width"], resolved["height"], resolved["steps"], resolved["dtype"]) == (1024, 1024, 50, "bfloat16")
    # the table's "left" column, which the JSON lacked (a new user's trial)
    usable = found["memory_bytes"] - found["held_back_bytes"]
    assert all(row["left_bytes"] == usable - row["peak_bytes"] > 0 for row in found["fits"])


def test_a_reduce_overhead_row_predicted_as_its_default_mode_twin_is_said_once(cli):
    """FLUX.1-dev on an H100 is GPU-bound: CUDA graphs remove launches its work already hides, so compile's two
    modes were two identical rows (a new user's trial). The table keeps one and says why; --json and
    --all-settings keep both. tiny-flux, host-bound, keeps both in the table (the test above)."""
    code, out, _ = cli("fit", "flux-dev", "--gpu", "h100", "--json")
    rows = {tuple(row["techniques"]): row for row in json.loads(out)["fits"]}
    assert code == 0 and rows[("compile-reduce-overhead",)]["expected_s"] == rows[("compile",)]["expected_s"]
    code, out, _ = cli("fit", "flux-dev", "--gpu", "h100")
    said = " ".join(out.split())
    cells = [line.split("│")[1].strip() for line in out.splitlines() if line.startswith("│")]
    assert code == 0 and "compile:mode=default" in cells and "compile:mode=reduce-overhead" not in cells
    assert "compile:mode=reduce-overhead rows left out: each predicted as its mode=default row" in said
    code, out, _ = cli("fit", "flux-dev", "--gpu", "h100", "--all-settings")
    assert code == 0 and "compile:mode=reduce-overhead" in out and "rows left out" not in out


def test_the_offloaded_settings_say_what_they_keep_in_the_machines_memory(cli):
    """fit flux2-dev on a 12 GB card ranked group and sequential offload first, 104.90 GiB of weights in the
    machine's RAM, with no word of it (a new user's trial): the footer says how much the listed settings keep."""
    from diffmeter.predict.techniques import stored_params
    from diffmeter.report.memory_table import host_memory_line

    card = "2GB,5TFLOPS,0.1TB/s,arch=ampere,link=32GB/s"  # sd15 fits only offloaded
    code, out, err = cli("fit", "sd15", "--gpu-spec", card, "--steps", "4", "--all-settings", "--json")
    assert code == 0, err
    settings = [tuple(row["techniques"]) for row in json.loads(out)["fits"]]
    code, out, _ = cli("fit", "sd15", "--gpu-spec", card, "--steps", "4", "--all-settings")
    said = " ".join(out.split())
    assert "Host memory: an offloaded setting keeps the pipeline's weights in the machine's RAM" in said
    # the most: an unquantized offloaded setting's, every component's weights at the run's dtype; a quantized
    # offloaded one's is less
    assert ("offload-sequential",) in settings and any(
        "quantize" in "".join(s) and "offload" in "".join(s) for s in settings
    )
    prediction, _ = predict_memory_and_work(ProfileSpec(model="sd15", steps=4))
    most = units.gib(sum(stored_params(prediction, ("offload-sequential",)).values()))
    assert f" to {most} as those settings store them, which the machine needs free beside the GPU" in said
    assert host_memory_line(prediction, [("vae-tiling",)]) is None
