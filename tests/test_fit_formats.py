"""`fit` and the leaderboard offer the ``--quantize BACKEND:TYPE`` formats (predict/fit_formats.py): FLUX.1-dev's real
prediction on a 12 GB card, the settings bench's own check lets through, the leaderboard's least quantization, and
the catalog's published quantized files against their predicted sizes (catalog/quantized_files.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml

from diffmeter.catalog import resolve
from diffmeter.catalog.quantized_files import PublishedSize, all_files, files_of
from diffmeter.predict import svdquant_files
from diffmeter.predict.devices import CUDA_HOLDBACK_BYTES, named_gpu
from diffmeter.predict.fit_formats import FIT_FORMATS, NEEDS_FP8, format_bytes, technique, with_fit_formats
from diffmeter.predict.footprints import meta_module
from diffmeter.predict.offload_time import moved_bytes
from diffmeter.predict.operators import predict_memory_and_work
from diffmeter.predict.quantized_files import error, predicted_bytes
from diffmeter.predict.quantized_formats import quantized_bytes
from diffmeter.predict.techniques import OFFLOADS, fitting, peak_under, settings
from diffmeter.runs.fitting import format_times, lower_times, plain_time, refusals, time_note
from diffmeter.spec import ProfileSpec

PUBLISHED = Path(__file__).parent.parent / "benchmarks" / "published_quantized.yaml"


@pytest.fixture(scope="module")
def flux_and_work():
    """FLUX.1-dev at its defaults, predicted as `fit` predicts it (one fake run), with the formats fit offers."""
    spec = ProfileSpec(model="flux-dev")
    memory, work = predict_memory_and_work(spec)
    return with_fit_formats(memory, spec), work


@pytest.fixture(scope="module")
def flux(flux_and_work):
    return flux_and_work[0]


def test_a_12_gb_card_gets_nf4_and_gguf_settings_and_bf16_does_not_fit(flux):
    usable = named_gpu("RTX 4070").memory_bytes - CUDA_HOLDBACK_BYTES
    fits = dict(fitting(flux, usable))
    assert flux.peak_bytes > usable and () not in fits  # bfloat16 as is: 33.8 GiB
    for name in ("quantize-bnb-nf4", "quantize-gguf-Q4_K_S"):
        found = [chosen for chosen in fits if name in chosen]
        assert found and all(fits[chosen] == peak_under(flux, chosen) <= usable for chosen in found), name
    # the stored bytes are the backend's layout of the real transformer (built on meta), not a guess
    module = meta_module(resolve("flux-dev").components["transformer"], torch.bfloat16)
    assert flux.quantized_bytes["quantize-bnb-nf4"]["transformer"] == quantized_bytes(
        module, "bnb", "nf4", torch.bfloat16
    )
    assert format_bytes(flux, "quantize-gguf-Q4_K_S") < format_bytes(flux, "quantize-gguf-Q8_0")


def test_float8_formats_only_on_cards_with_fp8_tensor_cores(flux):
    offered = {t for chosen in settings(flux) for t in chosen}
    assert set(NEEDS_FP8) <= offered and {technique(*f) for f in FIT_FORMATS} <= offered
    assert not set(NEEDS_FP8) & {t for chosen in settings(flux, fp8=False) for t in chosen}
    assert "quantize-int8" not in offered  # the formats replace the torchao-after-loading names


def test_benchs_own_check_lets_the_formats_through_on_cuda():
    """Each format as bench is asked for it (memory_setting_specs): bench's refusals before loading find none on a
    CUDA GPU at bfloat16 (FLUX's own); a GGUF setting is checked without its file (the user's download). At float32
    per-row float8 alone is refused: torchao quantizes per row only bfloat16 weights."""
    entry = resolve("tiny-flux")
    chosen = [(technique(*found), "offload-model") for found in FIT_FORMATS] + [("quantize-bnb-nf4", "vae-tiling")]
    spec = ProfileSpec(model="tiny-flux", dtype="bfloat16").with_defaults(entry.defaults)
    assert refusals(chosen, entry, spec) == []
    spec = ProfileSpec(model="tiny-flux", dtype="float32").with_defaults(entry.defaults)
    assert [found for found, _ in refusals(chosen, entry, spec)] == [("quantize-torchao-float8dq-row", "offload-model")]


def test_a_gguf_setting_is_refused_for_a_model_with_two_denoisers():
    """Wan 2.2 A14B's two experts cannot take a GGUF file each: bench takes one --weights file, which holds one
    component ("a GGUF file holds one component's weights: name one"). fit offered `offload-model + gguf:Q4_K_S` for
    wan22-t2v-a14b on an RTX 4090 all the same (a new user's trial); the other formats quantize both experts."""
    entry = resolve("tiny-wan22")
    spec = ProfileSpec(model="tiny-wan22", dtype="bfloat16").with_defaults(entry.defaults)
    chosen = [("offload-model", technique("gguf", "Q4_K_S")), ("offload-model", technique("bnb", "nf4"))]
    ((refused, why),) = refusals(chosen, entry, spec)
    assert refused == chosen[0] and "tiny-wan22 has 2 denoisers (transformer, transformer_2)" in why


def test_on_this_cpu_bench_refuses_offloading_and_cuda_only_formats_and_fit_says_so(cli):
    """``fit --gpu cpu`` fits this CPU's run: bench refuses offloading and bitsandbytes there, so fit leaves them out
    with bench's reason; torchao int8 runs there; the run is float32, as bench runs on a CPU."""
    entry = resolve("tiny-flux")
    spec = ProfileSpec(model="tiny-flux").with_defaults(entry.defaults)
    chosen = [("offload-model",), ("quantize-bnb-nf4",), ("quantize-int8",)]
    refused = dict(refusals(chosen, entry, spec, "cpu"))
    assert set(refused) == {("offload-model",), ("quantize-bnb-nf4",)}
    assert "offloading moves weights between the CPU and a GPU; this run is on cpu" in refused[("offload-model",)]
    assert "bitsandbytes only on a GPU" in refused[("quantize-bnb-nf4",)]
    code, out, _ = cli("fit", "tiny-flux", "--gpu", "cpu", "--json")
    assert code == 0 and json.loads(out)["settings"]["dtype"] == "float32"


def test_a_format_whose_time_is_modelled_is_timed_as_profile_times_it_and_the_others_say_why_not(flux_and_work):
    """NF4 and GGUF through predict.quantized_time (the quantized layers' matmuls as the backend runs them), as
    `profile --gpu --quantize` does; quanto int4 is not modelled: its row keeps the unquantized bound and says so."""
    prediction, work = flux_and_work
    spec, gpu = ProfileSpec(model="flux-dev"), named_gpu("RTX 4070")
    plain = plain_time(work, prediction, gpu)
    settings = [("offload-model", "quantize-bnb-nf4"), ("offload-model", "quantize-quanto-int4")]
    timed = format_times(work, prediction, spec, gpu, True, settings)
    nf4 = ("quantize-bnb-nf4",)
    assert set(timed) == {nf4} and timed[nf4].lower_s > plain.lower_s  # dequantizes
    times = lower_times(plain, prediction, gpu, settings, timed)
    link = gpu.host_link_bytes_per_s  # model offload: its transfers added to the format's own bound
    assert times[settings[0]] == pytest.approx(timed[nf4].lower_s + moved_bytes(prediction, settings[0]) / link)
    assert times[settings[1]] == pytest.approx(plain.lower_s + moved_bytes(prediction, settings[1]) / link)
    assert time_note(settings[0], timed) is None and "quanto:int4 not timed" in time_note(settings[1], timed)


def test_fit_json_lists_formats_with_their_time_note_and_quality(cli):
    code, out, err = cli("fit", "tiny-flux", "--gpu", "RTX 4070", "--json", "--steps", "2")
    data = json.loads(out)
    assert code == 0, err
    rows = {tuple(row["techniques"]): row for row in data["fits"]}
    assert rows[()]["quality"] == "lossless" and rows[()]["time_note"] is None  # tiny: it fits as is
    assert rows[()]["expected_s"] is not None and data["plain_peak_bytes"] > 0
    code, out, _ = cli("fit", "tiny-flux", "--memory", "1.2835GB", "--json", "--steps", "2")
    fits = json.loads(out)["fits"]
    quantized = [row for row in fits if any(t.startswith("quantize-") for t in row["techniques"])]
    assert quantized and all(row["quality"] == "not measured" and row["lower_s"] is None for row in quantized)


def test_fit_without_a_card_says_how_it_orders_and_drops_the_empty_time_column(cli):
    """No GPU named, no time: the rows are in the settings' order (least offload first), which the table says, and
    the time column, every cell of it empty, is not shown."""
    asked = ("fit", "tiny-flux", "--memory", "1.2835GB", "--steps", "2")
    code, out, err = cli(*asked)
    assert code == 0, err
    text = " ".join(out.split())
    assert "setting (least offload first)" in out and "fastest" not in out and "time >=" not in out
    assert "Order: no time without the card's figures, so not by speed: by offload (none, model, group" in text
    code, out, _ = cli(*asked, "--json")
    rows = [row["techniques"] for row in json.loads(out)["fits"]]
    offloads = [OFFLOADS.index(next((t for t in row if t.startswith("offload-")), "none")) for row in rows]
    assert len(set(offloads)) > 1 and offloads == sorted(offloads)


def test_fit_takes_component_dtypes_as_the_leaderboard_settles_them(cli):
    """A spec's component dtypes are (name, dtype) pairs: Wan's and SANA's catalog defaults keep the VAE in float32,
    and `fit --all` (the leaderboard) crashed on them with a traceback."""
    code, out, err = cli("fit", "tiny-flux", "--gpu", "RTX 4070", "--component-dtype", "vae=float32", "--json")
    assert code == 0 and "Traceback" not in err and json.loads(out)["fits"], err


@pytest.mark.slow
def test_fit_flux_dev_on_a_12_gb_card_says_why_bf16_does_not_fit(cli):
    code, out, _ = cli("fit", "flux-dev", "--gpu", "RTX 4070")
    text = " ".join(out.split())
    assert code == 0 and "As is (bfloat16) it does not fit: its peak 33.80 GiB" in text
    assert "bnb:nf4" in text and "gguf:Q4_K_S" in text  # the fastest rows combine them with compile and a cache
    code, out, _ = cli("fit", "flux-dev", "--gpu", "RTX 4070", "--all-settings")  # the untimed ones follow, said why
    text = " ".join(out.split())  # no bound either: profile gives none for a format whose time is not modelled
    assert code == 0 and "Not ranked (no expected range; after the ranked rows, by lower bound):" in text
    assert "quantize-quanto-int4: its packed int4 kernels run far from any bound in eager mode" in text


def test_the_leaderboard_names_the_least_quantization_that_fits(flux):
    from diffmeter.report.leaderboard import leaderboard_csv
    from diffmeter.runs.leaderboard import model_cells

    cards = [named_gpu(name) for name in ("H100 SXM", "RTX 4070")]
    big, small = model_cells("flux-dev", cards)
    assert big.least_format == "bf16"
    usable = small.memory_bytes - CUDA_HOLDBACK_BYTES
    chosen = "quantize-" + small.least_format.replace(":", "-")
    extras = [(), ("fp8-text-encoder",), ("vae-tiling",), ("fp8-text-encoder", "vae-tiling")]

    def fits(name: str) -> bool:  # without layer offloading: as is or with model offload
        return any(peak_under(flux, (*o, name, *e)) <= usable for o in ((), ("offload-model",)) for e in extras)

    assert fits(chosen)
    larger = [technique(*f) for f in FIT_FORMATS if format_bytes(flux, technique(*f)) > format_bytes(flux, chosen)]
    assert larger and not any(fits(name) for name in larger)
    assert f",{small.least_format}," in leaderboard_csv([small])


def test_published_sizes_are_read_as_their_sources_round_them():
    assert PublishedSize(value=6.79, unit="GB (Hugging Face file list)").byte_range() == (6_785_000_000, 6_795_000_000)
    assert PublishedSize(value=128, unit="MB (Hugging Face file list)").byte_range() == (127_500_000, 128_500_000)
    assert PublishedSize(value=4032341280, unit="B").byte_range() == (4032341280, 4032341280)


def test_the_catalogs_files_are_the_published_ones():
    """Copied, not computed: every listed file is in benchmarks/published_quantized.yaml with the same size."""
    published = {(e["repo"], e["file"]): e for e in yaml.safe_load(PUBLISHED.read_text())["file_sizes"]}
    for file in all_files():
        source = published[(file.repo, file.file)]
        assert (source["model"], source["size"]) == (file.model, file.size.model_dump()), file.file
        assert resolve(file.model).name == file.model and file.component in resolve(file.model).components
        assert file.rules_modelled or file.not_modelled  # a file whose rules are not modelled says why


@pytest.mark.slow
def test_every_listed_gguf_file_is_predicted_and_those_whose_rules_are_modelled_within_half_a_percent():
    modelled = {}
    for model in sorted({file.model for file in all_files()}):
        files = files_of(model)
        for file, size in zip(files, predicted_bytes(files), strict=True):
            if file.rules in svdquant_files.RULES:  # tests/test_svdquant_files.py holds them
                continue
            if file.format != "gguf" and file.rules != "diffusers-bnb":
                assert size is None
                continue
            if file.rules_modelled:
                assert abs(error(size, file)) < 0.005, (file.file, error(size, file))
                modelled[file.model] = modelled.get(file.model, 0) + 1
    # city96's FLUX.1, FLUX.2 (all but Q2_K), Qwen-Image, HiDream, Wan 2.1 and SD3.5 Large files, orabazes' FLUX.2,
    # QuantStack's Qwen-Image, a Wan 2.2 file from an F16 checkpoint, diffusers' and sayakpaul's bitsandbytes FLUX.1-dev
    # checkpoints (the int8 one's shards)
    assert modelled == {"flux-dev": 15, "flux-schnell": 11, "flux2-dev": 12, "qwen-image": 11, "hidream-i1-full": 8,
                        "hidream-i1-dev": 4, "wan21-t2v-14b": 10, "wan22-t2v-a14b": 1, "sd35-large": 1}  # fmt: skip


def test_models_model_lists_its_files_with_predictions(cli):
    code, out, err = cli("models", "flux-schnell", "--json")
    rows = json.loads(out)["files"]
    assert code == 0, err
    q4 = next(row for row in rows if row["file"] == "flux1-schnell-Q4_K_S.gguf")
    assert q4["size"] == {"value": 6783943712, "unit": "B"} and abs(q4["error"]) < 0.005
    svdq = next(row for row in rows if row["file"] == "svdq-int4-flux.1-schnell.safetensors")  # nunchaku's 2024 layout
    assert svdq["rules_modelled"] and 6.635e9 <= svdq["predicted_bytes"] <= 6.645e9 and svdq["error"] == 0
    code, out, _ = cli("models", "sd15")
    assert code == 0 and "no published quantized file is listed" in out


def test_a_sharded_bitsandbytes_checkpoint_is_split_as_diffusers_saves_it():
    """The LLM.int8() FLUX.1-dev checkpoint's two shards add up to the unsharded file, the first filled up to 10 GB as
    huggingface_hub's splitter fills it (a shard ends where the next tensor would pass the limit)."""
    import torch

    from diffmeter.predict.footprints import meta_module
    from diffmeter.predict.quantized_files import bnb_file_bytes

    first, second = [file for file in files_of("flux-dev") if file.repo == "diffusers/FLUX.1-dev-bnb-8bit"]
    module = meta_module(resolve("flux-dev").components["transformer"], torch.bfloat16)
    whole = first.model_copy(update={"file": "diffusion_pytorch_model.safetensors"})
    sizes = [bnb_file_bytes(module, file) for file in (first, second, whole)]
    assert sizes[0] + sizes[1] == sizes[2] and 9.9e9 < sizes[0] <= 10e9


@pytest.mark.slow
def test_fit_on_a_bare_memory_size_says_its_float8_rows_need_fp8_tensor_cores(cli):
    """With only --memory, the card's compute capability is unknown: float8 rows are listed (not refused), and the
    table says what they need; a named card without FP8 tensor cores leaves them out (a new user's finding)."""
    code, out, _ = cli("fit", "wan21-t2v-1.3b", "--memory", "16GB")
    text = " ".join(out.split())
    assert code == 0 and "torchao:float8dq-row" in text
    assert "float8: those formats need FP8 tensor cores (compute capability 8.9+" in text
    code, out, _ = cli("fit", "wan21-t2v-1.3b", "--gpu", "RTX 3090")
    assert code == 0 and "float8" not in out


def test_each_fit_row_names_the_bench_options_that_run_it(cli, monkeypatch, tmp_path):
    """--json's ``bench``: the row's setting as bench options; bench's own command line parses them into the
    techniques fit predicted (a JSON user could not tell how to run a 'quantize-bnb-nf4' row)."""
    import diffmeter.cli.bench as bench_cli
    from diffmeter.optimize.options import memory_setting_specs, parse_opt
    from diffmeter.runs.fit_speedups import is_speedup

    rows = []
    for card in (["--gpu", "RTX 4070"], ["--memory", "1.2835GB"]):  # it fits as is: speed-ups; it does not: formats
        code, out, err = cli("fit", "tiny-flux", *card, "--json", "--steps", "2", "--all-settings")
        assert code == 0, err
        rows += json.loads(out)["fits"]
    gguf = tmp_path / "tiny.gguf"
    gguf.write_bytes(b"")  # a path that exists: the options are parsed, not run
    parsed = []

    def captured(values):  # bench's parser, stopped before anything loads
        parsed.append(real(values).optimizations)
        raise SystemExit(0)

    real = bench_cli._bench_spec
    monkeypatch.setattr(bench_cli, "_bench_spec", captured)
    from diffmeter.runs.fit_speedups import bench_flags

    gguf_row = ("offload-model", "quantize-gguf-Q4_K_S", "vae-tiling")  # tiny-flux is offered no GGUF: its flags
    rows.append({"techniques": list(gguf_row), "optimizations": [], "bench": bench_flags(gguf_row)})
    for row in rows:
        flags = row["bench"].replace("FILE.gguf", str(gguf)).split()
        assert cli("bench", "tiny-flux", *flags)[0] == 0
        memory = tuple(t for t in row["techniques"] if not is_speedup(t))
        expected = memory_setting_specs(memory) + [parse_opt(o) for o in row["optimizations"]]
        found = parsed.pop()
        key = lambda spec: (spec.name, sorted((k, v) for k, v in spec.params.items() if k != "file"))  # noqa: E731
        assert sorted(map(key, found)) == sorted(map(key, expected)), row
    assert rows[-1]["bench"] == "--offload model --quantize gguf:Q4_K_S --weights FILE.gguf --vae-tiling"
    assert any("--opt compile" in row["bench"] for row in rows) and any("bnb:nf4" in row["bench"] for row in rows)


def test_a_gguf_type_without_a_listed_published_file_is_said():
    """fit offered Qwen-Image's gguf:Q8_0 and Q5_K_S and pointed to `diffmeter models qwen-image`, which lists
    neither (a new user's trial); FLUX.1-dev's Q8_0 is listed, so nothing is said for it."""
    from diffmeter.catalog.quantized_files import files_of
    from diffmeter.report.memory_table import unlisted_gguf

    rows = [(("offload-model", technique("gguf", "Q8_0")), 0, None), ((technique("gguf", "Q4_K_S"),), 0, None)]
    listed = {f.quant_type for f in files_of("qwen-image") if f.format == "gguf"}
    assert "Q4_K_S" in listed and "Q8_0" not in listed  # the catalog's own list, as `models qwen-image` shows it
    said = unlisted_gguf("qwen-image", rows)
    assert "the catalog lists none of type Q8_0:" in said and "Q4_K_S" not in said
    assert unlisted_gguf("flux-dev", rows) == ""


def test_settings_bench_refuses_are_said_once_per_reason_by_their_table_names():
    """A new user's trial: fit wan22-t2v-a14b listed its one GGUF reason 32 times, each setting by its technique name
    (quantize-gguf-Q8_0) where the table says gguf:Q8_0."""
    from diffmeter.report.memory_table import refused_text

    why, other = "a GGUF file holds one component's weights", "another reason"
    refused = [(("offload-group", f"quantize-gguf-{kind}", "vae-tiling"), why) for kind in ("Q8_0", "Q6_K", "Q5_K_S")]
    refused += [(("offload-model", "quantize-gguf-Q4_K_S"), why), (("offload-model",), other)]
    said = refused_text(refused)
    assert said.count(why) == 1 and said.count(other) == 1 and "quantize-gguf" not in said
    assert said.startswith("offload-group + gguf:Q8_0 + vae-tiling, offload-group + gguf:Q6_K + vae-tiling, ")
    assert f"vae-tiling and 1 more: {why}; offload-model: {other}" in said


def test_an_unranked_setting_whose_bound_is_under_the_first_rows_range_is_said_maybe_faster():
    """A new user's trial: fit flux2-dev --gpu rtx4090 listed group offload's 50.86 s lower bound below a first row
    expected at 116-178 s, ranked after it only because group offload has no fitted range."""
    from diffmeter.report.memory_table import maybe_faster

    first, group, slow = ("offload-model", "quantize-bnb-nf4"), ("offload-group", "quantize-gguf-Q8_0"), ("x",)
    rows = [(first, 1, 95.37), (group, 1, 50.86), (slow, 1, 130.0)]
    said = maybe_faster(rows, {first: (116.06, 177.78)})
    assert said.startswith("May be faster than the first row, whose expected range starts at 116.06 s")
    assert "offload-group + gguf:Q8_0 (50.86 s)" in said and "x (" not in said
    assert maybe_faster(rows, {first: (40.0, 60.0)}) is None and maybe_faster(rows, {}) is None
