"""Approvals bound to the screen (contract 6, "Bound approvals"), end to end in the web console: real runs
of ``tasks/bound-approval-demo.toml`` (the real SDK loop against the scripted model, a real Docker
sandbox with the demo app's ``/pay`` page in firefox-esr) and a real browser (Debian's chromium through
Playwright) answering the approval cards as a person does.

* **The button moves while the card is open** (``POST /api/pay/move`` in the guest when the card shows;
  the page moves the button 120 px down 300 ms later): the person approves once the live screen shows
  the moved button. The agent refuses the click (the screen changed where it lands): nothing is clicked,
  the record has ``decision: screen_changed`` (``by: agent``), and a second card asks again with the new
  screen (a screenshot other than the first card's, showing the moved button). Denied: the run ends
  ``failed``, the page logged no mouse press. Approved: the yes is bound to the new screen, the click
  runs and lands where the button was (the page logs one press beside the button), nothing is paid.
* **A clock redraws far from the button** (``/pay?clock=1``), nothing moves: the first card's yes goes
  through although the screen changed (elsewhere), the payment is recorded, no ``screen_changed``.

Every wait is on a condition (a page element, the live screen's pixels, an agent screenshot, the run's
end) with a deadline.
"""

from __future__ import annotations

import io
import json
import os
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from controller.run.record import read_entries
from controller.run.tasks import Task, load_task
from tests.conformance.harness import poll
from tests.console.test_e2e import (DEADLINE_MS, KeptOpen, console_run, docker_client, open_run, share_of, wait_card,
                                    wait_live_shows)
from tests.console.test_e2e import page  # noqa: F401 - fixture: a fresh chromium context, page errors fail
from wire.screen_match import changed_share

pytestmark = [pytest.mark.slow, pytest.mark.docker]

ROOT = Path(__file__).resolve().parents[2]
TASKS = ROOT / "tasks"
IMAGE_ENV = "DESKTOP_SANDBOX_IMAGE"
GUEST_PYTHON = "/opt/desktop-sandbox/bin/python"
CHROME_PX = 86
"""The browser's tab strip and navigation bar (images/pickup/app.py ``CHROME_PX``): screen y = page y + 86."""
GREEN = "#2f7d32"
"""The Pay button's colour (images/pickup/app.py ``PAY_STYLE``)."""
BUTTON_TOP = (572, 289, 136, 6)
"""x, y, w, h (screen px) of a strip along the top edge of the button at its place (the script's expectation)."""
MOVED_TOP = (572, 289 + 120, 136, 6)
"""The same strip once the button moved 120 px down (``PAY_MOVE_PX``)."""
CLOCK = (1062, 446 + CHROME_PX, 196, 36)
"""x, y, w, h (screen px) inside the clock of ``/pay?clock=1`` (``PAY_LAYOUT["clock"]``)."""
CLICK = (640, 314 - CHROME_PX)
"""Where the script clicks, in the page's viewport CSS px (the button's centre before the move); the page
logs it within a pixel (its viewport starts within a pixel of ``CHROME_PX``)."""


# -- the sandbox, the guest's page state --------------------------------------------------------------
@pytest.fixture
def sandboxes() -> Iterator[list[Any]]:
    """Started sandboxes (each closed at the end, even when the run closed it already)."""
    started: list[Any] = []
    yield started
    for sb in started:
        sb.close()


def start_sandbox(task: Task, started: list[Any]) -> Any:
    """A fresh Docker sandbox for ``task`` from ``$DESKTOP_SANDBOX_IMAGE`` (default ``desktop-sandbox:latest``),
    labelled as a test's; skips (``IMAGE``) without an engine or the image."""
    from controller.sandbox.docker import DockerOptions, DockerSandbox

    client = docker_client()
    image = os.environ.get(IMAGE_ENV, "desktop-sandbox:latest")
    sb = DockerSandbox.start(task.sandbox_spec(), DockerOptions(
        image=image, extra_labels={"desktop-sandbox.test": f"bound-{secrets.token_hex(4)}"}), client=client)
    started.append(sb)
    return sb


_PAGE_CALL = (
    "import json, sys, urllib.request as u\n"
    "opener = u.build_opener(u.ProxyHandler({}))\n"
    "method, path = sys.argv[1], sys.argv[2]\n"
    "request = u.Request('http://127.0.0.1:8080' + path, method=method, data=b'' if method == 'POST' else None)\n"
    "print(opener.open(request, timeout=10).read().decode())\n"
)


def page_call(sb: Any, method: str, path: str) -> dict[str, Any]:
    """``method path`` to the demo app from inside the guest (``docker exec`` in the desktop container,
    no proxy: the app is the guest's own 127.0.0.1:8080); its JSON answer."""
    result = sb.exec_in_guest([GUEST_PYTHON, "-c", _PAGE_CALL, method, path], timeout=30)
    assert result.exit_code == 0, result.stderr.decode()
    return json.loads(result.stdout.decode())


# -- pixels ---------------------------------------------------------------------------------------------
def differs(a: Image.Image, b: Image.Image, region: tuple[int, int, int, int], tolerance: int = 48) -> float:
    """Share (0-1) of the region's pixels that differ by more than ``tolerance`` in some channel."""
    x, y, w, h = region
    box = (x, y, x + w, y + h)
    return changed_share(a.convert("RGB").crop(box), b.convert("RGB").crop(box), tolerance)


def record_image(record_dir: Path, file: str) -> Image.Image:
    return Image.open(io.BytesIO((record_dir / file).read_bytes())).convert("RGB")


def card_file(card: Any) -> str:
    """The record's file name of the screenshot a card shows (its ``img`` is ``.../shots/<file>``)."""
    src = card.locator("img").get_attribute("src")
    assert src and "/shots/" in src, src
    return src.rsplit("/", 1)[1]


def wait_other_card(page: Any, run: Any, first_id: str) -> Any:
    """The one card shown once the card ``first_id`` is gone, its screenshot loaded; fails at once
    when the run ends first (nobody was asked again)."""
    from playwright.sync_api import expect

    card = page.locator(f".card:not([data-request-id='{first_id}'])")
    poll(lambda: card.count() > 0 or run.live.status is not None, timeout=DEADLINE_MS / 1000,
         what="a second card (or the run's end)")
    assert card.count() > 0, f"the run ended ({run.live.status}) without asking again on a new screen"
    expect(card).to_have_count(1)
    expect(page.locator(f".card[data-request-id='{first_id}']")).to_have_count(0)
    page.wait_for_function("(id) => { const i = document.querySelector(`.card:not([data-request-id='${id}']) img`);"
                           " return i !== null && i.complete && i.naturalWidth === 1280; }", arg=first_id)
    return card


def approvals_of(entries: list[Any]) -> list[tuple[str, str]]:
    return [(e.decision, e.by) for e in entries if e.type == "approval"]


def clock_task(tmp_path: Path) -> Task:
    """``tasks/bound-approval-demo.toml`` with the browser at ``/pay?clock=1`` (the same offline script)."""
    text = (TASKS / "bound-approval-demo.toml").read_text()
    changed = text.replace('"http://127.0.0.1:8080/pay"', '"http://127.0.0.1:8080/pay?clock=1"')
    assert changed != text
    script = TASKS / "bound-approval-demo.offline.jsonl"
    changed = changed.replace('script = "bound-approval-demo.offline.jsonl"', f"script = {json.dumps(str(script))}")
    path = tmp_path / "bound-approval-clock.toml"
    path.write_text(changed)
    return load_task(path)


# -- a. the button moves after the card appears -------------------------------------------------------
@pytest.mark.parametrize("second_answer", ["Deny", "Approve"])
def test_a_moved_button_voids_the_approval_and_a_second_card_asks_on_the_new_screen(
        tmp_path, page, sandboxes, second_answer):  # noqa: F811 - page: the fixture imported above
    from playwright.sync_api import expect

    task = load_task(TASKS / "bound-approval-demo.toml")
    sb = start_sandbox(task, sandboxes)
    runs = tmp_path / "runs"
    with console_run(task, KeptOpen(sb), runs) as run:
        open_run(page, run.server.url, run.run_id)
        first = wait_card(page)
        expect(first.locator(".checks .code")).to_have_text("sensitive_action")
        expect(first.locator(".actions li")).to_have_text(["click (640,314) left"])
        first_id = first.get_attribute("data-request-id")
        first_file = card_file(first)
        assert page_call(sb, "POST", "/api/pay/move") == {"moved": True}
        # as a person would: approve once the live screen shows the button at its new place
        wait_live_shows(page, MOVED_TOP, GREEN)
        first.get_by_role("button", name="Approve", exact=True).click()
        second = wait_other_card(page, run, first_id)
        expect(second.locator(".checks .code")).to_have_text("sensitive_action")
        second_file = card_file(second)
        second.get_by_role("button", name=second_answer, exact=True).click()
        expect(second).to_have_count(0)
        outcome = run.finish()
    state = page_call(sb, "GET", "/api/pay/clicks")

    entries = read_entries(outcome.record_dir)
    changed = [e for e in entries if e.type == "approval" and e.decision == "screen_changed"]
    assert len(changed) == 1, approvals_of(entries)
    assert (changed[0].what, changed[0].call_id, changed[0].codes) == ("safety_check", "call_0000", ["sensitive_action"]), changed[0]
    assert "regions matched" in changed[0].message, changed[0]
    # the cards: the first showed the model's screenshot (the button at its place), the second the new
    # screen (the button moved), which is the screen_changed line's screenshot
    assert second_file != first_file
    assert changed[0].screenshot == second_file
    shown_first, shown_second = record_image(outcome.record_dir, first_file), record_image(outcome.record_dir, second_file)
    assert share_of(shown_first, BUTTON_TOP, GREEN) >= 0.9 and share_of(shown_first, MOVED_TOP, GREEN) < 0.1
    assert share_of(shown_second, MOVED_TOP, GREEN) >= 0.9 and share_of(shown_second, BUTTON_TOP, GREEN) < 0.1
    assert state["payments"] == 0, state
    assert [c["passed"] for c in outcome.checks] == [False]
    assert outcome.status == "failed", outcome.reason
    if second_answer == "Deny":
        assert approvals_of(entries) == [("approved", "console"), ("screen_changed", "agent"), ("denied", "console")]
        assert state["clicks"] == [], state  # not one mouse press reached the page
        assert "denied" in outcome.reason, outcome.reason
    else:
        assert approvals_of(entries) == [("approved", "console"), ("screen_changed", "agent"), ("approved", "console")]
        # bound to the second screen, the click ran: it landed where the button was, beside it now
        (click,) = state["clicks"]
        assert not click["on_button"] and abs(click["x"] - CLICK[0]) <= 1 and abs(click["y"] - CLICK[1]) <= 1, state
        assert [e.action for e in entries if e.type == "action" and e.call_id == "call_0000"
                and e.error is None][:1] == ["click"]


# -- b. a clock far from the button, nothing moves ------------------------------------------------------
def test_b_a_clock_elsewhere_never_voids_the_approval(tmp_path, page, sandboxes):  # noqa: F811
    from playwright.sync_api import expect

    task = clock_task(tmp_path)
    sb = start_sandbox(task, sandboxes)
    runs = tmp_path / "runs"
    with console_run(task, KeptOpen(sb), runs) as run:
        open_run(page, run.server.url, run.run_id)
        card = wait_card(page)
        shown = record_image(runs / run.run_id, card_file(card))
        # approve once the screen has changed since the card's screenshot (the clock), and only there
        poll(lambda: differs(shown, Image.open(io.BytesIO(sb.agent.screenshot(format="png").data)), CLOCK) > 0,
             timeout=DEADLINE_MS / 1000, what="the clock to change since the card's screenshot")
        card.get_by_role("button", name="Approve", exact=True).click()
        expect(card).to_have_count(0)
        # the run ends without asking again (a second card would mean the yes was made void)
        poll(lambda: run.live.status is not None or page.locator(".card").count() > 0,
             timeout=DEADLINE_MS / 1000, what="the run to end (or a second card)")
        asked_again = page.locator(".card").count()
        assert asked_again == 0, "the approval was made void: a second card asks again"
        outcome = run.finish()
    state = page_call(sb, "GET", "/api/pay/clicks")

    entries = read_entries(outcome.record_dir)
    assert outcome.status == "passed", (outcome.reason, approvals_of(entries))
    assert approvals_of(entries) == [("approved", "console")]
    assert [c["passed"] for c in outcome.checks] == [True]
    assert state["payments"] == 1, state
    (click,) = state["clicks"]
    assert click["on_button"] and abs(click["x"] - CLICK[0]) <= 1 and abs(click["y"] - CLICK[1]) <= 1, state
    # the screen did change between the approval and the click: the model's next screenshot has another time
    asked = next(i for i, e in enumerate(entries) if e.type == "approval")
    after = next(e for e in entries[asked:] if e.type == "screenshot")
    assert differs(shown, record_image(outcome.record_dir, after.file), CLOCK) > 0
