"""The documentation site: built with warnings as errors, its API reference complete, and a real
browser finds the quick start and the page of ``eatta.EATTA``.

The build needs the ``docs`` extra (mkdocs, Material, mkdocstrings); the browser test Debian's
``chromium`` and ``chromium-driver`` (``.ci/run`` installs them). Without them the tests fail
under ``CI=true`` and are skipped elsewhere.
"""

from __future__ import annotations

import contextlib
import functools
import http.server
import inspect
import os
import re
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn

import pytest

import eatta

REPO = Path(__file__).resolve().parents[2]
CHROMEDRIVER = "/usr/bin/chromedriver"


def _missing(why: str) -> NoReturn:
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(why)
    pytest.skip(why)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site, built as CI builds it (``mkdocs build --strict``) into a temporary folder."""
    try:
        import mkdocs  # noqa: F401
    except ImportError:
        _missing("the site needs the docs extra: pip install -e '.[docs]'")
    out = tmp_path_factory.mktemp("site")
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "src"), env.get("PYTHONPATH", "")])
    command = [sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(out)]
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    return out


def _text(html: str) -> str:
    return " ".join(re.sub(r"<[^>]+>", " ", html).split())


def test_the_api_reference_has_every_public_name_and_every_method_key(site: Path):
    index = (site / "api" / "index.html").read_text(encoding="utf-8")
    for name in eatta.__all__:
        page = site / "api" / (name.strip("_") or name) / "index.html"
        assert page.is_file(), f"no API page for eatta.{name}"
        assert f"eatta.{name}" in _text(page.read_text(encoding="utf-8"))
        assert f"eatta.{name}" in _text(index)
    methods = _text((site / "api" / "methods" / "index.html").read_text(encoding="utf-8"))
    for name in eatta.available():
        keys = re.findall(r"^  ([\w.]+):", eatta.describe(name), re.M)
        assert keys and name in methods
        section = methods.split(name, 1)[1]
        assert all(key in section for key in keys), name
    # the docstring, not just the name: the class's first words are on its page
    words = " ".join(inspect.getdoc(eatta.EATTA).replace("`", "").split()[:3])  # type: ignore[union-attr]
    assert words in _text((site / "api" / "EATTA" / "index.html").read_text(encoding="utf-8"))


def test_a_public_name_without_a_docstring_stops_the_build(site_hooks, monkeypatch):
    from mkdocs.exceptions import PluginError

    from eatta.annotate import oracle

    nav = [{"Home": "index.md"}, {"API reference": "api/index.md"}]
    assert site_hooks.on_config({"nav": nav}) is not None  # today's names all have one
    assert [next(iter(e.values())) for e in nav[1]["API reference"][:3]] == [
        "api/index.md", "api/methods.md", f"api/{eatta.__all__[0].strip('_')}.md"
    ]  # fmt: skip
    monkeypatch.setattr(eatta, "Oracle", oracle.Oracle, raising=False)  # a type alias, no doc
    monkeypatch.setattr(eatta, "__all__", [*eatta.__all__, "Oracle"])
    with pytest.raises(PluginError, match=r"without a docstring.*eatta\.Oracle"):
        site_hooks.on_config({"nav": [{"API reference": "api/index.md"}]})


def test_the_changelog_and_the_results_are_on_the_site(site: Path):
    assert "Changelog" in (site / "changelog" / "index.html").read_text(encoding="utf-8")
    for page in ("safety", "approx-step", "small-batches", "guard", "real-annotators"):
        assert (site / page / "index.html").is_file(), page


@contextlib.contextmanager
def _served(root: Path) -> Iterator[str]:
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(Quiet, directory=str(root))
    )
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_a_browser_finds_the_quick_start_and_the_page_of_eatta_EATTA(site: Path):
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    try:
        from selenium import webdriver
        from selenium.common.exceptions import ElementClickInterceptedException
        from selenium.webdriver.chrome.service import Service
        from selenium.webdriver.common.by import By
        from selenium.webdriver.support.ui import WebDriverWait
    except ImportError:
        _missing("the browser test needs selenium")
    if binary is None or not os.path.exists(CHROMEDRIVER):
        _missing("the browser test needs chromium and chromium-driver (apt-get install)")
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        options.add_argument(flag)
    options.add_argument("--window-size=1400,1000")
    with _served(site) as url:
        driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
        try:
            driver.set_page_load_timeout(20)
            wait = WebDriverWait(driver, 15)
            driver.get(url + "/")
            quick = wait.until(lambda d: d.find_element(By.ID, "quick-start"))
            assert quick.text.strip().startswith("Quick start")
            code = driver.find_element(By.CSS_SELECTOR, "article pre code").text
            assert "eatta.create(" in code

            # from the home page to the API reference, and on to eatta.EATTA, by clicking
            def follow(selector: str) -> None:
                link = driver.find_element(By.CSS_SELECTOR, selector)
                try:
                    link.click()
                except ElementClickInterceptedException:  # under the sticky header
                    driver.execute_script("arguments[0].click()", link)

            follow('article a[href="api/"]')
            wait.until(lambda d: d.current_url.rstrip("/").endswith("/api"))
            follow('article a[href="EATTA/"]')
            wait.until(lambda d: d.current_url.rstrip("/").endswith("/api/EATTA"))
            title = driver.find_element(By.TAG_NAME, "h1").text
            assert title.replace("¶", "").strip() == "eatta.EATTA"
            doc = inspect.getdoc(eatta.EATTA) or ""
            words = " ".join(doc.replace("`", "").split()[:3])
            assert words in driver.find_element(By.TAG_NAME, "article").text
        finally:
            driver.quit()
