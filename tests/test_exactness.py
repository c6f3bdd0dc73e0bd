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


@pytest.mark.parametrize("name", ["tiny-sd", "tiny-sd3", "tiny-pixart"])
def test_exact_without_guidance_and_with_batch(name):
    entry = next(e for e in TINY if e.name == name)
    _, real, settings = run_tiny(entry, batch_size=2, guidance_scale=1.0)
    offline = profile(entry.name, **settings)
    assert {c.name: c.macs for c in offline.components} == real
    assert not offline.cfg
