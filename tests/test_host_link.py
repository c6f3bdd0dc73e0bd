"""The host link (measure/host_link.py): measured once per CUDA run and stored with its environment, named beside
every offload figure (show and the report); a CPU run stores none and says so. The CUDA runs use the fake CUDA device
(tests/fake_cuda): a CPU build has no GPU and no pinned allocator (the fake makes the probe's pinned buffer
pageable); its copies are real CPU copies (a fake tensor's shadow), so their rates are this machine's memcpy, not a
link's: no test asserts a rate's value."""

from __future__ import annotations

import json
import math
import resource

import pytest
from fake_cuda import FakeCuda, unavailable_reason

from diffmeter.measure import host_link
from diffmeter.optimize import OptimizationSpec
from diffmeter.runs.lifecycle import bench
from diffmeter.runs.spec import BenchSpec

REASON = unavailable_reason()
RATES = [f"{direction}_{kind}_gb_s" for direction in ("h2d", "d2h") for kind in host_link.KINDS]
#: a page is 4 KiB, or 2 MiB under transparent huge pages: at least one first-write fault per 2 MiB either way
FEWEST_FAULTS = host_link.COPY_BYTES // 2**21


def faults_while(work) -> int:
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    work()
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before


def test_a_fresh_buffer_has_never_touched_pages():
    """What offload's ``.to("cpu")`` writes into: a fresh buffer faults on its first write, a touched one does not."""
    fresh = host_link.fresh_host(host_link.COPY_BYTES)
    first = faults_while(lambda: fresh.fill_(1))
    again = faults_while(lambda: fresh.fill_(2))
    assert first >= FEWEST_FAULTS, f"{first} faults writing {host_link.COPY_BYTES} fresh bytes: not fresh"
    assert again < first / 100


@pytest.mark.fake_cuda
@pytest.mark.skipif(REASON is not None, reason=REASON or "")
def test_an_offloaded_cuda_run_stores_its_host_link_and_names_it(tmp_path, cli):
    spec = BenchSpec(
        model="tiny-sd", device="cuda:1", steps=2, iterations=1, predict=False,
        optimizations=[OptimizationSpec(name="offload", params={"mode": "model"})],
    )  # fmt: skip
    with FakeCuda(own="cuda:1") as cuda:
        result, folder = bench(spec, out=tmp_path)
    assert result.status == "complete" and not cuda.violations
    link = result.environment.host_link
    assert link is not None and link.device == "cuda:1" and link.copy_bytes == host_link.COPY_BYTES
    for name in RATES:
        assert math.isfinite(getattr(link, name)) and getattr(link, name) > 0, name
    # every copy waited for on the run's own GPU; the fresh D2H copies wrote into pages never touched before
    assert {call.device for call in cuda.calls if call.name == "synchronize"} == {1}
    assert link.d2h_fresh_page_faults >= host_link.REPEATS * FEWEST_FAULTS
    stored = json.loads((folder / "results.json").read_text())["environment"]["host_link"]
    assert set(RATES) <= set(stored)
    assert "host link of cuda:1: H2D pageable fresh" in (folder / "bench.log").read_text()
    code, out, _ = cli("show", folder)
    assert code == 0
    shown = " ".join(out.split())
    for direction in ("H2D", "D2H"):
        for kind in ("pageable fresh", "pageable touched", "pinned"):
            rate = link.rate(direction.lower(), kind.replace(" ", "_"))
            assert f"{direction} {kind} {rate:,.2f} GB/s" in shown
    from diffmeter.report.html.page import render
    from diffmeter.report.html.study import read_study

    page = render(read_study(tmp_path), "offloaded")
    assert f"D2H pageable fresh {link.d2h_pageable_fresh_gb_s:,.2f} GB/s" in page


def test_a_cpu_run_stores_no_host_link_and_says_so(tmp_path, cli):
    result, folder = bench(BenchSpec(model="tiny-sd", device="cpu", steps=2, iterations=1, predict=False), tmp_path)
    assert result.environment.host_link is None
    assert json.loads((folder / "results.json").read_text())["environment"]["host_link"] is None
    assert host_link.NO_LINK in (folder / "bench.log").read_text()
    code, out, _ = cli("show", folder)
    assert code == 0 and "host link" not in out  # nothing offloaded: no offload figure to name it beside
