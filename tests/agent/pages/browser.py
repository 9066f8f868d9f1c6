"""Headless Chromium (Debian's `chromium` + `chromium-driver`) through Selenium, for the page
tests; `make test` installs them where it can, and the tests skip and say why where it could not.

Screenshots go to docs/img/ only when EDGE_AGENT_SCREENSHOTS=1 (so a test run does not rewrite
tracked files):
`EDGE_AGENT_SCREENSHOTS=1 pytest tests/agent/pages tests/agent/manager/test_dashboard.py`.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

DOCS_IMG = Path(__file__).resolve().parents[3] / "docs" / "img"
PHONE, LAPTOP = 390, 1280


def chromium_missing() -> str | None:
    """Why the browser tests cannot run here, or None."""
    try:
        import selenium  # noqa: F401 - only to say whether it is there
    except ImportError:
        return "selenium is not installed (pip install -e '.[dev]')"
    for tool in ("chromium", "chromedriver"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (make test installs chromium and chromium-driver)"
    return None


@contextmanager
def chromium() -> Iterator[Any]:
    """A headless Chromium driven by Selenium; quit on exit."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or "chromium"
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1280,900", "--disable-extensions", "--no-first-run"):  # fmt: skip
        options.add_argument(arg)
    service = Service(executable_path=shutil.which("chromedriver") or "chromedriver")
    driver = webdriver.Chrome(options=options, service=service)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


def browser_fixture() -> Callable[[], Iterator[Any]]:
    """A module-scoped `browser` fixture that skips with the reason when Chromium is missing."""

    @pytest.fixture(scope="module")
    def browser() -> Iterator[Any]:
        reason = chromium_missing()
        if reason is not None:
            pytest.skip(reason)
        with chromium() as driver:
            yield driver

    return browser


def wait_for(driver: Any, check: Callable[[Any], Any], timeout: float = 20.0) -> Any:
    """Selenium's explicit wait on a condition (no sleeps)."""
    from selenium.webdriver.support.wait import WebDriverWait

    return WebDriverWait(driver, timeout, poll_frequency=0.1).until(check)


def first_paint_ms(driver: Any) -> float:
    """First contentful paint of the current page, from the browser's Performance API."""
    value = driver.execute_script(
        "const p = performance.getEntriesByName('first-contentful-paint')[0];"
        "return p ? p.startTime : performance.getEntriesByType('navigation')[0].domComplete;"
    )
    return float(value)


def text_of(driver: Any, css: str) -> str:
    """The visible text of the first element matching `css`, whitespace collapsed."""
    found = driver.execute_script("const e = document.querySelector(arguments[0]);"
                                  "return e ? e.innerText : '';", css)  # fmt: skip
    return " ".join(str(found).split())


def rows_of(driver: Any, css: str) -> list[str]:
    """The visible text of every element matching `css`, read in one go (a poll may replace
    them between two reads: one script call reads them all from the same document)."""
    found = driver.execute_script(
        "return [...document.querySelectorAll(arguments[0])].map((e) => e.innerText);", css
    )
    return [" ".join(str(text).split()) for text in found]


def screenshots(driver: Any, name: str) -> None:
    """docs/img/<name>-390.png and -1280.png, whole page, when EDGE_AGENT_SCREENSHOTS=1."""
    if os.environ.get("EDGE_AGENT_SCREENSHOTS") != "1":
        return
    DOCS_IMG.mkdir(parents=True, exist_ok=True)
    for width in (PHONE, LAPTOP):
        metrics = {"width": width, "height": 800, "deviceScaleFactor": 1, "mobile": width < 600}
        driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", metrics)
        height = driver.execute_script("return document.documentElement.scrollHeight")
        metrics["height"] = min(int(height), 4000)
        driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", metrics)
        driver.save_screenshot(str(DOCS_IMG / f"{name}-{width}.png"))
    driver.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})
