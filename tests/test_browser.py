"""The browser tests' helper: a missing Chromium or Playwright skips them, saying why, except under CI, where a
failed install fails them in one line (a browser the CI could not install had turned them into quiet skips)."""

import sys

import pytest
from browser import CHROMIUM, PLAYWRIGHT, browser_tools


@pytest.fixture
def no_chromium(monkeypatch, tmp_path):
    """No browser anywhere: DIFFMETER_CHROMIUM unset and a PATH holding no program."""
    monkeypatch.delenv("DIFFMETER_CHROMIUM", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))


@pytest.mark.parametrize("ci", ["true", "1", "yes"])
def test_a_missing_chromium_fails_under_ci(no_chromium, monkeypatch, ci):
    monkeypatch.setenv("CI", ci)
    with pytest.raises(pytest.fail.Exception) as failed:
        browser_tools()
    message = str(failed.value)
    assert message == f"under CI (CI={ci}) a browser test must run, not skip: {CHROMIUM}" and "\n" not in message


@pytest.mark.parametrize("ci", [None, "", "false", "0"])
def test_a_missing_chromium_skips_outside_ci(no_chromium, monkeypatch, ci):
    if ci is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", ci)
    with pytest.raises(pytest.skip.Exception, match="no Chromium here"):
        browser_tools()


def test_a_missing_playwright_fails_under_ci_and_skips_elsewhere(monkeypatch):
    monkeypatch.setitem(sys.modules, "playwright.sync_api", None)  # importing it raises ImportError, as uninstalled
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="playwright is not installed"):
        browser_tools()
    monkeypatch.delenv("CI")
    with pytest.raises(pytest.skip.Exception, match=PLAYWRIGHT.split(":")[0]):
        browser_tools()


def test_a_named_chromium_is_used(monkeypatch, tmp_path):
    monkeypatch.setenv("CI", "true")
    monkeypatch.setenv("DIFFMETER_CHROMIUM", str(tmp_path / "chrome"))
    pytest.importorskip("playwright.sync_api")
    assert browser_tools()[1] == str(tmp_path / "chrome")
