"""What a sweep stores for a cell whose process died or was stopped: the reason it quotes."""

from sweep_executors import FAST, stored

from diffmeter.optimize.options import parse_opt
from diffmeter.runs.lifecycle import CALL_STARTS
from diffmeter.runs.prepared import prepare
from diffmeter.runs.spec import BenchSpec
from diffmeter.runs.storage import LOG
from diffmeter.sweep.local import Outcome
from diffmeter.sweep.run import settle_outcome


def test_a_cell_stopped_in_a_pipeline_call_names_that_call(tmp_path):
    """A new user's compile cell stopped at its timeout said only "the last lines of its bench.log", a library's
    warnings, not that it was compiling on its first warm-up call. The run logs each call as it starts
    (``lifecycle.CALL_STARTS``), and the stored reason names the last one: here the staged log a cell that died
    while compiling leaves, as the run writes it."""

    out = tmp_path / "out"
    run = prepare(BenchSpec(model="tiny-sd", **FAST, optimizations=[parse_opt("compile")]))
    staged = out / f".{run.name}.partial-1"
    staged.mkdir(parents=True)
    started = f"{CALL_STARTS}warm-up call 1 of 1 (torch.compile compiles on it)"
    (staged / LOG).write_text(f"INFO spec ...\nINFO {started}\nWARNING a library's FutureWarning\n")
    status, error = settle_outcome(run, out, Outcome(code=None, tail="", seconds=60.0))
    assert status == "failed"
    assert error.startswith(
        "stopped at the sweep's per-cell timeout in warm-up call 1 of 1 (torch.compile compiles on it) after 60.0 s"
    )
    assert stored(out)[run.name]["error"] == error
