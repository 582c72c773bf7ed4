"""Browser turns of the offline scripted model (contract 3): ``browser_*`` function calls built from the
SDK's own tool schemas, served over loopback to the real openai client and run by the SDK's real
``BrowserToolset`` and ``ResponsesToolRunner``; element descriptions resolved from the read reports the
SDK sends back; re-reads and give-ups as for screen expectations; mixed computer and browser scripts."""

from __future__ import annotations

import base64
import io
import json

import openai
import pytest
from openai import ComputerToolset
from openai.lib.browser import BROWSER_MEMBERS, BrowserToolset
from openai.lib.responses_tool_runner import ResponsesToolRunner
from PIL import Image

from controller.offline import browser as br
from controller.offline.expectations import MAX_WAITS_PER_TURN
from controller.offline.scripted_server import ScriptedModel, ScriptedServer, ScriptError, load_script
from tests import scripted
from tests.controller.test_scripted_server import Clock

RED = "#cc0000"


def _png(image: Image.Image) -> str:
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


FORM = [{"ref": "e1", "role": "textbox", "label": "Full name"},
        {"ref": "e2", "role": "button", "label": "Name"},
        {"ref": "e3", "role": "textbox", "label": "Name"},
        {"ref": "e4", "role": "textbox", "label": "Pickup DATE (yyyy-mm-dd)"},
        {"ref": "e5", "role": "button", "label": "Book"}]


class PageStandIn:
    """Stands in for the guest's browser in these tests of the offline model (they test the scripted
    model, not the browser): a sync SDK ``BrowserDriver`` over one in-memory tab of form controls.

    ``log``: ``(member, arguments)`` for each call the SDK made, arguments as the SDK passed them.
    ``elements(n)``: what the n-th ``read_page`` (1-based) reports (default: :data:`FORM`).
    ``paint[(member, n)]``: the viewport (200x100 CSS px, white) turns this colour when the n-th call
    of ``member`` runs. ``navigate_on``: refs whose click loads a new document (a ``navigation`` change
    in the state's observation, as the agent reports one)."""

    def __init__(self, elements=None, paint=None, navigate_on=()) -> None:
        self.log: list[tuple[str, dict]] = []
        self.elements = elements or (lambda n: FORM)
        self.paint = paint or {}
        self.navigate_on = set(navigate_on)
        self.changes: list[dict] = []
        self.image = Image.new("RGB", (200, 100), "#ffffff")

    def _ran(self, member: str, action: dict) -> int:
        self.log.append((member, dict(action)))
        n = sum(1 for m, _ in self.log if m == member)
        if (member, n) in self.paint:
            self.image = Image.new("RGB", (200, 100), self.paint[(member, n)])
        return n

    def state(self) -> dict:
        return {"tabs": [{"id": "tab-1", "title": "Pickup", "url": "http://pickup.test/", "active": True}],
                "observation": {"version": 1, "sequence": len(self.changes), "dropped_changes": 0,
                                "title_truncated": False, "changes": list(self.changes)}}

    def read_page(self, action):
        n = self._ran("read_page", action)
        return {"version": 1, "text": "", "elements": list(self.elements(n)), "omitted": []}

    def find(self, action):
        self._ran("find", action)
        q = action["query"].casefold()
        return {"version": 1, "text": "", "elements": [e for e in FORM if q in e["label"].casefold()], "omitted": []}

    def get_page_text(self, action):
        self._ran("get_page_text", action)
        return {"version": 1, "text": "Your confirmation number PU-123456", "elements": [], "omitted": []}

    def click(self, action):
        self._ran("click", action)
        if action["target"] in self.navigate_on:
            self.changes.append({"type": "navigation", "sequence": len(self.changes) + 1, "tab_id": "tab-1"})

    def type(self, action):
        self._ran("type", action)

    def key(self, action):
        self._ran("key", action)

    def wait_for(self, action):
        self._ran("wait_for", action)

    def screenshot(self, action):
        self._ran("screenshot", action)
        return {"type": "input_image", "image_url": _png(self.image), "detail": "original"}


class Desk:
    """An in-memory ComputerDriver (200x100 model px): ``log`` lists action types; a click paints the
    whole screen ``click_paints``."""

    def __init__(self, click_paints: str | None = None) -> None:
        self.image = Image.new("RGB", (200, 100), "#ffffff")
        self.log: list[str] = []
        self.click_paints = click_paints

    def _act(self, action) -> None:
        self.log.append(action.type)
        if action.type == "click" and self.click_paints:
            self.image = Image.new("RGB", (200, 100), self.click_paints)

    click = double_click = drag = keypress = move = scroll = type = wait = _act

    def screenshot(self):
        return {"type": "computer_screenshot", "image_url": _png(self.image)}


def toolset(page: PageStandIn) -> BrowserToolset:
    return BrowserToolset(page, members=["read_page", "find", "get_page_text", "click", "type", "key", "wait_for",
                                         "screenshot"], confirm=lambda ctx: True)


def run(turns, page, desk=None, clock=None, max_steps=20, time_scale=1.0):
    """Run ``turns`` through the real SDK runner against the scripted server; (model, entries, response)."""
    entries: list[dict] = []
    model = ScriptedModel(turns, on_expectation=entries.append, **({"clock": clock} if clock else {}))
    model.time_scale = time_scale
    runner = ResponsesToolRunner(browser=toolset(page), computer=ComputerToolset(desk) if desk else None)
    content = [{"type": "input_text", "text": "book the pickup"}]
    if desk is not None:
        content.append({"type": "input_image", "image_url": _png(desk.image), "detail": "high"})
    with ScriptedServer(model) as server:
        client = scripted.client(server)
        response = runner.run(client, {"model": "scripted", "input": [{"role": "user", "content": content}]},
                              max_steps=max_steps)
        client.close()
    assert model.errors == []
    return model, entries, response


def calls(model: ScriptedModel) -> list[tuple[str, str]]:
    """(call_id, name) of each call the scripted model answered, in order (read off the last request)."""
    return [(i["call_id"], i.get("name", i["type"])) for i in model.requests[-1]["input"]
            if isinstance(i, dict) and i.get("type") in ("function_call", "computer_call")]


# -- the response: one function_call per entry, as the SDK parses it --------------------------------

def test_a_browser_turn_is_one_response_with_a_function_call_per_entry():
    page = PageStandIn()
    turns = [{"browser": [{"member": "read_page", "arguments": {"filter": "interactive"}},
                          {"member": "key", "arguments": {"keys": ["Control", "a"], "tab_id": "tab-1"}}]},
             {"message": "done"}]
    with ScriptedServer(ScriptedModel(turns)) as server:
        client = scripted.client(server)
        resp = client.responses.create(model="scripted", input="go", tools=toolset(page).tools)
        client.close()
    first, second = resp.output
    assert [first.type, second.type] == ["function_call", "function_call"]
    assert (first.name, first.call_id, first.status) == ("browser_read_page", "call_0000_b00", "completed")
    assert (second.name, second.call_id) == ("browser_key", "call_0000_b01")
    assert json.loads(first.arguments) == {"filter": "interactive", "tab_id": None}  # left out: null
    assert json.loads(second.arguments) == {"keys": ["Control", "a"], "tab_id": "tab-1"}
    assert first.id != second.id and resp.usage is not None


def test_the_sdk_runner_drives_a_script_and_descriptions_become_refs():
    """Exact labels first (the textbox "Name", not "Full name" before it nor the button "Name"), then a
    case-insensitive substring ("date"); the SDK's own read output is what the scripted model reads."""
    page = PageStandIn()
    turns = [{"browser": [{"member": "read_page", "arguments": {"filter": "interactive"}}]},
             {"browser": [{"member": "type", "arguments": {"target": {"label": "Name", "role": "textbox"},
                                                           "text": "Ada"}},
                          {"member": "type", "arguments": {"target": {"label": "date"}, "text": "2030-05-17"}},
                          {"member": "click", "arguments": {"target": {"label": "Name"}}},
                          {"member": "type", "arguments": {"target": None, "text": "!"}}]},
             {"browser": [{"member": "get_page_text", "arguments": {}}]},
             {"message": "booked"}]
    model, entries, response = run(turns, page)
    assert response.output_text == "booked"
    assert page.log == [("read_page", {"filter": "interactive", "tab_id": None}),
                        ("type", {"target": "e3", "text": "Ada", "tab_id": None}),
                        ("type", {"target": "e4", "text": "2030-05-17", "tab_id": None}),
                        ("click", {"target": "e2", "tab_id": None}),  # no role: the first exact "Name"
                        ("type", {"target": None, "text": "!", "tab_id": None}),
                        ("get_page_text", {"tab_id": None})]
    assert [c for c, _ in calls(model)] == ["call_0000_b00", "call_0001_b00", "call_0001_b01", "call_0001_b02",
                                            "call_0001_b03", "call_0002_b00"]
    assert entries == [] and model.unmet is None and len(model.requests) == 4
    assert model.wait_allowance == MAX_WAITS_PER_TURN  # one turn with descriptions


def test_a_find_report_counts_as_a_read():
    page = PageStandIn()
    turns = [{"browser": [{"member": "find", "arguments": {"query": "book"}}]},
             {"browser": [{"member": "click", "arguments": {"target": {"label": "book", "role": "button"}}}]},
             {"message": "ok"}]
    run(turns, page)
    assert page.log[1] == ("click", {"target": "e5", "tab_id": None})


def test_a_description_that_matches_nothing_is_read_again_until_it_appears():
    # the Book button shows only from the third read of the page on (the form renders late)
    page = PageStandIn(elements=lambda n: FORM if n >= 3 else FORM[:4])
    turns = [{"browser": [{"member": "read_page", "arguments": {"filter": "all"}}]},
             {"browser": [{"member": "click", "arguments": {"target": {"label": "Book", "role": "button"}}}]},
             {"message": "ok"}]
    model, entries, response = run(turns, page, clock=Clock(1.0), max_steps=5)
    assert response.output_text == "ok"
    assert [m for m, _ in page.log] == ["read_page", "read_page", "read_page", "click"]
    assert page.log[1] == ("read_page", {"filter": "interactive", "tab_id": None})
    assert page.log[-1] == ("click", {"target": "e5", "tab_id": None})
    assert [c for c, _ in calls(model)] == ["call_0000_b00", "call_0001_read_001", "call_0001_read_002",
                                            "call_0001_b00"]
    (entry,) = entries
    assert entry["met"] is True and entry["turn"] == 1 and entry["waits"] == 2 and entry["waited_s"] == 2.0
    assert entry["expected"] == ['button labelled "Book"']


def test_with_no_read_yet_the_model_reads_first():
    page = PageStandIn()
    model, _, _ = run([{"browser": [{"member": "click", "arguments": {"target": {"label": "Book"}}}]},
                       {"message": "ok"}], page)
    assert page.log == [("read_page", {"filter": "interactive", "tab_id": None}), ("click", {"target": "e5",
                                                                                             "tab_id": None})]


def test_a_navigation_after_the_read_makes_its_refs_stale():
    page = PageStandIn(navigate_on={"e5"}, elements=lambda n: FORM if n == 1 else
                       [{"ref": "n1", "role": "button", "label": "Book another"}])
    turns = [{"browser": [{"member": "read_page", "arguments": {"filter": "interactive"}}]},
             {"browser": [{"member": "click", "arguments": {"target": {"label": "Book"}}}]},
             {"browser": [{"member": "click", "arguments": {"target": {"label": "Book"}}}]},
             {"message": "ok"}]
    run(turns, page)
    # "Book" is in the first report too, but the first click loaded a new document: read again
    assert [(m, a.get("target")) for m, a in page.log] == [("read_page", None), ("click", "e5"), ("read_page", None),
                                                           ("click", "n1")]


def test_a_description_that_never_matches_gives_up_like_an_unmet_expectation():
    hostile = [{"ref": "h1", "role": "button", "label": "Pay\x1b[2J\u202e now"}]
    page = PageStandIn(elements=lambda n: hostile)
    turns = [{"browser": [{"member": "read_page", "arguments": {"filter": "interactive"}}]},
             {"browser": [{"member": "click", "arguments": {"target": {"label": "Book", "role": "button"}}}],
              "expect_timeout_s": 2.5},
             {"message": "not reached"}]
    model, entries, response = run(turns, page, clock=Clock(1.0), time_scale=2.0)
    # 2.5 s x 2: reads answered at t .. t+4, given up at t+5
    assert [m for m, _ in page.log] == ["read_page"] * 6
    failure = model.unmet
    assert failure is not None and entries == [failure]
    assert failure["met"] is False and failure["turn"] == 1 and failure["waits"] == 5
    assert failure["reason"] == "deadline of 5s passed" and failure["timeout_s"] == 5.0
    (unmet,) = failure["unmet"]
    assert unmet["kind"] == "target" and unmet["index"] == 0
    assert unmet["expectation"] == {"label": "Book", "role": "button"}
    assert unmet["expected"] == 'button labelled "Book"'
    assert "\x1b" not in unmet["observed"] and "\u202e" not in unmet["observed"]
    assert unmet["observed"].startswith('no label matches; button labels seen: "Pay\\x1b[2J')
    assert "gave up at turn 1" in response.output_text and 'button labelled "Book"' in response.output_text
    from controller.run.entries import Expectation  # the record's entry takes it as it is

    assert Expectation(**failure).unmet[0].kind == "target"


def test_re_reads_stop_after_the_per_turn_limit(monkeypatch):
    from controller.offline import scripted_server

    monkeypatch.setattr(scripted_server, "MAX_WAITS_PER_TURN", 3)
    page = PageStandIn(elements=lambda n: [])
    model, _, _ = run([{"browser": [{"member": "click", "arguments": {"target": {"label": "Book"}}}]},
                       {"message": "x"}], page)
    assert model.unmet["reason"] == "3 reads answered" and len(page.log) == 3
    assert model.unmet["unmet"][0]["observed"] == "no element in the latest read report (0 elements)"


# -- screen expectations on browser turns, and mixed scripts ----------------------------------------

RED_BOX = {"kind": "color", "x": 10, "y": 10, "w": 20, "h": 20, "rgb": RED}


def test_expectations_on_a_browser_turn_wait_with_browser_screenshots():
    page = PageStandIn(paint={("screenshot", 3): RED})  # the page turns red by the third screenshot
    turns = [{"browser": [{"member": "screenshot", "arguments": {}}]},
             {"expect": [RED_BOX], "browser": [{"member": "click", "arguments": {"target": {"label": "Book"}}}]},
             {"message": "ok"}]
    model, entries, response = run(turns, page)
    assert [m for m, _ in page.log] == ["screenshot", "screenshot", "screenshot", "read_page", "click"]
    assert [c for c, _ in calls(model)] == ["call_0000_b00", "call_0001_wait_001", "call_0001_wait_002",
                                            "call_0001_read_001", "call_0001_b00"]
    met_screen, met_target = entries
    assert met_screen["met"] is True and met_screen["waits"] == 2 and "color #cc0000" in met_screen["expected"][0]
    assert met_target["met"] is True and met_target["waits"] == 1
    assert model.wait_allowance == 2 * MAX_WAITS_PER_TURN


def test_a_mixed_script_runs_computer_and_browser_turns_in_one_conversation():
    """The computer click paints the screen red; the browser turn's expectation holds on that latest
    (computer) screenshot; the next computer turn expects the white page the browser screenshot shows."""
    page = PageStandIn()
    desk = Desk(click_paints=RED)
    turns = [{"actions": [{"type": "click", "x": 5, "y": 5, "button": "left"}]},
             {"expect": [RED_BOX], "browser": [{"member": "read_page", "arguments": {"filter": "interactive"}},
                                              {"member": "screenshot", "arguments": {}}]},
             {"expect": [dict(RED_BOX, rgb="#ffffff")], "actions": [{"type": "keypress", "keys": ["Return"]}]},
             {"browser": [{"member": "type", "arguments": {"target": {"label": "Name", "role": "textbox"},
                                                           "text": "Ada"}}]},
             {"message": "mixed"}]
    model, entries, response = run(turns, page, desk=desk)
    assert response.output_text == "mixed"
    assert desk.log == ["click", "keypress"]
    assert page.log == [("read_page", {"filter": "interactive", "tab_id": None}), ("screenshot", {"tab_id": None}),
                        ("type", {"target": "e3", "text": "Ada", "tab_id": None})]
    assert [c for c, _ in calls(model)] == ["call_0000", "call_0001_b00", "call_0001_b01", "call_0002",
                                            "call_0003_b00"]
    assert [e["met"] for e in entries] == [True, True] and model.unmet is None


def test_changed_on_a_browser_turn_compares_with_the_previous_turns_screenshot():
    page = PageStandIn(paint={("click", 1): RED})
    turns = [{"browser": [{"member": "screenshot", "arguments": {}}]},
             {"browser": [{"member": "click", "arguments": {"target": "e5"}},
                          {"member": "screenshot", "arguments": {}}]},
             {"expect": [{"kind": "changed", "x": 0, "y": 0, "w": 50, "h": 50, "fraction": 0.5}], "message": "changed"}]
    model, entries, response = run(turns, page)
    assert response.output_text == "changed" and entries[0]["met"] is True and entries[0]["waits"] == 0


# -- requests the scripted model refuses, as the real API does ---------------------------------------

def test_a_browser_turn_needs_its_tools_declared():
    tools = toolset(PageStandIn()).tools
    with ScriptedServer(ScriptedModel([{"browser": [{"member": "navigate", "arguments": {"url": "http://a.test/"}}]},
                                       {"message": "x"}])) as server:
        resp = scripted.post(server, {"model": "m", "input": "go", "tools": tools})
        assert resp.status_code == 400 and resp.json()["error"]["code"] == "invalid_tools"
        assert "browser_navigate" in resp.json()["error"]["message"]
    with ScriptedServer(ScriptedModel([{"actions": [{"type": "wait"}]}])) as server:
        resp = scripted.post(server, {"model": "m", "input": "go", "tools": tools})
        assert resp.status_code == 400 and "no computer tool" in resp.json()["error"]["message"]
        resp = scripted.post(server, {"model": "m", "input": "go", "tools": [*tools, {"type": "computer"}]})
        assert resp.status_code == 200


@pytest.mark.parametrize("output, code", [
    ([{"type": "input_image", "image_url": "data:image/png;base64,@@@"}], "invalid_image"),
    ([{"type": "input_image", "image_url": "https://example.test/x.png"}], "invalid_image"),
    ([{"type": "output_text", "text": "x"}], "invalid_input"),
    ({"ok": True}, "invalid_input"),
])
def test_malformed_function_call_outputs_get_a_structured_400(output, code):
    call = {"type": "function_call", "call_id": "call_0000_b00", "name": "browser_screenshot",
            "arguments": '{"tab_id": null}'}
    with ScriptedServer(ScriptedModel([{"browser": [{"member": "screenshot", "arguments": {}}]},
                                       {"message": "x"}])) as server:
        tools = toolset(PageStandIn()).tools
        body = {"model": "m", "tools": tools, "input": [{"role": "user", "content": "go"}, call,
                                                        {"type": "function_call_output", "call_id": "call_0000_b00",
                                                         "output": output}]}
        resp = scripted.post(server, body)
        assert resp.status_code == 400 and resp.json()["error"]["code"] == code, resp.text
        orphan = {**body, "input": [body["input"][0], body["input"][2]]}
        resp = scripted.post(server, {**orphan, "input": [orphan["input"][0], {**orphan["input"][1], "output": "ok"}]})
        assert resp.status_code == 400 and "unknown call_id" in resp.json()["error"]["message"]
        good = {**body, "input": [*body["input"][:2], {**body["input"][2], "output": "ok"}]}
        assert scripted.post(server, good).json()["output"][0]["content"][0]["text"] == "x"


# -- load: the SDK's own schemas, file:line errors --------------------------------------------------

def test_the_member_list_and_schemas_are_the_sdks():
    page_tools = BrowserToolset(br._SchemaDriver(), members=BROWSER_MEMBERS, confirm=lambda c: False,
                                url_policy=lambda c, u: False).tools
    assert br.MEMBERS == tuple(BROWSER_MEMBERS)
    assert br.tool_schemas() == {t["name"][len("browser_"):]: t["parameters"] for t in page_tools}
    assert set(br.ROLES) >= {"button", "textbox", "radio"}


def _click(**arguments):
    return {"member": "click", "arguments": arguments}


@pytest.mark.parametrize("turn, why", [
    ({"browser": []}, "browser must be a non-empty list"),
    ({"browser": [5]}, "browser[0]: a call must be an object"),
    ({"browser": [{"member": "teleport", "arguments": {}}]}, "browser[0].member: unknown member \"teleport\""),
    ({"browser": [{"member": "click"}]}, "browser[0].arguments: required"),
    ({"browser": [{"member": "click", "arguments": {"target": "r"}, "why": 1}]}, "browser[0].why: unknown field"),
    ({"browser": [_click(target="r", colour="red")]}, "browser[0].arguments.colour: unknown field"),
    ({"browser": [_click()]}, "browser[0].arguments.target: required"),
    ({"browser": [_click(target=5)]}, "browser[0].arguments.target: expected string, got integer"),
    ({"browser": [_click(target="r", tab_id=3)]}, "arguments.tab_id: expected string or null"),
    ({"browser": [{"member": "switch_tab", "arguments": {}}]}, "arguments.tab_id: required"),
    ({"browser": [{"member": "read_page", "arguments": {"filter": "some"}}]}, "arguments.filter: must be one of"),
    ({"browser": [{"member": "wait_for", "arguments": {"text": "x", "timeout_ms": 30001}}]},
     "arguments.timeout_ms: must be at most 30000"),
    ({"browser": [{"member": "wait_for", "arguments": {"text": "x", "timeout_ms": True}}]},
     "arguments.timeout_ms: expected integer, got boolean"),
    ({"browser": [{"member": "scroll", "arguments": {"direction": "down", "amount": -1}}]},
     "arguments.amount: must be at least 0"),
    ({"browser": [{"member": "zoom", "arguments": {"region": [1, 2, 3]}}]}, "arguments.region: needs at least 4"),
    ({"browser": [{"member": "zoom", "arguments": {"region": [9, 0, 3, 5]}}]}, "refused by the SDK's own check"),
    ({"browser": [{"member": "wait_for", "arguments": {"text": "   ", "timeout_ms": 5}}]},
     "arguments.text (Value error, must hold text"),  # the SDK's check names no field: the agent's model does
    ({"browser": [{"member": "find", "arguments": {"query": "x" * 257}}]},
     "arguments.query (Value error, must hold text, at most 256 bytes"),  # the SDK takes it, the agent would not
    ({"browser": [{"member": "run_script", "arguments": {"source": "1", "timeout_ms": 5}}]},
     "'run_script' is a member of the SDK's BrowserToolset the guest agent does not serve"),
    ({"browser": [_click(target={"label": "Book", "role": "link"})]}, "arguments.target.role: must be one of"),
    ({"browser": [_click(target={"label": ""})]}, "arguments.target.label: required, a non-empty string"),
    ({"browser": [_click(target={"name": "Book"})]}, "arguments.target.name: unknown field"),
    ({"browser": [_click(target={"label": "x" * 300})]}, "longer than 256 UTF-8 bytes"),
    ({"browser": [{"member": "key", "arguments": {"keys": {"label": "x"}}}]}, "arguments.keys: expected array"),
    ({"browser": [_click(target="r")] * 33}, "at most 32"),
    ({"browser": [_click(target="r")], "pending_safety_checks": []}, "unknown fields ['pending_safety_checks']"),
    ({"browser": [_click(target="r")], "expect_retry": {"after_s": 1, "actions": [{"type": "wait"}]}},
     "expect_retry"),
    ({"browser": [_click(target="r")], "expect_timeout_s": 3}, "expect: required"),
    ({"browser": [_click(target={"label": "Book"})], "expect_timeout_s": 0}, "expect_timeout_s"),
    ({"browser": [_click(target="r")], "usage": 5}, "usage may only be null"),
    ({"browser": [_click(target="r")], "actions": [{"type": "wait"}]}, "exactly one of"),
])
def test_bad_browser_turns_are_refused_at_load_naming_the_line(tmp_path, turn, why):
    path = tmp_path / "s.jsonl"
    path.write_text(json.dumps({"message": "first"}) + "\n" + json.dumps(turn) + "\n")
    with pytest.raises(ScriptError, match="s.jsonl:2") as info:
        load_script(path)
    assert why in str(info.value) and "\n" not in str(info.value)


def test_valid_browser_turns_load_as_written(tmp_path):
    turns = [{"comment": "read", "usage": None, "browser": [{"member": "read_page", "arguments": {"filter": "all"}}]},
             {"browser": [_click(target={"label": "Book", "role": "button"}), _click(target="opaque-ref", tab_id="t2"),
                          {"member": "type", "arguments": {"target": {"label": "Name"}, "text": ""}},
                          {"member": "new_tab", "arguments": {"url": None}},
                          {"member": "zoom", "arguments": {"region": [0, 0, 10, 10]}}], "expect_timeout_s": 3},
             {"expect": [RED_BOX], "browser": [{"member": "list_tabs", "arguments": {}}]},
             {"message": "done"}]
    path = tmp_path / "s.jsonl"
    path.write_text("".join(json.dumps(t) + "\n" for t in turns))
    assert load_script(path) == turns
    assert ScriptedModel(turns).wait_allowance == 2 * MAX_WAITS_PER_TURN


def test_sdk_schema_keywords_this_check_does_not_know_are_noticed(monkeypatch):
    monkeypatch.setattr(br, "_SCHEMA_KEYWORDS", br._SCHEMA_KEYWORDS - {"maxItems"})
    br.tool_schemas.cache_clear()
    try:
        with pytest.raises(RuntimeError, match="maxItems"):
            br.tool_schemas()
    finally:
        monkeypatch.undo()
        br.tool_schemas.cache_clear()



def test_a_legacy_computer_tool_among_function_tools_still_gets_single_action_waits():
    white = _png(Image.new("RGB", (200, 100), "#ffffff"))
    legacy = {"type": "computer_use_preview", "display_width": 200, "display_height": 100, "environment": "linux"}
    with ScriptedServer(ScriptedModel([{"expect": [RED_BOX], "actions": [{"type": "wait"}]}])) as server:
        resp = scripted.post(server, {"model": "m", "tools": [*toolset(PageStandIn()).tools, legacy], "input": [
            {"role": "user", "content": [{"type": "input_image", "image_url": white}]}]})
    (call,) = resp.json()["output"]
    assert call["call_id"] == "call_0000_wait_001" and call["action"] == {"type": "wait"} and "actions" not in call
