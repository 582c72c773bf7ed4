"""A task with the browser tools end to end on a local desktop, offline: ``tasks/browser-pickup.toml`` on
Xvfb with the real agent, Debian's chromium as its channel app (DevTools pipe, as the launch broker
starts it), the pickup demo app, the scripted model's ``browser_*`` calls through the SDK's
``ResponsesToolRunner`` and ``BrowserToolset`` over :class:`controller.run.browser_driver.GuestBrowserDriver`.
The booking is verified from the app's database; every call is one ``browser_call`` line. The same task
runs in Docker in ``tests/docker/test_browser_pickup.py``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

import pytest

from controller.run.record import read_entries
from controller.run.runner import RunOptions, run_task
from controller.run.tasks import load_task
from tests.helpers import chromium_desktop, chromium_missing
from tests.loop.local_sandbox import LocalSandbox

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.slow, pytest.mark.skipif(chromium_missing() is not None, reason=str(chromium_missing()))]


@pytest.fixture
def desktop() -> Iterator[LocalSandbox]:
    """The local desktop with chromium as the agent's channel app and the pickup demo app
    (:func:`tests.helpers.chromium_desktop`)."""
    with chromium_desktop(pickup=True) as sandbox:
        yield sandbox


def _on(sb: LocalSandbox, script: Path | None = None):
    task = load_task(ROOT / "tasks" / "browser-pickup.toml")
    launch = [l.model_copy(update={"args": [a.replace(":8080/", f":{sb.pickup_port}/") for a in l.args]})
              for l in task.launch]
    return task.model_copy(update={"launch": launch})


def test_browser_pickup_passes_on_the_real_agent_with_browser_calls_only(desktop, tmp_path):
    outcome = run_task(_on(desktop), lambda task: desktop, RunOptions(runs_dir=tmp_path, live=False, terminal=False))
    entries = read_entries(outcome.record_dir)
    calls = [e for e in entries if e.type == "browser_call"]
    assert outcome.status == "passed", (outcome.reason, calls[-3:])
    assert [c.member for c in calls if c.member in ("type", "click")] == ["type", "type", "click", "type", "click"]
    assert all(c.ok for c in calls), [c for c in calls if not c.ok]
    assert calls[0].member == "read_page" and calls[0].result.kind == "read" and calls[0].result.elements
    typed = [c for c in calls if c.member == "type"]
    assert all(c.target and c.viewport for c in typed)  # the field's box, and where the viewport is
    assert not [e for e in entries if e.type in ("computer_call", "action")]
    text = json.dumps([e.as_json() for e in entries if e.type not in ("check", "run_finished")])
    assert "Ada Lovelace" not in text and "2 boxes of books" not in text  # typed text: its length only
    assert [c.arguments["text_length"] for c in typed] == [12, 10, 16]


def test_a_wrong_browser_script_fails_on_the_check(desktop, tmp_path):
    text = (ROOT / "tasks" / "browser-pickup.offline.jsonl").read_text()
    wrong = text.replace('"2030-05-17"', '"2030-05-18"')
    assert wrong != text
    script = tmp_path / "wrong.jsonl"
    script.write_text(wrong)
    outcome = run_task(_on(desktop), lambda task: desktop,
                       RunOptions(runs_dir=tmp_path, live=False, terminal=False, script=script))
    assert outcome.status == "failed", outcome.reason
    [check] = outcome.checks
    assert not check["passed"] and "2030-05-18" in json.dumps(check["observed"])


def test_a_denied_browser_click_ends_the_run_failed_before_the_next_turn(desktop, tmp_path):
    """``--confirm-actions click`` with nobody to ask: the Book click is denied, nothing is booked, and the
    run ends ``failed`` on that denial at once (the script's next turn, a 20 s ``wait_for``, never runs),
    as a denied computer action ends it."""
    outcome = run_task(_on(desktop), lambda task: desktop,
                       RunOptions(runs_dir=tmp_path, live=False, terminal=False, confirm_actions=["click"]))
    entries = read_entries(outcome.record_dir)
    calls = [e for e in entries if e.type == "browser_call"]
    assert outcome.status == "failed" and "browser click" in outcome.reason and "denied" in outcome.reason, outcome.reason
    assert "wait_for" not in [c.member for c in calls]
    assert [(a.decision, a.by) for a in entries if a.type == "approval"][:1] == [("denied", "no-approver")]
    [check] = outcome.checks
    assert not check["passed"]  # the radio button's click was the first one denied: nothing booked


def test_the_sdks_toolset_over_the_driver_on_the_real_agent(desktop):
    from openai.lib.browser import BrowserToolset, _state
    from openai.types.responses import ResponseFunctionToolCall

    from controller.run.browser_driver import GuestBrowserDriver, UrlRules
    from guest.cdp import wait_until

    task = _on(desktop)
    page = f"http://127.0.0.1:{desktop.pickup_port}/"
    desktop.agent.launch("chromium", [page])
    driver = GuestBrowserDriver(desktop.agent, rules=UrlRules.for_task(task, None, desktop.agent.base_url))
    assert wait_until(lambda: any(t["url"].startswith(page) for t in driver.state()["tabs"]), 20, 0.1), \
        "chromium did not show the page"
    toolset = BrowserToolset(driver, members=list(task.browser_members), confirm=driver.confirm,
                             url_policy=driver.url_policy)
    previous = None

    def call(member: str, n: int, **arguments):
        nonlocal previous
        out = toolset.execute(ResponseFunctionToolCall(type="function_call", call_id=f"call_{n}",
                                                       name=f"browser_{member}", arguments=json.dumps(arguments)))
        payload = json.loads(out["output"][0]["text"])
        previous = _state(payload["state"], previous)["observation"]  # each state continues the last
        return payload, out["output"][1:]

    payload, image = call("screenshot", 1, tab_id=None)
    assert payload["ok"] and image[0]["image_url"].startswith("data:image/png;base64,")
    assert driver.last.image.size[0] > 100 and driver.last.viewport["width"] > 100
    payload, _ = call("navigate", 2, tab_id=None, url=f"http://127.0.0.1:{desktop.agent_proc.port}/v1/display")
    assert payload["error"] == "Browser navigation was not approved."
    assert payload["state"]["observation"]["changes"][-1]["reason"] == "policy"
    payload, _ = call("click", 3, tab_id=None, target="never-issued")
    assert not payload["ok"] and payload["error"].startswith("stale_ref: ")
    payload, _ = call("read_page", 4, tab_id=None, filter="interactive")
    assert payload["ok"] and any(e["label"] == "Book" for e in payload["result"]["elements"])
