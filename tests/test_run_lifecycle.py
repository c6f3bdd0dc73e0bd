"""Between the lifecycle's phases: a finished run frees its pipeline before the next one in the process, and
the warm-up plan records CUDA graphs before the measured calls."""

import pytest

from diffmeter.runs.lifecycle import bench
from diffmeter.runs.spec import BenchSpec


@pytest.mark.parametrize("trace", [False, True])
def test_a_finished_run_leaves_none_of_its_modules_for_the_next_run(tmp_path, trace):
    """diffusers' hooks tie a pipeline's modules into reference cycles: on an H200, pixart-sigma-1024 run
    after flux-schnell in one process found FLUX's 22 GiB transformer still on the GPU. With the cyclic
    collector off, nothing of a finished run may remain."""
    import gc

    from diffusers import ModelMixin
    from transformers import PreTrainedModel

    def modules():
        return [o for o in gc.get_objects() if isinstance(o, (ModelMixin, PreTrainedModel))]

    gc.collect()
    before = len(modules())
    gc.disable()
    try:
        bench(BenchSpec(model="tiny-flux", steps=2, iterations=1, trace=trace), out=tmp_path)
        left = modules()
    finally:
        gc.enable()
    assert len(left) == before, sorted({type(o).__name__ for o in left})


def test_cuda_graph_modes_warm_up_twice_so_once_per_call_components_record_before_the_measured_calls():
    """cudagraph trees warm a function up on its first call and record on the second: with --warmup 1, a compiled
    VAE decode (once per generation) recorded its graph inside measured call 0. (CUDA graphs need CUDA: the rule
    is checked on the warm-up plan.)"""
    from diffmeter.catalog import resolve
    from diffmeter.runs.calls import warm_up_indices
    from diffmeter.runs.workload import Workload
    from diffmeter.tiny import tiny_pipeline

    entry = resolve("tiny-sd")
    spec = BenchSpec(model="tiny-sd", warmup=1, iterations=2).settle(entry)
    pipe, workload = tiny_pipeline(entry), Workload(spec, entry)
    assert warm_up_indices(spec, pipe, workload, compiling=True, graphs=True) == ([0, 1], 0)
    assert warm_up_indices(spec, pipe, workload, compiling=True, graphs=False) == ([0], 0)
    three = spec.model_copy(update={"warmup": 3})
    assert warm_up_indices(three, pipe, workload, compiling=True, graphs=True) == ([0, 1, 2], 0)
