"""A run's cold start: the first call's time beyond the median, never negative, and what it is made of as the run
counted it (compilation only where the first call compiled)."""

from diffmeter.catalog import resolve
from diffmeter.flops.profile import profile_spec
from diffmeter.measure.compilation import Compilation
from diffmeter.report.run_table import cold_start
from diffmeter.runs.lifecycle import bench
from diffmeter.runs.spec import BenchSpec


def test_cold_start_overhead_is_never_negative():
    """A first call that happens to be faster than the median is noise, not negative compilation."""
    from diffmeter.measure.energy import Energy
    from diffmeter.measure.memory import PeakMemory
    from diffmeter.measure.stages import Stages
    from diffmeter.runs.results import Iteration
    from diffmeter.runs.summary import summarize_run

    spec = BenchSpec(model="tiny-sd").settle(resolve("tiny-sd"))
    stages = Stages(text_encoding_s=0.1, denoising_s=0.5, steps_s=[0.25, 0.25], vae_decode_s=0.3, other_s=0.1)
    iterations = [
        Iteration(index=i, images=1, total_s=1.0, wall_s=1.0, denoiser_calls=2, stages=stages) for i in range(3)
    ]
    summary = summarize_run(
        spec.model_copy(update={"steps": 2}),
        iterations,
        PeakMemory(process_peak_rss_bytes=1),
        Energy.unavailable("test"),
        profile_spec(spec.profile_spec()),
        0.8,
        Compilation(),
        None,
    )
    assert summary.cold_start_overhead_s == 0.0


def test_a_cold_start_names_compilation_only_where_the_first_call_compiled(tmp_path):
    """An eager run's first call compiles nothing: its overhead is allocation, lazy initialization and caches, and
    "compilation, autotuning" would send its reader the wrong way. (A compiled run's first call counting its graphs:
    tests/test_bench.py, slow.)"""
    result, _ = bench(BenchSpec(model="tiny-sd", steps=1, iterations=1), out=tmp_path)
    summary = result.summary
    assert summary.first_call_compilation == Compilation()  # counted, and none
    eager = summary.model_copy(update={"cold_start_overhead_s": 0.5})
    assert "compilation" not in cold_start(eager) and "lazy initialization" in cold_start(eager)
    compiled = eager.model_copy(update={"first_call_compilation": Compilation(graphs_compiled=3)})
    assert "compilation and autotuning (3 graphs compiled, 0 CUDA graphs recorded)" in cold_start(compiled)
    older = eager.model_copy(update={"first_call_compilation": None})  # stored before the first call was watched
    assert "any compilation (not counted in this older run)" in cold_start(older)
