"""Keeping library chatter (config warnings, import-time probes) out of diffmeter's output."""

from __future__ import annotations

import contextlib
import io
import logging
from contextlib import contextmanager

#: loggers of optional packages that warn about their own optional kernels at import
OPTIONAL_PACKAGE_LOGGERS = ("torchao",)


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
