"""`diffmeter profile --gpu/--gpu-spec`: the predicted memory beside the profile; GPU figures."""

from __future__ import annotations

import json

import pytest

from diffmeter.errors import DiffmeterError
from diffmeter.optimization_spec import OptimizationSpec
from diffmeter.predict.devices import named_gpu, other_cards
from diffmeter.predict.gpu_spec import spec_gpu
from diffmeter.predict.peaks import PEAKS


def test_profile_with_gpu_prints_stage_peaks_and_the_fit(cli):
    code, out, _ = cli("profile", "tiny-sd", "--gpu", "h100")
    assert code == 0
    for text in ("text encoding", "denoising step", "VAE decode", "whole generation", "H100 SXM", "fits"):
        assert text in out


def test_profile_json_holds_the_memory_prediction(cli):
    code, out, _ = cli("profile", "tiny-sd", "--gpu-spec", "0.004GB,100TFLOPS,1TB/s", "--json")
    data = json.loads(out)
    assert code == 0 and data["gpu"]["memory_bytes"] == int(0.004 * 2**30)
    stages = data["memory"]["stages"]
    assert data["memory"]["peak_bytes"] == max(stage["peak_bytes"] for stage in stages)
    assert data["total_flops"] == 2 * data["total_macs"]  # the profile itself is unchanged
    # under a technique, each stage's peak as bench's prediction stores it; "memory" stays the pipeline's without it
    code, out, _ = cli("profile", "tiny-sd", "--gpu-spec", "0.004GB,100TFLOPS,1TB/s", "--offload", "model", "--json")
    held = json.loads(out)
    assert held["memory"]["peak_bytes"] == data["memory"]["peak_bytes"]
    assert held["peak_memory_bytes"] == max(held["stage_peak_memory_bytes"].values()) < data["peak_memory_bytes"]
    assert all(held["stage_peak_memory_bytes"][s] < data["stage_peak_memory_bytes"][s] for s in ("text encoding",))


def test_a_generation_larger_than_the_card_does_not_fit(cli):
    code, out, _ = cli("profile", "tiny-sd", "--gpu-spec", "0.004GB")  # ~4.3 MB: tiny SD peaks at ~7.7 MB
    assert code == 0 and "does not fit" in out
    # the command that lists what does fit, with this model and card filled in
    assert "`diffmeter fit tiny-sd --gpu-spec 0.004GB` lists the memory settings that do" in " ".join(out.split())
    # the settings asked for go with it: fit answers for this generation, not the catalog's default one
    asked = ("--steps", "3", "--height", "96", "--width", "64", "--batch-size", "2", "--component-dtype", "vae=float32")
    code, out, _ = cli("profile", "tiny-sd", "--gpu-spec", "0.004GB", *asked)
    command = "diffmeter fit tiny-sd --gpu-spec 0.004GB --height 96 --width 64 --steps 3 --batch-size 2"
    assert code == 0 and f"`{command} --component-dtype vae=float32` lists" in " ".join(out.split())


def test_named_gpus_come_from_the_datasheet_table():
    h100 = named_gpu("h100")
    row = next(row for row in PEAKS if row.name == "H100 SXM")
    assert h100.name == "H100 SXM" and h100.memory_bytes == 81_559 * 2**20  # as nvidia-smi reports it
    assert named_gpu("H100 PCIe").name == "H100 PCIe" and named_gpu("a10").name == "A10"
    assert h100.peak_tflops("bfloat16") == row.tflops["bf16"]


def test_table_memory_is_the_drivers_within_the_datasheets_gb_read_as_10_9_and_as_gib():
    """An L40S sold as 48 GB reports 46,068 MiB (ECC on); reading its "48 GB" as GiB overstated it by 3 GiB."""
    from diffmeter.predict.devices import driver_memory, of_row

    assert named_gpu("l40s").memory_bytes == 46_068 * 2**20 and named_gpu("l4").memory_bytes == 23_034 * 2**20
    rows = {row.name: row for row in PEAKS}
    for name, reported in driver_memory().items():
        row = rows[name]  # every figure belongs to a row of the table
        assert reported["source"] and reported["quote"]
        assert int(row.memory_gb * 1e9) < reported["mib"] * 2**20 <= row.memory_gb * 2**30
    # a card with none: its GB read as GiB less the measured cards' reserve (tests/test_memory_unit.py)
    assert "A40" not in driver_memory() and of_row(rows["A40"]).memory_bytes == 46_068 * 2**20


def test_gpu_spec_reads_text_and_json():
    text = spec_gpu("80GB,989TFLOPS,3.35TB/s")
    as_json = spec_gpu('{"memory_gb": 80, "tflops": 989, "bandwidth_gb_s": 3350}')
    assert text.memory_bytes == as_json.memory_bytes == 80 * 2**30
    assert text.bandwidth_bytes_per_s == as_json.bandwidth_bytes_per_s == pytest.approx(3.35e12)
    assert text.peak_tflops("bfloat16") == as_json.peak_tflops("float32") == 989


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--gpu", "h1000"], "unknown GPU 'h1000'"),
        (["--gpu", "h100", "--gpu-spec", "80GB"], "pick one"),
        (["--gpu-spec", "80 parsecs"], "--gpu-spec takes"),
        (["--gpu", "h100", "--csv"], "use --json"),
        # a JSON figure that is no number raised a traceback; an unknown key and 0GB passed silently
        (["--gpu-spec", '{"memory_gib": 24, "tflops": "x"}'], "--gpu-spec's TFLOPS must be a positive number"),
        (["--gpu-spec", '{"memory_gib": 24, "tflop": 100}'], "'tflop': not one of its keys"),
        (["--gpu-spec", "0GB,100TFLOPS,1TB/s"], "--gpu-spec's memory must be a positive number; got 0.0"),
    ],
)
def test_bad_gpu_input_is_one_line(cli, args, message):
    code, _, err = cli("profile", "tiny-sd", *args)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("model", "flags", "message"),
    [  # profile predicted sea-cache on a UNet and refused deep-cache in words of its own; bench's line now
        ("tiny-sd", ["--opt", "sea-cache"], "sea-cache cannot be used with tiny-sd: UNet2DConditionModel has no"),
        ("tiny-flux", ["--opt", "deep-cache"], "deep-cache cannot be used with tiny-flux: DeepCache caches Stable"),
        ("tiny-sd", ["--fp8-text-encoder"], "fp8-text-encoder cannot be used with tiny-sd"),
        ("tiny-flux", ["--opt", "pab", "--opt", "taylorseer"], "pab and taylorseer are both cache techniques"),
    ],
)
def test_a_technique_bench_refuses_for_the_model_profile_refuses_in_the_same_line(cli, model, flags, message):
    code, _, err = cli("profile", model, "--gpu", "h100", *flags)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1


def test_a_backend_whose_package_is_missing_here_is_still_predicted(cli):
    """The predicted run's machine may have flash-attn: only what bench refuses for the model is refused."""
    from diffmeter.optimize import Target, build, check
    from diffmeter.optimize.base import importable

    code, out, err = cli(
        "profile", "tiny-flux", "--gpu", "h100", "--dtype", "bfloat16", "--opt", "attention:backend=flash"
    )
    assert code == 0, err
    if not importable("flash_attn"):  # bench here: refused for the package alone, as would apply once installed
        import torch

        from diffmeter.catalog import resolve
        from diffmeter.errors import MissingPackage
        from diffmeter.families import get_family

        entry = resolve("tiny-flux")
        target = Target(entry, get_family(entry.family), torch.device("cuda"), "bfloat16", 2)
        with pytest.raises(MissingPackage, match="attention would apply to tiny-flux, but Flash Attention"):
            check(build([OptimizationSpec(name="attention", params={"backend": "flash"})]), target)


def test_unknown_gpu_lists_the_table():
    with pytest.raises(DiffmeterError, match="L40S"):
        named_gpu("nope")


def test_profile_gpu_with_benchs_technique_flags_predicts_what_bench_stores(cli, tmp_path):
    """The same flags, parsed by the same code, name the same techniques: profile's prediction of the run is
    the prediction bench stores beside its measurements of it."""
    from diffmeter.runs.lifecycle import bench
    from diffmeter.runs.spec import BenchSpec

    spec = ["--gpu-spec", "80GB,100TFLOPS,2TB/s"]  # a GPU given by its figures: no host link among them
    code, out, _ = cli("profile", "tiny-sd3", *spec, "--vae-tiling", "--offload", "model", "--json")
    assert code == 0
    predicted = json.loads(out)
    assert predicted["memory_techniques"] == ["offload-model", "vae-tiling"]
    # the time is the pipeline's without offload (no host link): a field a program reads, with why
    assert predicted["time"] is not None and predicted["time"]["offload"] is None
    assert predicted["time_left_out"] == [
        "offload-model: no host link figure for this device (predict/data/host_links.json)"
    ]
    code, _, err = cli("profile", "tiny-sd3", "--gpu", "cpu", "--offload", "model")  # as bench refuses it on a CPU
    assert code == 2 and "offload cannot be used with tiny-sd3: offloading moves weights between the CPU and a" in err
    code, out, _ = cli("profile", "tiny-sd3", "--gpu", "cpu", "--vae-tiling", "--json")
    predicted = json.loads(out)
    result, _ = bench(
        BenchSpec(model="tiny-sd3", steps=predicted["steps"], iterations=1, optimizations=[{"name": "vae-tiling"}]),
        out=tmp_path,
    )
    assert result.prediction.memory_techniques == predicted["memory_techniques"] == ["vae-tiling"]
    assert result.prediction.time_left_out == predicted["time_left_out"] == []
    # the same peak: a CPU run predicted as one (no cuDNN copies of its convolutions) by profile as by bench
    assert result.prediction.peak_memory_bytes == predicted["peak_memory_bytes"]
    assert result.prediction.peak_memory_bytes == predicted["peak_memory_bytes"] <= predicted["memory"]["peak_bytes"]
    code, out, _ = cli("profile", "tiny-sd3", "--gpu", "h100", "--opt", "compile", "--json")  # timed, memory as eager
    assert code == 0 and json.loads(out)["time_techniques"] == ["compile mode=default"]
    code, out, _ = cli("profile", "tiny-sd3", "--gpu", "cpu", "--opt", "compile", "--json")  # the CPU's compiled fit
    found = json.loads(out)
    assert code == 0 and found["time_techniques"] == ["compile mode=default"] and found["time_left_out"] == []
    mode = "compile:mode=max-autotune-no-cudagraphs"
    code, out, _ = cli("profile", "tiny-sd3", "--gpu", "cpu", "--opt", mode, "--json")
    found = json.loads(out)  # inductor's C++ loops were fitted in mode=default alone
    assert code == 0 and found["time_techniques"] == [] and "only mode=default was fitted" in found["time_left_out"][0]
    code, _, err = cli("profile", "tiny-sd3", "--gpu", "cpu", "--opt", "compile:mode=max-autotune")  # as bench
    assert code == 2 and "max-autotune records CUDA graphs; this run is on cpu" in err
    code, _, err = cli("profile", "tiny-sd3", "--gpu", "cpu", "--opt", "fuse-qkv")
    assert code == 2 and "fuse-qkv: the prediction models offload" in err
    assert "first-block-cache" in err and "--tf32" not in err  # the caches it times are named among those it models
    code, _, err = cli("profile", "tiny-sd3", "--gpu", "h100", "--opt", "tf32")
    assert code == 2 and "float32 on TF32 is --tf32" in err
    code, _, err = cli("profile", "tiny-sd3", "--gpu", "cpu", "--opt", "tf32")  # bench's refusal on a CPU first
    assert code == 2 and "tf32 cannot be used with tiny-sd3: TF32 is an NVIDIA tensor-core mode; this run is on" in err


def test_a_quantization_format_bench_cannot_run_on_a_cpu_is_refused_for_this_cpu(cli):
    """``--gpu cpu`` predicts this CPU's run: a format whose backend runs only on CUDA is refused in bench's line (its
    ``cannot_run``), one that runs here is predicted, and the same CUDA-only format is predicted for a GPU."""
    code, _, err = cli("profile", "tiny-flux", "--gpu", "cpu", "--quantize", "bnb:nf4")
    assert code == 2 and "bnb cannot be used with tiny-flux: diffusers quantizes with bitsandbytes only on a GPU" in err
    code, out, _ = cli("profile", "tiny-flux", "--gpu", "cpu", "--quantize", "quanto:int8", "--json")
    assert code == 0 and json.loads(out)["memory_techniques"] == ["quantize-quanto-int8"]
    code, out, _ = cli("profile", "tiny-flux", "--gpu", "h100", "--quantize", "bnb:nf4", "--json")
    assert code == 0 and json.loads(out)["memory_techniques"] == ["quantize-bnb-nf4"]


def test_a_float32_run_is_timed_as_bench_runs_it_on_tf32_or_strictly_with_no_tf32(cli):
    """bench on CUDA runs float32 matmuls and convolutions on TF32 unless --no-tf32: profile and fit time them the
    same way, and say so (the title's peak is TF32's; attention, at float32's peak, is named apart)."""
    h100 = named_gpu("h100")
    found = {}
    for flag in ("--tf32", "--no-tf32"):
        code, out, _ = cli("profile", "tiny-sd", "--gpu", "h100", "--dtype", "float32", "--json", flag)
        assert code == 0
        found[flag] = json.loads(out)["time"]
    on, off = found["--tf32"], found["--no-tf32"]
    assert (on["peak_tflops"], on["peak_precision"]) == (h100.tflops["tf32"], "tf32")
    assert (off["peak_tflops"], off["peak_precision"]) == (h100.tflops["fp32"], None)
    assert any("attention at 67 TFLOP/s" in line and "matmul" not in line for line in on["other_peaks"])
    assert off["other_peaks"] == [] and off["lower_s"] > on["lower_s"]
    code, out, _ = cli("profile", "tiny-sd", "--gpu", "h100", "--dtype", "float32")
    assert code == 0 and "float32, matmuls on TF32" in " ".join(out.split())
    fits = {}
    for flag in ("--tf32", "--no-tf32"):
        code, out, _ = cli("fit", "tiny-sd", "--gpu", "h100", "--dtype", "float32", "--json", flag)
        assert code == 0
        fits[flag] = {tuple(row["techniques"]): row["lower_s"] for row in json.loads(out)["fits"]}
    assert fits["--no-tf32"][()] > fits["--tf32"][()]
    code, _, err = cli("fit", "--all", "--no-tf32")
    assert code == 2 and "drop --no-tf32" in err
    code, _, err = cli("profile", "tiny-sd", "--no-tf32")
    assert code == 2 and "--no-tf32 changes the predicted time, not the count: add --gpu" in err


def test_the_energy_line_says_how_its_range_is_made(cli):
    """The energy range is the expected time's geometric midpoint at the fitted power, widened by the energy fit's
    own spread (not the time range at that power): the line says both, and the figures agree with it."""
    code, out, _ = cli("profile", "tiny-sd", "--gpu", "h100", "--json")
    time = json.loads(out)["time"]
    (low, high), power = time["energy"]["per_output_j"], time["energy"]["power_w"]
    fast, slow = time["expected_s"]
    assert (low * high) ** 0.5 == pytest.approx(power * (fast * slow) ** 0.5, rel=1e-9)
    code, out, _ = cli("profile", "tiny-sd", "--gpu", "h100")
    said = " ".join(out.split())
    assert code == 0 and "geometric midpoint at" in said and f"divided by {(high / low) ** 0.5:.3g}, the spread" in said


def test_no_energy_prediction_names_what_is_missing(cli):
    """An A10G (AWS's part) has no cited TDP: the line says so; a --gpu-spec card has no expected time to turn into
    energy."""
    code, out, _ = cli("profile", "tiny-sd", "--gpu", "a10g")
    said = " ".join(out.split())
    assert code == 0 and "no energy prediction on A10G: the table has no cited TDP for the A10G" in said
    code, out, _ = cli("profile", "tiny-sd", "--gpu-spec", "24GB,165TFLOPS,1TB/s", "--json")
    assert json.loads(out)["time"]["energy_left_out"].startswith("no expected time to turn into energy")
    code, out, _ = cli("profile", "tiny-sd", "--gpu", "h100", "--json")
    assert json.loads(out)["time"]["energy_left_out"] is None


def test_a_short_gpu_name_says_which_card_it_took_and_which_it_left(cli):
    from diffmeter.predict.devices import other_cards

    a100s = [row.name for row in PEAKS if row.name.startswith("A100")]
    assert len(a100s) == 4 and other_cards("a100").startswith(f"--gpu a100 is the {a100s[0]};")
    assert all(name in other_cards("a100") for name in a100s[1:])
    assert other_cards("A100 40GB PCIe") is None and other_cards("l4") is None and other_cards("cpu") is None
    code, out, _ = cli("profile", "tiny-sd", "--gpu", "a100")
    assert code == 0 and "note: --gpu a100 is the A100 80GB SXM; the table also has" in " ".join(out.split())
    code, out, _ = cli("fit", "tiny-sd", "--gpu", "a100 40gb sxm")
    assert code == 0 and "note: --gpu" not in out
    # the SXM form, wherever the table lists it (the H200 NVL comes first there, for driver names)
    assert named_gpu("h200").name == "H200 SXM" and other_cards("h200").endswith(
        "also has the H200 NVL: name one for another card"
    )
    assert named_gpu("h200 nvl").name == "H200 NVL"
    # as nvidia-smi and torch.cuda.get_device_name() name them; a near miss suggested
    assert (
        named_gpu("NVIDIA GeForce RTX 4090").name == "RTX 4090"
        and named_gpu("NVIDIA H100 80GB HBM3").name == "H100 SXM"
    )
    with pytest.raises(DiffmeterError, match="unknown GPU 'rtx 4900'; did you mean RTX 4090"):
        named_gpu("rtx 4900")


def test_a_word_of_one_cards_name_is_that_card():
    """`--gpu 4090` was refused though one card holds the word, and `v100s` was the V100 SXM2 (whose name, spaces
    removed, starts with "v100s"): a name's words are matched whole before its letters as a prefix."""
    from diffmeter.predict.devices import other_cards

    assert named_gpu("4090").name == "RTX 4090" and other_cards("4090") is None
    assert named_gpu("v100s").name == "V100S PCIe" and other_cards("v100s") is None
    assert named_gpu("a6000").name == "RTX A6000" and named_gpu("6000").name == "RTX 6000 Ada"
    assert named_gpu("l40").name == "L40" and named_gpu("h10").name == "H100 SXM"  # a prefix still serves
    # one cut inside a model number is said (a new user's typos "rtx 409" and "b20" passed without a word)
    assert other_cards("rtx 409") == "--gpu rtx 409 is read as the RTX 4090, whose name it starts: name the card whole"
    assert "read as the B200" in other_cards("b20") and other_cards("l40") is None and other_cards("rtx 4090") is None
    # a bare family word names every card it holds, the Ti and Super ones too (a new user's trial: five were missing)
    assert all(f" {card}," in other_cards("rtx") for card in ("RTX 4070 Ti", "RTX 4070 Ti Super", "RTX 4060 Ti 16GB"))
    assert other_cards("rtx 4070") is None  # the card of that name: its Ti is another card


@pytest.mark.parametrize(
    ("name", "row"),
    [
        ("RTX 4070", "RTX 4070"),
        ("4070", "RTX 4070"),
        ("rtx 4070 ti", "RTX 4070 Ti"),
        ("4070 ti super", "RTX 4070 Ti Super"),
        ("NVIDIA GeForce RTX 4070 Ti SUPER", "RTX 4070 Ti Super"),
        ("rtx 4060 ti", "RTX 4060 Ti 16GB"),
        ("RTX 3060", "RTX 3060 12GB"),
        ("rtx 5060 ti", "RTX 5060 Ti 16GB"),
        ("rtx 5070", "RTX 5070"),
        ("rtx 5070 ti", "RTX 5070 Ti"),
    ],
)
def test_the_consumer_cards_are_named_as_users_name_them(name, row):
    """Issue 47: the 12 and 16 GB cards were unknown GPUs. "4070" is the RTX 4070 alone: the Ti and Ti Super are
    other cards, not other forms of it, so nothing is said about them."""
    assert named_gpu(name).name == row and other_cards(name) is None


@pytest.mark.parametrize("name", ["H100 80GB", "h100 sxm5", "h100-sxm", "NVIDIA H100 SXM5 80GB", "h100 80gb hbm3"])
def test_common_spellings_of_the_h100_sxm_are_it(name):
    """`--gpu "H100 80GB"` was unknown (did you mean A100 80GB SXM?) and so was "h100 sxm5": a memory size the card
    has and the SXM form's generation name the card."""
    assert named_gpu(name).name == "H100 SXM"


def test_an_unknown_gpu_suggests_its_own_model_number_first():
    with pytest.raises(DiffmeterError, match="unknown GPU 'H100 96GB'; did you mean H100 "):
        named_gpu("H100 96GB")  # no H100 has 96 GB; its spelling is nearer the A100 80GB SXM
    assert named_gpu("h100 pcie 80gb").name == "H100 PCIe"


def test_a_bare_a800_is_timed(cli):
    """`profile --gpu a800` said "no memory bandwidth" (issue 50): the A800 is now timed as the 80GB SXM."""
    code, out, err = cli("profile", "tiny-sd", "--gpu", "a800", "--json")
    found = json.loads(out)
    assert code == 0, err
    assert found["gpu"]["name"] == "A800 80GB SXM" and found["time"]["bandwidth_bytes_per_s"] == 2039e9
    assert found["time"]["lower_s"] > 0


@pytest.mark.parametrize("name", ["rtx 4060", "rtx 5060", "rtx 3060 ti", "rtx 4070 super", "rtx 4060 ti 8gb"])
def test_a_card_the_table_lacks_is_not_its_neighbour(name):
    """The RTX 4060 is not the 4060 Ti (a prefix or a subset of words matched it), nor a 4060 Ti 8GB the 16 GB row."""
    with pytest.raises(DiffmeterError, match=f"unknown GPU '{name}'"):
        named_gpu(name)


@pytest.mark.parametrize("command", [["profile"], ["profile", "--gpu", "h100"], ["fit", "--memory", "24GB"]])
def test_a_component_dtype_for_a_component_the_model_lacks_is_refused(cli, command):
    """fit accepted --component-dtype vea=float32 and predicted as if it had not been given."""
    code, _, err = cli(command[0], "tiny-wan", *command[1:], "--component-dtype", "vea=float32")
    assert code == 2 and "tiny-wan has no component vea (it has transformer, text_encoder, vae)" in err


def test_profile_and_fit_on_this_cpu_predict_the_peak_bench_stores_for_a_cpu_run(cli, tmp_path):
    """`profile --gpu cpu` and `fit --gpu cpu` added cuDNN's copies of the VAE's convolutions (a CUDA run's) to a CPU
    run's peak: 0.00757 GiB where bench's own prediction of the same run said 0.00719 GiB."""
    from diffmeter.runs.lifecycle import bench
    from diffmeter.runs.spec import BenchSpec

    result, _ = bench(BenchSpec(model="tiny-sd", steps=2, iterations=1, save_images=False), out=tmp_path)
    code, out, _ = cli("profile", "tiny-sd", "--steps", "2", "--gpu", "cpu", "--json")
    assert code == 0 and json.loads(out)["peak_memory_bytes"] == result.prediction.peak_memory_bytes
    code, out, _ = cli("fit", "tiny-sd", "--steps", "2", "--gpu", "cpu", "--json")
    assert code == 0 and json.loads(out)["fits"][0]["peak_bytes"] == result.prediction.peak_memory_bytes


def test_a_host_bound_run_says_so_in_the_json_and_the_table(cli):
    """tiny-sd on an H100: its GPU work is microseconds, the host's issuing of its operators milliseconds: the JSON
    carries the host's time per stage, the busy share and why it is host-bound; the table says it too. A CPU run
    has no host term (the host is the device)."""
    code, out, _ = cli("profile", "tiny-sd", "--gpu", "h100", "--json")
    time = json.loads(out)["time"]
    assert code == 0 and time["host_bound"].startswith("host-bound") and time["busy_share"] < 0.5
    for stage in time["stages"]:
        assert stage["host_s"][0] > stage["gpu_s"][0] and stage["expected_s"] == pytest.approx(stage["host_s"])
    code, out, _ = cli("profile", "tiny-sd", "--gpu", "h100")
    assert code == 0 and "host issues" in out and "host-bound" in " ".join(out.split())
    code, out, _ = cli("profile", "tiny-sd", "--gpu", "cpu", "--steps", "2", "--json")
    time = json.loads(out)["time"]
    assert time["host_bound"] is None and time["busy_share"] is None
    assert all(stage["host_s"] is None for stage in time["stages"])


def test_a_time_for_a_run_that_does_not_fit_says_it_is_one_if_it_fit(cli):
    """profile printed 'predicted time on RTX 4090' and its energy under a memory table saying 'does not fit, 11.10
    GiB short' (flux-dev), a time that cannot happen as asked: the title and the energy line now say so."""
    from diffmeter.predict.devices import CUDA_HOLDBACK_BYTES
    from diffmeter.predict.memory import predict_memory
    from diffmeter.spec import ProfileSpec

    peak = predict_memory(ProfileSpec(model="tiny-flux", steps=2)).peak_bytes
    size = CUDA_HOLDBACK_BYTES + peak
    for memory, short in ((size - 2**20, True), (size + 2**20, False)):
        card = f"{memory / 2**30:.9f}GB,100TFLOPS,1TB/s,arch=hopper"
        code, out, err = cli("profile", "tiny-flux", "--steps", "2", "--gpu-spec", card)
        said = " ".join(out.split())
        assert code == 0, err
        assert ("if it fit (it does not: 0.000977 GiB short)" in said) is short
        assert ("does not fit" in said) is short and "predicted time on" in said
