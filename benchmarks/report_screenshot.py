"""The report of a real CPU sweep, built and photographed in headless Chromium for the docs.

Builds `diffmeter report` from benchmarks/results (the sweep of benchmarks/sweep_cpu.py, run
first, and the stored ladder ladder_cpu.json), opens it in Chromium through Playwright (the
system browser: DIFFMETER_CHROMIUM or `chromium` on PATH), checks it rendered with no console
error and no request beyond the file, and saves two views to docs/: the summary with where the
time goes, and the trade-offs with the images.

Run from the repo root:  python benchmarks/sweep_cpu.py && python benchmarks/report_screenshot.py
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

from playwright.sync_api import sync_playwright

from diffmeter.report.html import write_report

ROOT = Path(__file__).resolve().parents[1]
VIEWS = {"report-overview.png": "#summary", "report-tradeoffs.png": "#tradeoffs"}


def main() -> None:
    if len(sys.argv) > 1:
        sys.exit(__doc__)
    chromium = os.environ.get("DIFFMETER_CHROMIUM") or shutil.which("chromium")
    if chromium is None:
        sys.exit("no Chromium: apt-get install chromium, or set DIFFMETER_CHROMIUM")
    with tempfile.TemporaryDirectory() as folder:
        page_file = write_report(ROOT / "benchmarks" / "results", Path(folder) / "report.html", "CPU sweep (2 cores)")
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1280, "height": 1500})
            errors, requests = [], []
            page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
            page.on("request", lambda request: requests.append(request.url))
            page.goto(page_file.as_uri())
            page.wait_for_function("document.querySelectorAll('.js-plotly-plot .main-svg').length > 0")
            if errors or requests != [page_file.as_uri()]:
                sys.exit(f"the report did not render cleanly: errors {errors}, requests {requests}")
            for name, anchor in VIEWS.items():
                page.locator(anchor).scroll_into_view_if_needed()
                page.evaluate(f"window.scrollTo(0, document.querySelector('{anchor}').offsetTop - 10)")
                page.screenshot(path=ROOT / "docs" / name)
                print(f"docs/{name}")
            browser.close()


if __name__ == "__main__":
    main()
