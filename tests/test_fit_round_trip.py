"""`fit` -> `bench`'s techniques on CPU: every setting `fit` can list that a CPU can run is applied by bench's own
technique code to the pipeline bench's loader makes, and the real call's peak (torch.profiler's memory timeline)
is the fit prediction's within 2%, as tests/test_predict_memory.py holds the bare pipeline. Offloading and
float8 weights need a GPU: tests/test_fake_cuda.py runs fit -> bench for those on the fake device."""

from __future__ import annotations

import pytest
import torch
from tiny_runs import tiny_call, token_settings

from diffmeter.catalog import resolve
from diffmeter.families import get_family
from diffmeter.loading import load_pipeline
from diffmeter.measure.memory_timeline import measure_stage_peaks
from diffmeter.optimize import registry
from diffmeter.optimize.base import Target
from diffmeter.optimize.options import memory_setting_specs
from diffmeter.predict.memory import STAGE_OF_ROLE, predict_memory, settled_plan
from diffmeter.predict.techniques import peak_under, settings
from diffmeter.spec import ProfileSpec
from diffmeter.weights import locate_weights

ON_CPU = {"vae-tiling", "vae-slicing", "quantize-int8", "fp8-text-encoder"}


def cpu_settings(model: str) -> list[tuple[str, ...]]:
    prediction = predict_memory(ProfileSpec(model=model), on_cuda=False)
    return [chosen for chosen in settings(prediction) if set(chosen) <= ON_CPU]


@pytest.mark.slow
@pytest.mark.parametrize(("model", "setting"), [(m, s) for m in ("tiny-flux", "tiny-sd") for s in cpu_settings(m)])
def test_every_setting_a_cpu_runs_peaks_where_fit_predicts(model, setting):
    round_trip(model, setting)


@pytest.mark.slow
@pytest.mark.parametrize("setting", [(), ("quantize-int8",)])
def test_a_real_size_model_peaks_where_fit_predicts(setting):
    """SD 1.5 at its 512 px with random weights (bench --random-weights), one step."""
    round_trip("sd15", setting, steps=1)


def round_trip(model: str, setting: tuple[str, ...], steps: int | None = None) -> None:
    if "quantize-int8" in setting:
        pytest.importorskip("torchao")
    entry = resolve(model)
    pipe = load_pipeline(entry, locate_weights(entry, True), torch.device("cpu"), "float32")
    pipe, call, values = tiny_call(entry, pipe=pipe, steps=steps)
    spec = ProfileSpec(model=model, dtype="float32", **values, **token_settings(entry, pipe))
    target = Target(entry, get_family(entry.family), torch.device("cpu"), "float32", values["steps"])
    techniques = registry.build(memory_setting_specs(setting))
    registry.check(techniques, target)  # bench's own refusals: none for a setting fit lists
    for technique in techniques:
        technique.apply(pipe, target)
    _, _, plan = settled_plan(spec)
    components = {c.component: (getattr(pipe, c.component), c.method, STAGE_OF_ROLE[c.role]) for c in plan if c.count}
    real = measure_stage_peaks(call, components)
    predicted = peak_under(predict_memory(spec, on_cuda=False), setting)
    assert predicted == pytest.approx(real.peak_bytes, rel=0.02), setting
