"""A real browser labels samples on the page (headless Chromium through Selenium), and the
adapting side receives exactly those answers.

Needs Debian's ``chromium`` and ``chromium-driver`` (``.ci/run`` installs them): without them the
test fails under ``CI=true`` and is skipped elsewhere. ``EATTA_SCREENSHOT=1`` saves the page to
``docs/img/annotate-page.png``.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from _annotate_helpers import make_request, serve_in_thread

from _browser import browser_or_skip, chromium, wait_for
from eatta.annotate import Answer, LabelQueue, LabelRequest

SCREENSHOT = Path(__file__).resolve().parents[2] / "docs" / "img" / "annotate-page.png"


def test_a_person_labels_by_click_keyboard_and_yes_no(tmp_path: Path) -> None:
    binary = browser_or_skip()
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    path = tmp_path / "labels.db"
    names = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
    adapting = LabelQueue(path, class_names=names)
    preds = [3, 1, 7, 5, 2]
    requests = [make_request(f"req-{i}", 10 + i, pred=p) for i, p in enumerate(preds)]
    try:  # real 8 x 8 digits look better in the screenshot than noise
        from sklearn.datasets import load_digits

        images = torch.tensor(load_digits().images[:5], dtype=torch.float32).unsqueeze(1) / 16
        requests = [
            LabelRequest(r.id, images[i], r.logits, r.kind, r.step, r.index)
            for i, r in enumerate(requests)
        ]
    except ImportError:
        pass
    adapting.submit(requests)

    with serve_in_thread(path, order="oldest") as url:  # the requests in the order they were made
        driver = chromium(binary)
        try:
            driver.get(url + "/")

            def shown() -> str:
                box = driver.find_element(By.ID, "current")
                return "" if box.get_attribute("hidden") else box.get_attribute("data-id") or ""

            def answered() -> int:
                return int(driver.find_element(By.TAG_NAME, "body").get_attribute(
                    "data-answered"
                ) or 0)  # fmt: skip

            def next_after(done: int, rid: str) -> None:
                wait_for(lambda: answered() == done, what=f"answer {done} acknowledged")
                wait_for(lambda: shown() != rid, what="the next sample")

            assert wait_for(shown, what="the first sample") == "req-0"  # oldest first (--order)
            assert driver.find_element(By.ID, "pred-name").text == "three"
            img = driver.find_element(By.ID, "sample")
            assert img.get_attribute("src").endswith("/api/images/req-0.png")
            assert driver.execute_script("return arguments[0].naturalWidth", img) == 8
            assert img.size["width"] >= 200  # scaled up for a small input
            if os.environ.get("EATTA_SCREENSHOT"):
                wait_for(
                    lambda: driver.find_element(By.ID, "stat-pending").text == "5", what="stats"
                )
                SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
                driver.save_screenshot(str(SCREENSHOT))
            # 1. a click on a class button
            driver.find_element(By.CSS_SELECTOR, '#classes button[data-class="4"]').click()
            next_after(1, "req-0")
            # 2. the keyboard: a digit, then Enter
            assert shown() == "req-1"
            body = driver.find_element(By.TAG_NAME, "body")
            body.send_keys("8")
            body.send_keys(Keys.ENTER)
            next_after(2, "req-1")
            # 3. arrows move from the prediction (7): right, right, left -> 8
            assert shown() == "req-2"
            for key in (Keys.ARROW_RIGHT, Keys.ARROW_RIGHT, Keys.ARROW_LEFT):
                body.send_keys(key)
            body.send_keys(Keys.ENTER)
            next_after(3, "req-2")
            # 4. yes/no on the prediction: "no" by click, then "yes" by key
            assert shown() == "req-3"
            driver.find_element(By.ID, "no").click()
            next_after(4, "req-3")
            assert shown() == "req-4"
            body.send_keys("y")
            wait_for(lambda: answered() == 5, what="answer 5 acknowledged")
            wait_for(
                lambda: driver.find_element(By.ID, "empty").is_displayed(), what="an empty queue"
            )
            wait_for(lambda: driver.find_element(By.ID, "stat-answered").text == "5", what="stats")
            right = driver.find_element(By.ID, "stat-right").text
            assert right == "20 % of 5", right  # only "yes" on req-4 said the model was right
            errors = [
                e for e in driver.get_log("browser") if e.get("level") == "SEVERE"
            ]  # fmt: skip
            assert errors == [], errors
        finally:
            driver.quit()
    got = adapting.collect()
    assert got == [
        Answer("req-0", label=4),
        Answer("req-1", label=8),
        Answer("req-2", label=8),
        Answer("req-3", correct=False),
        Answer("req-4", correct=True),
    ]
    times = [a["seconds"] for a in adapting.answers()]
    assert all(t is not None and 0 <= t < 60 for t in times), times
    assert adapting.collect() == []
