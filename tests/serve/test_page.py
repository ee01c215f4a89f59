"""The labelling page served by eatta-serve, in headless Chromium: a person labels the sample a
served request led to, and the method learns that answer."""

from __future__ import annotations

from pathlib import Path

import pytest
from _serve_helpers import batches, make_service, running

from _browser import browser_or_skip, chromium, wait_for
from _threaded import wait_until

pytestmark = pytest.mark.small_batches


def test_a_person_answers_on_the_servers_page_and_the_method_learns_it(tmp_path: Path) -> None:
    binary = browser_or_skip()
    from selenium.webdriver.common.by import By

    service = make_service(tmp_path / "s")
    with running(service) as url:
        xs = batches(6, 3)
        for i, x in enumerate(xs[:3]):  # 9 samples: one step on a window of 8, one request
            wait_until(lambda: service.adapter.idle, what="the adapter idle")
            service.batcher.submit(x, f"req-{i}").result(10)
        wait_until(lambda: service.adapter.stats.annotation.get("requested") == 1)
        driver = chromium(binary)
        try:
            driver.get(f"http://{url}/")
            box = driver.find_element(By.ID, "current")
            wait_for(lambda: not box.get_attribute("hidden"), what="the request on the page")
            key = box.get_attribute("data-id")
            driver.find_element(By.CSS_SELECTOR, '#classes button[data-class="4"]').click()
            wait_for(
                lambda: (
                    driver.find_element(By.TAG_NAME, "body").get_attribute("data-answered") == "1"
                ),
                what="the answer acknowledged",
            )
            errors = [e for e in driver.get_log("browser") if e.get("level") == "SEVERE"]
            assert errors == [], errors
        finally:
            driver.quit()
        assert [a["id"] for a in service.queue.answers()] == [key]
        for i, x in enumerate(xs[3:], 3):  # the next step collects the answer
            wait_until(lambda: service.adapter.idle, what="the adapter idle")
            service.batcher.submit(x, f"req-{i}").result(10)
        wait_until(lambda: service.adapter.stats.annotation.get("received") == 1, what="learned")
