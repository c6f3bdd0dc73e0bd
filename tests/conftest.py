"""Test-wide settings: keep library warnings out of test output; count, do not read a cache."""

import os
import sys
import tempfile
import warnings

import pytest

# the tests check counting itself; tests of the cache point DIFFMETER_CACHE_DIR at a folder of their own
os.environ["DIFFMETER_CACHE_DIR"] = "off"
# this CPU's peaks are measured once per session into a folder of its own (xdist's workers inherit it), never the
# user's stored ones read
if not os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["DIFFMETER_CPU_PEAKS_DIR"] = tempfile.mkdtemp(prefix="diffmeter-cpu-peaks-")


def pytest_configure(config):
    """Under pytest-xdist each worker gets one torch thread (the workers share the cores), and no $COLUMNS: xdist
    hands its workers the controller's width, and the CLI's tables are checked as written to a file."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        import torch

        torch.set_num_threads(1)
        os.environ.pop("COLUMNS", None)


@pytest.fixture(autouse=True)
def _quiet_libraries():
    import diffusers
    import transformers

    transformers.utils.logging.set_verbosity_error()
    diffusers.utils.logging.set_verbosity_error()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


@pytest.fixture
def cli(capsys, monkeypatch):
    """Run the `diffmeter` command in-process: ``cli(*args) -> (exit code, stdout, stderr)``."""
    from diffmeter.cli import main

    def run(*args):
        monkeypatch.setattr(sys, "argv", ["diffmeter", *map(str, args)])
        code = 0
        try:
            main()
        except SystemExit as exit:
            code = exit.code
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    return run


@pytest.fixture
def saved(tmp_path, capsys):
    """Save a pipeline with ``save_pretrained`` and load it back as its user would: ``saved(pipe, name, **given) ->
    (the folder, the catalog entry diffmeter reads from it, the reloaded pipeline with its progress bar off)``;
    ``given``: components handed to ``from_pretrained`` (one the folder was saved without)."""
    from diffmeter.catalog import resolve

    def save(pipe, name: str = "saved", **given):
        folder = tmp_path / name
        pipe.save_pretrained(folder)
        reloaded = type(pipe).from_pretrained(folder, **given)
        reloaded.set_progress_bar_config(disable=True)
        capsys.readouterr()  # the saving and loading's own progress
        return folder, resolve(str(folder)), reloaded

    return save


@pytest.fixture(autouse=True)
def _isolated_compiler_state():
    """Each test starts from the compiler state the one before it found: inductor settings (which
    torchao and --compile-inductor-flags change process-wide) and dynamo's compiled-code caches,
    whose per-function recompile limit otherwise makes a later test fall back to eager."""
    import torch._inductor.config as inductor

    settings = inductor.get_config_copy()
    yield
    inductor.load_config(settings)
    if "torch._dynamo" in sys.modules:
        sys.modules["torch._dynamo"].reset()


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the groups (xdist/remote.py, 236-254)
def pytest_collection_modifyitems(items):
    """Under pytest-xdist (--dist loadgroup) a module's tests that share a module-scoped fixture run on one worker,
    so the fixture (a whole benchmark, a study) is built once; every other test goes wherever a worker is free."""
    for item in items:
        fixtures = getattr(item, "_fixtureinfo", None)
        definitions = fixtures.name2fixturedefs.values() if fixtures else ()
        if any(definition[-1].scope == "module" for definition in definitions):
            item.add_marker(pytest.mark.xdist_group(item.module.__name__))


#: the fake CUDA ledgers pytest-xdist's workers sent back, gathered on the controller
WORKER_LEDGERS: list[tuple[str, str]] = []


def pytest_sessionfinish(session):
    """A worker hands its fake CUDA ledger to the controller (pytest-xdist's workeroutput)."""
    fake_cuda = sys.modules.get("fake_cuda")
    if hasattr(session.config, "workeroutput") and fake_cuda is not None:
        session.config.workeroutput["fake_cuda_ledger"] = [list(line) for line in fake_cuda.LEDGER]


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    """The controller gathers each worker's fake CUDA ledger."""
    WORKER_LEDGERS.extend(map(tuple, getattr(node, "workeroutput", {}).get("fake_cuda_ledger", [])))


def pytest_terminal_summary(terminalreporter):
    """What ran on the fake CUDA device and what could not, with the reasons (docs/fake-cuda.md)."""
    fake_cuda = sys.modules.get("fake_cuda")
    ledger = sorted(WORKER_LEDGERS) + (fake_cuda.LEDGER if fake_cuda is not None else [])
    if not ledger:
        return
    terminalreporter.write_sep("-", "fake CUDA device: what ran on cuda:1, and what could not")
    for subject, outcome in ledger:
        terminalreporter.write_line(f"{subject}: {outcome}")
