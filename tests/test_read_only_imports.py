"""The commands that read stored answers (`show`, `table`, `compare`, `report`, a cached `fit`) import neither torch
nor diffusers: each runs in a fresh process on runs stored by tiny bench runs, and the process says what it imported.
`doctor` reads its probes back without diffusers. `models` is held to the same in test_cache.py."""

import json
import os
import subprocess
import sys

import pytest

from diffmeter.optimize.options import parse_opt
from diffmeter.runs.lifecycle import bench
from diffmeter.runs.spec import BenchSpec
from diffmeter.runs.storage import read_result

FAST = {"model": "tiny-sd", "steps": 1, "iterations": 2, "device": "cpu"}
HEAVY = ("torch", "diffusers", "transformers")
#: a fresh process running one command, then naming the heavy libraries it imported on its last line
SCRIPT = (
    "import sys\n"
    "from diffmeter.cli import main\n"
    "sys.argv = ['diffmeter', *sys.argv[1:]]\n"
    "code = 0\n"
    "try:\n    main()\nexcept SystemExit as exit:\n    code = exit.code\n"
    f"print('imported:', ','.join(name for name in {HEAVY!r} if name in sys.modules) or 'none')\n"
    "sys.exit(code)\n"
)


def run(*arguments, cache="off") -> list[str]:
    """``diffmeter ARGUMENTS`` in a fresh process: its output's lines (the last names what it imported)."""
    environment = {**os.environ, "DIFFMETER_CACHE_DIR": str(cache), "COLUMNS": "200"}
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, *map(str, arguments)], capture_output=True, text=True, env=environment
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.rstrip().splitlines()


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    """Stored runs of tiny-sd in one folder: two at different sizes (so `compare` has no images to compare), and a
    technique measured against the first with --compare-baseline (its image comparison stored with it)."""
    out = tmp_path_factory.mktemp("stored")
    _, small = bench(BenchSpec(**FAST), out=out)
    _, large = bench(BenchSpec(**FAST, height=64, width=64), out=out)
    fused, folder = bench(BenchSpec(**FAST, optimizations=[parse_opt("fuse-qkv")], compare_baseline=True), out=out)
    assert fused.quality is not None
    return out, small, large, folder


def test_show_reads_a_run_without_torch(stored):
    out, small, *_ = stored
    lines = run("show", small)
    assert lines[-1] == "imported: none"
    assert any("tiny-sd" in line for line in lines)
    assert run("show", small, "--json")[-1] == "imported: none"


def test_table_reads_every_run_without_torch(stored):
    out, *_ = stored
    lines = run("table", out)
    assert lines[-1] == "imported: none"
    assert any("3 runs under" in line for line in lines)


def test_compare_reads_two_runs_without_torch(stored):
    _, small, large, _ = stored
    lines = run("compare", small, large)
    assert lines[-1] == "imported: none"
    assert any("images not compared: the sizes differ" in line for line in lines)


def test_compare_reads_a_stored_image_comparison_without_torch(stored):
    """B measured with --compare-baseline against A itself: compare shows B's stored comparison, computes none."""
    _, small, _, fused = stored
    lines = run("compare", small, fused, "--json")
    assert lines[-1] == "imported: none"
    quality = json.loads("\n".join(lines[:-1]))["pairs"][0]["quality"]
    assert quality == read_result(fused).quality.model_dump(mode="json")
    assert quality["identical"] == len(quality["images"]) > 0  # fuse-qkv is lossless here: every image identical


def test_report_writes_the_page_without_torch(stored, tmp_path):
    out, *_ = stored
    page = tmp_path / "report.html"
    lines = run("report", out, "-o", page)
    assert lines[-1] == "imported: none"
    assert page.stat().st_size > 0


def test_a_cached_fit_answers_without_torch(tmp_path):
    """The first `fit` runs the fake-tensor prediction (torch imported) and stores it; the second reads it."""
    question = ("fit", "tiny-flux", "--memory", "8GB", "--json")
    first, second = run(*question, cache=tmp_path), run(*question, cache=tmp_path)
    assert first[-1] != "imported: none" and second[-1] == "imported: none"
    assert first[:-1] == second[:-1]  # the same answer, read back


@pytest.mark.slow
def test_a_second_doctor_probes_nothing_and_imports_no_diffusers(tmp_path):
    """The attention probes and the energy counters are remembered for this machine as it is: the second `doctor`
    says the same without diffusers (torch it needs: the CUDA devices, the build)."""
    first, second = run("doctor", "--json", cache=tmp_path), run("doctor", "--json", cache=tmp_path)
    assert "diffusers" in first[-1] and second[-1] == "imported: torch"
    assert first[:-1] == second[:-1]
