"""The dashboard's first paint in Debian's headless Chromium, driven by Selenium.

`first_paint(urls)` opens each page and returns its first contentful paint and when its DOM
was complete (the browser's Performance API: a page paints its top before it has parsed a long
table, so both are given) and how many table rows it drew. `browser_missing()` says why it
cannot run here (Chromium, its driver or Selenium missing).
"""

from __future__ import annotations

import shutil
from typing import Any

__all__ = ["browser_missing", "first_paint"]


def browser_missing() -> str | None:
    """Why the paint cannot be measured here, or None."""
    try:
        import selenium  # noqa: F401, PLC0415 - only to say whether it is there
    except ImportError:
        return "selenium is not installed (pip install -e '.[dev]')"
    for tool in ("chromium", "chromedriver"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (sudo apt-get install chromium chromium-driver)"
    return None


def first_paint(urls: list[str]) -> list[tuple[float, float, int]]:
    """(first contentful paint ms, DOM complete ms, rows in the devices table) of each page.

    Raises:
        RuntimeError: the browser is missing (`browser_missing` says why).
    """
    missing = browser_missing()
    if missing is not None:
        raise RuntimeError(missing)
    from selenium import webdriver  # noqa: PLC0415 - only where a browser is wanted
    from selenium.webdriver.chrome.service import Service  # noqa: PLC0415

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or "chromium"
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--window-size=1280,900",
        "--disable-extensions",
        "--no-first-run",
    ):
        options.add_argument(arg)
    service = Service(executable_path=shutil.which("chromedriver") or "chromedriver")
    driver: Any = webdriver.Chrome(options=options, service=service)
    driver.set_page_load_timeout(300)
    found = []
    try:
        for url in urls:
            driver.get(url)
            paint = driver.execute_script(
                "const p = performance.getEntriesByName('first-contentful-paint')[0];"
                "return p ? p.startTime : performance.getEntriesByType('navigation')[0]"
                ".domComplete;"
            )
            done = driver.execute_script(
                "return performance.getEntriesByType('navigation')[0].domComplete;"
            )
            rows = driver.execute_script(
                "return document.querySelectorAll('#devices-body tr').length;"
            )
            found.append((round(float(paint), 1), round(float(done), 1), int(rows)))
    finally:
        driver.quit()
    return found
