"""The offline profile equals what the real diffusers pipeline does, per component, exactly.

Each tiny entry is built with random weights and real tokenizers and schedulers, run
for real on CPU under the FLOP counter, and compared with the meta-device profile of
the same config at the same size, steps, batch and guidance.
"""

import pytest
from tiny_runs import TINY, run_tiny

from diffmeter import profile


@pytest.mark.parametrize("entry", TINY, ids=lambda e: e.name)
def test_offline_profile_equals_real_pipeline(entry):
    _, real, settings = run_tiny(entry)
    offline = profile(entry.name, **settings)
    assert {c.name: c.macs for c in offline.components} == real
    assert offline.total_macs == sum(real.values())


@pytest.mark.parametrize("guidance_scale", [None, 1.0], ids=["default-guidance", "no-guidance"])
@pytest.mark.parametrize("entry", TINY, ids=lambda e: e.name)
def test_exact_at_batch_two_with_and_without_guidance(entry, guidance_scale):
    _, real, settings = run_tiny(entry, batch_size=2, guidance_scale=guidance_scale)
    offline = profile(entry.name, **settings)
    assert {c.name: c.macs for c in offline.components} == real
    if guidance_scale == 1.0:
        assert not offline.cfg


@pytest.mark.parametrize(
    "name,length", [("tiny-flux", 16), ("tiny-sd3", 100), ("tiny-pixart-sigma", 64), ("tiny-wan", 40)]
)
def test_exact_at_another_max_sequence_length(name, length):
    entry = next(e for e in TINY if e.name == name)
    _, real, settings = run_tiny(entry, max_sequence_length=length)
    offline = profile(entry.name, **settings)
    assert {c.name: c.macs for c in offline.components} == real
