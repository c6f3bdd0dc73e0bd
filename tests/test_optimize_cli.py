"""Optimizations from the command line: flags, config file, DIFFMETER_* variables, refusals,
the registry listing, quality against the baseline, and the ladder."""

import json

import pytest

from diffmeter.optimize import REGISTRY
from diffmeter.optimize.base import Optimization
from diffmeter.optimize.registry import register
from diffmeter.runs.storage import RESULTS

QUICK = ("--steps", "3", "--iterations", "1", "-q")


def stored(folder):
    return json.loads((folder / RESULTS).read_text())


def test_lossy_technique_is_compared_with_the_unoptimized_images(cli, tmp_path):
    code, _, err = cli(
        "bench",
        "tiny-sd",
        *QUICK,
        "--batch-size",
        "2",
        "--scheduler",
        "dpm++2m",
        "--compare-baseline",
        "--out",
        tmp_path,
    )
    assert code == 0, err
    folders = sorted(p.name for p in tmp_path.iterdir())
    assert len(folders) == 2 and folders[0].endswith("+cpu") and folders[1].endswith("+opt-scheduler-dpm_2m")
    result = stored(tmp_path / folders[1])
    quality = result["quality"]
    assert result["optimizations"][0]["label"] == "scheduler-dpm++2m" and not result["optimizations"][0]["lossless"]
    assert len(quality["images"]) == 2 and quality["identical"] == 0
    assert 10 < quality["mean_psnr_db"] < 100 and 0 < quality["mean_ssim"] < 1
    assert quality["baseline"] == str(tmp_path / folders[0])
    code, shown, _ = cli("show", tmp_path / folders[1])  # a quality figure of random weights says what it is
    assert code == 0 and "random weights: the images are noise" in " ".join(shown.split())
    from diffmeter.cli.bench import json_summary
    from diffmeter.runs.results import BenchResult

    printed = json_summary(BenchResult.model_validate(result), tmp_path / folders[1])  # what bench --json prints
    assert printed["quality"]["caveat"].startswith("random weights: the images are noise")
    assert printed["quality"]["mean_ssim"] == quality["mean_ssim"]


def test_lossless_technique_gives_identical_images_and_reuses_the_stored_baseline(cli, tmp_path):
    assert cli("bench", "tiny-sd", *QUICK, "--out", tmp_path)[0] == 0
    (baseline,) = tmp_path.iterdir()
    before = (baseline / RESULTS).stat().st_mtime_ns
    code, _, err = cli("bench", "tiny-sd", *QUICK, "--fuse-qkv", "--compare-baseline", "--out", tmp_path)
    assert code == 0, err
    assert (baseline / RESULTS).stat().st_mtime_ns == before  # the stored baseline was reused
    quality = stored(next(p for p in tmp_path.iterdir() if p != baseline))["quality"]
    assert quality["identical"] == 1 and quality["mean_psnr_db"] is None and quality["mean_ssim"] == pytest.approx(1.0)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--cache", "first-block-cache"], "first-block-cache cannot be used with tiny-sd"),
        (["--cache-threshold", "0.1"], "need --cache NAME"),
        (["--cache", "taylorseer", "--cache-threshold", "0.1"], "--cache-threshold does not apply to taylorseer"),
        (["--opt", "fuse-qvk"], "Did you mean fuse-qkv"),
        (["--scheduler", "heun"], "scheduler: bad parameter name"),
        (["--compile-fullgraph"], "need --compile MODE"),
        (["--tf32"], "TF32 is an NVIDIA tensor-core mode"),
        # more steps than the scheduler's trained timesteps: diffusers' ValueError was a traceback (sweep too)
        (["--steps", "2000"], "DDIMScheduler refuses it"),
        # by name on a CPU: its own reason, not a --no-tf32 nobody passed
        (["--opt", "tf32"], "TF32 is an NVIDIA tensor-core mode"),
        (["--opt", "tf32", "--no-tf32"], "--no-tf32 contradicts the tf32 optimization"),
        (["--scheduler", "ddim", "--opt", "scheduler:name=euler"], "scheduler is asked for twice"),
        # --cache took any technique's name (compile ran as one); now the registry's caches only
        (["--cache", "compile"], "--cache compile: not a cache; the caches: "),
        (["--cache", "sea-cache"], "sea-cache cannot be used with tiny-sd"),  # reached the model's check
        # a new user's trial: a KeyError traceback, and the second threshold silently taken
        (["--opt", "scheduler"], "scheduler: bad parameter name: field required (its parameters: name)"),
        (["--opt", "first-block-cache:threshold=0.1,threshold=0.3"], "threshold is given twice; give it once"),
    ],
)
def test_refusals_come_before_anything_is_loaded_or_written(cli, tmp_path, args, message):
    code, _, err = cli("bench", "tiny-sd", *args, "--out", tmp_path / "out")
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_flags_beat_variables_which_beat_the_config_file(cli, tmp_path, monkeypatch):
    config = tmp_path / "run.yaml"
    config.write_text("steps: 4\niterations: 1\nbatch_size: 2\noptimizations:\n  fuse-qkv: {}\n")
    monkeypatch.setenv("DIFFMETER_SCHEDULER", "ddim")
    code, _, err = cli("bench", "tiny-sd", "--config", config, "--steps", "2", "--out", tmp_path / "out", "-q")
    assert code == 0, err
    (folder,) = (tmp_path / "out").iterdir()
    result = stored(folder)
    assert result["spec"]["steps"] == 2 and result["spec"]["batch_size"] == 2  # flag over file; file over default
    assert [o["label"] for o in result["optimizations"]] == ["scheduler-ddim", "fuse-qkv"]
    bad = tmp_path / "bad.yaml"
    bad.write_text("stepz: 3\n")
    code, _, err = cli("bench", "tiny-sd", "--config", bad, "--out", tmp_path / "out2")
    assert code == 2 and "unknown option 'stepz'" in err


def test_optimizations_lists_the_registry_and_why_not(cli):
    code, out, _ = cli("optimizations", "tiny-sd", "--device", "cpu", "--json")
    rows = {row["name"]: row for row in json.loads(out)}
    assert code == 0 and set(rows) == set(REGISTRY)
    assert rows["deep-cache"]["applies"] and not rows["first-block-cache"]["applies"]
    assert "CacheMixin" in rows["first-block-cache"]["reason"]
    assert rows["scheduler"]["variants"] == [
        "scheduler-ddim",
        "scheduler-dpm++2m",
        "scheduler-dpm++2m-karras",
        "scheduler-euler",
        "scheduler-euler-ancestral",
        "scheduler-unipc",
    ]
    code, out, _ = cli("optimizations", "tiny-flux", "--device", "cpu")
    assert code == 0 and "first-block-cache" in out and "offloading moves weights" in out


def test_a_wrong_cache_name_lists_the_registrys_caches(cli, tmp_path):
    @register
    class Skipping(Optimization):  # a cache registered at runtime is one --cache takes, with no list edited
        name, kind, lossless, summary = "test-skipping", "cache", False, "skips everything"

    try:
        code, _, err = cli("bench", "tiny-sd", "--cache", "nope", "--out", tmp_path)
        named = err.split("the caches: ")[1].split(" (")[0].split(", ")
        assert code == 2 and {"sea-cache", "test-skipping", "deep-cache"} <= set(named)
        assert "compile" not in named and "offload" not in named
    finally:
        del REGISTRY["test-skipping"]


def test_the_matrix_is_computed_from_the_registry(cli):
    @register
    class Everywhere(Optimization):  # a technique registered at runtime shows up with no table edited
        name, kind, lossless, summary = "test-everywhere", "fusion", True, "applies to anything"

        def supports(self, target):
            return None if target.entry.family == "sd" else "only Stable Diffusion"

    try:
        code, out, _ = cli("optimizations", "--json")
        cells = json.loads(out)["test-everywhere"]
        assert code == 0 and cells["sd"]["applies"] and not cells["flux"]["applies"]
        assert cells["flux"]["reason"] == "only Stable Diffusion"
    finally:
        del REGISTRY["test-everywhere"]


@pytest.mark.slow
def test_ladder_adds_one_technique_per_rung_and_resumes(cli, tmp_path):
    args = (
        "ladder",
        "tiny-flux",
        "--rungs",
        "scheduler,half,attention,cache",
        "--steps",
        "6",
        "--fast-steps",
        "3",
        "--iterations",
        "1",
        "--out",
        tmp_path,
        "--json",
    )
    code, out, err = cli(*args)
    assert code == 0, err
    rows = {row["rung"]: row for row in json.loads(out)["rows"]}
    assert list(rows) == ["baseline", "scheduler", "half", "attention", "cache"]
    assert (
        rows["baseline"]["speedup"] == 1.0 and rows["baseline"]["steps"] == 6 and rows["baseline"]["dtype"] == "float32"
    )
    assert rows["scheduler"]["steps"] == 3 and rows["scheduler"]["quality"]["mean_psnr_db"] > 0
    assert rows["half"]["dtype"] == "bfloat16" and rows["cache"]["adds"] == "first-block-cache"
    assert rows["attention"]["skipped"]  # no faster attention kernel on CPU, and it says why
    # each rung beside the range its run predicted from its settings alone (ladder showed none: a new user's trial)
    for name in ("baseline", "scheduler", "half"):
        low, high = rows[name]["expected_s"]
        verdict = "inside" if low <= rows[name]["latency_s"] <= high else "outside: "
        assert rows[name]["expected_verdict"].startswith(verdict), name
    (stored_ladder,) = tmp_path.glob("ladder-*.json")
    code, shown, _ = cli("show", stored_ladder)
    assert code == 0 and "optimization ladder" in shown and "first-block-cache" in shown
    assert "weights: tiny random weights (a test pipeline" in " ".join(shown.split())
    # its PSNR/SSIM are of noise images, said as bench's and compare's say it (a new user read them as quality)
    assert json.loads(out)["weights_random"] and "the images are noise" in " ".join(shown.split())
    mtimes = {p: (p / RESULTS).stat().st_mtime_ns for p in tmp_path.iterdir() if p.is_dir()}
    assert cli(*args)[0] == 0
    assert {p: (p / RESULTS).stat().st_mtime_ns for p in mtimes} == mtimes  # every rung reused
    assert list(tmp_path.glob("ladder-*.json")) == [stored_ladder]  # the same ladder: its own file again
    # a ladder of other rungs from the same baseline is a file of its own: it replaced the first (a new user's trial)
    fewer = list(args)
    fewer[fewer.index("--rungs") + 1] = "scheduler"
    assert cli(*fewer)[0] == 0 and len(list(tmp_path.glob("ladder-*.json"))) == 2
    code, _, err = cli("ladder", "tiny-flux", "--rungs", "cache,cache", "--out", tmp_path / "twice")
    assert code == 2 and "--rungs: cache given twice" in err and not (tmp_path / "twice").exists()


def _tiny_clip(folder):
    """A random-weight CLIP checkpoint written offline: the CLIP-score path, not its values."""
    import transformers

    from diffmeter.tiny import TOKENIZERS

    tokenizer = TOKENIZERS["clip"]()
    config = transformers.CLIPConfig(
        text_config={
            "vocab_size": len(tokenizer),
            "hidden_size": 32,
            "intermediate_size": 37,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "max_position_embeddings": 77,
        },
        vision_config={
            "image_size": 32,
            "patch_size": 8,
            "hidden_size": 32,
            "intermediate_size": 37,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
        },
        projection_dim=16,
    )
    transformers.CLIPModel(config).save_pretrained(folder)
    processor = transformers.CLIPProcessor(
        image_processor=transformers.CLIPImageProcessor(
            size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}
        ),
        tokenizer=tokenizer,
    )
    processor.save_pretrained(folder)


@pytest.mark.slow
def test_clip_score_when_a_local_checkpoint_exists_and_why_not_otherwise(cli, tmp_path, monkeypatch):
    import huggingface_hub.constants as constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "empty-hub"))
    args = ("bench", "tiny-sd", *QUICK, "--scheduler", "ddim", "--compare-baseline")
    assert cli(*args, "--out", tmp_path / "a")[0] == 0
    quality = stored(next(p for p in (tmp_path / "a").iterdir() if "opt-" in p.name))["quality"]
    assert quality["mean_clip_score"] is None and "no CLIP checkpoint" in quality["not_computed"]["clip_score"]
    assert "LPIPS needs torchvision" in quality["not_computed"]["lpips"] and quality["mean_lpips"] is None

    _tiny_clip(tmp_path / "clip")
    monkeypatch.setenv("DIFFMETER_CLIP_MODEL", str(tmp_path / "clip"))
    assert cli(*args, "--out", tmp_path / "b")[0] == 0
    quality = stored(next(p for p in (tmp_path / "b").iterdir() if "opt-" in p.name))["quality"]
    assert quality["clip_model"] == str(tmp_path / "clip") and "clip_score" not in quality["not_computed"]
    assert 0 <= quality["mean_clip_score"] <= 100 and 0 <= quality["mean_baseline_clip_score"] <= 100
    assert quality["images"][0]["clip_score"] is not None


@pytest.mark.slow
def test_a_stored_baseline_with_other_prompts_is_not_reused(cli, tmp_path):
    assert cli("bench", "tiny-sd", *QUICK, "--prompt", "a red cat", "--out", tmp_path)[0] == 0
    (red,) = tmp_path.iterdir()
    before = (red / RESULTS).read_bytes()
    code, _, err = cli(
        "bench", "tiny-sd", *QUICK, "--prompt", "a blue dog", "--fuse-qkv", "--compare-baseline", "--out", tmp_path
    )
    assert code == 0, err
    assert (red / RESULTS).read_bytes() == before  # the prompts name the run: the red-cat baseline is kept
    (blue,) = [p for p in tmp_path.iterdir() if "a_blue_dog" in p.name and "opt-" not in p.name]
    optimized = next(p for p in tmp_path.iterdir() if "opt-fuse-qkv" in p.name)
    assert stored(blue)["images"][0]["prompt"] == "a blue dog"
    assert stored(optimized)["quality"]["baseline"] == str(blue)


def test_a_stored_baseline_short_of_images_is_kept_unless_forced(cli, tmp_path):
    assert cli("bench", "tiny-sd", *QUICK, "--out", tmp_path)[0] == 0
    (base,) = tmp_path.iterdir()
    before = (base / RESULTS).read_bytes()
    more = ("--steps", "3", "--iterations", "2", "-q", "--fuse-qkv", "--compare-baseline", "--out", tmp_path)
    code, _, err = cli("bench", "tiny-sd", *more)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "holds 1 of the 2 images" in err and "--force" in err
    assert (base / RESULTS).read_bytes() == before and [p.name for p in tmp_path.iterdir()] == [base.name]
    code, _, err = cli("bench", "tiny-sd", *more, "--force")
    assert code == 0, err
    assert len(stored(base)["iterations"]) == 2  # measured again, as asked


def test_install_hints_keep_their_extra_and_the_header_names_the_device(cli, monkeypatch, tmp_path):
    import importlib.util

    import torch

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "DeepCache" else real(name, *a))
    code, out, _ = cli("optimizations", "tiny-sd")
    assert code == 0 and "pip install 'diffmeter[deepcache]'" in " ".join(out.split())
    if not torch.cuda.is_available():
        assert "on cpu" in out and "on cuda" not in out
    code, _, err = cli("bench", "tiny-sd", "--cache", "deep-cache", "--out", tmp_path)
    assert code == 2 and "pip install 'diffmeter[deepcache]'" in err and len(err.strip().splitlines()) == 1


def test_a_rung_that_would_apply_if_installed_says_so_before_what_does_not_apply(cli, tmp_path, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "DeepCache" else real(name, *a))
    code, out, err = cli(
        "ladder",
        "tiny-sd",
        "--rungs",
        "cache",
        "--steps",
        "2",
        "--iterations",
        "1",
        "--no-recheck",
        "--out",
        tmp_path,
        "--json",
    )
    assert code == 0, err
    cache = next(row for row in json.loads(out)["rows"] if row["rung"] == "cache")
    first = cache["skipped"].split("; ")[0]
    assert first.startswith("deep-cache would apply to tiny-sd, but") and "pip install 'diffmeter[deepcache]'" in first


@pytest.mark.slow
def test_the_ladder_measures_its_baseline_again_at_the_end(cli, tmp_path):
    code, out, err = cli(
        "ladder",
        "tiny-sd",
        "--rungs",
        "scheduler",
        "--steps",
        "4",
        "--fast-steps",
        "2",
        "--iterations",
        "1",
        "--out",
        tmp_path,
        "--json",
    )
    assert code == 0, err
    ladder = json.loads(out)
    assert ladder["baseline_recheck_s"] > 0 and len(ladder["baseline_recheck_interval_s"]) == 2
    scheduler = ladder["rows"][1]
    assert scheduler["speedup_interval"][0] <= scheduler["speedup"] <= scheduler["speedup_interval"][1]
    assert not any(path.name.startswith(".ladder-recheck") for path in tmp_path.iterdir())  # nothing left behind


def test_compare_baseline_without_a_technique_says_nothing_was_compared(cli, tmp_path):
    """A LoRA is part of the generation, not a technique: the run is its own baseline, so nothing runs twice, the
    record says it was not compared and a note says why (the flag was accepted and silently did nothing)."""
    code, out, err = cli("bench", "tiny-sd", *QUICK[:-1], "--lora-rank", "4", "--compare-baseline", "--out", tmp_path)
    assert code == 0, err
    (folder,) = tmp_path.iterdir()
    result = stored(folder)
    assert result["spec"]["compare_baseline"] is False and result["quality"] is None
    assert "--compare-baseline: nothing compared, the run applies no technique" in " ".join(out.split())


@pytest.mark.parametrize(
    ("model", "technique", "why"),
    [
        ("tiny-chroma", "first-block-cache", "ChromaPipeline never sets a cache context"),
        ("tiny-flux-kontext", "taylorseer", "FluxKontextPipeline never sets a cache context"),
        ("tiny-ltx2", "first-block-cache", "no metadata for LTX2VideoTransformerBlock"),
        ("tiny-qwenimage21", "mag-cache", "no metadata for QwenImage21TransformerBlock"),
        # diffusers' hook subtracts the double block's list of outputs from the single block's tensor: TypeError
        ("tiny-flux2-klein", "first-block-cache", "its first block (Flux2TransformerBlock)"),
        ("tiny-wan", "taylorseer", "diffusers' TaylorSeer patterns"),  # a no-op: attn1 matched by no pattern
    ],
)
def test_a_hook_cache_diffusers_would_fail_at_the_first_call_is_refused_before_loading(cli, model, technique, why):
    """``optimizations`` said yes and ``profile`` predicted a cached time, while bench failed after loading ("No cache
    context is set") or with a traceback ("Model class ChromaTransformerBlock not registered"): a new user's trial."""
    code, out, err = cli("bench", model, "--opt", technique, "--steps", "2", "--iterations", "1")
    assert code == 2 and why in " ".join(err.split()) and "Traceback" not in out + err
    code, out, _ = cli("optimizations", model)
    assert code == 0 and why in " ".join(out.split())


def test_profile_predicts_no_cached_time_for_a_cache_that_cannot_run(cli):
    """``profile flux2-dev --opt first-block-cache`` predicted 28% to 58% of the calls skipped: Flux2Pipeline sets no
    cache context, so the hook fails at the first call."""
    code, _, err = cli("profile", "flux2-dev", "--gpu", "h100", "--opt", "first-block-cache")
    assert code == 2 and "Flux2Pipeline never sets a cache context" in err
