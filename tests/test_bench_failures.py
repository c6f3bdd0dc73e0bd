"""`diffmeter bench` on what goes wrong around a run: a pipeline call that raises, a stored baseline measured
otherwise, and the prediction stored beside a run of prompt-dependent compute."""

import pytest
import torch

from diffmeter.errors import DiffmeterError
from diffmeter.runs.lifecycle import bench
from diffmeter.runs.spec import BenchSpec
from diffmeter.runs.storage import read_result


def test_a_pipeline_call_that_raises_is_a_failed_result_quoting_its_reason_in_one_line(cli, tmp_path):
    """StableDiffusionPipeline hands the UNet's float32 latents to a bfloat16 VAE unchanged: the call raised, and
    bench printed a whole traceback (a new user's trial). Now the run is stored as failed with the real reason, and
    the terminal gets one line naming the option."""
    code, out, err = cli(
        "bench", "tiny-sd", "--steps", "1", "--iterations", "1", "--component-dtype", "vae=bfloat16", "--out", tmp_path
    )
    assert code != 0 and "Traceback" not in err + out and len(err.strip().splitlines()) == 1
    assert "--component-dtype vae=bfloat16" in err and "bias type" in err
    (folder,) = tmp_path.iterdir()
    failed = read_result(folder)
    assert failed.status == "failed" and "RuntimeError" in failed.error and failed.summary is None
    assert "Traceback" in (folder / "bench.log").read_text()


def test_the_stored_prediction_times_the_work_of_the_prompts_the_run_counted(tmp_path):
    """Qwen-Image's compute follows its prompts' tokens: the stored profile counted the run's, the prediction timed
    the catalog default's (the text encoder's 13x as many FLOPs: a new user's trial), and bench called the measured
    median inside a range predicted for a heavier run."""
    result, _ = bench(BenchSpec(model="tiny-qwenimage", steps=1, iterations=1, device="cpu"), out=tmp_path)
    assert any("longest prompt" in note for note in result.notes)
    for stage in result.prediction.time.stages:
        assert stage.flops == result.summary.flops[stage.stage], stage.stage


def test_a_stored_baseline_measured_with_other_threads_is_not_compared_against(tmp_path):
    """A --compare-baseline run reused a baseline stored with 2 torch threads while it ran with 1: "121x faster"
    for a sampler that changed nothing (a new user's trial). Refused in one line naming the difference; --force
    measures the baseline again."""
    from diffmeter.optimize.options import parse_opt

    spec = BenchSpec(model="tiny-sd", steps=1, iterations=1, device="cpu")
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        bench(spec, out=tmp_path)
        torch.set_num_threads(1)
        compared = spec.model_copy(update={"optimizations": [parse_opt("fuse-qkv")], "compare_baseline": True})
        with pytest.raises(DiffmeterError, match=r"measured otherwise than this process would \(torch threads: 2 -> 1"):
            bench(compared, out=tmp_path)
        result, _ = bench(compared, out=tmp_path, force=True)
        assert result.speedup is not None and read_result(result.speedup.baseline).environment.torch_threads == 1
    finally:
        torch.set_num_threads(threads)
