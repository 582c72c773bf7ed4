"""The guest browser as the SDK's ``BrowserToolset`` driver (``controller.run.browser_driver``): the
observation it re-sequences is one the SDK's own ``_state`` accepts on every call (with the state before
it as ``previous``), URLs are judged by the task's network policy, and the real SDK toolset runs over the
driver and the real agent client: refusals reach the model escaped, a malformed answer is a failed call
(never the end of the run), a refused URL is a ``navigation_refused`` change, a member the person must
confirm is asked through the run's gate, and each call is one ``browser_call`` line with typed text as
its length only.

The agent here is a fake on 127.0.0.1 (:class:`FakeAgent`) that answers ``/v1/browser/state`` and
``/v1/browser/call`` with canned JSON: the agent's endpoints need Debian's chromium over the launch
broker, which these controller tests do not start, and most answers below (a read report the SDK
refuses, a control character in a refusal, a sequence that goes back) are what a compromised guest
sends, which the real agent never does. The run against the real agent is in ``tests/loop``.
"""

from __future__ import annotations

import base64
import io
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Iterator

import pytest
from openai.lib.browser import BrowserToolset, _state
from openai.types.responses import ResponseFunctionToolCall
from PIL import Image
from rich.console import Console

from controller.agent_client import AgentClient
from controller.gateway.policy import NetworkPolicy
from controller.run.approvals import ActionGate
from controller.run.browser_driver import ChangeLog, GuestBrowserDriver, UrlRules
from controller.run.record import RunRecord, read_entries
from controller.run.recording import RecordingHooks
from controller.run.registry import ApprovalRegistry
from wire.browser_tools import MAX_CHANGES


# -- the observation ---------------------------------------------------------------------------------
def _agent_obs(first: int, last: int, dropped: int | None = None) -> dict[str, Any]:
    """The agent's observation holding its changes ``first..last`` (navigation on tab-1 each)."""
    dropped = first - 1 if dropped is None else dropped
    return {"version": 1, "sequence": last, "dropped_changes": dropped, "title_truncated": False,
            "changes": [{"type": "navigation", "sequence": n, "tab_id": "tab-1"} for n in range(first, last + 1)]}


TABS = [{"id": "tab-1", "title": "Pickup", "url": "http://127.0.0.1:8080/", "active": True}]


def _walk(log: ChangeLog, steps: list[Callable[[ChangeLog], None]]) -> list[dict[str, Any]]:
    """Apply each step and check the resulting state with the SDK's ``_state`` against the one before."""
    previous = None
    seen = []
    for step in steps:
        step(log)
        state = _state({"tabs": TABS, "observation": log.observation()}, previous)
        previous = state["observation"]
        seen.append(previous)
    return seen


def test_the_observation_stays_one_the_sdk_accepts_across_calls():
    refused = {"type": "navigation_refused", "tab_id": "tab-1", "reason": "policy"}
    seen = _walk(ChangeLog(), [
        lambda log: log.take(_agent_obs(1, 2)),                 # the launch's changes
        lambda log: log.take(_agent_obs(1, 2)),                 # nothing new: the same state
        lambda log: log.add(refused),                           # the driver's own refusal
        lambda log: log.take(_agent_obs(1, 4)),                 # two more from the agent, after it
        lambda log: log.take(_agent_obs(10, 12, dropped=9)),    # the agent dropped 5..9 before we saw them
        lambda log: log.take(_agent_obs(1, 1)),                 # a new browser: its sequence went back
        *[lambda log: log.add(refused)] * (MAX_CHANGES + 3),     # more than are retained
    ])
    assert [c["type"] for c in seen[3]["changes"]] == ["navigation", "navigation", "navigation_refused",
                                                         "navigation", "navigation"]
    assert seen[4]["dropped_changes"] == 5 + 5 and seen[4]["changes"][0]["sequence"] == 11  # 5 kept, 5 lost
    assert seen[5]["sequence"] == seen[4]["sequence"] + 1
    assert len(seen[-1]["changes"]) == MAX_CHANGES and seen[-1]["sequence"] == seen[5]["sequence"] + MAX_CHANGES + 3


def test_the_agents_numbers_alone_would_break_the_sdks_rule():
    """What the re-sequencing is for: the agent's own observation after a refusal of the driver's was
    added would go back, and the SDK refuses that."""
    log = ChangeLog()
    log.take(_agent_obs(1, 2))
    log.add({"type": "navigation_refused", "tab_id": "tab-1", "reason": "policy"})
    previous = _state({"tabs": TABS, "observation": log.observation()})["observation"]
    with pytest.raises(RuntimeError):
        _state({"tabs": TABS, "observation": _agent_obs(1, 2)}, previous)
    log.take(_agent_obs(1, 2))
    _state({"tabs": TABS, "observation": log.observation()}, previous)


# -- URLs --------------------------------------------------------------------------------------------
def _rules(**network: Any) -> UrlRules:
    from controller.gateway.origin import Origin

    return UrlRules(network=NetworkPolicy(**network), local=frozenset({Origin.parse("http://127.0.0.1:8080")}),
                    gateway_hosts=frozenset({"gateway", "172.30.0.2"}), agent_port=8000)


@pytest.mark.parametrize("network, url, allowed", [
    ({}, "about:blank", True),
    ({}, "http://127.0.0.1:8080/form?x=1", True),            # the task's own page
    ({}, "http://localhost:8080/", False),                   # another spelling is another origin
    ({}, "http://127.0.0.1:9999/", False),                   # a guest-local service the task does not open
    ({}, "http://127.0.0.1:8000/v1/display", False),         # the agent
    ({"mode": "allowlist", "allow": ["http://[::ffff:127.0.0.1]:8000"], "allow_addresses": ["127.0.0.1/32"]},
     "http://[::ffff:127.0.0.1]:8000/", False),              # the agent, written as an IPv4-mapped address
    ({}, "http://[::ffff:7f00:1]:8000/", False),
    ({}, "http://0.0.0.0:8000/", False),                     # the unspecified address is the guest too
    ({}, "https://example.org/", False),                     # deny-all
    ({}, "file:///etc/passwd", False),
    ({}, "chrome://settings", False),
    ({}, "javascript:alert(1)", False),
    ({"mode": "allowlist", "allow": ["https://example.org"]}, "https://example.org/a", True),
    ({"mode": "allowlist", "allow": ["https://example.org"]}, "https://example.org:8443/", False),
    ({"mode": "allowlist", "allow": ["https://example.org"]}, "http://gateway:3128/", False),
    ({"mode": "allowlist", "allow": ["http://172.30.0.2"]}, "http://172.30.0.2/", False),  # the gateway, whatever the rules
    ({"mode": "allowlist", "allow": ["http://10.0.0.5"]}, "http://10.0.0.5/", False),      # special, no allow_addresses
    ({"mode": "allowlist", "allow": ["http://10.0.0.5"], "allow_addresses": ["10.0.0.5"]}, "http://10.0.0.5/", True),
    ({"mode": "ask", "ask": ["https://*.python.org"]}, "https://docs.python.org/3/", True),  # the gateway asks
    ({"mode": "ask", "ask": ["https://*.python.org"]}, "https://example.org/", False),
    ({"mode": "ask", "quiet": ["https://docs.python.org"]}, "https://docs.python.org/", False),
])
def test_urls_are_judged_by_the_tasks_network_policy(network, url, allowed):
    why = _rules(**network).refusal(url)
    assert (why is None) == allowed, why


def test_the_rules_for_a_task_take_its_local_pages_and_the_sandboxs_addresses():
    from controller.run.tasks import load_task
    from controller.sandbox.topology import NetworkTopology
    from tests.controller.test_tasks import TASKS

    task = load_task(TASKS / "browser-pickup.toml")
    topology = NetworkTopology(backend="docker", proxy_host="172.30.0.2", proxy_port=3128,
                               gateway_guest_ip="172.30.0.2", agent_port=8000, agent_host_port=5555)
    rules = UrlRules.for_task(task, topology)
    assert rules.refusal("http://127.0.0.1:8080/") is None
    assert rules.refusal("http://127.0.0.1:8000/") and rules.refusal("http://172.30.0.2:8001/")
    assert UrlRules.for_task(task, None, "http://127.0.0.1:4321").agent_port == 4321


def test_the_guest_rule_is_the_same_rule_for_every_guest_local_url():
    """What the agent applies to every request of its chromium (a redirect, a link, a frame...) refuses
    exactly the guest-local and gateway URLs the driver refuses for the model's own, in any spelling."""
    rules = _rules(mode="allowlist", allow=["http://localhost:9000", "https://example.org"])
    rule = rules.guest_rule()
    assert rule.local_origins == ["http://127.0.0.1:8080", "http://localhost:9000"]
    assert rule.agent_port == 8000 and set(rule.gateway_hosts) == {"gateway", "172.30.0.2"}
    for url in ["http://127.0.0.1:8080/x", "http://0x7f.1:8080/", "http://2130706433:8080/", "http://127.1:9999/",
                "http://[::1]:8080/", "http://[::ffff:127.0.0.1]:8000/", "http://localhost.:9000/",
                "http://0.0.0.0:8080/", "http://localhost:8000/", "http://gateway:3128/", "http://172.30.0.2:8001/",
                "http://api.localhost:9000/"]:
        assert (rule.refusal(url) is None) == (rules.refusal(url) is None), url
    assert rule.refusal("https://example.org/") is None
    assert rule.refusal("https://elsewhere.test/") is None  # not guest-local: the gateway decides it


# -- the SDK's toolset over the driver and the agent client ---------------------------------------------
class FakeAgent:
    """A fake agent on 127.0.0.1 (module docstring): ``state`` is served on ``GET /v1/browser/state``;
    each ``POST /v1/browser/call`` is answered by ``answer(member, arguments) -> (status, body)`` and
    noted in ``calls``."""

    def __init__(self) -> None:
        self.state: dict[str, Any] = {"tabs": TABS, "observation": _agent_obs(1, 1)}
        self.answer: Callable[[str, dict[str, Any]], tuple[int, Any]] = lambda m, a: (200, {"result": None})
        self.calls: list[tuple[str, dict[str, Any]]] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *_: Any) -> None:
                pass

            def _send(self, status: int, body: Any) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                self._send(200, fake.state)

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                fake.calls.append((body["member"], body["arguments"]))
                self._send(*fake.answer(body["member"], body["arguments"]))

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()
        self.client = AgentClient(f"http://127.0.0.1:{self.server.server_address[1]}", "token", timeout=5.0)

    def close(self) -> None:
        self.client.close()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def fake() -> Iterator[FakeAgent]:
    agent = FakeAgent()
    yield agent
    agent.close()


def _call(toolset: BrowserToolset, member: str, arguments: dict[str, Any], call_id: str = "call_1",
          **kw: Any) -> tuple[dict[str, Any], list[Any]]:
    """Run one function call through the SDK's toolset; returns the payload the model gets and the
    output's other parts."""
    call = ResponseFunctionToolCall(type="function_call", call_id=call_id, name=f"browser_{member}",
                                    arguments=json.dumps(arguments), status="completed")
    output = toolset.execute(call, **kw)
    parts = output["output"]
    return json.loads(parts[0]["text"]), parts[1:]


def _toolset(driver: GuestBrowserDriver, members: list[str] | None = None) -> BrowserToolset:
    return BrowserToolset(driver, members=members or ["read_page", "click", "type", "navigate", "screenshot"],
                          confirm=driver.confirm, url_policy=driver.url_policy)


READ = {"version": 1, "text": "Pickup desk", "omitted": ["private"],
        "elements": [{"ref": "e1", "role": "textbox", "label": "Name"}, {"ref": "e2", "role": "button", "label": "Book"}]}


def test_a_read_report_reaches_the_model_with_the_state(fake):
    fake.answer = lambda m, a: (200, {"result": READ, "target": None, "viewport": None})
    driver = GuestBrowserDriver(fake.client)
    payload, _ = _call(_toolset(driver), "read_page", {"tab_id": None, "filter": "all"})
    assert payload["ok"] and payload["result"] == READ
    assert payload["state"]["tabs"][0]["url"] == "http://127.0.0.1:8080"  # the SDK shows the origin only
    assert fake.calls == [("read_page", {"tab_id": None, "filter": "all"})]
    assert driver.last.result == {"kind": "read", "text_length": 11, "elements": 2, "omitted": ["private"]}


def test_a_refusal_reaches_the_model_escaped_and_other_failures_do_not(fake):
    driver = GuestBrowserDriver(fake.client)
    toolset = _toolset(driver)
    fake.answer = lambda m, a: (422, {"error": {"code": "stale_ref", "message": "ref e9\x1b[2J is not of this page"}})
    payload, _ = _call(toolset, "click", {"tab_id": None, "target": "e9"})
    assert not payload["ok"] and payload["error"] == "stale_ref: ref e9\\x1b[2J is not of this page"
    fake.answer = lambda m, a: (504, {"error": {"code": "browser_timeout", "message": "secret page words"}})
    payload, _ = _call(toolset, "click", {"tab_id": None, "target": "e1"}, call_id="call_2")
    assert payload == {"ok": False, "state": payload["state"], "error": "Browser action failed."}
    assert "browser_timeout" in driver.last.error


@pytest.mark.parametrize("result", [
    {**READ, "elements": [{"ref": "e1", "role": "textbox", "label": "x" * 300}]},   # a label over 256 bytes
    {**READ, "elements": [{"ref": "e1", "role": "button", "label": "a"}, {"ref": "e1", "role": "button", "label": "b"}]},
    "a string for a read is fine, but not this:", ])
def test_an_answer_the_sdk_would_refuse_is_a_failed_call_not_the_end_of_the_run(fake, result):
    fake.answer = lambda m, a: (200, {"result": result})
    driver = GuestBrowserDriver(fake.client)
    payload, _ = _call(_toolset(driver), "read_page", {"tab_id": None, "filter": "all"})
    if isinstance(result, str):  # a string is a valid read result: handed over
        assert payload["ok"] and payload["result"] == result
    else:
        assert payload["error"] == "Browser action failed." and "read report" in driver.last.error


def test_a_refused_url_is_a_navigation_refused_change_and_never_reaches_the_agent(fake):
    driver = GuestBrowserDriver(fake.client, rules=_rules())
    payload, _ = _call(_toolset(driver), "navigate", {"tab_id": None, "url": "http://127.0.0.1:8000/v1/display"})
    assert payload["error"] == "Browser navigation was not approved." and fake.calls == []
    assert payload["state"]["observation"]["changes"][-1] == {
        "type": "navigation_refused", "sequence": 2, "tab_id": "tab-1", "reason": "policy"}
    assert "agent's own address" in driver.refused_url
    fake.answer = lambda m, a: (200, {"result": None})
    payload, _ = _call(_toolset(driver), "navigate", {"tab_id": None, "url": "http://127.0.0.1:8080/"}, "call_2")
    assert payload["ok"] and fake.calls == [("navigate", {"tab_id": None, "url": "http://127.0.0.1:8080/"})]


def test_a_confirmed_member_is_asked_through_the_gate(fake):
    decisions: list[Any] = []
    registry = ApprovalRegistry(5.0)

    def answer(question: str) -> str:
        assert "browser type" in question and '"Ada"' in question  # the person sees what is typed
        return "y"

    gate = ActionGate(confirm=["type"], asker=answer, console=Console(file=io.StringIO()), registry=registry,
                      on_decision=decisions.append)
    driver = GuestBrowserDriver(fake.client, gate=gate)
    payload, _ = _call(_toolset(driver), "type", {"tab_id": None, "text": "Ada", "target": "e1"})
    assert payload["ok"] and [(d.what, d.decision, d.by) for d in decisions] == [("action", "approved", "terminal")]
    assert "Ada" not in decisions[0].action and "<3 chars>" in decisions[0].action
    payload, _ = _call(_toolset(driver), "click", {"tab_id": None, "target": "e2"}, "call_2")  # not confirmed
    assert payload["ok"] and len(decisions) == 1
    nobody = ActionGate(confirm=["click"], asker=None, console=Console(file=io.StringIO()), registry=registry,
                        on_decision=decisions.append)
    payload, _ = _call(_toolset(GuestBrowserDriver(fake.client, gate=nobody)), "click",
                       {"tab_id": None, "target": "e2"}, "call_3")
    assert not payload["ok"] and decisions[-1].by == "no-approver" and len(fake.calls) == 2


def _png(width: int, height: int) -> dict[str, str]:
    buffer = io.BytesIO()
    Image.new("RGB", (width, height), (200, 10, 10)).save(buffer, "PNG")
    return {"type": "input_image", "image_url": "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode(),
            "detail": "original"}


def test_each_call_is_one_browser_call_line_and_typed_text_never_enters_the_record(fake, tmp_path):
    record = RunRecord(tmp_path, "run")
    driver = GuestBrowserDriver(fake.client, rules=_rules())
    hooks = RecordingHooks(record, driver=None)  # type: ignore[arg-type]
    hooks.browser = driver
    toolset = _toolset(driver)
    calls = [("type", {"tab_id": None, "text": "Ada Lovelace", "target": "e1"}),
             ("screenshot", {"tab_id": "tab-1"}),
             ("navigate", {"tab_id": None, "url": "https://example.org/"})]
    body = {"output": [{"type": "function_call", "call_id": f"call_{n}", "name": f"browser_{m}",
                        "arguments": json.dumps(a)} for n, (m, a) in enumerate(calls)]}
    hooks.on_request(type("U", (), {"status": 200, "total_tokens": None, "response_id": "resp_1"})(), body)
    box = {"x": 10.0, "y": 20.0, "width": 100.0, "height": 30.0}
    view = {"x": 0, "y": 100, "width": 1280, "height": 480}
    fake.answer = lambda m, a: (200, {"result": _png(64, 24) if m == "screenshot" else None, "target":
                                      box if m == "type" else None, "viewport": view})
    for n, (member, arguments) in enumerate(calls):
        _call(toolset, member, arguments, call_id=f"call_{n}", on_diagnostic=hooks.on_diagnostic)
    record.close()
    lines = read_entries(tmp_path / "run")
    browser = [e for e in lines if e.type == "browser_call"]
    assert [(e.member, e.ok, e.step) for e in browser] == [("type", True, 1), ("screenshot", True, 1),
                                                           ("navigate", False, 1)]
    assert list(browser[0].arguments.items()) == [("tab_id", None), ("text_length", 12), ("target", "e1")]
    assert browser[0].target == box and browser[0].viewport == view
    assert "Ada" not in (tmp_path / "run" / "record.jsonl").read_text()
    [shot] = [e for e in lines if e.type == "screenshot"]
    assert shot.call_id == "call_1" and shot.image_size == (64, 24) and shot.frame == (0, 100, 1280, 480)
    assert browser[1].screenshot == shot.file and (tmp_path / "run" / shot.file).read_bytes()[:4] == b"\x89PNG"
    assert browser[1].as_json()["result"] == {"kind": "image", "text_length": None, "elements": None, "omitted": []}
    assert browser[2].error.startswith("navigation refused: an origin the task's network policy")


def test_a_browser_screenshot_taken_while_a_region_is_held_is_filled_for_the_model_and_the_record(fake, tmp_path):
    """The browser tools' images come from chromium, not the screen grab: the held regions are filled in
    them too (mapped from screen px into the viewport's image), in what the SDK sends the model and in the
    record's file."""
    record = RunRecord(tmp_path, "run")
    driver = GuestBrowserDriver(fake.client, rules=_rules())
    hooks = RecordingHooks(record, driver=None)  # type: ignore[arg-type]
    hooks.browser = driver
    fake.answer = lambda m, a: (200, {"result": _png(640, 240), "target": None,
                                      "viewport": {"x": 0, "y": 100, "width": 1280, "height": 480}})
    body = {"output": [{"type": "function_call", "call_id": "call_0", "name": "browser_screenshot",
                        "arguments": json.dumps({"tab_id": None})}]}
    hooks.on_request(type("U", (), {"status": 200, "total_tokens": None, "response_id": "resp_1"})(), body)
    fake.client.redactor.hold("typing", (200, 140, 400, 160))  # screen px: image px (96, 16)..(304, 96)
    payload, output = _call(_toolset(driver), "screenshot", {"tab_id": None}, "call_0", on_diagnostic=hooks.on_diagnostic)
    record.close()
    [shot] = [e for e in read_entries(tmp_path / "run") if e.type == "screenshot"]
    assert shot.redacted == [(200, 140, 400, 160)]
    sent = json.dumps(output)
    for data in ((tmp_path / "run" / shot.file).read_bytes(), base64.b64decode(sent.split("base64,")[1].split('"')[0])):
        with Image.open(io.BytesIO(data)) as image:
            pixels = image.convert("RGB")
            assert pixels.getpixel((100, 20)) == (0, 0, 0) and pixels.getpixel((300, 90)) == (0, 0, 0)
            assert pixels.getpixel((20, 20)) == (200, 10, 10) and pixels.getpixel((400, 200)) == (200, 10, 10)


# -- what a person sees of the calls -------------------------------------------------------------------
def _browser_record(tmp_path) -> Any:
    from controller.run import entries as en

    record = RunRecord(tmp_path, "shown")
    record.write(en.RunStarted(task=en.TaskRef(name="t"), mode="offline"))
    record.write(en.ModelResponse(response_id="resp_1", http_status=200))
    buffer = io.BytesIO()
    Image.new("RGB", (640, 240), (255, 255, 255)).save(buffer, "PNG")
    shot = record.save_screenshot(buffer.getvalue(), "image/png", image_size=(640, 240), frame=(0, 100, 1280, 480),
                                  call_id="call_0")
    record.write(en.ModelResponse(response_id="resp_2", http_status=200))
    record.write(en.BrowserCall(step=2, call_id="call_1", member="type", ok=True, ms=12.0,
                                arguments=en.browser_arguments("type", {"tab_id": None, "text": "Ada", "target": "e1"}),
                                result=en.BrowserResult(kind="none"), target={"x": 100, "y": 40, "width": 200, "height": 20},
                                viewport={"x": 0, "y": 100, "width": 1280, "height": 480}))
    record.write(en.BrowserCall(step=2, call_id="call_2", member="navigate", ok=False,
                                arguments={"tab_id": None, "url": "http://evil.test/\x1b[31m<b>"},
                                error="navigation refused: an origin the task's network policy does not let through"))
    record.finish("passed", "ok")
    record.close()
    return record, shot


def test_progress_prints_one_line_per_browser_call_typed_text_as_its_length(tmp_path):
    from controller.run.progress import RunPrinter

    out = io.StringIO()
    printer = RunPrinter(Console(file=out, width=300))
    record, _ = _browser_record(tmp_path)
    for entry in read_entries(record.dir):
        printer(entry)
    lines = [line for line in out.getvalue().splitlines() if "browser " in line]
    assert lines[0] == "  browser type <3 chars> target=e1: ok (12 ms)" and len(lines) == 2
    # a line fits 100 columns: the failure's reason is shortened at its end
    assert lines[1].startswith("  browser navigate url=http://evil.test/\\x1b[31m<b>: FAILED: navigation refused: ")
    assert lines[1].endswith("…") and len(lines[1]) == 100


def test_the_report_lists_browser_calls_in_their_step_and_boxes_their_targets(tmp_path):
    from controller.report import render_report

    record, shot = _browser_record(tmp_path)
    page = render_report(record.dir)
    step2 = page[page.index('id="step-2"'):]
    assert "browser type &lt;3 chars&gt; target=e1: ok" in step2 and "Ada" not in page
    assert "\x1b" not in page and "&lt;b&gt;" in step2
    # the target (100, 40) of the viewport at screen (0, 100) on a 1280x480 frame shown as 640x240 image px
    assert '<rect class="line" x="50" y="20" width="100" height="10"/>' in step2


def test_a_state_not_of_the_schema_or_over_the_cap_is_refused_by_the_client(fake):
    from controller.agent_client import AgentError

    driver = GuestBrowserDriver(fake.client)
    fake.state = {"tabs": TABS, "observation": {**_agent_obs(1, 1), "sequence": 5}}  # sequence != dropped + changes
    with pytest.raises(AgentError) as err:
        driver.state()
    assert err.value.code == "bad_response" and "sequence" in err.value.message
    fake.state = {"tabs": [{**TABS[0], "title": "x" * (2 << 20)}], "observation": _agent_obs(1, 1)}
    with pytest.raises(AgentError) as err:
        driver.state()
    assert err.value.code == "too_large"
    fake.state = {"tabs": TABS, "observation": _agent_obs(1, 1)}
    fake.answer = lambda m, a: (200, {"result": {"version": 1, "text": "", "elements": [], "omitted": []},
                                      "target": "everywhere"})
    with pytest.raises(AgentError) as err:
        driver.call("read_page", {"tab_id": None, "filter": "all"})
    assert err.value.code == "bad_response" and "target" in err.value.message and "everywhere" not in str(err.value)
