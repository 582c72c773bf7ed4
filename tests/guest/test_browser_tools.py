"""The browser tools endpoints (guest/browser_tools.py, ``GET /v1/browser/state``, ``POST
/v1/browser/call``) against Debian's real chromium, the site of tests/browser_site.py on loopback
and the installed openai SDK's own checks (``openai.lib.browser._state``, ``_read_result``,
``_arguments``). Chromium runs headless as ``nobody`` (its sandbox on) when the tests run as root, the
pipes made by :func:`guest.launch.spawn_with_pipes` as the broker makes them; the X input members run
against a headed chromium on a private Xvfb. One browser per module; every wait is for a condition."""

from __future__ import annotations

import base64
import contextlib
import io
import os
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Iterator
from urllib.parse import quote

import pytest
from fastapi.testclient import TestClient
from openai.lib import browser as sdk
from PIL import Image

from controller.chromium import profile_tree
from guest.app import AgentConfig, create_app
from guest.cdp import wait_until
from guest.launch import spawn_with_pipes
from tests import browser_site
from wire import browser_tools as W

CHROMIUM = "/usr/bin/chromium"
TOKEN = "browser-tools-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}

pytestmark = pytest.mark.skipif(not os.access(CHROMIUM, os.X_OK) or not shutil.which("setpriv"),
                                reason="needs Debian's chromium and setpriv")


@pytest.fixture(scope="module")
def site() -> Iterator[dict[str, str]]:
    base, other, stop = browser_site.serve()
    yield {"base": base, "other": other}
    stop()


def start_chromium(extra: list[str], env: dict[str, str], address: str = "about:blank") -> tuple[int, list[int], Path]:
    """Debian's chromium with a DevTools pipe, as ``nobody`` when root, started on ``address``; returns
    (pid, fds, its top dir)."""
    top = Path(tempfile.mkdtemp(prefix="ds-tools-"))
    prefix = profile_tree(top, "downloads")
    profile, downloads = top / "profile", top / "downloads"
    pid, fds = spawn_with_pipes([CHROMIUM, *extra, "--remote-debugging-pipe", f"--user-data-dir={profile}",
                                 "--no-first-run", "--password-store=basic", address],
                                {"HOME": str(profile), "PATH": "/usr/bin:/bin", "XDG_DOWNLOAD_DIR": str(downloads), **env},
                                prefix)
    return pid, fds, top


class Agent:
    """The agent app (in-process, over HTTP with Starlette's test client) holding one chromium."""

    def __init__(self, display: str, extra: list[str], env: dict[str, str], local: list[str]) -> None:
        self.display = display
        self.app = create_app(AgentConfig(display=display, token=TOKEN))
        self.http = TestClient(self.app)
        self.tools = self.app.state.browser_tools
        self.tools.load_timeout = 3.0
        self.rule(local)
        self.pid, fds, self.top = start_chromium(extra, env)
        self.app.state.browser.take_channel("chromium", self.pid, *fds)
        assert wait_until(lambda: self.try_state() and self.try_state()["tabs"], 20, 0.1), "chromium did not start"
        self.previous: Any = None

    def rule(self, local: list[str], **more: Any) -> None:
        """The URL rule (``PUT /v1/browser/rule``): ``local`` the guest-local origins chromium may load."""
        r = self.http.put("/v1/browser/rule", headers=AUTH, json={"local_origins": local, **more})
        assert r.status_code == 200, r.text

    def try_state(self) -> dict[str, Any] | None:
        r = self.http.get("/v1/browser/state", headers=AUTH)
        return r.json() if r.status_code == 200 else None

    def state(self) -> dict[str, Any]:
        r = self.http.get("/v1/browser/state", headers=AUTH)
        assert r.status_code == 200, r.text
        body = r.json()
        sdk._state(body)  # the SDK accepts it as it is
        return body

    def raw(self, member: str, **arguments: Any) -> Any:
        return self.http.post("/v1/browser/call", headers=AUTH, json={"member": member, "arguments": arguments})

    def call(self, member: str, **arguments: Any) -> dict[str, Any]:
        """One call, checked as the SDK checks it: its arguments by ``_arguments`` (nullable fields
        filled in), its result by ``_action_result``, the state around it by ``_state``."""
        fields = sdk._MEMBERS[member][1]
        full = {name: arguments.get(name) for name in fields}
        sdk._arguments(member, __import__("json").dumps(full))
        before = sdk._state(self.state())
        r = self.raw(member, **full)
        assert r.status_code == 200, r.text
        body = r.json()
        assert set(body) == {"result", "target", "viewport"}
        body["result"] = sdk._action_result(member, body["result"], None)
        sdk._state(self.state(), before.get("observation"))
        return body

    def refused(self, member: str, **arguments: Any) -> tuple[int, str, str]:
        r = self.raw(member, **arguments)
        error = r.json()["error"]
        return r.status_code, error["code"], error["message"]

    def page(self, expression: str, tab: str | None = None) -> Any:
        """``expression``'s value in the page's own world of the active tab (the test looking in)."""
        tools = self.tools
        ch = tools._channel()
        target = tools._tab(ch, tab)
        answer = ch.pipe.call("Runtime.evaluate", {"expression": expression, "returnByValue": True},
                              session_id=tools._session(ch, target), timeout=5)
        return answer.get("result", {}).get("value")

    def wait_page(self, expression: str, timeout: float = 10) -> Any:
        value = wait_until(lambda: self.page(expression), timeout, 0.05)
        assert value, f"the page never answered {expression!r} truthily"
        return value

    def goto(self, url: str) -> dict[str, Any]:
        assert self.call("navigate", url=url)["result"] is None
        return self.call("read_page", filter="all")["result"]

    def close(self) -> None:
        self.http.close()
        self.app.state.browser.close()
        try:
            os.waitpid(self.pid, 0)
        except ChildProcessError:
            pass
        shutil.rmtree(self.top, ignore_errors=True)


@pytest.fixture(scope="module")
def agent(site: dict[str, str]) -> Iterator[Agent]:
    a = Agent(":0", ["--headless=new", "--window-size=1000,700"], {}, [site["base"], site["other"]])
    yield a
    a.close()


def by_label(report: dict[str, Any], label: str) -> dict[str, Any]:
    found = [e for e in report["elements"] if e["label"] == label]
    assert len(found) == 1, (label, [e["label"] for e in report["elements"]])
    return found[0]


# -- the SDK's vocabulary -----------------------------------------------------------------------------
def test_the_members_and_fields_are_the_sdks() -> None:
    assert set(W.GUEST_MEMBERS) <= set(sdk.BROWSER_MEMBERS)
    assert set(sdk.BROWSER_MEMBERS) - set(W.GUEST_MEMBERS) == {
        "list_tabs", "read_page_scoped", "read_diagnostics", "run_script", "upload_file", "download_file"}
    for member in W.GUEST_MEMBERS:
        assert set(W.ARGUMENT_MODELS[member].model_fields) == set(sdk._MEMBERS[member][1]), member
    assert set(W.Omission.__args__) == set(sdk._READ_OMISSIONS)
    assert set(W.ReadRole.__args__) == set(sdk._ReadRole.__args__)


@pytest.mark.parametrize("member,arguments", [
    ("click_at", {"x": 1, "y": 2, "button": "left", "click_count": 4, "keys": []}),
    ("click_at", {"x": 1, "y": 2, "button": "left", "click_count": 1, "keys": ["Shift", "Shift"]}),
    ("click_at", {"x": 1.0, "y": 2, "button": "left", "click_count": 1, "keys": []}),
    ("drag_path", {"path": [{"x": 1, "y": 1}], "keys": []}),
    ("hold_keys", {"keys": ["a"], "duration_ms": 3001}),
    ("hold_keys", {"keys": ["x" * 65], "duration_ms": 1}),
    ("zoom", {"region": [10, 0, 10, 5]}),
    ("wait_for", {"text": "  ", "timeout_ms": 5}),
    ("wait_for", {"text": "a", "timeout_ms": 30001}),
    ("set_checked", {"target": "d1e1", "checked": 1}),
    ("scroll", {"direction": "down", "amount": -1}),
])
def test_what_the_sdk_refuses_is_refused_here(member: str, arguments: dict[str, Any]) -> None:
    full = {name: arguments.get(name) for name in sdk._MEMBERS[member][1]}
    with pytest.raises(sdk.BrowserError):
        sdk._arguments(member, __import__("json").dumps(full))
    assert W.call_problem({"member": member, "arguments": full}) is not None


def test_bad_calls_are_structured_400s(agent: Agent) -> None:
    r = agent.http.post("/v1/browser/call", json={"member": "click", "arguments": {"target": "x"}})
    assert r.status_code == 401
    for body in ({"member": "run_script", "arguments": {}}, {"member": "click", "arguments": {"target": "x", "extra": 1}},
                 {"member": "click", "arguments": {"target": 5}}, [], {"member": "type", "arguments": {"text": "x" * 20_001}}):
        r = agent.http.post("/v1/browser/call", headers=AUTH, json=body)
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_request", (body, r.text)
    r = agent.http.post("/v1/browser/call", headers=AUTH, json={"member": "type", "arguments": {"text": "secret-text", "target": 3}})
    assert "secret-text" not in r.text
    assert agent.refused("key", keys=["NoSuchKey"])[:2] == (400, "invalid_request")


# -- reading -----------------------------------------------------------------------------------------
def test_read_page_reports_the_form_as_the_sdk_reads_it(agent: Agent, site: dict[str, str]) -> None:
    report = agent.goto(site["base"] + "/form")
    assert report["version"] == 1 and "Feature form" in report["text"]
    roles = {e["label"]: e["role"] for e in report["elements"]}
    assert roles["Full name"] == "textbox" and roles["Send form"] == "button" and roles["Other page"] == "button"
    assert roles["Colour"] == "combobox" and roles["Extras"] == "listbox" and roles["I agree"] == "checkbox"
    assert roles["Small"] == "radio" and roles["Volume"] == "slider" and roles["Editor"] == "textbox"
    assert by_label(report, "Full name")["value"] == "Ada"
    assert by_label(report, "Colour")["value"] == "g"
    assert by_label(report, "Colour")["options"] == [{"label": "Red", "value": "r"}, {"label": "Green", "value": "g"},
                                                     {"label": "Blue", "value": "b"}]
    assert [o.get("selected") for o in by_label(report, "Extras")["options"]] == [False, True, False]
    assert by_label(report, "Large")["checked"] is True and by_label(report, "I agree")["checked"] is False
    assert "value" not in by_label(report, "Password") and "value" not in by_label(report, "Card number")
    assert "private" in report["omitted"] and "unsupported_control" in report["omitted"]
    assert "frame_limit" in report["omitted"]  # the frame of the other origin
    labels = [e["label"] for e in report["elements"]]
    assert "Ghost button" not in labels and "hidden-value" not in str(report)
    assert "Shadow button" in labels and "Shadow field" in labels and "Frame button" in labels
    assert "Inside the frame" in report["text"]
    interactive = agent.call("read_page", filter="interactive")["result"]
    assert interactive["text"] == "" and [e["ref"] for e in interactive["elements"]] == [e["ref"] for e in report["elements"]]


def test_refs_live_in_the_agents_world_only(agent: Agent, site: dict[str, str]) -> None:
    report = agent.goto(site["base"] + "/private")
    assert "value" not in report["elements"][0] and report["omitted"] == ["private"]
    assert agent.page("window.__dsTools") == "page"  # the page's own global, untouched
    ref = report["elements"][0]["ref"]
    assert ref not in agent.page("document.documentElement.outerHTML")
    assert agent.call("click", target=ref)["target"] is not None  # the page's global did not shadow the world's


def test_find_and_get_page_text(agent: Agent, site: dict[str, str]) -> None:
    agent.goto(site["base"] + "/form")
    found = agent.call("find", query="  send   FORM ")["result"]
    assert [e["label"] for e in found["elements"]] == ["Send form"]
    assert agent.call("find", query="inside the")["result"]["text"] == "Inside the frame"
    text = agent.call("get_page_text")["result"]
    assert text["elements"] == [] and "Feature form" in text["text"]


# -- acting ------------------------------------------------------------------------------------------
def test_click_type_select_check_act_on_the_page_with_trusted_input(agent: Agent, site: dict[str, str]) -> None:
    report = agent.goto(site["base"] + "/form")
    ref = lambda label: by_label(report, label)["ref"]  # noqa: E731
    body = agent.call("type", text="Grace Hopper", target=ref("Full name"))
    box = body["target"]
    assert box["width"] > 0 and agent.page("document.getElementById('name').value") == "Grace Hopper"
    agent.call("type", text="é日\n", target=ref("Notes"))
    assert agent.page("document.getElementById('notes').value") == "é日\n"
    agent.call("select_option", target=ref("Colour"), values=["Blue"])
    agent.call("select_option", target=ref("Extras"), values=["x", "Extra Z"])
    agent.call("set_checked", target=ref("I agree"), checked=True)
    agent.call("set_checked", target=ref("I agree"), checked=True)  # already: nothing clicked
    agent.call("set_checked", target=ref("Small"), checked=True)
    agent.call("click", target=ref("Send form"))
    agent.call("click", target=ref("Shadow button"))
    agent.call("click", target=ref("Frame button"))
    agent.wait_page("window.events.includes('frame clicked')")
    assert agent.page("window.events") == ["colour b", "extras x,z", "agree click trusted true", "agree true", "size s",
                                           "submitted Grace Hopper", "shadow clicked", "frame clicked"]
    assert agent.refused("set_checked", target=ref("Small"), checked=False)[1] == "not_actionable"
    assert agent.refused("select_option", target=ref("Colour"), values=["r", "g"])[1] == "not_actionable"
    assert agent.refused("select_option", target=ref("Colour"), values=["purple"])[1] == "not_actionable"
    assert agent.refused("type", text="x", target=ref("Send form"))[1] == "not_actionable"
    assert agent.refused("click", target=ref("Disabled button"))[:2] == (422, "not_actionable")
    assert agent.refused("click", target=ref("Under"))[2] == "another element covers the element's centre"
    agent.call("click", target=ref("Editor"))
    agent.call("key", keys=["Control", "a"])
    agent.call("type", text="typed at the focus")
    assert agent.page("document.getElementById('editor').textContent") == "typed at the focus"
    agent.call("type", text="", target=ref("E-mail"))
    agent.call("key", keys=["Shift", "b"])
    agent.call("key", keys=["Enter"])
    assert agent.page("document.getElementById('mail').value") == "B"
    agent.wait_page("window.events.includes('submitted Grace Hopper') && window.events.includes('keydown Enter')")


def test_refs_go_stale_with_their_document(agent: Agent, site: dict[str, str]) -> None:
    report = agent.goto(site["base"] + "/form")
    ref = by_label(report, "Send form")["ref"]
    assert agent.refused("click", target="d999e1") == (422, "stale_ref", "unknown ref; use a ref from the latest read_page or find")
    assert agent.refused("click", target="made-up")[1] == "stale_ref"
    agent.page("document.getElementById('f').remove()")
    assert agent.refused("click", target=ref)[1] == "stale_ref"
    report = agent.goto(site["base"] + "/form")
    ref = by_label(report, "Send form")["ref"]
    agent.call("navigate", url=site["base"] + "/form")  # a reload: a new document
    assert agent.refused("click", target=ref)[1] == "stale_ref"


def test_scroll_scroll_to_and_hover(agent: Agent, site: dict[str, str]) -> None:
    agent.goto(site["base"] + "/scroll")
    agent.call("scroll", direction="down", amount=700)
    agent.wait_page("scrollY >= 700")
    agent.call("scroll", direction="right", amount=300)
    agent.wait_page("scrollX >= 300")
    report = agent.goto(site["base"] + "/scroll")
    bottom = by_label(report, "Bottom button")
    agent.page("scrollTo(0, 0)")
    body = agent.call("scroll_to", target=bottom["ref"])
    assert agent.page("scrollY") > 4000 and 0 <= body["target"]["y"] < 700
    agent.page("scrollTo(0, 0)")
    agent.call("hover", target=bottom["ref"])
    agent.wait_page("window.events.includes('hovered')")


def test_wait_for(agent: Agent, site: dict[str, str]) -> None:
    agent.goto(site["base"] + "/later")
    agent.call("wait_for", text="Ready now", timeout_ms=5000)
    t0 = time.monotonic()
    assert agent.refused("wait_for", text="never there", timeout_ms=300)[:2] == (422, "wait_timeout")
    assert time.monotonic() - t0 < 3


def test_screenshot_and_zoom_are_images_of_the_viewport(agent: Agent, site: dict[str, str]) -> None:
    agent.goto(site["base"] + "/form")
    shot = agent.call("screenshot")["result"]
    assert shot["type"] == "input_image" and shot["image_url"].startswith("data:image/png;base64,")
    width, height = agent.page("[innerWidth, innerHeight]")
    assert Image.open(io.BytesIO(base64.b64decode(shot["image_url"].split(",", 1)[1]))).size == (width, height)
    body = agent.call("zoom", region=[0, 0, 320, 200])
    image = Image.open(io.BytesIO(base64.b64decode(body["result"]["image_url"].split(",", 1)[1])))
    assert image.size == (1280, 800) and body["target"] == {"x": 0, "y": 0, "width": 320, "height": 200}
    assert agent.refused("zoom", region=[5000, 0, 5001, 1])[1] == "not_actionable"
    agent.goto(site["base"] + "/bands")  # blue above y = 1000 of the document, red below
    agent.page("scrollTo(0, 1000)")
    agent.wait_page("scrollY === 1000")
    zoomed = agent.call("zoom", region=[0, 0, 40, 40])["result"]
    image = Image.open(io.BytesIO(base64.b64decode(zoomed["image_url"].split(",", 1)[1]))).convert("RGB")
    assert image.getpixel((image.width // 2, image.height // 2)) == (255, 0, 0)  # the viewport's, not the document's top


# -- tabs, navigation, dialogs, downloads ---------------------------------------------------------------
def changes_since(agent: Agent, sequence: int) -> list[dict[str, Any]]:
    return [c for c in agent.state()["observation"]["changes"] if c["sequence"] > sequence]


def test_tabs(agent: Agent, site: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    agent.goto(site["base"] + "/form")
    start = agent.state()
    first = next(t["id"] for t in start["tabs"] if t["active"])
    mark = start["observation"]["sequence"]
    agent.call("new_tab", url=site["base"] + "/other")
    state = agent.state()
    new = next(t for t in state["tabs"] if t["active"])
    assert new["id"] != first and new["title"] == "Other" and new["url"] == site["base"] + "/other"
    assert [c["type"] for c in changes_since(agent, mark)][:2] == ["tab_opened", "tab_switched"]
    assert "The other page" in agent.call("get_page_text")["result"]["text"]
    assert "Feature form" in agent.call("get_page_text", tab_id=first)["result"]["text"]
    agent.call("switch_tab", tab_id=first)
    assert next(t["id"] for t in agent.state()["tabs"] if t["active"]) == first
    agent.call("close_tab", tab_id=new["id"])
    assert new["id"] not in [t["id"] for t in agent.state()["tabs"]]
    assert agent.refused("switch_tab", tab_id=new["id"])[:2] == (422, "unknown_tab")
    assert agent.refused("read_page", tab_id="tab-999", filter="all")[1] == "unknown_tab"
    # a link with target=_blank and window.open open tabs the agent sees, in front
    report = agent.call("read_page", filter="interactive")["result"]
    mark = agent.state()["observation"]["sequence"]
    agent.call("click", target=by_label(report, "Open blank")["ref"])
    assert wait_until(lambda: any(t["title"] == "Popup" and t["active"] for t in agent.state()["tabs"]), 10, 0.05)
    assert "tab_opened" in [c["type"] for c in changes_since(agent, mark)]
    popup = next(t["id"] for t in agent.state()["tabs"] if t["active"])
    agent.call("switch_tab", tab_id=first)
    agent.call("click", target=by_label(report, "Open window")["ref"])
    assert wait_until(lambda: len(agent.state()["tabs"]) == 3, 10, 0.05)
    for tab in agent.state()["tabs"]:
        if tab["id"] != first:
            agent.call("close_tab", tab_id=tab["id"])
    assert [t["id"] for t in agent.state()["tabs"]] == [first] and popup != first
    assert agent.refused("close_tab", tab_id=first)[1] == "not_actionable"
    monkeypatch.setattr(W, "MAX_TABS", 2)
    agent.call("new_tab")
    assert agent.refused("new_tab", url=None)[:2] == (422, "too_many_tabs")
    agent.call("close_tab", tab_id=next(t["id"] for t in agent.state()["tabs"] if t["active"]))


@pytest.mark.parametrize("url", ["file:///etc/passwd", "chrome://settings", "about:config", "javascript:alert(1)",
                                 "data:text/html,hi", "view-source:http://127.0.0.1/", "http://", "ftp://x.test/"])
def test_unsupported_urls_are_refused_and_observed(agent: Agent, url: str) -> None:
    mark = agent.state()["observation"]["sequence"]
    status, code, _ = agent.refused("navigate", url=url)
    assert (status, code) == (422, "unsupported_url")
    assert agent.refused("new_tab", url=url)[1] == "unsupported_url"
    refused = changes_since(agent, mark)
    assert [c["type"] for c in refused] == ["navigation_refused"] * 2
    assert refused[0]["reason"] == "unsupported" and refused[0]["tab_id"] and refused[1]["tab_id"] is None


def test_dialogs_are_dismissed_and_a_dialog_loop_is_bounded(agent: Agent, site: dict[str, str]) -> None:
    mark = agent.state()["observation"]["sequence"]
    agent.raw("navigate", url=site["base"] + "/alerts")  # its load may never complete: the page loops
    assert wait_until(lambda: agent.state()["observation"]["dropped_changes"] > 0, 20, 0.05)
    state = agent.state()
    observation = state["observation"]
    assert len(observation["changes"]) == W.MAX_CHANGES
    kinds = {c["kind"] for c in observation["changes"] if c["type"] == "dialog_dismissed"}
    assert kinds == {"alert", "confirm", "prompt"} and observation["sequence"] > mark
    # the agent still answers and can leave the page
    assert agent.call("navigate", url=site["other"] + "/other")["result"] is None
    assert "The other page" in agent.call("get_page_text")["result"]["text"]
    agent.goto(site["base"] + "/unload")
    agent.page("document.body.click()")  # a page may ask beforeunload only after a user gesture
    assert agent.call("navigate", url=site["base"] + "/other")["result"] is None
    assert wait_until(lambda: next(t for t in agent.state()["tabs"] if t["active"])["title"] == "Other", 10, 0.05)


def test_downloads_are_blocked_and_observed(agent: Agent, site: dict[str, str]) -> None:
    report = agent.goto(site["base"] + "/form")
    mark = agent.state()["observation"]["sequence"]
    agent.call("click", target=by_label(report, "Get file")["ref"])
    assert wait_until(lambda: any(c["type"] == "download" for c in changes_since(agent, mark)), 10, 0.05)
    download = next(c for c in changes_since(agent, mark) if c["type"] == "download")
    assert download["status"] == "blocked"
    assert not any(agent.top.rglob("f.bin"))


# -- hostile pages -------------------------------------------------------------------------------------
def test_a_page_that_never_stops_loading_returns_at_the_deadline(agent: Agent, site: dict[str, str]) -> None:
    t0 = time.monotonic()
    assert agent.call("navigate", url=site["base"] + "/slow")["result"] is None
    assert agent.tools.load_timeout <= time.monotonic() - t0 < agent.tools.load_timeout + 3
    assert "Still loading page" in agent.call("get_page_text")["result"]["text"]


def test_a_slow_server_does_not_stretch_navigates_deadline(agent: Agent, site: dict[str, str]) -> None:
    """Headers 2 s late, then a body that never ends: the navigation's wait and the load's are one
    deadline (``load_timeout``), so the driver's client deadline still holds."""
    t0 = time.monotonic()
    assert agent.call("navigate", url=site["base"] + "/late")["result"] is None
    assert time.monotonic() - t0 < agent.tools.load_timeout + 1.5
    assert "Late page" in agent.call("get_page_text")["result"]["text"]


@pytest.mark.parametrize("keys", [["Control", "t"], ["Control", "w"], ["Control", "n"], ["Control", "Shift", "n"],
                                  ["Control", "h"], ["Control", "u"], ["Control", "l"], ["Control", "Tab"],
                                  ["Alt", "Home"], ["Alt", "ArrowLeft"], ["Meta", "a"], ["F6"], ["F12"], ["ctrl", "J"],
                                  ["Shift", "Escape"]])
def test_key_never_reaches_the_browsers_own_shortcuts(agent: Agent, site: dict[str, str], keys: list[str]) -> None:
    """Key events sent over DevTools reach chromium's own shortcuts too (a new window, chrome:// pages,
    view-source, the home page, quitting with the last tab): those chords are refused, nothing changes."""
    agent.goto(site["base"] + "/form")
    before = [(t["id"], t["url"]) for t in agent.state()["tabs"]]
    status, code, message = agent.refused("key", keys=keys)
    assert (status, code) == (422, "not_actionable") and "browser" in message, message
    assert [(t["id"], t["url"]) for t in agent.state()["tabs"]] == before
    assert "Feature form" in agent.call("get_page_text")["result"]["text"]


def test_reads_never_return_what_a_password_or_code_field_holds(agent: Agent, site: dict[str, str]) -> None:
    """The fields the sign-in scanner takes for a password or a one-time code (by name, autocomplete hint
    or label, not only ``type=password``) are the ones whose values a read omits (one rule)."""
    report = agent.goto(site["base"] + "/secrets")
    for label in ("Passphrase", "Current", "New password", "Passcode", "Sign-in code", "Verification"):
        assert "value" not in by_label(report, label), label
    assert by_label(report, "Nickname")["value"] == "shown-value"
    assert "private" in report["omitted"]
    found = agent.call("find", query="pass")["result"]
    text = str(report) + str(found) + agent.call("get_page_text")["result"]["text"]
    assert not [v for v in ("pw-by-", "pc-by-", "otp-by-", "code-in-") if v in text]


def test_type_says_when_the_element_did_not_take_the_text(agent: Agent, site: dict[str, str]) -> None:
    report = agent.goto(site["base"] + "/fields")
    for label in ("Fixed", "Fake"):  # read-only, and a role=textbox that is not editable
        status, code, message = agent.refused("type", target=by_label(report, label)["ref"], text="new")
        assert (status, code) == (422, "not_actionable") and "takes no typed text" in message, (label, message)
    status, code, message = agent.refused("type", target=by_label(report, "Amount")["ref"], text="NEWTEXT")
    assert (status, code) == (422, "not_actionable") and "did not take the text" in message
    assert agent.page("document.getElementById('fixed').value") == "keep"
    agent.call("type", target=by_label(report, "Amount")["ref"], text="42")
    agent.call("type", target=by_label(report, "Plain")["ref"], text="same")  # its value already: no refusal
    assert agent.page("[amount.value, plain.value]") == ["42", "same"]


def test_mouse_members_refuse_a_tab_behind_at_once(agent: Agent, site: dict[str, str]) -> None:
    """Chromium delivers no mouse input to a hidden tab: click, hover and scroll there are refused at
    once with what to do, not left to time out."""
    report = agent.goto(site["base"] + "/form")
    behind = next(t["id"] for t in agent.state()["tabs"] if t["active"])
    agent.call("new_tab", url=site["base"] + "/other")
    try:
        t0 = time.monotonic()
        for member, arguments in (("click", {"target": by_label(report, "Send form")["ref"]}),
                                  ("hover", {"target": by_label(report, "Send form")["ref"]}),
                                  ("scroll", {"direction": "down", "amount": 100})):
            status, code, message = agent.refused(member, tab_id=behind, **arguments)
            assert (status, code) == (422, "not_actionable") and "switch_tab" in message, (member, message)
        assert time.monotonic() - t0 < 5  # each well inside the 5 s a mouse command would wait
        agent.call("type", tab_id=behind, target=by_label(report, "Full name")["ref"], text="Bea")  # keys do go there
    finally:
        agent.call("close_tab", tab_id=next(t["id"] for t in agent.state()["tabs"] if t["active"]))


def test_big_pages_are_bounded(agent: Agent, site: dict[str, str]) -> None:
    report = agent.goto(site["base"] + "/many")
    assert len(report["elements"]) == W.MAX_READ_ELEMENTS and "target_limit" in report["omitted"]
    t0 = time.monotonic()
    found = agent.call("find", query="Button 9999")["result"]
    assert "work_limit" in found["omitted"] or [e["label"] for e in found["elements"]] == ["Button 9999"]
    assert time.monotonic() - t0 < 5
    agent.call("navigate", url=site["base"] + "/huge")  # 50 MB: read while (or after) it loads
    agent.wait_page("document.body && document.body.childElementCount > 10")
    t0 = time.monotonic()
    report = agent.call("read_page", filter="all")["result"]
    assert time.monotonic() - t0 < 5
    assert len(report["text"]) <= W.MAX_READ_TEXT and "text_limit" in report["omitted"]
    shot = agent.call("screenshot")["result"]
    assert len(shot["image_url"]) < 2 * W.MAX_IMAGE_BYTES


def test_a_page_that_rewrites_itself_while_read(agent: Agent, site: dict[str, str]) -> None:
    agent.call("navigate", url=site["base"] + "/rewrite")
    for _ in range(5):
        report = agent.call("read_page", filter="all")["result"]
        assert len(report["elements"]) == 50
        r = agent.raw("click", target=report["elements"][0]["ref"])  # replaced since the read, or not yet
        assert r.status_code == 200 or r.json()["error"]["code"] == "stale_ref", r.text
    assert agent.state()["tabs"]


def test_titles_keep_control_characters_and_are_cut_to_the_sdk_limit(agent: Agent, site: dict[str, str]) -> None:
    agent.goto(site["base"] + "/title")
    # chromium shows C0 controls of a title as spaces; the rest (an RTL override) reaches the state as is
    assert wait_until(lambda: "\u202e" in next(t for t in agent.state()["tabs"] if t["active"])["title"], 5, 0.05)
    title = next(t for t in agent.state()["tabs"] if t["active"])["title"]
    assert title == agent.page("document.title") and "rtl\u202e end" in title
    agent.goto(site["base"] + "/longtitle")
    assert wait_until(lambda: agent.state()["observation"]["title_truncated"], 5, 0.05)
    title = next(t for t in agent.state()["tabs"] if t["active"])["title"]
    assert title == "\u00e9" * 512 and sdk._state(agent.state())["observation"]["title_truncated"] is True


# -- the URL rule: every request chromium makes ---------------------------------------------------------
@pytest.fixture(scope="module")
def secret() -> Iterator[tuple[str, list[str]]]:
    """A guest-local service the rule does not name: ``(origin, hits)``."""
    port, hits, stop = browser_site.serve_secret()
    yield f"http://127.0.0.1:{port}", hits
    stop()


@pytest.fixture
def one_tab(agent: Agent, site: dict[str, str]) -> Iterator[Agent]:
    """The agent, left with one tab afterwards (a test may open more)."""
    yield agent
    agent.rule([site["base"], site["other"]])
    tabs = agent.state()["tabs"]
    for tab in tabs[1:]:
        agent.call("close_tab", tab_id=tab["id"])
    agent.call("switch_tab", tab_id=tabs[0]["id"])


def go(site: dict[str, str], kind: str, to: str) -> str:
    return f"{site['base']}/go/{kind}?to={quote(to, safe='')}"


def refused_text(agent: Agent, tab: str | None = None, saying: str = "The sandbox did not load this address") -> str:
    """The text of the tab once it shows the refusal page (waited for), ``saying`` a given text when the
    tab may still show an earlier refusal (a test's second navigation)."""
    agent.call("wait_for", tab_id=tab, text=saying, timeout_ms=10_000)
    return agent.call("get_page_text", tab_id=tab)["result"]["text"]


@pytest.mark.parametrize("kind", browser_site.GO_KINDS)
def test_every_way_to_a_refused_origin_ends_on_the_refusal_page(one_tab: Agent, site: dict[str, str],
                                                                 secret: tuple[str, list[str]], kind: str) -> None:
    """A redirect (301, 302, a POST's 307), a meta refresh, a link, ``location =``, a form (GET, POST), a
    new tab (target=_blank, window.open), a frame and subresources: none reaches the guest-local service
    the rule does not name; a tab or frame shows the refusal page instead, and a tab's refusal is observed."""
    agent, (origin, hits) = one_tab, secret
    before = len(hits)
    mark = agent.state()["observation"]["sequence"]
    report = agent.goto(go(site, kind, origin + "/private?x=1"))
    first = next(t["id"] for t in agent.state()["tabs"] if t["active"])
    if kind in ("redirect307", "link", "form-get", "form-post", "blank", "open"):
        agent.call("click", target=by_label(report, "Go")["ref"])
    if kind in ("blank", "open"):
        assert wait_until(lambda: len(agent.state()["tabs"]) == 2, 10, 0.05)
        tab = next(t["id"] for t in agent.state()["tabs"] if t["id"] != first)
    else:
        tab = first
    if kind == "subresources":
        agent.call("wait_for", text="subresources done", timeout_ms=10_000)
    elif kind == "frame":
        framed = wait_until(lambda: agent.page("document.getElementById('framed').contentDocument === null"), 10, 0.05)
        assert framed  # a sandboxed document of its own: an opaque origin
    else:
        text = refused_text(agent, tab)
        assert W.REFUSED_LOCAL in text and "/private?" in text and "secret" not in text.lower()
        refusals = [c for c in changes_since(agent, mark) if c["type"] == "navigation_refused"]
        assert refusals and refusals[-1] == {**refusals[-1], "reason": "policy", "tab_id": tab}
    assert hits[before:] == []


@pytest.mark.parametrize("host", ["0x7f.1", "2130706433", "127.1", "0177.0.0.1", "[::1]", "[::ffff:127.0.0.1]",
                                  "[::]", "0.0.0.0", "localhost", "localhost.", "api.localhost", "[fe80::1]",
                                  "169.254.169.254"])
def test_a_redirect_to_any_form_of_a_guest_local_address_is_refused(one_tab: Agent, site: dict[str, str],
                                                                    secret: tuple[str, list[str]], host: str) -> None:
    origin, hits = secret
    before = len(hits)
    target = f"http://{host}:{origin.rsplit(':', 1)[1]}/private"
    one_tab.call("navigate", url=go(site, "redirect302", target))
    assert W.REFUSED_LOCAL in refused_text(one_tab)
    assert hits[before:] == []


def test_the_agents_port_and_the_gateway_are_never_loaded(one_tab: Agent, site: dict[str, str],
                                                          secret: tuple[str, list[str]]) -> None:
    """Even where the rule names the origin: the agent's own port and the gateway's hosts are refused."""
    origin, hits = secret
    before = len(hits)
    one_tab.rule([site["base"], origin], agent_port=int(origin.rsplit(":", 1)[1]), gateway_hosts=["127.0.0.2"])
    one_tab.call("navigate", url=go(site, "redirect302", "http://[::ffff:7f00:1]:" + origin.rsplit(":", 1)[1] + "/"))
    assert W.REFUSED_AGENT in refused_text(one_tab, saying=W.REFUSED_AGENT)
    one_tab.call("navigate", url=site["other"] + "/other")
    assert W.REFUSED_GATEWAY in refused_text(one_tab, saying=W.REFUSED_GATEWAY)
    assert hits[before:] == []


def test_the_refusal_page_shows_the_url_escaped_and_runs_nothing(one_tab: Agent, site: dict[str, str],
                                                                 secret: tuple[str, list[str]]) -> None:
    origin, _ = secret
    one_tab.call("navigate", url=go(site, "script", origin + "/<script>alert(1)</script>\u202e" + "y" * 400))
    text = refused_text(one_tab)
    assert "/%3Cscript%3Ealert(1)%3C/script%3E%E2%80%AEyyy" in text and "\u202e" not in text
    assert text.rstrip().endswith("...") and len(text) < 600
    assert one_tab.page("document.scripts.length") == 0 and one_tab.page("origin") == "null"


def test_a_narrower_rule_takes_tabs_off_the_pages_it_refuses(one_tab: Agent, site: dict[str, str],
                                                             secret: tuple[str, list[str]]) -> None:
    origin, hits = secret
    one_tab.rule([site["base"], origin])
    assert "secret loopback page" in one_tab.goto(origin + "/allowed")["text"]
    one_tab.rule([site["base"]])
    assert W.REFUSED_LOCAL in refused_text(one_tab)


def test_a_bad_rule_is_a_structured_400(agent: Agent) -> None:
    for body in ({"local_origins": ["http://example.test"]}, {"local_origins": ["http://127.0.0.1/path"]},
                 {"local_origins": "http://127.0.0.1"}, {"agent_port": "8000"}, {"agent_port": 0},
                 {"gateway_hosts": ["a b"]}, {"extra": 1}, [], {"local_origins": ["http://127.0.0.1"] * 257}):
        r = agent.http.put("/v1/browser/rule", headers=AUTH, json=body)
        assert (r.status_code, r.json()["error"]["code"]) == (400, "invalid_request"), (body, r.text)
        assert "example.test" not in r.text
    assert agent.http.put("/v1/browser/rule", json={}).status_code == 401


def test_the_origins_chromium_is_launched_with_are_loaded() -> None:
    """What ``POST /v1/launch`` hands chromium: its guest-local http(s) origins pass the rule, others do not."""
    from guest.browser import BrowserHost
    from guest.browser_tools import BrowserTools

    tools = BrowserTools(BrowserHost())
    tools.set_rule(W.GuestUrlRule(local_origins=["http://127.0.0.1:9000"]))
    tools.launching(["http://localhost:8080/app?x=1", "https://example.test/", "about:blank", "--flag",
                     "http://[::1]:81"])
    assert tools.refusal("http://localhost:8080/other") is None and tools.refusal("http://[::1]:81/") is None
    assert tools.refusal("http://127.0.0.1:9000/") is None
    assert tools.refusal("http://127.0.0.1:8080/") == W.REFUSED_LOCAL  # another host: another origin
    assert tools.refusal("http://example.test/") is None  # the gateway's to decide


# -- the input gate: a click lands on the element named, or on nothing ----------------------------------------
def events_of(agent: Agent, prefix: str) -> list[str]:
    return [e for e in agent.page("window.events") or [] if e.startswith(prefix)]


def activations(agent: Agent, prefix: str) -> list[str]:
    """The noted press, release and click events of ``prefix`` (its hover events may come from the
    resting pointer once a page moves the element under it: the page's doing, after the call)."""
    return [e for e in events_of(agent, prefix) if e.split()[-1] in ("pointerdown", "mousedown", "pointerup",
                                                                        "mouseup", "click")]


@pytest.mark.parametrize("when", browser_site.SWAP_WHEN)
def test_a_click_never_lands_on_an_element_the_page_moves_under_it(one_tab: Agent, site: dict[str, str],
                                                                   when: str) -> None:
    """"Buy" (a form's submit button) comes over "Cancel" before the press, between press and release, on
    the pointer's move, or a frame does: the click fails saying so, or lands on "Cancel"; "Buy" gets no
    event at all and the form is not submitted."""
    report = one_tab.goto(f"{site['base']}/swap?when={when}")
    r = one_tab.raw("click", target=by_label(report, "Cancel")["ref"])
    if when in ("pointerup", "mouseup"):  # the click's target is already settled: "Cancel"
        assert r.status_code == 200, r.text
        assert events_of(one_tab, "cancel") == ["cancel click"]
    else:
        assert (r.status_code, r.json()["error"]["code"]) == (422, "not_actionable"), r.text
        assert "cancel click" not in events_of(one_tab, "cancel")
    assert activations(one_tab, "buy") == [] and "frame clicked" not in one_tab.page("window.events")
    assert one_tab.page("location.pathname") == "/swap"


def test_a_page_flipping_elements_all_the_time_never_gets_a_click_elsewhere(one_tab: Agent,
                                                                            site: dict[str, str]) -> None:
    report = one_tab.goto(f"{site['base']}/swap?when=timer")
    cancel, keep = by_label(report, "Cancel")["ref"], by_label(report, "Keep")["ref"]
    for _ in range(15):
        for member, arguments in (("click", {"target": cancel}),
                                  ("set_checked", {"target": keep, "checked": not one_tab.page("keep.checked")})):
            r = one_tab.raw(member, **arguments)
            assert r.status_code in (200, 422), r.text
    assert activations(one_tab, "buy") == [] and activations(one_tab, "danger") == []
    assert one_tab.page("location.pathname") == "/swap" and one_tab.page("danger.checked") is False


@pytest.mark.parametrize("when", ["pointerrawupdate"])
def test_a_hover_that_the_page_moves_another_element_under_fails(one_tab: Agent, site: dict[str, str],
                                                                 when: str) -> None:
    report = one_tab.goto(f"{site['base']}/swap?when={when}")
    assert one_tab.refused("hover", target=by_label(report, "Cancel")["ref"])[:2] == (422, "not_actionable")


@pytest.mark.parametrize("when", ["pointermove", "mousedown"])
def test_set_checked_never_toggles_another_box(one_tab: Agent, site: dict[str, str], when: str) -> None:
    report = one_tab.goto(f"{site['base']}/swap?when={when}")
    status, code, _ = one_tab.refused("set_checked", target=by_label(report, "Keep")["ref"], checked=True)
    assert (status, code) == (422, "not_actionable")
    assert activations(one_tab, "danger") == [] and one_tab.page("danger.checked") is False


def test_typed_text_never_lands_in_an_element_the_page_moves_the_focus_to(one_tab: Agent, site: dict[str, str]) -> None:
    """The page takes the focus from the field named to another one whenever it can (a timer, and as the
    agent's focus selects the field's text): the text (or the Backspace of an empty one) lands in the field
    named, or nowhere and the call fails; never in the other field."""
    refusals = 0
    for _ in range(8):
        report = one_tab.goto(site["base"] + "/steal-focus")
        for text in ("typed by the model", ""):
            r = one_tab.raw("type", target=by_label(report, "Search")["ref"], text=text)
            values = one_tab.page("[document.getElementById('q').value, document.getElementById('o').value]")
            assert values[1] == "", "the text landed in the field the page moved the focus to"
            if r.status_code == 200:
                assert values[0] == text
            else:
                assert (r.status_code, r.json()["error"]["code"]) == (422, "not_actionable")
                assert "focus" in r.json()["error"]["message"]
                refusals += 1
    assert refusals  # the page won the race at least once


def test_a_tab_a_page_opens_has_the_gate_before_its_first_script(one_tab: Agent, site: dict[str, str]) -> None:
    """The new tab's document registers its own capture listeners on the window first thing ("hog"): the
    agent's gate still comes before them (the tab waited for the agent), so "Buy"'s form is not submitted."""
    report = one_tab.goto(go(site, "blank", site["base"] + "/swap?when=pointermove&hog=1"))
    one_tab.call("click", target=by_label(report, "Go")["ref"])
    assert wait_until(lambda: any(t["title"] == "Swap" and t["active"] for t in one_tab.state()["tabs"]), 10, 0.05)
    report = one_tab.call("read_page", filter="interactive")["result"]
    assert one_tab.refused("click", target=by_label(report, "Cancel")["ref"])[:2] == (422, "not_actionable")
    assert one_tab.page("location.pathname") == "/swap" and one_tab.page("window.events") == []


def test_a_gated_click_still_follows_a_link_and_the_gate_lets_go(one_tab: Agent, site: dict[str, str]) -> None:
    report = one_tab.goto(site["base"] + "/form")
    one_tab.call("click", target=by_label(report, "Other page")["ref"])
    assert wait_until(lambda: next(t for t in one_tab.state()["tabs"] if t["active"])["title"] == "Other", 10, 0.05)
    report = one_tab.goto(f"{site['base']}/swap?when=pointermove")
    assert one_tab.refused("click", target=by_label(report, "Cancel")["ref"])[1] == "not_actionable"
    one_tab.page("document.getElementById('cancel').click()")  # the page's own (untrusted) click: never gated
    assert events_of(one_tab, "cancel") == ["cancel click"]


def test_state_and_calls_without_a_browser() -> None:
    app = create_app(AgentConfig(display=":0", token=TOKEN))
    with TestClient(app) as http:
        r = http.get("/v1/browser/state", headers=AUTH)
        assert (r.status_code, r.json()["error"]["code"]) == (409, "no_browser")
        r = http.post("/v1/browser/call", headers=AUTH, json={"member": "screenshot", "arguments": {}})
        assert (r.status_code, r.json()["error"]["code"]) == (409, "no_browser")


# -- the X input members: a headed chromium on a private Xvfb -------------------------------------------
@pytest.fixture(scope="module")
def headed(site: dict[str, str]) -> Iterator[Agent]:
    from guest.localrun import Xvfb

    if not shutil.which("Xvfb"):
        pytest.skip("needs Xvfb")
    server = Xvfb(1280, 800, 24).start()
    # Off the screen's corner, so that the window's place and its frame both count in the mapping.
    a = Agent(server.display, ["--window-position=37,23", "--window-size=900,600"], {"DISPLAY": server.display},
              [site["base"], site["other"]])
    yield a
    a.close()
    server.stop()


def events(agent: Agent, kind: str) -> list[list[Any]]:
    return [e for e in agent.page("window.events") or [] if e[0] == kind]


def test_click_at_lands_on_the_viewport_point_given(headed: Agent, site: dict[str, str]) -> None:
    headed.goto(site["base"] + "/xy")
    viewport = headed.call("screenshot")["viewport"]
    assert viewport["x"] >= 37 and viewport["y"] > 23  # below the tab strip and toolbar
    assert headed.page("document.documentElement.clientWidth === innerWidth")  # no scrollbar in the way
    for x, y in [(0, 0), (123, 45), (headed.page("innerWidth") - 1, headed.page("innerHeight") - 1)]:  # the last pixel
        body = headed.call("click_at", x=x, y=y, button="left", click_count=1, keys=[])
        assert body["target"] == {"x": x, "y": y, "width": 0, "height": 0}
        clicks = headed.wait_page(f"window.events.filter(e => e[0] === 'click' && e[1] === {x})")
        assert clicks[-1][1:5] == [x, y, 0, 1]
    headed.call("click_at", x=300, y=200, button="right", click_count=1, keys=["Shift"])
    menu = headed.wait_page("window.events.filter(e => e[0] === 'contextmenu')")
    assert menu[-1][1:4] == [300, 200, 2] and menu[-1][5] is True
    headed.call("click_at", x=310, y=210, button="left", click_count=3, keys=["Control"])
    triple = headed.wait_page("window.events.filter(e => e[0] === 'click' && e[4] === 3)")
    assert triple[-1][1:3] == [310, 210] and triple[-1][6] is True
    headed.call("hover_at", x=222, y=111)
    moves = headed.wait_page("window.events.filter(e => e[0] === 'mousemove' && e[1] === 222)")
    assert moves[-1][1:3] == [222, 111]
    headed.page("window.events.length = 0")
    headed.call("drag_path", path=[{"x": 10, "y": 20}, {"x": 60, "y": 40}, {"x": 100, "y": 90}], keys=[])
    headed.wait_page("window.events.some(e => e[0] === 'mouseup')")
    assert events(headed, "mousedown")[0][1:3] == [10, 20] and events(headed, "mouseup")[-1][1:3] == [100, 90]
    assert [100, 90, 1] in [e[1:4] for e in events(headed, "mousemove")]  # button down (chromium coalesces moves)


def test_hold_keys_holds_them_for_the_duration(headed: Agent, site: dict[str, str]) -> None:
    headed.goto(site["base"] + "/xy")
    headed.call("click_at", x=50, y=50, button="left", click_count=1, keys=[])  # the page has the focus
    headed.page("window.events.length = 0")
    t0 = time.monotonic()
    headed.call("hold_keys", keys=["Shift", "a"], duration_ms=400)
    assert time.monotonic() - t0 >= 0.4
    up = headed.wait_page("window.events.filter(e => e[0] === 'keyup' && e[1].toLowerCase() === 'a')")
    down = [e for e in events(headed, "keydown") if e[1] == "A"]
    assert down and up[-1][2] - down[0][3] >= 350 and [e[1] for e in events(headed, "keydown")][0] == "Shift"
    assert headed.refused("hold_keys", keys=["Terminate_Server"], duration_ms=1)[:2] == (400, "invalid_request")


@pytest.mark.parametrize("keys", [["Control", "l"], ["Alt", "d"], ["F6"], ["ctrl", "t"], ["Super"], ["Menu"]])
def test_hold_keys_never_reaches_the_browsers_own_shortcuts(headed: Agent, site: dict[str, str], keys) -> None:
    """The address bar (Ctrl+L, Alt+D, F6), a new tab (Ctrl+T) and the like are the browser's, not the page's:
    held through the X input they would open what the URL policy refuses, so they are refused and no key goes
    down."""
    headed.goto(site["base"] + "/xy")
    headed.page("window.events.length = 0")
    assert headed.refused("hold_keys", keys=keys, duration_ms=50)[:2] == (422, "not_actionable")
    assert events(headed, "keydown") == []


def test_hold_keys_needs_the_page_to_have_the_keyboard_focus(headed: Agent, site: dict[str, str]) -> None:
    """Through the X input the keys go where the X focus is: while another window has it (here an X
    client's own window given the focus), hold_keys refuses and no key reaches anything."""
    from Xlib import X, display as xdisplay

    headed.goto(site["base"] + "/xy")
    headed.call("click_at", x=50, y=50, button="left", click_count=1, keys=[])
    assert headed.wait_page("document.hasFocus()")
    d = xdisplay.Display(headed.display)
    try:
        w = d.screen().root.create_window(0, 0, 50, 50, 0, d.screen().root_depth)
        w.map()
        d.sync()
        w.set_input_focus(X.RevertToParent, X.CurrentTime)
        d.sync()
        assert wait_until(lambda: headed.page("document.hasFocus()") is False, 10, 0.05)
        headed.page("window.events.length = 0")
        status, code, message = headed.refused("hold_keys", keys=["a"], duration_ms=50)
        assert (status, code) == (422, "not_actionable") and "keyboard focus" in message
        assert events(headed, "keydown") == []
    finally:
        d.close()


def test_x_input_needs_the_tab_in_front_and_a_point_in_the_viewport(headed: Agent, site: dict[str, str]) -> None:
    headed.goto(site["base"] + "/xy")
    first = next(t["id"] for t in headed.state()["tabs"] if t["active"])
    width = headed.page("innerWidth")
    assert headed.refused("click_at", x=width, y=5, button="left", click_count=1, keys=[])[1] == "not_actionable"
    headed.call("new_tab", url=site["base"] + "/other")
    status, code, message = headed.refused("hover_at", tab_id=first, x=5, y=5)
    assert (status, code) == (422, "not_actionable") and "switch_tab" in message
    headed.call("close_tab", tab_id=next(t["id"] for t in headed.state()["tabs"] if t["active"]))


def _setup_done() -> None:
    """Wait for the agent's set-up of its new browser (its thread, bounded) to end."""
    for thread in [t for t in threading.enumerate() if t.name == "browser-tools-setup"]:
        thread.join(60)
        assert not thread.is_alive(), "the browser's set-up did not end"


@pytest.mark.parametrize("opens_it_itself", [False, True, "several"], ids=["blank", "opened", "several"])
def test_the_address_chromium_was_launched_with_is_shown_once(opens_it_itself: Any,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """A browser launched with an address may start with its one tab blank and no load under way (what
    chromium did starting on a loaded, emulated machine): the agent opens the address itself once the
    browser is set up. Here chromium is started on about:blank alone after the agent was told the
    address (``launching``). A browser that opened the address itself is left alone: the page is
    fetched once. Several addresses: the first in front, the others in background tabs, an address the
    agent does not load left out."""
    from guest import browser_tools as tools_module

    monkeypatch.setattr(tools_module, "STARTUP_OPEN_GRACE_S", 2.0)
    port, hits, stop = browser_site.serve_secret()
    address = f"http://127.0.0.1:{port}/start"
    app = create_app(AgentConfig(display=":0", token=TOKEN))
    http = TestClient(app)
    pid, top = 0, None
    try:
        assert http.put("/v1/browser/rule", headers=AUTH, json={"local_origins": [f"http://127.0.0.1:{port}"]}
                        ).status_code == 200
        more = [f"http://127.0.0.1:{port}/second", "http://bad address/"] if opens_it_itself == "several" else []
        app.state.browser_tools.launching([address, *more])
        pid, fds, top = start_chromium(["--headless=new"], {}, address if opens_it_itself is True else "about:blank")
        app.state.browser.take_channel("chromium", pid, *fds)
        _setup_done()
        assert wait_until(lambda: "/start" in hits, 20, 0.05), "the launch address was never fetched"
        tabs = http.get("/v1/browser/state", headers=AUTH).json()["tabs"]
        assert [t["url"] for t in tabs if t["active"]] == [address], tabs
        assert hits.count("/start") == 1, hits
        if more:
            assert wait_until(lambda: "/second" in hits, 20, 0.05), hits
            assert hits.count("/second") == 1 and not any("bad" in h for h in hits), hits
    finally:
        http.close()
        app.state.browser.close()
        if pid:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
        if top is not None:
            shutil.rmtree(top, ignore_errors=True)
        stop()
