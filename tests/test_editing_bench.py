"""`diffmeter bench` of an edit (the tiny FLUX.1 Kontext with an input image): the image encoding timed as its own
stage, the stored profile counting it, the input images seeded per output or read from a file."""

import json

import pytest
from PIL import Image

from diffmeter.catalog import resolve
from diffmeter.runs.lifecycle import bench
from diffmeter.runs.spec import BenchSpec
from diffmeter.runs.storage import RESULTS
from diffmeter.runs.workload import Workload


@pytest.fixture(scope="module")
def edit(tmp_path_factory):
    out = tmp_path_factory.mktemp("edits")
    return bench(BenchSpec(model="tiny-flux-kontext", image_sizes=[(24, 40)], batch_size=2, iterations=2), out=out)


def test_the_image_encoding_is_a_stage_of_its_own(edit):
    result, folder = edit
    for iteration in result.iterations:
        stages = iteration.stages
        assert stages.image_encoding_s > 0
        parts = [stages.text_encoding_s, stages.image_encoding_s, stages.denoising_s, stages.vae_decode_s]
        assert sum(parts) + stages.other_s == pytest.approx(iteration.total_s, rel=1e-9)
    encode = [c for c in result.profile.components if c.role == "image_encoder"]
    assert [(c.name, c.calls, c.batch_per_call) for c in encode] == [("vae", 1, 1)]  # one image, for both outputs
    assert result.summary.flops["image_encoding"] == encode[0].flops
    assert result.profile.input_images == [(24, 40)]
    assert "image-40x24" in folder.name
    stored = json.loads((folder / RESULTS).read_text())
    assert stored["spec"]["image_sizes"] == [[24, 40]]
    prediction = result.prediction
    assert "image_encoding" in [stage.stage for stage in prediction.time.stages]
    assert "image encoding" in prediction.stage_peak_memory_bytes


def test_each_call_edits_a_seeded_image(edit):
    """The image of a call is its first output's seed's (Kontext edits one image for the batch)."""
    result, _ = edit
    workload = Workload(result.spec, resolve("tiny-flux-kontext"))
    first, second = workload.input_images(0), workload.input_images(1)
    assert first[0].size == second[0].size == (40, 24)
    assert first[0].tobytes() != second[0].tobytes()
    assert workload.input_images(0)[0].tobytes() == first[0].tobytes()  # seeded: the same image every time


def test_an_image_file_sets_the_input_size(tmp_path):
    path = tmp_path / "cat.png"
    Image.new("RGB", (36, 20), (200, 120, 40)).save(path)
    result, folder = bench(BenchSpec(model="tiny-flux-kontext", images=[str(path)], iterations=1), out=tmp_path / "o")
    assert result.status == "complete"
    assert result.spec.image_sizes == [(20, 36)]
    assert result.profile.input_images == [(20, 36)]
    assert "image-file-cat-36x20" in folder.name


def test_sizes_are_typed_as_on_the_command_line():
    """A sweep file writes ``image_sizes: ["40x24"]`` (WxH), as ``--image-size`` takes them."""
    assert BenchSpec(model="tiny-flux-kontext", image_sizes=["40x24"]).image_sizes == [(24, 40)]
    assert BenchSpec(model="tiny-flux-kontext", image_sizes=[(24, 40)]).image_sizes == [(24, 40)]


def test_wan_animates_an_image_with_its_image_to_video_pipeline(tmp_path):
    """tiny-wan22-5b with --image-size: WanImageToVideoPipeline on the same components, the image encoding timed
    and counted once per call (bench's generator per output handed over as their noise: ``Wan.seeded_call``)."""
    result, folder = bench(
        BenchSpec(model="tiny-wan22-5b", image_sizes=["96x64"], batch_size=2, iterations=1), out=tmp_path
    )
    assert result.status == "complete", result.error
    assert all(iteration.stages.image_encoding_s > 0 for iteration in result.iterations)
    encode = next(c for c in result.profile.components if c.role == "image_encoder")
    assert (encode.calls, encode.batch_per_call) == (1, 1)
    assert result.profile.input_images == [(64, 64)]  # resized to the video's size


def test_a_sweep_takes_image_sizes_as_an_axis(cli, tmp_path):
    """A sweep file writes input sizes as the command line does ("40x24"); each cell is planned with its own."""
    study = tmp_path / "edits.yaml"
    study.write_text("name: edits\naxes:\n  image_sizes: [['40x24'], ['32x32']]\nfixed:\n  model: tiny-flux-kontext\n")
    code, out, err = cli("sweep", study, "--out", tmp_path / "out", "--dry-run", "--json")
    assert code == 0, err
    cells = json.loads(out)
    assert [cell["values"]["image_sizes"] for cell in cells] == [["40x24"], ["32x32"]]
    assert ["image-40x24" in cells[0]["folder"], "image-32x32" in cells[1]["folder"]] == [True, True]
    assert cells[0]["tflops_per_call"] != cells[1]["tflops_per_call"]  # the images' tokens differ


def test_a_prediction_with_an_image_shows_the_editing_check():
    """The memory check of a family editing an image is its own (benchmarks/memory_prediction_families_cpu.py
    checks it apart): a prediction with images shows that one, one without the text-to-image one."""
    from diffmeter.predict.memory import predict_memory
    from diffmeter.spec import ProfileSpec

    plain = predict_memory(ProfileSpec(model="tiny-wan22-5b"), on_cuda=False, vae_modes=())
    edit = predict_memory(ProfileSpec(model="tiny-wan22-5b", image_sizes=((64, 64),)), on_cuda=False, vae_modes=())
    assert "editing an image" not in plain.checked and "wan" in plain.checked
    assert "editing an image" in edit.checked


def test_fit_takes_images_and_a_lora(cli):
    """`fit` counts an edit with a LoRA like `profile` does; `fit --all` (catalog defaults) refuses both."""
    code, out, err = cli("fit", "tiny-flux-kontext", "--image-size", "40x24", "--lora-rank", "4", "--memory", "8GB")
    assert code == 0, err
    # the header names what is fitted: another input image or LoRA had read as the plain run (a new user's trial)
    header = "tiny-flux-kontext (32x32 px (WxH), 2 steps, batch 1, input image 40x24, LoRA rank 4) on --memory 8GB"
    assert header in " ".join(out.split())
    assert "predicted peak" in out
    code, _, err = cli("fit", "--all", "--image-size", "40x24", "--lora-rank", "4")
    assert code == 2 and "--image-size, --lora-rank" in err and len(err.strip().splitlines()) == 1


def test_ltx_animates_an_image_with_its_image_to_video_pipeline(tmp_path):
    """tiny-ltx with --image-size: LTXImageToVideoPipeline on the same components, the image encoded once per
    output and the profile's transformer counting the per-token timestep."""
    result, _ = bench(BenchSpec(model="tiny-ltx", image_sizes=["96x64"], batch_size=2, iterations=1), out=tmp_path)
    assert result.status == "complete", result.error
    assert all(iteration.stages.image_encoding_s > 0 for iteration in result.iterations)
    encode = next(c for c in result.profile.components if c.role == "image_encoder")
    assert (encode.calls, encode.batch_per_call) == (2, 1)
    assert any("timestep per token" in note for note in result.profile.notes)


def test_no_image_benches_the_catalog_edit_text_to_image(cli, tmp_path):
    """`--no-image` runs FLUX.1 Kontext's pipeline without its input image, as `profile --no-image` counts it: no
    image-encoding stage, no image in the stored profile or the run folder's name; with an image it is one line."""
    code, out, err = cli("bench", "tiny-flux-kontext", "--no-image", "--iterations", "1", "--out", str(tmp_path))
    assert code == 0, err
    stored = json.loads(next(tmp_path.rglob(RESULTS)).read_text())
    assert stored["spec"]["no_image"] is True and stored["profile"]["input_images"] == []
    assert stored["summary"]["flops"]["image_encoding"] == 0
    assert all(run["stages"]["image_encoding_s"] == 0 for run in stored["iterations"])
    assert "image-" not in next(tmp_path.rglob(RESULTS)).parent.name
    code, _, err = cli("bench", "tiny-flux-kontext", "--no-image", "--image-size", "32x32", "--out", str(tmp_path))
    assert code == 2 and "--no-image and --image-size/--image contradict each other" in err


def test_fit_takes_no_image_as_profile_does(cli):
    """`fit tiny-flux-kontext --no-image` fits the text-to-image call: a smaller peak than an edit's (its image's
    tokens beside the output's in every attention)."""
    code, out, err = cli("fit", "tiny-flux-kontext", "--memory", "24GB", "--image-size", "64x64", "--json")
    edit = json.loads(out)["fits"][0]["peak_bytes"]
    code, out, err = cli("fit", "tiny-flux-kontext", "--memory", "24GB", "--no-image", "--json")
    assert code == 0, err
    found = json.loads(out)
    assert found["settings"]["image_sizes"] == [] and found["fits"][0]["peak_bytes"] < edit
    code, _, err = cli("fit", "tiny-flux-kontext", "--memory", "24GB", "--no-image", "--image-size", "32x32")
    assert code == 2 and "--no-image and --image-size contradict each other" in err
