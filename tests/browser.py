"""A real browser for the report's and the leaderboard's tests: Playwright driving a local Chromium. Where either is
missing a test skips and says why, except under CI (``CI`` set to anything but "", 0, false or no, as CI services
and .ci/run set it): there a missing browser is a failed install, and the test fails."""

import os
import shutil

import pytest

CHROMIUM = "no Chromium here: apt-get install chromium (.ci/run does), or set DIFFMETER_CHROMIUM"
PLAYWRIGHT = "playwright is not installed: pip install -e '.[test]' (it is in the test extra)"


def chromium() -> str | None:
    return os.environ.get("DIFFMETER_CHROMIUM") or next(
        (path for name in ("chromium", "chromium-browser", "google-chrome") if (path := shutil.which(name))), None
    )


def under_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def missing(reason: str):
    """Skip saying ``reason``; under CI, fail saying it in one line instead."""
    if under_ci():
        pytest.fail(f"under CI (CI={os.environ['CI']}) a browser test must run, not skip: {reason}", pytrace=False)
    pytest.skip(reason)


def browser_tools():
    """``(playwright.sync_api, Chromium's path)``, or a skip (a failure under CI) naming what is missing."""
    try:
        import playwright.sync_api as playwright
    except ImportError:
        missing(PLAYWRIGHT)
    executable = chromium()
    if executable is None:
        missing(CHROMIUM)
    return playwright, executable
