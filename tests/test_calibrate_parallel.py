"""benchmarks/calibrate_parallel.py's held-out test of the multi-GPU range: each run's compute is timed as
`profile --gpu` times it, by the eager calibration refitted without the run's source (none of that source's eager
runs reach it), and the claim `profile` prints is the report's figure."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks"))
sys.path.insert(0, str(Path(__file__).parent))

from calibrate_parallel import counted  # noqa: E402
from published_comparison import load_figures  # noqa: E402
from published_groups import CountedRun, base, without  # noqa: E402
from published_runs import source_of  # noqa: E402
from test_fit_published import MADE, made  # noqa: E402

from diffmeter.predict.fit_published import fit  # noqa: E402
from diffmeter.predict.parallel import stored_communication_fit  # noqa: E402

BENCHMARKS = Path(__file__).parents[1] / "benchmarks"
#: one GPU of tiny FLUX's Ulysses-2 group on H100s (NVLink), as a published_parallel.yaml run names it
RUN = {"id": "tiny", "model": "tiny-flux", "gpu": "h100", "height": 128, "width": 128, "steps": 2, "ulysses": 2}


@pytest.fixture(scope="module")
def group() -> CountedRun:
    return CountedRun(RUN)


def test_a_runs_figures_under_the_shipped_calibration_are_profiles_own(group, cli):
    code, out, err = cli("profile", "tiny-flux", "--gpu", "h100", "--steps", "2", "--height", "128", "--width", "128",
                         "--ulysses-degree", "2", "--json")  # fmt: skip
    assert code == 0, err
    found = json.loads(out)
    mine, profiles = group.figures(None), base(found["time"], found["parallel"])
    assert mine == profiles  # the same computation, to the last bit
    assert mine["link"]["name"].startswith("NVLink") and mine["calls"] and mine["received"]


def test_a_held_out_sources_eager_runs_never_reach_its_multi_gpu_runs_compute():
    """s0's eager runs made 3x slower: s0's run is timed by the fit without them all the same, while the fit without
    s1, which holds them, times it otherwise."""
    eager = [made(MADE, f"s{i % 3}", i) for i in range(24)]
    slow = [made({g: 3 * a for g, a in MADE.items()}, "s0", i) if i % 3 == 0 else run for i, run in enumerate(eager)]
    asked = [{**RUN, "harness": "s0"}, {**RUN, "id": "tiny-s1", "harness": "s1"}]
    counted(asked, {}, lambda: slow)
    others = [run for run in eager if run.source != "s0"]
    clean = CountedRun(RUN).figures(without(fit(others), others, "hopper", "s0"))
    held = asked[0]["figures_without"]
    assert held["s0"]["total"] == pytest.approx(clean["total"])
    assert held["s1"]["total"] != pytest.approx(held["s0"]["total"], rel=0.05)  # s0's slow runs in that fit
    with pytest.raises(SystemExit, match="eager_source s9: no published eager run"):
        counted([{**RUN, "harness": "s9"}], {}, lambda: slow)


def test_each_multi_gpu_source_names_a_harness_of_the_eager_fit():
    """A misspelt ``eager_source`` would leave nothing out of the refit: each names a harness with eager runs."""
    harnesses = {source_of(f) for f in load_figures() if f["kind"] == "latency" and not f["techniques"]}
    sources = yaml.safe_load((BENCHMARKS / "published_parallel.yaml").read_text())["sources"]
    assert {source["eager_source"] for source in sources.values()} <= harnesses


def test_the_printed_claim_is_the_reports_held_out_row():
    """`claim` (what `profile --gpu` prints for a group) quotes the report's row of the prediction it gives: the
    held-out fit's where used, else the datasheet rate's on the eager calibration refitted without each source."""
    stored = stored_communication_fit()
    report = (BENCHMARKS / "results" / "calibration_parallel.md").read_text()
    rows = {line.split(" | ")[0].strip("| "): line.split(" | ")[1:4] for line in report.splitlines()}
    runs, inside, error = rows["held out a source at a time" if stored.used else "datasheet rate (before)"]
    count, share = inside.split(" ")
    assert f"{count} of {runs} published multi-GPU runs {share} inside, midpoint median error {error};" in stored.claim
    assert stored.used or "refitted without its source" in stored.claim
