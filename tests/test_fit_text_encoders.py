"""`fit` and the leaderboard put a quantized format on a pipeline's large text encoders where the encoder sets the peak
(predict/fit_formats.py ``ENCODER_FORMATS``): FLUX.2-dev's 24B Mistral 3 on a 24 GB card, as diffusers' FLUX.2 docs
run it; each such row asks bench for what fit predicted; and bench loads it so on a fake GPU."""

from __future__ import annotations

import re
from types import SimpleNamespace
from unittest import mock

import pytest
import torch
from fake_cuda import LEDGER, unavailable_reason

from diffmeter.catalog import resolve
from diffmeter.optimize import OptimizationSpec
from diffmeter.optimize.options import memory_setting_specs
from diffmeter.predict.devices import CUDA_HOLDBACK_BYTES, named_gpu
from diffmeter.predict.fit_formats import least_quantization, on_encoders, with_fit_formats
from diffmeter.predict.footprints import meta_module
from diffmeter.predict.memory import predict_memory
from diffmeter.predict.quantized_formats import quantized_bytes
from diffmeter.predict.technique_names import format_parts
from diffmeter.predict.techniques import fitting, peak_under, settings
from diffmeter.quantization_spec import optimization_specs
from diffmeter.runs.fit_speedups import Timed, bench_flags, no_faster, setting_name
from diffmeter.spec import ProfileSpec

ENCODER = "quantize-bnb-nf4@text_encoder"


@pytest.fixture(scope="module")
def flux2():
    """FLUX.2-dev at its defaults with the formats fit offers (its text encoder: Mistral 3, 24B parameters)."""
    spec = ProfileSpec(model="flux2-dev")
    return with_fit_formats(predict_memory(spec), spec)


def test_flux2_fits_a_24_gb_card_with_its_text_encoder_in_nf4_and_not_without(flux2):
    """Model offload holds one component at a time, and the bfloat16 Mistral 3 alone is over the card: only with it
    in NF4 does a setting without layer offloading fit (diffusers' FLUX.2 docs: both in 4 bits on a 24 GB card)."""
    usable = named_gpu("RTX 4090").memory_bytes - CUDA_HOLDBACK_BYTES
    fits = dict(fitting(flux2, usable))
    assert peak_under(flux2, ("offload-model", "quantize-bnb-nf4")) > usable
    assert fits[("offload-model", "quantize-bnb-nf4", ENCODER)] == peak_under(
        flux2, ("offload-model", "quantize-bnb-nf4", ENCODER)
    )
    # the least quantization that fits names the encoder's: its 8-bit form (23.63 GiB) is over the card too
    assert least_quantization(flux2, list(fits.items())).endswith(" + text_encoder=bnb:nf4")
    assert not any("quantize-bnb-int8@text_encoder" in chosen for chosen in fits)
    # the stored bytes are bitsandbytes' layout of the real encoder (built on meta), its skips (lm_head) included
    module = meta_module(resolve("flux2-dev").components["text_encoder"], torch.bfloat16)
    assert flux2.quantized_bytes[ENCODER] == {"text_encoder": quantized_bytes(module, "bnb", "nf4", torch.bfloat16)}


def test_a_backend_runs_at_one_type_and_the_encoder_formats_pair_with_other_backends(flux2):
    """bench's ``--quantize`` takes one type per backend in a run: no bnb:int8 denoiser beside an NF4 encoder; a
    GGUF denoiser beside one is offered (the usual pairing)."""
    offered = settings(flux2)
    assert on_encoders(flux2) == ("quantize-bnb-int8@text_encoder", ENCODER)
    for chosen in offered:
        formats = {format_parts(t)[:2] for t in chosen if t.startswith("quantize-")}
        assert len(formats) == len({backend for backend, _ in formats}), chosen
    assert ("offload-model", "quantize-gguf-Q4_K_S", ENCODER) in offered
    assert ("offload-model", "quantize-bnb-int8", ENCODER) not in offered


@pytest.mark.parametrize(
    ("setting", "values", "specs"),
    [
        (
            ("offload-model", "quantize-bnb-nf4", "quantize-bnb-nf4@text_encoder_3,text_encoder_4"),
            ["bnb:nf4", "text_encoder_3=bnb:nf4", "text_encoder_4=bnb:nf4"],
            [{"type": "nf4", "components": ["denoiser", "text_encoder_3", "text_encoder_4"]}],
        ),
        (
            ("quantize-torchao-int8wo", "quantize-bnb-int8@text_encoder"),
            ["torchao:int8wo", "text_encoder=bnb:int8"],
            [{"type": "int8wo"}, {"type": "int8", "components": ["text_encoder"]}],
        ),
    ],
)
def test_each_row_asks_bench_for_what_fit_predicted(setting, values, specs):
    """The row's bench options parse (``--quantize``'s own grouping) to the techniques fit predicted the setting
    under, one per backend holding its components."""
    flags = bench_flags(setting)
    assert re.findall(r"--quantize (\S+)", flags) == values
    asked = [s for s in optimization_specs(values)]
    assert asked == [s for s in memory_setting_specs(setting) if s.name != "offload"]
    assert [s.params for s in asked] == specs
    assert setting_name(setting).count("=bnb:") == len(format_parts(setting[-1])[2])


@pytest.mark.fake_cuda
@pytest.mark.skipif(unavailable_reason() is not None, reason=unavailable_reason() or "")
def test_a_fit_row_with_its_text_encoder_quantized_loads_both_quantized_on_its_own_gpu(tmp_path):
    """tiny-flux2 on a card too small for its NF4 transformer beside the bfloat16 encoder: fit's row quantizes both,
    and bench hands each component's own library the NF4 config (diffusers' for the transformer, transformers' for
    Mistral 3). bitsandbytes' tensors cannot be faked, so the loader is a recorder loading them back unquantized."""
    from test_fake_cuda import assert_ran_on_its_own_gpu, fake_bench

    import diffmeter.quantized_loading as loading

    spec = ProfileSpec(model="tiny-flux2", dtype="bfloat16")
    prediction = with_fit_formats(predict_memory(spec), spec)
    card = peak_under(prediction, ("quantize-bnb-nf4", ENCODER))
    assert peak_under(prediction, ("quantize-bnb-nf4",)) > card
    chosen = next(c for c, _ in fitting(prediction, card) if ENCODER in c and not any("offload" in t for t in c))
    seen = {}

    def load_quantized(cls, folder, config, dtype):
        seen[folder.name] = (type(config).__module__.split(".")[0], config.to_dict())
        return cls.from_pretrained(folder, **{"dtype" if "transformers" in cls.__module__ else "torch_dtype": dtype})

    optimizations = [OptimizationSpec(name=s.name, params=s.params) for s in memory_setting_specs(chosen)]
    with mock.patch.object(loading, "load_quantized", load_quantized):
        result, folder, cuda = fake_bench(tmp_path, "tiny-flux2", optimizations=optimizations)
    assert_ran_on_its_own_gpu(result, folder, cuda)
    assert {name: library for name, (library, _) in seen.items()} == {
        "transformer": "diffusers",
        "text_encoder": "transformers",
    }
    assert all(config["bnb_4bit_quant_type"] == "nf4" and config["load_in_4bit"] for _, config in seen.values())
    LEDGER.append((f"fit -> bench ({' + '.join(chosen)}) on tiny-flux2", "placement covered, loader recorded"))


def test_under_offloading_a_smaller_format_is_offered_and_kept_only_where_predicted_faster(flux2):
    """On a 16 GB card FLUX.2-dev fits only offloading layer by layer; NF4 weights then cross the host link in a third
    of the bytes, so fit offers the format there (``faster``), and keeps a row only where its time beats the row it
    adds to (``no_faster``): by the lower bound where neither has a range."""
    usable = named_gpu("RTX 4060 Ti").memory_bytes - CUDA_HOLDBACK_BYTES
    sequential, nf4 = ("offload-sequential",), ("offload-sequential", "quantize-bnb-nf4")
    assert nf4 in dict(fitting(flux2, usable, timed=True)) and nf4 not in dict(fitting(flux2, usable))
    rows = [(sequential, 2, 596.0), (nf4, 2, 465.0), ((*sequential, "vae-tiling"), 1, 600.0)]
    assert no_faster(rows, {}, usable) == {(*sequential, "vae-tiling")}
    times = {c: Timed(time=SimpleNamespace(expected_s=e)) for c, e in ((sequential, (4, 9)), (nf4, (5, 9)))}
    assert no_faster(rows[:2], times, usable) == {nf4}  # by the ranges where both have one
    assert no_faster(rows[:2], {nf4: times[nf4]}, usable) == set()  # a range of its own against a bound
    assert no_faster(rows[:2], {sequential: times[sequential]}, usable) == {nf4}  # no range against one: not faster
    assert no_faster([(sequential, 2, 596.0), (nf4, 2, None)], {}, usable) == {nf4}  # no time at all
    # the setting it adds to is borderline (within 2% of the card) and it lowers the peak: kept, a real run may not fit
    assert no_faster([(sequential, usable, 596.0), (nf4, usable // 2, 700.0)], {}, usable) == set()
