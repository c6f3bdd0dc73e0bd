"""Runs the model card recommends beyond steps and guidance: Lumina-Image-2.0's ``cfg_trunc_ratio`` 0.25 (CFG on the
first steps only) and FLUX.1-schnell's ``max_sequence_length`` 256, counted by ``profile`` and passed by ``bench``."""

from dataclasses import replace

import pytest
import torch
from tiny_runs import macs_by_name

from diffmeter import profile
from diffmeter.catalog import resolve
from diffmeter.errors import DiffmeterError
from diffmeter.families import get_family
from diffmeter.flops.counter import count_flops
from diffmeter.flops.profile import profile_spec
from diffmeter.optimize.base import Target
from diffmeter.runs.lifecycle import bench
from diffmeter.runs.parallel_support import check_cfg_parallel
from diffmeter.runs.spec import BenchSpec
from diffmeter.runs.storage import run_name
from diffmeter.runs.workload import Workload
from diffmeter.spec import ProfileSpec
from diffmeter.tiny import tiny_pipeline


def _transformer(result):
    return next(c for c in result.components if c.name == "transformer")


def test_lumina2_runs_the_cards_62_transformer_calls_and_100_at_the_pipelines_ratio():
    """The card's cfg_trunc_ratio 0.25 at 50 steps: the unconditional call on steps 1-12 only ((i + 1) / 50 <= 0.25),
    50 + 12 calls; Lumina2Pipeline's own 1.0 guides all 50 (100 calls). A small size keeps the count quick."""
    card = profile("lumina2", height=256, width=256)
    every = profile("lumina2", height=256, width=256, cfg_trunc_ratio=1.0)
    assert (card.steps, card.cfg_trunc_ratio, every.cfg_trunc_ratio) == (50, 0.25, 1.0)
    assert _transformer(card).calls == 62 and _transformer(every).calls == 100
    counts = {i.note.split(":")[0]: i.count for i in _transformer(card).invocations}
    assert counts == {"cond": 50, "uncond": 12}
    uncond = next(i for i in _transformer(every).invocations if i.note.startswith("uncond"))
    assert every.total_macs - card.total_macs == 38 * uncond.macs_per_call
    assert any("CFG on the first 12 of 50 steps" in note for note in card.notes)


def test_bench_passes_the_ratio_and_the_real_pipeline_runs_the_calls_counted():
    """Tiny Lumina 2 at 4 steps and ratio 0.3: the real pipeline (random weights, CPU) runs the unconditional call on
    step 1 only, 5 transformer calls, and its MACs equal the profile's of the same prompt."""
    entry = resolve("tiny-lumina2")
    spec = BenchSpec(model="tiny-lumina2", steps=4, cfg_trunc_ratio=0.3, device="cpu").settle(entry)
    workload = Workload(spec, entry)
    pipe = tiny_pipeline(entry)
    batch = workload.batch(0)
    arguments = workload.call_arguments(pipe, batch)
    assert arguments["cfg_trunc_ratio"] == 0.3
    calls = []
    pipe.transformer.register_forward_hook(lambda *_: calls.append(1))
    with torch.no_grad(), count_flops({name: getattr(pipe, name) for name in entry.components}) as counts:
        pipe(**arguments)
    real = {name: sum(counts.by_module.get(name, {}).values()) // 2 for name in entry.components}
    settings = get_family(entry.family).prompt_settings(pipe, batch.prompts)
    offline = profile_spec(replace(spec.profile_spec(), **settings))
    assert len(calls) == _transformer(offline).calls == 5
    assert macs_by_name(offline) == real


def test_a_measured_run_makes_as_many_denoiser_calls_as_its_profile(tmp_path):
    result, folder = bench(
        BenchSpec(model="tiny-lumina2", steps=4, cfg_trunc_ratio=0.5, iterations=1, save_images=False), out=tmp_path
    )
    assert result.spec.cfg_trunc_ratio == 0.5 and "cfg-trunc-0.5" in folder.name
    profiled = sum(c.calls for c in result.profile.components if c.role == "denoiser")
    assert profiled == 4 + 2  # (i + 1) / 4 <= 0.5 on steps 1 and 2
    assert all(iteration.denoiser_calls == profiled for iteration in [result.first_call, *result.iterations])


def _t5(**settings):
    result = profile("flux-schnell", height=256, width=256, **settings)
    return next(c for c in result.components if c.name == "text_encoder_2").invocations[0].note


def test_flux_schnell_counts_the_cards_256_t5_tokens_unless_asked():
    assert _t5() == "256 tokens"
    assert _t5(max_sequence_length=512) == "512 tokens"  # FluxPipeline's own default, asked for


@pytest.mark.parametrize("asked, passed", [(None, 256), (512, 512)])
def test_bench_passes_flux_schnells_sequence_length(asked, passed):
    """Bench calls the pipeline with the length the profile counted: the card's 256, or the one asked for."""
    entry = resolve("flux-schnell")
    spec = BenchSpec(model="flux-schnell", max_sequence_length=asked, device="cpu").settle(entry)
    workload = Workload(spec, entry)
    pipe = tiny_pipeline(resolve("tiny-flux"))  # a FluxPipeline: call_arguments reads its __call__'s signature
    assert workload.call_arguments(pipe, workload.batch(0))["max_sequence_length"] == passed
    assert f"max-sequence-length-{passed}" in run_name(spec, entry)


def test_lumina2_bench_passes_the_cards_ratio():
    entry = resolve("lumina2")
    spec = BenchSpec(model="lumina2", device="cpu").settle(entry)
    workload = Workload(spec, entry)
    pipe = tiny_pipeline(resolve("tiny-lumina2"))  # a Lumina2Pipeline
    assert workload.call_arguments(pipe, workload.batch(0))["cfg_trunc_ratio"] == 0.25


def test_a_ratio_is_refused_where_the_pipeline_takes_none_or_out_of_range():
    with pytest.raises(DiffmeterError, match="takes none: drop it"):
        profile("flux-schnell", cfg_trunc_ratio=0.5)
    with pytest.raises(DiffmeterError, match="0 to 1"):
        ProfileSpec(model="lumina2", cfg_trunc_ratio=1.5).check()


def test_cfg_parallel_on_truncated_cfg_names_the_ratio():
    """CFG parallelism pairs every step's two calls: the card's truncated CFG has none after step 12."""
    entry = resolve("lumina2")
    target = Target(entry, get_family(entry.family), torch.device("cpu"), "bfloat16", 50)
    with pytest.raises(DiffmeterError, match="--cfg-trunc-ratio 1"):
        check_cfg_parallel(BenchSpec(model="lumina2", cfg_degree=2), target)
    check_cfg_parallel(BenchSpec(model="lumina2", cfg_degree=2, cfg_trunc_ratio=1.0), target)
