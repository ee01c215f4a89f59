"""Headless Chromium for the page's tests (tests/annotate/test_browser.py, the page under
eatta-serve in tests/serve/test_page.py).

Needs Debian's ``chromium`` and ``chromium-driver`` (``.ci/run`` installs them): without them a
test fails under ``CI=true`` and is skipped elsewhere.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from typing import Any

import pytest

from _threaded import wait_until

CHROMEDRIVER = "/usr/bin/chromedriver"


def browser_or_skip() -> str:
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    missing = []
    if binary is None:
        missing.append("chromium")
    if not os.path.exists(CHROMEDRIVER):
        missing.append("chromium-driver")
    try:
        import selenium  # noqa: F401
    except ImportError:
        missing.append("selenium")
    if missing:
        why = f"the browser test needs {', '.join(missing)} (apt-get install chromium-driver)"
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(why)
        pytest.skip(why)
    assert binary is not None
    return binary


def wait_for(condition: Callable[[], object], timeout: float = 15.0, what: str = "") -> object:
    return wait_until(condition, timeout, what, every=0.05)


def chromium(binary: str) -> Any:
    """A headless Chromium driven by Selenium (quit it when done)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        options.add_argument(flag)
    options.add_argument("--window-size=1000,720")
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(20)
    return driver
