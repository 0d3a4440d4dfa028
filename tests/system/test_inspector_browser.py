"""The inspector in a real browser: Debian's headless Chromium, driven by selenium through
Debian's chromedriver, against a real ``compactor serve``, Redis and worker.

Sign in, list, timeline, a compaction (its sections link to the messages they were drawn
from), restore and approve (with an edit, counted again as it is typed) through the page, live
events, another tenant's conversation answered 404, no console errors, every action reached
with the keyboard with a visible focus, and no horizontal scroll at 375 px. The layout a
newcomer met, measured: a long conversation's timeline (62 outcomes, most of them skips)
filtered to its compactions, its chart as wide as the page with no two revision labels
touching, no event type broken inside a word, the list's readable times and counts, the summary
editor as wide as the page. A screenshot of each page goes to ``$COMPACTOR_ARTIFACTS_DIR``
(else ``.pytest_cache/screenshots``), and the before/after pairs of the list, the timeline and
the review page also to the test's own tmp dir. Skipped, with the reason, only where chromium
or chromedriver is not installed (``.ci/run`` installs both)."""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pytest
from support.http_support import KEY_A, KEY_B, Stack
from support.inspector_support import submit, wait_for_type
from support.service_support import REPO_ROOT, client_for, conversation

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
def browser(tmp_path_factory: pytest.TempPathFactory, system_scenario: None) -> Iterator[Any]:
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


def shot(driver: Any, name: str, also: Path | None = None) -> None:
    """A screenshot of the page to the artifacts, and to ``also`` (a test's tmp dir)."""
    for where in (screenshots_dir(), *([also] if also is not None else [])):
        assert driver.save_screenshot(str(where / f"inspector-{name}.png")), where


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


_COUNTED = re.compile(r"Your edit: ([0-9,]+) tokens \(the proposal: ([0-9,]+)\)")


def content_width(driver: Any) -> float:
    """The width of the page's main column, padding excluded (CSS pixels)."""
    width: float = driver.execute_script(
        "const m = document.querySelector('main'); const s = getComputedStyle(m);"
        "return m.clientWidth - parseFloat(s.paddingLeft) - parseFloat(s.paddingRight);"
    )
    return width


def test_approving_a_held_compaction_through_the_page(
    stack: Stack, browser: Any, tmp_path: Path
) -> None:
    """A snapshot that asks for review is held as compaction.proposed; its page shows the
    summary in an editor as wide as the page, counts an edit again as it is typed (the same
    count the approval publishes), and approves it as made in the inspector."""
    snapshot = conversation("c-held", 12)
    snapshot.setdefault("config", {})["review"] = True
    submit(stack, snapshot)
    events = wait_for_type(stack, "c-held", "compaction.proposed")
    proposed = next(e for e in events if e["type"] == "compaction.proposed")
    proposed_tokens = proposed["compaction"]["summary"]["tokens"]
    driver = browser
    sign_in(driver, stack, KEY_A)
    driver.get(f"{stack.base}/ui/conversations/c-held/compactions/{proposed['event_id']}")
    assert "Held for review" in driver.find_element(By.ID, "review-heading").text
    field = driver.find_element(By.ID, "summary-edit")
    assert field.size["width"] >= 0.95 * content_width(driver), field.size  # the page's width
    figures = driver.find_element(By.ID, "edit-figures")
    assert f"The proposed summary: {proposed_tokens:,} tokens" in figures.text
    driver.execute_script("document.getElementById('review-heading').scrollIntoView()")
    shot(driver, "review-before", tmp_path)
    shot(driver, "proposal")
    edit = "Edited in the browser: the failing test is in src/pkg/core.py."
    field.clear()
    field.send_keys(edit)
    counted = wait_until(lambda: _COUNTED.search(figures.text), "the edit counted")
    tokens = int(counted.group(1).replace(",", ""))
    assert int(counted.group(2).replace(",", "")) == proposed_tokens and tokens < proposed_tokens
    assert "saved per later turn" in figures.text
    shot(driver, "review-after", tmp_path)
    form = driver.find_element(By.CSS_SELECTOR, "section.review form.edit")
    form.find_element(By.XPATH, ".//button[normalize-space()='Approve']").click()
    wait_until(lambda: "done=approved" in driver.current_url, "back on the timeline")
    shot(driver, "approved")
    completed = wait_for_type(stack, "c-held", "compaction.completed")
    done = [e for e in completed if e["type"] == "compaction.completed"][-1]
    assert done["proposal_event_id"] == proposed["event_id"]
    assert done["approved_by"] == "inspector"
    summary = done["compaction"]["summary"]
    assert summary["edited"] and edit in summary["text"]
    assert summary["tokens"] == tokens  # the page counted what the approval published
    row = driver.find_element(By.CSS_SELECTOR, "table.events tr.t-compaction-completed")
    assert "approved (inspector)" in row.text
    assert console_errors(driver) == []


@pytest.fixture(scope="module")
def long_line(stack: Stack) -> list[dict[str, Any]]:
    """acme's c-long: a snapshot per turn for 62 turns, each waited for: most of its events
    are skips, with a compaction every ten or so (its events, as the API lists them)."""
    with stack.http() as client:
        for turns in range(1, 63):
            revision = conversation("c-long", turns, body=150)["revision"]
            submit(stack, conversation("c-long", turns, body=150))
            wait_until(lambda r=revision: _outcome_of(client, r), f"turn {turns}'s outcome")
        events: list[dict[str, Any]] = client.get("/v1/conversations/c-long/events").json()
    kinds = [e["type"] for e in events]
    assert kinds.count("compaction.completed") >= 3 and kinds.count("compaction.skipped") >= 40
    return events


def _outcome_of(client: Any, revision: int) -> bool:
    events = client.get("/v1/conversations/c-long/events").json()
    return any(e["revision"] == revision and e["type"].startswith("compaction.") for e in events)


# Each word of an event's type on one line (a range of its text has one box per line it is
# on), and, on a wide screen, each type on one line.
_WORDS_BROKEN = (
    "return [...document.querySelectorAll('.event-name .word')].filter(w => {"
    "const r = document.createRange(); r.selectNodeContents(w);"
    "return r.getClientRects().length !== 1; }).map(w => w.textContent);"
)
_NAMES_WRAPPED = (
    "return [...document.querySelectorAll('.event-name')].filter(n => "
    "n.firstElementChild.getBoundingClientRect().top !== "
    "n.lastElementChild.getBoundingClientRect().top).map(n => n.textContent);"
)
_TICKS = (
    "return [...document.querySelectorAll('svg.chart text.tick.x')].map(t => {"
    "const r = t.getBoundingClientRect(); return [r.left, r.right, t.textContent]; });"
)


def test_a_long_timeline_filters_its_compactions_and_reads_cleanly(
    stack: Stack, browser: Any, long_line: list[dict[str, Any]], tmp_path: Path
) -> None:
    driver = browser
    sign_in(driver, stack, KEY_A)
    driver.get(f"{stack.base}/ui/conversations/c-long")
    rows = driver.find_elements(By.CSS_SELECTOR, "table.events tbody tr")
    assert len(rows) == len(long_line)
    shot(driver, "timeline-before", tmp_path)
    # the chart takes the page's width, and no two revision labels touch
    chart = driver.find_element(By.CSS_SELECTOR, "svg.chart")
    assert chart.size["width"] >= 0.95 * content_width(driver), chart.size
    ticks = driver.execute_script(_TICKS)
    assert len(ticks) >= 5, ticks
    for (_l, right, label), (left, _r, following) in itertools.pairwise(ticks):
        assert right + 4 <= left, (label, following, ticks)
    assert ticks[0][2] == str(long_line[0]["revision"])
    assert ticks[-1][2] == str(long_line[-1]["revision"])
    # no event type is broken inside a word, nor at all on a wide screen
    assert len(driver.find_elements(By.CSS_SELECTOR, ".event-name")) == len(long_line)
    assert driver.execute_script(_WORDS_BROKEN) == []
    assert driver.execute_script(_NAMES_WRAPPED) == []
    # the filter: compactions only, then every event again
    driver.find_element(By.PARTIAL_LINK_TEXT, "Compactions only").click()
    wait_until(lambda: "show=compactions" in driver.current_url, "filtered")
    shown = driver.find_elements(By.CSS_SELECTOR, "table.events tbody tr")
    made = [e for e in long_line if e["type"] == "compaction.completed"]
    assert [r.get_attribute("class") for r in shown] == ["t-compaction-completed"] * len(made)
    assert [r.get_attribute("id") for r in shown] == [f"e-{e['stream_id']}" for e in made]
    current = driver.find_element(By.CSS_SELECTOR, "nav.filter a[aria-current=page]")
    assert current.text.startswith("Compactions only") and f"({len(made)})" in current.text
    shot(driver, "timeline-after", tmp_path)
    driver.find_element(By.PARTIAL_LINK_TEXT, "All events").click()
    wait_until(lambda: "show=all" in driver.current_url, "unfiltered")
    assert len(driver.find_elements(By.CSS_SELECTOR, "table.events tbody tr")) == len(long_line)
    # on a narrow screen too: words whole, and the page never scrolls sideways
    driver.execute_cdp_cmd(
        "Emulation.setDeviceMetricsOverride",
        {"width": 375, "height": 812, "deviceScaleFactor": 1, "mobile": True},
    )
    try:
        driver.get(f"{stack.base}/ui/conversations/c-long")
        assert driver.execute_script(_WORDS_BROKEN) == []
        sizes = driver.execute_script(
            "const d = document.documentElement; return [d.scrollWidth, d.clientWidth];"
        )
        assert sizes[0] <= sizes[1], sizes
        shot(driver, "narrow-timeline-long", tmp_path)
    finally:
        driver.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})
    assert console_errors(driver) == []


_READABLE = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2} [0-9]{2}:[0-9]{2} UTC · ")


def test_the_list_says_when_and_what_compaction_saved(
    stack: Stack, browser: Any, long_line: list[dict[str, Any]], tmp_path: Path
) -> None:
    with stack.http() as client:
        listed = {r["conversation_id"]: r for r in client.get("/v1/conversations").json()[
            "conversations"
        ]}  # fmt: skip
    made = [e for e in long_line if e["type"] == "compaction.completed"]
    row = listed["c-long"]
    assert row["compactions"] == len(made)
    assert row["tokens_saved"] == sum(
        e["compaction"]["tokens_before"] - e["compaction"]["tokens_after"] for e in made
    )
    driver = browser
    sign_in(driver, stack, KEY_A)
    shot(driver, "list-after", tmp_path)
    table = driver.find_element(By.CSS_SELECTOR, "table.conversations")
    heads = [th.text for th in table.find_elements(By.CSS_SELECTOR, "thead th")]
    for conversation_id, doc in listed.items():
        cells = table.find_element(By.LINK_TEXT, conversation_id).find_elements(
            By.XPATH, "ancestor::tr/*"
        )
        by_head = dict(zip(heads, (c.text for c in cells), strict=True))
        assert _READABLE.match(by_head["Last activity"]), by_head
        assert "T" not in by_head["Last activity"].split(" UTC")[0]  # no raw ISO time
        assert by_head["Compactions"] == f"{doc['compactions']:,}"
        saved = f"{doc['tokens_saved']:,}" if doc["compactions"] else "—"
        assert by_head["Tokens saved"] == saved, by_head
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


def test_live_events_follow_the_filter(stack: Stack, browser: Any) -> None:
    """Filtered to compactions, the page adds a compaction as it arrives and not the skip
    published before it (the stream is ordered: the skip reached the script first)."""
    driver = browser
    sign_in(driver, stack, KEY_A)
    submit(stack, conversation("c-live2", 1, revision=1))
    wait_for_type(stack, "c-live2", "compaction.skipped")
    driver.get(f"{stack.base}/ui/conversations/c-live2?show=compactions")
    assert driver.find_elements(By.CSS_SELECTOR, "table.events tbody tr.t-compaction-skipped") == []
    submit(stack, conversation("c-live2", 1, revision=2))
    wait_for_type(stack, "c-live2", "compaction.skipped", count=2)
    submit(stack, conversation("c-live2", 12, revision=40))
    wait_until(
        lambda: driver.find_elements(By.CSS_SELECTOR, "table.events tbody tr.fresh"),
        "the compaction on the page",
    )
    fresh = driver.find_elements(By.CSS_SELECTOR, "table.events tbody tr.fresh")
    assert [r.find_elements(By.TAG_NAME, "td")[1].text for r in fresh] == ["compaction.completed"]
    assert driver.find_element(By.ID, "live").text.startswith("1 new event since")
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
