"""The command line: outputs, and one clear line with exit code 2 for bad input."""

import csv
import io
import json
import subprocess
import sys

import pytest


def test_profile_json_is_one_object(cli):
    code, out, _ = cli("profile", "tiny-sd", "--json")
    data = json.loads(out)
    assert code == 0 and data["model"] == "diffmeter/tiny-sd" and data["total_flops"] == 2 * data["total_macs"]


def test_profile_scaling_table_in_json_and_csv(cli):
    code, out, _ = cli("profile", "tiny-sd", "--height", "32,64", "--steps", "2,4", "--json")
    sizes = [(p["height"], p["width"], p["steps"]) for p in json.loads(out)["profiles"]]
    assert code == 0 and sizes == [(32, 32, 2), (32, 32, 4), (64, 64, 2), (64, 64, 4)]
    code, out, _ = cli("profile", "tiny-sd", "tiny-dit", "--csv")
    rows = list(csv.DictReader(io.StringIO(out)))
    assert code == 0 and {r["component"] for r in rows} == {"text_encoder", "unet", "vae", "transformer"}
    assert all(int(r["flops"]) == 2 * int(r["macs"]) for r in rows)


def test_profile_csv_holds_the_denoiser_steps_its_table_shows(cli):
    """SD 1.5's PNDM calls the denoiser once more than its steps: the table said so, the CSV had the steps alone."""
    code, out, _ = cli("profile", "sd15", "--height", "64", "--steps", "2", "--json")
    counted = json.loads(out)
    code, out, _ = cli("profile", "sd15", "--height", "64", "--steps", "2", "--csv")
    rows = list(csv.DictReader(io.StringIO(out)))
    assert code == 0 and counted["denoiser_steps"] != counted["steps"]
    assert {(int(r["steps"]), int(r["denoiser_steps"])) for r in rows} == {(2, counted["denoiser_steps"])}


def test_profile_csv_names_the_input_images_and_the_controlnet(cli):
    """Two image-conditioned profiles differ in their input images or ControlNet alone: the CSV held neither."""
    images = ("tiny-qwenimage-edit-plus", "--image-size", "32x48", "--image-size", "64x64")
    code, out, err = cli("profile", *images, "--csv")
    assert code == 0, err
    (row, *_) = list(csv.DictReader(io.StringIO(out)))
    counted = json.loads(cli("profile", *images, "--json")[1])
    assert row["input_images"] == ";".join(f"{w}x{h}" for h, w in counted["input_images"]) and row["controlnet"] == ""
    controlnet = ("tiny-sd", "--controlnet", "tiny-controlnet-sd")
    code, out, err = cli("profile", *controlnet, "--csv")
    assert code == 0, err
    named = json.loads(cli("profile", *controlnet, "--json")[1])["controlnet"]
    assert named and {r["controlnet"] for r in csv.DictReader(io.StringIO(out))} == {named}


def test_profile_table_names_units(cli):
    code, out, _ = cli("profile", "tiny-flux", "--depth", "1")
    assert code == 0 and "MACs" in out and "FLOPs" in out and "  .transformer_blocks" in out


@pytest.mark.slow
def test_models_lists_the_catalog(cli):
    code, out, _ = cli("models", "--json")
    rows = {row["name"]: row for row in json.loads(out)}
    assert code == 0 and rows["flux-dev"]["params"] > 16e9 and rows["tiny-sd"]["origin"] == "tiny"


def test_models_shows_the_size_an_editing_model_makes_at_its_defaults(cli):
    """tiny-qwenimage-edit's pipeline, called without a size, makes the 1024x1024-area size of its 64x64 default input
    image: the size column said 64x64 while its runs were 1024x1024, as its profile says."""
    from diffmeter import profile

    code, out, _ = cli("models")
    row = next(line.split() for line in out.splitlines() if line.startswith("tiny-qwenimage-edit "))
    made = profile("tiny-qwenimage-edit")
    assert code == 0 and row[2] == f"{made.width}x{made.height}" == "1024x1024"
    assert next(line.split() for line in out.splitlines() if line.startswith("tiny-sd "))[2] == "32x32"


def test_calls_of_different_work_show_their_range_not_their_mean(cli):
    """Qwen-Image encodes the prompt and a shorter negative prompt: "MACs / call" was their mean, no call's."""
    from diffmeter import profile
    from diffmeter.units import macs

    (encoder,) = [c for c in profile("tiny-qwenimage").components if c.name == "text_encoder"]
    least, most = sorted(call.macs_per_call for call in encoder.invocations)
    code, out, _ = cli("profile", "tiny-qwenimage")
    assert code == 0 and least < most and f"{macs(least)} to {macs(most)}" in out


def test_one_step_is_singular(cli):
    code, out, _ = cli("profile", "tiny-sd", "--steps", "1")
    assert code == 0 and ", 1 step, batch 1" in out and "1 steps" not in out


def test_profile_all_leaves_out_the_models_that_refuse_the_settings(cli, monkeypatch):
    """DiT generates its own size only: ``--all --height 512`` profiles the others and says why DiT is not there;
    settings every model refuses are one error."""
    import diffmeter.catalog
    from diffmeter.catalog import resolve

    two = (resolve("dit-xl-2-256"), resolve("sd15"))
    monkeypatch.setattr(diffmeter.catalog, "all_entries", lambda: two)
    code, out, err = cli("profile", "--all", "--height", "512", "--steps", "2", "--json")
    notes = err.splitlines()  # --height alone's note first, then the models left out
    assert code == 0 and notes[0].startswith("note: --height alone: the width follows it")
    assert notes[1].startswith("note: left out dit-xl-2-256: dit-xl-2-256 generates 256x256 images only")
    assert json.loads(out)["model"] == "stable-diffusion-v1-5/stable-diffusion-v1-5"  # the notes beside, on stderr
    code, out, _ = cli("profile", "--all", "--height", "512", "--steps", "2")
    assert code == 0 and out.splitlines()[1].startswith("note: left out dit-xl-2-256") and "sd15" in out
    code, out, err = cli("profile", "--all", "--num-frames", "9")
    assert code == 2 and "--all: every catalog model refuses these settings" in err and out.count("left out") == 2


@pytest.mark.parametrize(
    "args,message",
    [
        (["profile", "flux-deb"], "unknown model 'flux-deb'"),
        # a technique flag fit does not take: why, and where it goes (click suggested --gpu for --opt)
        (["fit", "sdxl", "--gpu", "l4", "--opt", "compile"], "fit does not take --opt: fit tries the memory settings"),
        (
            ["profile", "sd15", "--gpu", "a100", "--offload", "bogus"],
            "offload: bad parameter mode 'bogus': input should be 'model', 'sequential' or 'group'",
        ),
        (["profile", "sd15", "--gpu", "a100", "--quantize", "int4"], "--quantize 'int4': write BACKEND:TYPE"),
        (["profile", "sd15", "--gpu", "a100", "--quantize", "fp8"], "the A100 80GB SXM lacks (no fp8 peak"),
        (["profile", "sd3-medium", "--height", "1000"], "not a multiple of 16"),
        (["profile", "sd15", "--bogus"], "No such option: --bogus"),
        (["profil", "sd15"], "No such command 'profil'. Did you mean 'profile'?"),
        (["bench"], "Missing argument 'MODEL'"),
        (["bench", "tiny-sd", "--steps", "abc"], "Invalid value for '--steps'"),
        (["bench", "tiny-sd", "--cache", "pab", "--cache", "taylorseer"], "--cache is given twice"),
        (["profile", "sd15", "--json", "--csv"], "pick one"),
        (["profile", "sd15", "--gpu", ""], "'--gpu': an empty name"),  # it had printed the count, no prediction
        # counted first, then refused without naming the flag; a bad format now first, in bench's words
        (["profile", "tiny-flux", "--quantize", "bnb:nf4"], "--quantize bnb:nf4 needs a device to predict for"),
        (["profile", "tiny-flux", "--quantize", "foo"], "--quantize 'foo': write BACKEND:TYPE"),
        (["profile", "tiny-flux", "--offload", "banana"], "offload: bad parameter mode"),  # not "add --gpu"
        (["profile", "tiny-flux", "--opt", "nonsense"], "unknown optimization 'nonsense'"),
        # --no-image on a text-to-image model passed silently; refused as --image-size is
        (["profile", "tiny-sd", "--no-image"], "tiny-sd (StableDiffusionPipeline) generates from text alone and"),
        (["bench", "tiny-sd", "--no-image"], "takes no input image: drop --no-image"),
        (["fit", "tiny-sd", "--no-image", "--memory", "24GB"], "takes no input image: drop --no-image"),
        (["profile", "sd15", "--all"], "--all profiles every catalog model: drop sd15"),
        (["profile", "sd15", "--num-frames", "9"], "--num-frames is for video models"),
        (["profile", "flux-dev", "--prompt-tokens", "20"], "flux-dev pads every prompt to one length"),
        (["profile", "my[red]model"], "unknown model 'my[red]model'"),
        (["ladder", "tiny-sd", "--fast-steps", "50", "--steps", "2"], "--fast-steps 50 must be between 1 and"),
        (["ladder", "tiny-sd", "--compile-mode", "fastest"], "compile: bad parameter mode"),
        (["profile", "flux-dev", "--steps", "0"], "--steps must be a positive integer"),
        (["profile", "flux-dev", "--batch-size", "-2"], "--batch-size must be a positive integer"),
        (["profile", "flux-dev", "--height", "512,abc"], "--height takes numbers"),
        (["profile", "flux-dev", "--steps", "20,,30"], "--steps takes numbers separated by commas, got '20,,30'"),
        (["profile", "flux-dev", "--height", "512,768", "--width", "512"], "same length"),
        (["profile"], "name a MODEL"),
        (["profile", "sd15", "--max-sequence-length", "128"], "takes no max_sequence_length"),
        (["profile", "flux-dev", "--max-sequence-length", "0"], "--max-sequence-length must be a positive integer"),
        (["profile", "/nonexistent/dir"], "no such folder: /nonexistent/dir"),
        (["profile", "./nowhere"], "no such folder: ./nowhere"),
        (["profile", "flux-dev", "--guidance-scale", "-1"], "must be a finite number, 0 or more, got -1"),
        (["bench", "tiny-sd", "--guidance-scale", "-1"], "must be a finite number, 0 or more, got -1"),
        (["profile", "sdxl", "--guidance-scale", "nan"], "must be a finite number, 0 or more, got nan"),
        (["profile", "sdxl", "--guidance-scale", "inf"], "must be a finite number, 0 or more, got inf"),
        (["bench", "tiny-sd", "--seed", "-1"], "--seed must be 0 or more"),
        (["fit", "tiny-sd", "--memory", "24XB"], "such as 24GB or 24GiB (GB read as GiB), or 23034MiB or 23034MB"),
        (["fit", "tiny-sd", "--memory", "12MB"], "0.0117 GiB is not more than the 1.28 GiB held back for CUDA"),
        (["fit", "tiny-sd", "--memory", "-5GB"], "--memory takes a positive size"),
        (["fit", "tiny-sd", "--memory", "0"], "--memory takes a positive size"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(cli, args, message):
    code, out, err = cli(*args)
    assert code == 2 and message in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("size", "name"), [("23034MiB", "--memory 23034MiB"), ("23034MB", "--memory 23034MB, read as MiB")]
)
def test_fit_takes_the_memory_in_mib_as_nvidia_smi_prints_it(cli, size, name):
    code, out, err = cli("fit", "tiny-flux", "--memory", size, "--steps", "2", "--json")
    assert code == 0, err
    found = json.loads(out)
    assert found["memory_bytes"] == 23034 * 2**20 and found["device"] == name


def test_local_directory_without_index_exits_2(cli, tmp_path):
    code, _, err = cli("profile", str(tmp_path))
    assert code == 2 and "no model_index.json" in err


def test_console_script_is_installed():
    result = subprocess.run(["diffmeter", "profile", "nope"], capture_output=True, text=True)
    assert result.returncode == 2 and result.stderr.startswith("error: unknown model 'nope'")


def test_parallel_workers_give_the_serial_answer(cli):
    _, serial, _ = cli("profile", "tiny-sd", "tiny-dit", "tiny-sd3", "--jobs", "1", "--json")
    code, parallel, _ = cli("profile", "tiny-sd", "tiny-dit", "tiny-sd3", "--jobs", "2", "--json")
    assert code == 0 and json.loads(parallel) == json.loads(serial)


def test_no_resolution_binning_counts_the_requested_size(cli):
    args = ("profile", "pixart-sigma-1024", "--height", "1008", "--width", "608", "--steps", "1", "--json")
    _, binned, _ = cli(*args)
    code, requested, _ = cli(*args, "--no-resolution-binning")
    assert code == 0 and json.loads(requested)["width"] == 608 and json.loads(binned)["width"] != 608


def test_version(cli):
    from diffmeter import __version__

    code, out, _ = cli("--version")
    assert code == 0 and out.strip() == f"diffmeter {__version__}"


def test_dtype_changes_parameter_memory_not_compute(cli):
    _, half, _ = cli("profile", "tiny-sd", "--dtype", "float16", "--json")
    code, full, _ = cli("profile", "tiny-sd", "--dtype", "float32", "--json")
    half, full = json.loads(half), json.loads(full)
    assert code == 0 and full["param_bytes"] == 2 * half["param_bytes"] == 4 * full["params"]
    assert full["total_macs"] == half["total_macs"]


def test_every_option_of_every_command_has_help():
    import typer.main

    from diffmeter.cli import app

    group = typer.main.get_command(app)
    for name, command in group.commands.items():
        for param in command.params:
            assert param.param_type_name != "option" or (param.help or "").strip(), f"{name} {param.opts}"
            assert param.param_type_name != "argument" or (param.help or "").strip(), f"{name} {param.name}"


def test_usage_lines_name_arguments_plainly(cli):
    code, out, _ = cli("optimizations", "--help")
    assert code == 0 and "Usage: diffmeter optimizations [OPTIONS] [MODEL]" in " ".join(out.split())
    code, out, _ = cli("bench", "--help")
    assert "Usage: diffmeter bench [OPTIONS] MODEL" in " ".join(out.split()) and "{MODEL}" not in out


def test_brackets_in_paths_and_names_are_printed_as_written(cli, tmp_path):
    out_dir = tmp_path / "q[/]"
    code, out, err = cli("bench", "tiny-sd", "--steps", "1", "--iterations", "1", "--out", out_dir)
    assert code == 0, err
    assert "results: " + str(out_dir) in " ".join(out.split())


def test_profile_accepts_the_dtype_names_bench_accepts(cli):
    _, short, _ = cli("profile", "tiny-sd", "--dtype", "fp16", "--json")
    code, long, _ = cli("profile", "tiny-sd", "--dtype", "float16", "--json")
    assert code == 0 and json.loads(short) == json.loads(long) and json.loads(short)["dtype"] == "float16"


def test_csv_with_depth_keeps_the_module_rows(cli):
    code, out, _ = cli("profile", "tiny-sd", "--depth", "1", "--csv")
    rows = list(csv.DictReader(io.StringIO(out)))
    modules = [row for row in rows if row["module"]]
    assert code == 0 and modules and all(row["module"].startswith(row["component"] + ".") for row in modules)
    unet = next(row for row in rows if row["component"] == "unet" and not row["module"])
    assert sum(int(row["macs"]) for row in modules if row["component"] == "unet") == int(unet["macs"])


@pytest.mark.slow
def test_library_warnings_stay_off_the_terminal(tmp_path):
    """torchao's failed kernel extensions and torch's pytree notices (logged when diffusers imports torchao)
    reach the terminal of a plain import, but not the output of bench, table, or a parallel run's ranks."""
    import os

    # as a fresh shell has it: without what an in-process command line set for itself
    set_by_diffmeter = ("DIFFMETER_QUIET_LIBRARIES", "DIFFUSERS_VERBOSITY", "TRANSFORMERS_VERBOSITY")
    set_by_diffmeter += ("AR_LOG_LEVEL", "HF_HUB_DISABLE_PROGRESS_BARS")
    environment = {k: v for k, v in os.environ.items() if k not in set_by_diffmeter}
    # and transformers' progress bars as a text encoder is quantized at load (a new user's trial)
    markers = ("Failed to load", "_pytree", "Unable to import `torchao`", "Writing model shards", "Loading weights")
    plain = subprocess.run(
        [sys.executable, "-c", "import diffusers.quantizers"], capture_output=True, text=True, env=environment
    )
    if not any(marker in plain.stderr for marker in markers):
        pytest.skip("the installed torchao imports quietly: nothing to keep off the terminal here")

    def diffmeter(*args):
        done = subprocess.run(
            [sys.executable, "-c", "from diffmeter.cli import main; main()", *args],
            capture_output=True, text=True, env=environment, timeout=300,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        return done.stdout + done.stderr

    common = ("--steps", "1", "--iterations", "1", "--no-save-images", "--out", str(tmp_path))
    outputs = [
        diffmeter("bench", "tiny-sd", *common),
        diffmeter("bench", "tiny-flux", "--data-parallel", "2", *common),
        diffmeter("bench", "tiny-flux", "--quantize", "text_encoder_2=quanto:int8", *common),
        diffmeter("table", str(tmp_path)),
    ]
    for output in outputs:
        assert not [marker for marker in markers if marker in output], output[:2000]


def test_a_command_line_sweep_is_named_so_and_its_title_counts_cells(tmp_path, cli):
    """A title "sweep cli: 4 done" read "cli" as a word of the sentence: it names the sweep and its cells."""
    options = ["--model", "tiny-sd", "--opt", "offload", "--opt", "sdpa-kernel:kernel=cudnn", "--steps", "1"]
    code, out, err = cli("sweep", *options, "--device", "cpu", "--out", tmp_path)
    assert code == 2 and "all 2 cells of sweep 'command-line' were refused" in err
    assert "sweep 'command-line', 2 cells: 2 refused" in out
    assert (tmp_path / "sweep-command-line.json").exists()


def test_one_side_alone_says_the_other_follows_it(cli):
    """`profile wan22-t2v-a14b --width 832` counted 832x832 with no word (a user may have meant 832x480)."""
    code, out, _ = cli("profile", "tiny-flux", "--width", "64")
    assert code == 0 and "note: --width alone: the height follows it (a square)" in out and "64x64 px" in out
    code, out, err = cli("profile", "tiny-flux", "--height", "64", "--json")
    assert code == 0 and "--height alone: the width follows it" in err and json.loads(out)
    code, out, _ = cli("profile", "tiny-flux", "--height", "64", "--width", "32")
    assert code == 0 and "alone" not in out
