"""Test-wide settings: keep library warnings out of test output."""

import warnings

import pytest


@pytest.fixture(autouse=True)
def _quiet_libraries():
    import diffusers
    import transformers

    transformers.utils.logging.set_verbosity_error()
    diffusers.utils.logging.set_verbosity_error()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield
