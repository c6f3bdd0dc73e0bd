"""`diffmeter bench` and `diffmeter show` from the command line, bad input included."""

import json
from pathlib import Path

import pytest
import torch
from diffusers.hooks import FirstBlockCacheConfig
from PIL import Image

from diffmeter.runs.storage import RESULTS


@pytest.mark.slow
def test_bench_prints_the_stage_table_and_show_reprints_it(cli, tmp_path):
    code, out, err = cli("bench", "tiny-sd", "--steps", "2", "--iterations", "2", "--out", tmp_path)
    assert code == 0, err
    for text in ("text encoding", "denoising (2 steps)", "one step", "VAE decode", "total", "images/s", "results:"):
        assert text in out
    (folder,) = tmp_path.iterdir()
    code, shown, _ = cli("show", folder)
    assert code == 0 and "denoising (2 steps)" in shown and "tiny random weights" in shown
    code, stored, _ = cli("show", folder / RESULTS, "--json")
    assert code == 0 and json.loads(stored)["status"] == "complete"


def test_bench_json_prints_the_summary_with_its_weights_and_noise_notes(cli, tmp_path):
    code, out, _ = cli("bench", "tiny-dit", "--steps", "2", "--iterations", "1", "--out", tmp_path, "--json", "-q")
    data = json.loads(out)
    assert code == 0 and data["summary"]["images"] == 1 and data["folder"].startswith(str(tmp_path))
    assert data["summary"]["latency_s"]["median"] > 0 and "--peak-tflops" in data["summary"]["mfu_note"]
    assert data["weights_random"] is True and data["weights"].startswith("tiny random weights")
    stored = json.loads((Path(data["folder"]) / RESULTS).read_text())
    assert data["notes"] == stored["notes"]
    noisy = [note for note in stored["notes"] if note.startswith("noisy:")]  # one call: its median has no interval
    assert noisy and [note for note in data["noise"] if note.startswith("noisy:")] == noisy


def test_prompts_file_and_quiet(cli, tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "a red cat"}\n"a blue dog"\n')
    code, out, err = cli(
        "bench", "tiny-sd", "--steps", "1", "--iterations", "2", "--prompts", prompts, "--out", tmp_path / "o", "-q"
    )
    assert code == 0 and out == "" and err == ""
    (folder,) = (tmp_path / "o").iterdir()
    stored = json.loads((folder / RESULTS).read_text())
    assert sorted(image["prompt"] for image in stored["images"]) == ["a blue dog", "a red cat"]


def _empty_file(tmp_path):
    path = tmp_path / "empty.txt"
    path.write_text("\n  \n")
    return path


def _file_in_the_way(tmp_path):
    blocker = tmp_path / "blocker"
    blocker.write_text("not a folder")
    return blocker / "results"


BAD = [
    (["nope-model"], "unknown model 'nope-model'"),
    (["tiny-sd", "--height", "33"], "is not a multiple of 8, which StableDiffusionPipeline requires"),
    (["tiny-sd", "--device", "mps"], "--device mps is not supported"),
    (["tiny-sd", "--target-precision", "2"], "--target-precision is a fraction"),
    (["tiny-sd", "--batch-size", "10000000"], "needs at least"),
    (["tiny-sd", "--batch-size", "99999999999"], "--batch-size 99999999999 is too large"),
    (["tiny-sd", "--batch-size", "99999999999", "--vae-slicing"], "--batch-size 99999999999 is too large"),
    (["tiny-sd", "--warmup", "0"], "--warmup must be at least 1"),
    (["tiny-sd", "--iterations", "0"], "--iterations must be at least 1"),
    (["tiny-sd", "--dtype", "int8"], "unknown dtype 'int8'"),
    (["tiny-sd", "--device", "tpu"], "unknown device 'tpu'"),
    (["tiny-sd", "--prompts", "missing.txt"], "cannot read prompts file"),
    (["tiny-sd", "--prompt", "a", "--prompts", "b.txt"], "either --prompt or --prompts"),
    (["sd15"], "not in the local Hugging Face cache"),
    (["tiny-dit", "--prompt", "a cat"], "is class-conditional"),
    (["tiny-sd", "--image-size", "32x32"], "takes no input image: drop --image or --image-size"),
    (["tiny-sd", "--image", "a.png"], "takes no input image: drop --image or --image-size"),
    (["tiny-flux-kontext", "--image-size", "32"], "--image-size takes WIDTHxHEIGHT"),
    (["tiny-flux-kontext", "--image-size", "2x2"], "leaving nothing; use at least 4x4"),
    (["tiny-flux-kontext", "--image-size", "32x32", "--image-size", "32x32"], "edits one input image"),
    (["tiny-flux-kontext", "--image", "missing.png"], "--image missing.png: no such file"),
    (["tiny-flux-kontext", "--image", "prompts.txt"], "not an image PIL can read"),
    (["tiny-flux-kontext", "--image", "a.png", "--image", "a.png"], "got 2: pass one --image or --image-size"),
]


@pytest.mark.parametrize(("args", "message"), BAD)
def test_bad_input_is_one_line_exit_2_and_writes_nothing(cli, tmp_path, monkeypatch, args, message):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "prompts.txt").write_text("a cat\n")
    Image.new("RGB", (32, 32)).save(tmp_path / "a.png")
    code, out, err = cli("bench", *args, "--out", tmp_path / "out")
    assert code == 2 and message in err
    assert err.startswith("error:") and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("DIFFMETER_COMPILE", "bogus", "DIFFMETER_COMPILE=bogus: compile: bad parameter mode"),
        ("DIFFMETER_CACHE", "nonsense", "DIFFMETER_CACHE=nonsense: --cache nonsense: not a cache; the caches: "),
    ],
)
def test_a_refused_technique_set_by_a_variable_names_the_variable(cli, tmp_path, monkeypatch, variable, value, message):
    monkeypatch.setenv(variable, value)
    code, _, err = cli("bench", "tiny-sd", "--out", tmp_path / "out")
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message when CUDA is absent")
def test_cuda_asked_for_but_absent(cli, tmp_path):
    code, _, err = cli("bench", "tiny-sd", "--device", "cuda", "--out", tmp_path / "out")
    assert code == 2 and "sees no CUDA device" in err and "--device cpu" in err


@pytest.mark.parametrize("make", [_empty_file, _file_in_the_way])
def test_empty_prompts_file_and_unwritable_output(cli, tmp_path, make):
    target = make(tmp_path)
    args = ["--prompts", target] if target.name == "empty.txt" else ["--out", target]
    code, _, err = cli("bench", "tiny-sd", *args)
    assert code == 2 and ("holds no prompts" in err or "cannot write results under" in err)
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_existing_result_needs_force(cli, tmp_path):
    args = ("bench", "tiny-sd", "--steps", "1", "--iterations", "1", "--out", tmp_path, "-q")
    assert cli(*args)[0] == 0
    code, _, err = cli(*args)
    assert code == 2 and "already exists" in err and "--force" in err
    assert cli(*args, "--force")[0] == 0


def test_show_refuses_what_is_not_a_result(cli, tmp_path):
    code, _, err = cli("show", tmp_path)
    assert code == 2 and "no results.json" in err
    (tmp_path / RESULTS).write_text('{"status": "compl')
    code, _, err = cli("show", tmp_path)
    assert code == 2 and "is not a readable diffmeter result" in err and len(err.strip().splitlines()) == 1
    assert "(Invalid JSON: " in err  # what is wrong, not "1 validation error for BenchResult"
    (tmp_path / RESULTS).write_text("[]")  # valid JSON, the wrong shape: pydantic's location is empty
    code, _, err = cli("show", tmp_path)
    assert code == 2 and "(the file as a whole: Input should be an object)" in err and "(: " not in err
    # the --out folder of several runs (a new user's `show sw`): said so, not "an interrupted run leaves none"; and
    # `report` on a folder whose one run cannot be read says why, not "no run folder"
    study = tmp_path / "study"
    for name in ("a", "b"):
        (study / name).mkdir(parents=True)
        (study / name / RESULTS).write_text('{"status": "compl')
    code, _, err = cli("show", study)
    assert code == 2 and f"{study} holds 2 run folders, not one run: point at one of them ({study / 'a'})" in err
    code, _, err = cli("report", study, "--out", tmp_path / "r.html")
    assert code == 2 and "is not a readable diffmeter result (Invalid JSON: " in err and "(and 1 more)" in err


def test_a_result_from_a_newer_diffmeter_is_refused_naming_both_schemas(cli, tmp_path):
    from diffmeter.runs.results import SCHEMA_VERSION

    args = ("bench", "tiny-sd", "--steps", "1", "--iterations", "1", "--out", tmp_path, "-q")
    assert cli(*args)[0] == 0
    (folder,) = [path for path in tmp_path.iterdir() if path.is_dir()]
    stored = json.loads((folder / RESULTS).read_text())
    (folder / RESULTS).write_text(json.dumps({**stored, "schema_version": SCHEMA_VERSION + 1}))
    code, _, err = cli("show", folder)
    assert code == 2 and f"written by a newer diffmeter: schema {SCHEMA_VERSION + 1}, this one reads" in err


def test_measurement_options_reach_the_result(cli, tmp_path):
    code, _, err = cli(
        "bench",
        "tiny-sd",
        "--steps",
        "1",
        "--iterations",
        "2",
        "--warmup",
        "2",
        "--num-prompts",
        "1",
        "--batch-size",
        "2",
        "--no-save-images",
        "--peak-tflops",
        "0.5",
        "--seed",
        "7",
        "--out",
        tmp_path,
        "-q",
    )
    assert code == 0, err
    (folder,) = tmp_path.iterdir()
    result = json.loads((folder / RESULTS).read_text())
    assert len(result["warmup_s"]) == 2 and len(result["iterations"]) == 2 and result["images"] == []
    assert not any((folder / "images").iterdir())
    assert result["summary"]["peak"]["tflops"] == 0.5 and result["summary"]["mfu"]["total"] > 0
    calls = json.loads((folder / "requests.json").read_text())["calls"]
    assert len({p for call in calls for p in call["prompts"]}) == 1  # one prompt, cycled
    assert calls[0]["seeds"] == [7, 8] and "seed-7" in folder.name


def test_results_are_ordinary_readable_files(cli, tmp_path):
    import os
    import stat

    code, _, err = cli("bench", "tiny-sd", "--steps", "1", "--iterations", "1", "--out", tmp_path, "-q")
    assert code == 0, err
    (folder,) = tmp_path.iterdir()
    umask = os.umask(0)
    os.umask(umask)
    for name in ("results.json", "requests.json", "bench.log"):
        assert stat.S_IMODE((folder / name).stat().st_mode) == 0o666 & ~umask  # not mkstemp's private 0600


def test_an_existing_result_says_what_it_shares_and_what_differs(cli, tmp_path):
    args = ("bench", "tiny-sd", "--steps", "1", "--out", tmp_path, "-q")
    assert cli(*args, "--iterations", "1")[0] == 0
    code, _, err = cli(*args, "--iterations", "2")
    assert code == 2 and "already exists" in err and "different iterations 1 -> 2" in err


def test_the_parameters_that_ran_are_recorded_defaults_included(cli, tmp_path):
    code, _, err = cli(
        "bench",
        "tiny-flux",
        "--steps",
        "2",
        "--iterations",
        "1",
        "--cache",
        "first-block-cache",
        "--out",
        tmp_path,
        "-q",
    )
    assert code == 0, err
    (folder,) = tmp_path.iterdir()
    (applied,) = json.loads((folder / RESULTS).read_text())["optimizations"]
    assert applied["name"] == "first-block-cache"
    assert applied["params"] == {"threshold": FirstBlockCacheConfig().threshold}  # diffusers' own default


@pytest.mark.slow
def test_running_out_of_cpu_memory_is_a_stored_failed_result(tmp_path):
    """A real allocator failure: the address space is capped below what the batch needs (a batch of 16 at
    4096x4096 fails within seconds; a batch of tiny images fails only after minutes of text encoding)."""
    import resource
    import subprocess

    def cap_memory():
        resource.setrlimit(resource.RLIMIT_AS, (9 * 2**30, 9 * 2**30))

    command = ["diffmeter", "bench", "tiny-sd", "--batch-size", "16", "--height", "4096", "--width", "4096"]
    command += ["--steps", "1", "--iterations", "1"]
    done = subprocess.run(
        [*command, "--no-memory-check", "--out", str(tmp_path)], capture_output=True, text=True, preexec_fn=cap_memory
    )
    assert done.returncode == 2, done.stderr[-2000:]
    lines = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "out of memory on cpu" in lines[0] and "Traceback" not in done.stderr
    (folder,) = tmp_path.iterdir()
    failed = json.loads((folder / RESULTS).read_text())
    assert failed["status"] == "failed" and "can't allocate memory" in failed["error"]


def test_a_batch_too_large_names_batch_size_and_the_largest_that_fits(cli, tmp_path):
    code, _, err = cli("bench", "tiny-sd", "--batch-size", "99999999999", "--out", tmp_path)
    (line,) = err.strip().splitlines()
    assert code == 2 and line.startswith("error: --batch-size 99999999999 is too large") and "Traceback" not in err
    largest = int(line.split("pass --batch-size ")[1].split()[0])
    assert 1 <= largest < 99999999999 and "--height" not in line and "the size" not in line


def test_a_pipeline_that_fails_to_load_leaves_no_folder_it_made(cli, tmp_path, capsys):
    """Weights that cannot be read: one line, exit 2, and the --out folders bench made for the result removed again;
    a folder that was there before stays."""
    from diffmeter.catalog import resolve
    from diffmeter.tiny import tiny_pipeline

    tiny_pipeline(resolve("tiny-sd")).save_pretrained(tmp_path / "sd")
    (tmp_path / "sd" / "unet" / "diffusion_pytorch_model.safetensors").write_text("not safetensors")
    capsys.readouterr()  # save_pretrained's progress bar
    code, _, err = cli("bench", str(tmp_path / "sd"), "--device", "cpu", "--out", tmp_path / "new" / "deeper")
    assert code == 2 and "cannot load" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "new").exists()
    (tmp_path / "kept").mkdir()
    code, _, _ = cli("bench", str(tmp_path / "sd"), "--device", "cpu", "--out", tmp_path / "kept")
    assert code == 2 and (tmp_path / "kept").is_dir() and not list((tmp_path / "kept").iterdir())
