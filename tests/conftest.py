"""Test-wide settings: keep library warnings out of test output; count, do not read a cache."""

import os
import sys
import warnings

import pytest

# the tests check counting itself; tests of the cache point DIFFMETER_CACHE_DIR at a folder of their own
os.environ["DIFFMETER_CACHE_DIR"] = "off"


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


def pytest_terminal_summary(terminalreporter):
    """What ran on the fake CUDA device and what could not, with the reasons (docs/fake-cuda.md)."""
    fake_cuda = sys.modules.get("fake_cuda")
    if fake_cuda is None or not fake_cuda.LEDGER:
        return
    terminalreporter.write_sep("-", "fake CUDA device: what ran on cuda:1, and what could not")
    for subject, outcome in fake_cuda.LEDGER:
        terminalreporter.write_line(f"{subject}: {outcome}")
