"""The inspector in a real browser: Debian's headless Chromium, driven by selenium through
Debian's chromedriver, against a real ``compactor serve``, Redis and worker.

Sign in, list, timeline, a compaction (its sections link to the messages they were drawn
from), restore and approve (with an edit) through the page, live events, another tenant's
conversation answered 404, no console errors, every action reached with the keyboard with a
visible focus, and no horizontal scroll at 375 px. A screenshot of each page goes to
``$COMPACTOR_ARTIFACTS_DIR`` (else ``.pytest_cache/screenshots``). Skipped, with the reason,
only where chromium or chromedriver is not installed (``.ci/run`` installs both)."""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pytest
from http_support import KEY_A, KEY_B, Stack
from inspector_support import submit, wait_for_type
from service_support import REPO_ROOT, client_for, conversation

from worker.backend import keys

pytestmark = pytest.mark.slow

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
if not (Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()):
    pytest.skip(
        "headless Chromium needs Debian's chromium and chromium-driver "
        "(apt-get install chromium chromium-driver; .ci/run does)",
        allow_module_level=True,
    )

from selenium import webdriver  # noqa: E402 - only with a browser to drive
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.common.keys import Keys  # noqa: E402
from selenium.webdriver.remote.webelement import WebElement  # noqa: E402

FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--window-size=1280,900",
]


def screenshots_dir() -> Path:
    where = os.environ.get("COMPACTOR_ARTIFACTS_DIR")
    path = Path(where) if where else REPO_ROOT / ".pytest_cache" / "screenshots"
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(scope="module")
def data(stack: Stack) -> dict[str, Any]:
    submit(stack, conversation("c-1", 12))
    submit(stack, conversation("c-undo", 12))
    submit(stack, conversation("g-1", 12), key=KEY_B)
    done = {}
    for name in ("c-1", "c-undo"):
        events = wait_for_type(stack, name, "compaction.completed")
        done[name] = next(e for e in events if e["type"] == "compaction.completed")
    return done


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(executable_path=CHROMEDRIVER))
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()


def wait_until(condition: Callable[[], Any], what: str, timeout_s: float = 60) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not {what} within {timeout_s}s")
        time.sleep(0.05)


def console_errors(driver: Any) -> list[dict[str, Any]]:
    return [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]


def shot(driver: Any, name: str) -> None:
    driver.save_screenshot(str(screenshots_dir() / f"inspector-{name}.png"))


def sign_in(driver: Any, stack: Stack, key: str) -> None:
    driver.delete_all_cookies()
    driver.get(f"{stack.base}/ui/conversations")
    wait_until(lambda: "/ui/login" in driver.current_url, "sent to the sign-in form")
    shot(driver, "login")
    field = driver.find_element(By.ID, "key")
    field.send_keys(key)
    field.send_keys(Keys.ENTER)
    wait_until(lambda: driver.current_url.endswith("/ui/conversations"), "signed in")


def test_reading_a_compaction_in_the_browser(
    stack: Stack, browser: Any, data: dict[str, Any]
) -> None:
    driver = browser
    sign_in(driver, stack, KEY_A)
    assert "c-1" in driver.find_element(By.CSS_SELECTOR, "table.conversations").text
    assert "g-1" not in driver.page_source
    shot(driver, "conversations")

    driver.find_element(By.LINK_TEXT, "c-1").click()
    wait_until(lambda: driver.current_url.endswith("/ui/conversations/c-1"), "on the timeline")
    assert driver.find_elements(By.CSS_SELECTOR, "svg.chart .marker.completed")
    shot(driver, "timeline")

    driver.find_element(By.LINK_TEXT, "Inspect").click()
    wait_until(lambda: "/compactions/" in driver.current_url, "on the compaction")
    shot(driver, "compaction")
    done = data["c-1"]
    sections = [s for s in done["compaction"]["summary"]["sections"] if s["source_ids"]]
    shown = driver.find_elements(By.CSS_SELECTOR, "section.summary-section")
    by_title = {}
    for element in shown:
        heading = element.find_element(By.TAG_NAME, "h4").text
        links = element.find_elements(By.CSS_SELECTOR, ".sources a")
        by_title[heading.split(" ", 1)[1]] = [unquote(a.get_attribute("hash")) for a in links]
    for section in sections:
        wanted = [f"#m-{mid}" for mid in section["source_ids"]]
        assert by_title[section["title"]] == wanted, section["title"]
        for anchor in wanted:  # each one is a replaced message of the page
            target = driver.find_element(By.ID, anchor[1:])
            assert (
                target.find_element(By.XPATH, "ancestor::section").get_attribute("class")
                == "side replaced"
            )
    # following a source link lands on that message
    link = driver.find_element(By.CSS_SELECTOR, "section.summary-section .sources a")
    link.click()
    wait_until(lambda: driver.execute_script("return location.hash"), "on the anchor")
    target = driver.execute_script("return document.querySelector(':target').id")
    assert f"m-{unquote(link.get_attribute('hash'))[3:]}" == target
    assert console_errors(driver) == []


_OUTLINE = (
    "const s = getComputedStyle(document.activeElement);"
    "return [s.outlineStyle, s.outlineWidth, document.activeElement.outerHTML.slice(0, 120)];"
)


def _tab_through(driver: Any, presses: int) -> list[tuple[WebElement, list[str]]]:
    """Each element TAB reaches from the top of the page, with its outline while focused."""
    driver.execute_script("window.scrollTo(0, 0); document.activeElement.blur()")
    seen = []
    for _ in range(presses):
        driver.switch_to.active_element.send_keys(Keys.TAB)
        seen.append((driver.switch_to.active_element, driver.execute_script(_OUTLINE)))
    return seen


def test_every_action_is_reached_by_keyboard_with_a_visible_focus(
    stack: Stack, browser: Any, data: dict[str, Any]
) -> None:
    driver = browser
    sign_in(driver, stack, KEY_A)
    done = data["c-1"]
    for path in ("/ui/conversations/c-1", f"/ui/conversations/c-1/compactions/{done['event_id']}"):
        driver.get(stack.base + path)
        actions = driver.find_elements(
            By.CSS_SELECTOR,
            "main button, main a.recall, main input:not([type=hidden]), main td a, header button",
        )
        assert actions
        focusable = driver.find_elements(By.CSS_SELECTOR, "a, button, input:not([type=hidden])")
        reached = _tab_through(driver, len(focusable) + 3)
        ids = {element.id for element, _style in reached}
        missing = [a.get_attribute("outerHTML")[:120] for a in actions if a.id not in ids]
        assert missing == [], path
        for element, (style, width, outer) in reached:
            if element.tag_name != "body":
                assert style != "none" and width != "0px", outer
    assert console_errors(driver) == []


def test_restoring_through_the_page(stack: Stack, browser: Any, data: dict[str, Any]) -> None:
    driver = browser
    sign_in(driver, stack, KEY_A)
    done = data["c-undo"]
    driver.get(f"{stack.base}/ui/conversations/c-undo/compactions/{done['event_id']}")
    form = driver.find_element(By.CSS_SELECTOR, "form.restore")
    form.find_element(By.NAME, "reason").send_keys("checking the inspector")
    form.find_element(By.TAG_NAME, "button").click()
    wait_until(lambda: "done=restored" in driver.current_url, "back on the timeline")
    assert "was restored" in driver.find_element(By.CSS_SELECTOR, ".notice").text
    rows = driver.find_elements(By.CSS_SELECTOR, "table.events tr.t-compaction-reverted")
    assert len(rows) == 1 and "checking the inspector" in rows[0].text
    assert not driver.find_elements(By.CSS_SELECTOR, "form.restore")  # nothing newer to undo
    shot(driver, "restored")
    redis = client_for(stack.workers).state.client
    assert redis.get(keys.composed("acme:c-undo")) is None
    assert redis.llen(keys.last_compaction("acme:c-undo")) == 0
    with stack.http() as client:
        last = client.get("/v1/conversations/c-undo/events").json()[-1]
    assert last["type"] == "compaction.reverted" and last["reverted_event_id"] == done["event_id"]
    assert console_errors(driver) == []


def test_approving_a_held_compaction_through_the_page(stack: Stack, browser: Any) -> None:
    """A snapshot that asks for review is held as compaction.proposed; its page approves it with
    an edited summary, and the completed event carries the edit."""
    snapshot = conversation("c-held", 12)
    snapshot.setdefault("config", {})["review"] = True
    submit(stack, snapshot)
    events = wait_for_type(stack, "c-held", "compaction.proposed")
    proposed = next(e for e in events if e["type"] == "compaction.proposed")
    driver = browser
    sign_in(driver, stack, KEY_A)
    driver.get(f"{stack.base}/ui/conversations/c-held/compactions/{proposed['event_id']}")
    assert "Held for review" in driver.find_element(By.ID, "review-heading").text
    shot(driver, "proposal")
    edit = "Edited in the browser: the failing test is in src/pkg/core.py."
    field = driver.find_element(By.ID, "summary-edit")
    field.clear()
    field.send_keys(edit)
    form = driver.find_element(By.CSS_SELECTOR, "section.review form.decide")
    form.find_element(By.TAG_NAME, "button").click()
    wait_until(lambda: "done=approved" in driver.current_url, "back on the timeline")
    shot(driver, "approved")
    completed = wait_for_type(stack, "c-held", "compaction.completed")
    done = [e for e in completed if e["type"] == "compaction.completed"][-1]
    assert done["proposal_event_id"] == proposed["event_id"] and done["approved_by"] == "api"
    summary = done["compaction"]["summary"]
    assert summary["edited"] and edit in summary["text"]
    assert console_errors(driver) == []


def test_new_events_appear_without_reloading(stack: Stack, browser: Any) -> None:
    driver = browser
    sign_in(driver, stack, KEY_A)
    submit(stack, conversation("c-live", 1, revision=1))
    wait_for_type(stack, "c-live", "compaction.skipped")
    driver.get(f"{stack.base}/ui/conversations/c-live")
    before = len(driver.find_elements(By.CSS_SELECTOR, "table.events tbody tr"))
    marker = driver.execute_script("window.__same_page = true; return true")
    assert marker
    submit(stack, conversation("c-live", 1, revision=2))
    wait_until(
        lambda: len(driver.find_elements(By.CSS_SELECTOR, "table.events tbody tr")) > before,
        "the new event on the page",
    )
    assert driver.execute_script("return window.__same_page === true")  # not reloaded
    assert "new event" in driver.find_element(By.ID, "live").text
    shot(driver, "live")
    assert console_errors(driver) == []


def test_another_tenants_conversation_is_not_reachable(
    stack: Stack, browser: Any, data: dict[str, Any]
) -> None:
    driver = browser
    sign_in(driver, stack, KEY_B)
    assert "c-1" not in driver.find_element(By.CSS_SELECTOR, "table.conversations").text
    done = data["c-1"]
    for path in ("/ui/conversations/c-1", f"/ui/conversations/c-1/compactions/{done['event_id']}"):
        driver.get(stack.base + path)
        assert driver.find_element(By.TAG_NAME, "h1").text == "404"
        assert "no such conversation" in driver.find_element(By.CSS_SELECTOR, ".error").text
    shot(driver, "other-tenant-404")
    # the 404 pages logged their status as console errors: read and drop them
    errors = console_errors(driver)
    assert all("404" in e["message"] for e in errors), errors


def test_a_narrow_screen_has_no_horizontal_scroll(
    stack: Stack, browser: Any, data: dict[str, Any]
) -> None:
    driver = browser
    sign_in(driver, stack, KEY_A)
    driver.execute_cdp_cmd(
        "Emulation.setDeviceMetricsOverride",
        {"width": 375, "height": 812, "deviceScaleFactor": 1, "mobile": True},
    )
    try:
        done = data["c-1"]
        pages = {
            "conversations": "/ui/conversations",
            "timeline": "/ui/conversations/c-1",
            "compaction": f"/ui/conversations/c-1/compactions/{done['event_id']}",
            "message": "/ui/conversations/c-1/messages/a1",
        }
        for name, path in pages.items():
            driver.get(stack.base + path)
            sizes = driver.execute_script(
                "const d = document.documentElement; return [d.scrollWidth, d.clientWidth];"
            )
            assert sizes[0] <= sizes[1], (name, sizes)
            shot(driver, f"narrow-{name}")
    finally:
        driver.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})
    assert console_errors(driver) == []


def test_signing_out(stack: Stack, browser: Any) -> None:
    driver = browser
    sign_in(driver, stack, KEY_A)
    driver.find_element(By.CSS_SELECTOR, "form.logout button").click()
    wait_until(lambda: "/ui/login" in driver.current_url, "signed out")
    driver.get(f"{stack.base}/ui/conversations")
    assert "/ui/login" in driver.current_url
    cookies = {c["name"]: c for c in driver.get_cookies()}
    assert "cw_ui" not in cookies
    assert json.dumps(cookies).find(KEY_A) == -1
