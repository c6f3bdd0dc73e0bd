"""Keeping library chatter (config warnings, import-time probes) out of diffmeter's output."""

from __future__ import annotations

import contextlib
import io
import logging
import os
import sys
from contextlib import contextmanager

#: loggers of optional packages that warn about their own optional kernels at import
OPTIONAL_PACKAGE_LOGGERS = ("torchao",)
#: loggers whose warnings are about the libraries, not about the user's run (torchao's failed kernel extensions,
#: torch's pytree deprecation notices that torchao's import triggers, bitsandbytes' CPU kernel probe)
LIBRARY_LOGGERS = ("torchao", "torch.utils._pytree", "bitsandbytes")
#: set by the command line for itself and every process it starts (ranks, sweep cells)
QUIET_VARIABLE = "DIFFMETER_QUIET_LIBRARIES"


def keep_library_warnings_off_the_terminal() -> None:
    """For the command line and the processes it starts: library warnings at ERROR and above only, decided
    before the libraries are imported (diffusers and transformers read their verbosity from the environment
    when they first log). The Python API leaves the caller's logging alone."""
    os.environ[QUIET_VARIABLE] = "1"
    os.environ.setdefault("DIFFUSERS_VERBOSITY", "error")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("AR_LOG_LEVEL", "ERROR")  # auto-round sets its logger's level from it at import (envs.py:60)
    # the Hub's and transformers' progress bars ("Loading weights", "Writing model shards" as a text encoder is
    # quantized at load): transformers reads it at import (transformers 5.24.0 utils/logging.py:55)
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    for name in LIBRARY_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)


@contextmanager
def native_stderr_to(path):
    """What native libraries write straight to the process's stderr (file descriptor 2: libkineto's
    ``USDT: ... profiler_start`` lines) appended to ``path`` while active, instead of the terminal."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(path, "a", encoding="utf-8") as target:
            os.dup2(target.fileno(), 2)
            yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)


@contextmanager
def quiet_import():
    """Silence what optional packages log at import (torchao's kernel probes, torch pytree notices)."""
    for name in OPTIONAL_PACKAGE_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)
    previous = logging.root.manager.disable
    logging.disable(logging.WARNING)
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            yield
    finally:
        logging.disable(previous)


@contextmanager
def quiet_libraries():
    """Silence the libraries' config warnings while building (unused keys, deprecations)."""
    import diffusers
    import transformers

    loggers = [logging.getLogger(name) for name in ("diffusers", "transformers")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    diffusers.utils.logging.set_verbosity_error()
    transformers.utils.logging.set_verbosity_error()
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


def load_libraries() -> None:
    """Import torch, diffusers and transformers once, keeping what they print at import (optional
    kernel probes, deprecation notices) off the user's terminal; commands call it first."""
    with quiet_import():
        import diffusers
        import torch  # noqa: F401
        import transformers
    diffusers.utils.logging.set_verbosity_error()
    transformers.utils.logging.set_verbosity_error()
