"""``report --html``: the review page of a run (controller.report).

A record written here with RunRecord (every action kind, approvals, network decisions, checks, hostile
strings, a hostile screenshot ``file``) is rendered and read back with an HTML parser: each step shows
its screenshot with the actions drawn at their model px coordinates, every record string is escaped,
nothing outside the run directory is read. The last test runs the real pickup task offline on a local
desktop and opens its page in Chromium."""

from __future__ import annotations

import base64
import io
from html.parser import HTMLParser
from pathlib import Path
from typing import Any, Literal, Optional

import pytest
from PIL import Image

from controller.report import render_report, write_report
from controller.run import entries as entries_mod
from controller.run import shots
from controller.run.record import RunRecord
from tests.controller.hostile_text import EVIL, RAW
from tests.controller.test_cli import _offline_cli as _cli

ROOT = Path(__file__).resolve().parents[2]
W, H = 320, 200
SCRIPT = "<script>alert(1)</script>"


def _png(color: tuple[int, int, int], size: tuple[int, int] = (W, H)) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", size, color).save(out, "PNG")
    return out.getvalue()


class Page(HTMLParser):
    """Every element of a page: ``{tag, attrs, ancestors, text}`` (``text``: all text inside it)."""

    VOID = {"meta", "img", "br", "link", "input", "hr"}

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.elements: list[dict[str, Any]] = []
        self._stack: list[dict[str, Any]] = []
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, Optional[str]]], closed: bool = False) -> None:
        el = {"tag": tag, "attrs": dict(attrs), "ancestors": list(self._stack), "text": ""}
        self.elements.append(el)
        if tag not in self.VOID and not closed:
            self._stack.append(el)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, Optional[str]]]) -> None:
        self.handle_starttag(tag, attrs, closed=True)

    def handle_endtag(self, tag: str) -> None:
        while self._stack:
            if self._stack.pop()["tag"] == tag:
                break

    def handle_data(self, data: str) -> None:
        for el in self._stack:
            el["text"] += data

    def find(self, tag: str, *, within: Optional[dict[str, Any]] = None, **attrs: str) -> list[dict[str, Any]]:
        """Elements ``tag`` with these attributes (``class_`` matches one class), inside ``within``."""
        def match(el: dict[str, Any], key: str, value: str) -> bool:
            if key == "class_":
                return value in (el["attrs"].get("class") or "").split()
            return el["attrs"].get(key) == value

        return [el for el in self.elements if el["tag"] == tag
                and (within is None or any(a is within for a in el["ancestors"]))
                and all(match(el, k, v) for k, v in attrs.items())]

    def step(self, n: int) -> dict[str, Any]:
        (article,) = self.find("article", id=f"step-{n}")
        return article

    def mark(self, n: int, kind: str, step: int = 1) -> dict[str, Any]:
        (group,) = self.find("g", within=self.step(step), class_=kind, **{"data-n": str(n)})
        return group


SHOTS = {1: _png((200, 30, 30)), 2: _png((30, 200, 30)), 3: _png((30, 30, 200))}
OUTSIDE = _png((1, 2, 3), (7, 5))  # a PNG outside the run directory: the page must never carry it


def _hostile_record(tmp_path: Path, status: str = "failed") -> RunRecord:
    """A finished record of 4 steps: every action kind (step 1), a left scroll and a pending check
    (step 2), a legacy single-action call (step 3), the final message (step 4), shown on a screenshot
    entry naming a file outside the run directory."""
    rec = RunRecord(tmp_path / "runs", "run-hostile")
    rec.write("run_started", task={"name": f"demo {SCRIPT}", "source": "tasks/demo.toml"}, mode="offline",
              model="scripted", image="local")
    rec.write("approval", what="opt-in", decision="approved", by="command line", codes=["sensitive_action"])
    rec.save_screenshot(SHOTS[1], "image/png", image_size=(W, H), frame=(0, 0, 640, 400), screen_size=(640, 400))
    rec.write("expectation", turn=0, call_id="call_1", met=True, expected=["color #ffffff in 10x10 at (0,0)"])
    rec.write("model_response", response_id="resp_1", http_status=200, usage={"total_tokens": 100})
    rec.write("computer_call", call_id="call_1", form="actions", actions=[
        {"type": "click", "x": 10, "y": 20, "button": "right"},
        {"type": "double_click", "x": 30, "y": 40},
        {"type": "drag", "path": [{"x": 50, "y": 60}, {"x": 70, "y": 80}, {"x": 90, "y": 100}]},
        {"type": "scroll", "x": 110, "y": 120, "scroll_x": 0, "scroll_y": 300},
        {"type": "move", "x": 130, "y": 140, "keys": ["shift"]},
        {"type": "type", "text_length": 7},
        {"type": "keypress", "keys": ["ctrl", "c"]},
        {"type": "wait"},
        # a hand-edited record may carry typed text: the page shows its length only
        {"type": "type", "text": "hunter2-typed-secret"},
    ])
    rec.write("action", call_id="call_1", action="click", duration_ms=3.0)
    rec.write("action", call_id="call_1", action="drag", duration_ms=3.0, error=f"boom {SCRIPT}")
    rec.write("network", seq=1, origin="https://allowed.example", decision="allow", reason="allowlisted")
    rec.write("network", seq=2, origin=f"http://evil.example/{SCRIPT}\u202e", decision="deny",
              reason="not allowed \x1b[2J")
    rec.save_screenshot(SHOTS[2], "image/png", image_size=(W, H), frame=(0, 0, 640, 400), call_id="call_1")
    rec.write("model_response", response_id="resp_2", http_status=200)
    rec.write("computer_call", call_id="call_2", form="actions",
              pending_checks=[{"id": "sc_1", "code": "sensitive_action", "message": "<img src=x onerror=alert(1)>"}],
              actions=[{"type": "scroll", "x": 300, "y": 10, "scroll_x": -200, "scroll_y": 0}])
    rec.write("approval", what="safety_check", decision="approved", by="console", call_id="call_2",
              codes=["sensitive_action"], message=EVIL)
    rec.write("action", call_id="call_2", action="scroll", duration_ms=2.0)
    rec.save_screenshot(SHOTS[3], "image/png", image_size=(W, H), frame=(0, 0, 640, 400), call_id="call_2")
    rec.write("expectation", turn=2, call_id="call_3", met=False, reason="deadline passed",
              unmet=[{"kind": "color", "expected": "white", "observed": "<b>black</b>"}])
    rec.write("model_response", response_id="resp_3", http_status=200)
    rec.write("computer_call", call_id="call_3", form="action", actions=[{"type": "click", "x": 5, "y": 6,
                                                                          "button": "left"}])
    rec.write("action", call_id="call_3", action="click", duration_ms=1.0)
    (tmp_path / "outside.png").write_bytes(OUTSIDE)
    rec.write("screenshot", file="../outside.png", sha256="0" * 64, mime="image/png", image_size=(W, H),
              frame=(0, 0, 640, 400), call_id="call_3")
    rec.write("model_response", response_id="resp_4", http_status=200)
    rec.write("check", kind="file", target="/home/sandbox/Documents/out.txt", rule="text",
              expected=SCRIPT, observed="a\x1b[2Jb\u202e", passed=False, detail="differs <here>")
    rec.write("check", kind="sqlite", target="/home/sandbox/app.db", rule="rows of: SELECT 1",
              expected=[[1]], observed=[[1]], passed=True)
    rec.write("network_log", complete=True, decisions=2)
    rec.finish(status, f"1 of 2 checks {SCRIPT}", final_message=f"done {EVIL}", timings={"loop": 1.5, "verify": 0.25},
               wall_s=3.0)
    rec.close()
    return rec


@pytest.fixture
def hostile(tmp_path: Path) -> tuple[RunRecord, str, Page]:
    rec = _hostile_record(tmp_path)
    text = render_report(rec.dir)
    return rec, text, Page(text)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def test_each_step_shows_the_screenshot_the_model_chose_its_actions_on(hostile):
    _, text, page = hostile
    assert len(page.find("article", class_="step")) == 4 and not page.find("article", class_="unshown")
    for n, shot in ((1, 1), (2, 2), (3, 3)):
        (img,) = page.find("img", within=page.step(n))
        assert img["attrs"]["src"] == f"data:image/png;base64,{_b64(SHOTS[shot])}", n
        assert img["attrs"]["width"] == str(W) and img["attrs"]["height"] == str(H)
        (svg,) = page.find("svg", within=page.step(n))
        assert svg["attrs"]["viewbox"] == f"0 0 {W} {H}"  # model px: the screenshot's image_size
    # the last step sent no call: it saw the screenshot after call_3 (not readable), and ended with words
    assert not page.find("img", within=page.step(4)) and "done :warning:" in page.step(4)["text"]
    assert "screenshot ../outside.png not shown: not a screenshot file name" in page.step(4)["text"]
    assert "1 right" in page.mark(1, "click")["text"]
    # grouping: approvals, network and failed calls in step 1; the pending check and denial in step 2
    s1, s2 = page.step(1)["text"], page.step(2)["text"]
    assert "https://allowed.example" in s1 and "drag: boom <script>" in s1
    assert "sensitive_action" in s2 and "approved" in s2 and "console" in s2 and "allowed.example" not in s2
    assert "color #ffffff" in s1 and "deadline passed" in page.step(3)["text"]  # each expectation before its call
    assert "command line" in page.find("section", id="before")[0]["text"]


def test_actions_are_drawn_at_their_model_px(hostile):
    _, _, page = hostile

    def attrs(group: dict[str, Any], tag: str, cls: str) -> list[dict[str, str]]:
        return [e["attrs"] for e in page.find(tag, within=group, class_=cls)]

    click = page.mark(1, "click")
    assert {(a["cx"], a["cy"]) for a in attrs(click, "circle", "ring")} == {("10", "20")}
    double = page.mark(2, "double_click")
    rings = attrs(double, "circle", "ring")
    assert len(rings) == 2 and {(a["cx"], a["cy"]) for a in rings} == {("30", "40")}
    drag = page.mark(3, "drag")
    assert attrs(drag, "polyline", "line")[0]["points"] == "50,60 70,80 90,100"
    assert attrs(drag, "polygon", "head")[0]["points"].startswith("90,100 ")  # arrowhead at the end
    scroll = page.mark(4, "scroll")
    (line,) = attrs(scroll, "line", "line")
    assert (line["x1"], line["y1"], line["x2"]) == ("110", "120", "110") and float(line["y2"]) > 120  # down
    left = page.mark(1, "scroll", step=2)
    (line,) = attrs(left, "line", "line")
    assert (line["x1"], line["y1"], line["y2"]) == ("300", "10", "10") and float(line["x2"]) < 300  # left
    move = page.mark(5, "move")
    diamond = [tuple(map(float, p.split(","))) for p in attrs(move, "polygon", "ring")[0]["points"].split()]
    assert sum(x for x, _ in diamond) / 4 == 130 and sum(y for _, y in diamond) / 4 == 140
    assert "5 move +shift" in move["text"]
    notes = [e["text"] for e in page.find("li", within=page.step(1), class_="note")]
    assert notes == ["6 typed 7 chars", "7 keys ctrl+c", "8 wait", "9 typed ? chars"]
    assert "typed" not in page.mark(1, "click", step=3)["text"] and page.mark(1, "click", step=3)
    assert not page.find("g", within=page.step(4))


def test_record_strings_are_escaped_and_typed_text_never_shown(hostile):
    _, text, page = hostile
    assert "<script" not in text.lower() and "<img src=x" not in text and "<b>black" not in text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text and "&lt;img src=x onerror=alert(1)&gt;" in text
    raw = [hex(ord(c)) for c in RAW if c in text]
    assert not raw, raw
    assert "\\u202e" in text and "\\x1b[2J" in text and ":warning:\\x1b]0;TITLE\\x07[red]styled[/]" in text
    assert "hunter2" not in text
    assert page.find("title")[0]["text"].startswith("demo <script>")  # shown as text, parsed as text


def test_the_page_loads_nothing_from_anywhere(hostile):
    _, text, page = hostile
    (csp,) = page.find("meta", **{"http-equiv": "Content-Security-Policy"})
    assert csp["attrs"]["content"] == ("default-src 'none'; img-src data: 'self'; media-src 'self'; "
                                       "style-src 'unsafe-inline'")
    before = [e["tag"] for e in page.elements[:page.elements.index(csp)]]
    assert before == ["html", "head", "meta"]  # after the charset, before anything the browser could load
    assert not page.find("script") and not page.find("iframe")
    assert [link["attrs"] for link in page.find("link")] == [{"rel": "icon", "href": "data:,"}]  # no icon to fetch
    for el in page.elements:
        for name, value in el["attrs"].items():
            if name in ("src", "href") and el["tag"] != "link":
                assert value.startswith(("data:image/", "#")), (el["tag"], name, value[:80])
    assert "url(" not in text and "@import" not in text


def test_the_checks_table_and_the_verdict(hostile):
    _, _, page = hostile
    (table,) = page.find("table", within=page.find("section", id="checks")[0])
    rows = [[td["text"] for td in page.find("td", within=tr)] for tr in page.find("tr", within=table)[1:]]
    assert rows[0] == ["file", "/home/sandbox/Documents/out.txt", "text", '"<script>alert(1)</script>"',
                       '"a\\u001b[2Jb\\u202e"', "fail", "differs <here>"]
    assert rows[1] == ["sqlite", "/home/sandbox/app.db", "rows of: SELECT 1", "[[1]]", "[[1]]", "pass", ""]
    verdict = page.find("section", id="verdict")[0]["text"]
    assert "failed" in verdict and "1 of 2 checks <script>" in verdict and "read in full (2 decisions)" in verdict
    timings = page.find("section", id="timings")[0]["text"]
    assert "loop" in timings and "1.50" in timings and "3.0 s" in timings


def test_a_screenshot_file_outside_the_run_directory_is_never_read(tmp_path):
    rec = _hostile_record(tmp_path)
    outside = tmp_path / "elsewhere.png"
    outside.write_bytes(OUTSIDE)
    # the third screenshot becomes a symlink out of the directory: not followed either
    (rec.dir / "shot-0003.png").unlink()
    (rec.dir / "shot-0003.png").symlink_to(outside)
    text = render_report(rec.dir)
    assert _b64(OUTSIDE) not in text and _b64(OUTSIDE)[:40] not in text
    page = Page(text)
    assert not page.find("img", within=page.step(3))
    assert "not shown: is a symbolic link (not followed)" in page.step(3)["text"]  # O_NOFOLLOW: refused
    # the marks stay, over an empty frame of the image's size
    assert page.mark(1, "click", step=3)

    seen: list[str] = []
    served = render_report(rec.dir, embed_images=False, image_url=lambda name: seen.append(name) or f"/shots/{name}")
    assert seen == ["shot-0001.png", "shot-0002.png"] and "data:image" not in served
    assert [i["attrs"]["src"] for i in Page(served).find("img")] == ["/shots/shot-0001.png", "/shots/shot-0002.png"]


@pytest.mark.parametrize("name, why", [("/etc/passwd", "not a screenshot file name"),
                                       ("shot-0001.png/..", "not a screenshot file name"),
                                       ("shot-0001.jpg", "not a PNG or JPEG as its name says"),
                                       ("shot-0002.png", "larger than")])
def test_read_shot_refuses(tmp_path, monkeypatch, name, why):
    (tmp_path / "shot-0001.jpg").write_bytes(SHOTS[1])  # a PNG named .jpg
    (tmp_path / "shot-0002.png").write_bytes(SHOTS[1])
    if why == "larger than":
        monkeypatch.setattr(shots, "MAX_SHOT_BYTES", len(SHOTS[1]) - 1)
    data, reason = shots.read_shot(tmp_path, name)
    assert data is None and reason.startswith(why)
    assert shots.read_shot(tmp_path / "nope", "shot-0001.png")[0] is None


def test_unknown_and_future_entries_are_shown_as_text(tmp_path, monkeypatch):
    """A record with ``human_action`` entries (the web console's take-over) renders them in their step."""

    class HumanAction(entries_mod._Entry):
        type: Literal["human_action"] = "human_action"
        action: Any = None
        by: Optional[str] = None

    class FutureThing(entries_mod._Entry):
        type: Literal["future_thing"] = "future_thing"
        detail: Any = None

    monkeypatch.setitem(entries_mod.ENTRY_TYPES, "human_action", HumanAction)
    monkeypatch.setitem(entries_mod.ENTRY_TYPES, "future_thing", FutureThing)
    rec = RunRecord(tmp_path, "run-human")
    rec.write("run_started", task={"name": "t"})
    rec.save_screenshot(SHOTS[1], "image/png", image_size=(W, H), frame=(0, 0, W, H))
    rec.write("model_response", response_id="r1")
    rec.write("computer_call", call_id="c1", actions=[{"type": "move", "x": 1, "y": 2}])
    rec.write("human_action", action={"type": "type", "text": "person-secret"}, by=f"console {SCRIPT}")
    rec.write("human_action", action="click (3,4) left", by="console")
    rec.write("future_thing", detail=f"x {SCRIPT}")
    rec.save_screenshot(SHOTS[2], "image/png", image_size=(W, H), frame=(0, 0, W, H), call_id="c1")
    rec.finish("cancelled", "SIGINT")
    rec.close()
    page = Page(text := render_report(rec.dir))
    step = page.step(1)["text"]
    assert "type <13 chars>" in step and "click (3,4) left" in step and "console <script>" in step
    assert "future_thing" in step and '"detail": "x <script>' in step
    assert "person-secret" not in text and "<script" not in text
    # the screen after the last call, which the model never answered: shown after the steps
    (after,) = page.find("article", class_="unshown")
    assert page.find("img", within=after)[0]["attrs"]["src"] == f"data:image/png;base64,{_b64(SHOTS[2])}"


def test_write_report_replaces_a_symlink_instead_of_following_it(tmp_path):
    rec = _hostile_record(tmp_path)
    victim = tmp_path / "victim.txt"
    victim.write_text("keep")
    (rec.dir / "report.html").symlink_to(victim)
    path = write_report(rec.dir / "record.jsonl")
    assert path == rec.dir / "report.html" and not path.is_symlink() and victim.read_text() == "keep"
    assert path.read_text(encoding="utf-8") == render_report(rec.dir)
    assert not [p for p in rec.dir.iterdir() if p.name.startswith(".report-")]


@pytest.mark.parametrize("status, code", [("passed", 0), ("failed", 1), ("cancelled", 1)])
def test_cli_report_html_writes_the_page_and_exits_by_the_verdict(tmp_path, status, code):
    rec = _hostile_record(tmp_path, status)
    out = _cli("report", str(rec.dir), "--html", cwd=tmp_path)
    assert out.returncode == code, out.stderr
    assert out.stdout == f"{rec.dir / 'report.html'}\n"
    assert f'<span class="status {status}">{status}</span>' in (rec.dir / "report.html").read_text(encoding="utf-8")


@pytest.mark.parametrize("content", [None, "{not json\n", '{"type": "run_started", "task": "x"}\n'])
def test_cli_report_html_refuses_bad_input_in_one_line(tmp_path, content):
    run = tmp_path / "run"
    if content is not None:
        run.mkdir()
        (run / "record.jsonl").write_text(content)
    out = _cli("report", str(run), "--html", cwd=tmp_path)
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1 and "Traceback" not in out.stderr
    assert "cannot read the run record" in out.stderr and out.stdout == ""
    assert not (run / "report.html").exists()
    both = _cli("report", str(run), "--html", "--json", cwd=tmp_path)
    assert both.returncode == 2 and "not both" in both.stderr


@pytest.mark.slow
def test_the_pickup_runs_report_in_chromium(tmp_path):
    """The real pickup task, run offline on a local desktop (tests/loop's LocalSandbox), then its page."""
    from controller.run.record import read_entries
    from controller.run.runner import RunOptions, run_task
    from controller.run.tasks import load_task
    from tests.loop.local_sandbox import LocalSandbox
    from tests.require import require_browser, require_commands

    require_browser()
    require_commands("X", "firefox-esr", "openbox", "xterm", install="apt-get install firefox-esr openbox xterm")
    task = load_task(ROOT / "tasks" / "pickup.toml")
    with LocalSandbox(openbox=True, pickup=True) as sb:
        launch = [l.model_copy(update={"args": [a.replace(":8080/", f":{sb.pickup_port}/") for a in l.args]})
                  for l in task.launch]
        outcome = run_task(task.model_copy(update={"launch": launch}), lambda t: sb,
                           RunOptions(runs_dir=tmp_path, live=False, terminal=False))
    assert outcome.status == "passed", outcome.reason
    out = _cli("report", str(outcome.record_dir), "--html", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    entries = read_entries(outcome.record_dir)
    responses = sum(e.type == "model_response" for e in entries)
    first_click = next(e for e in entries if e.type == "computer_call").actions[0]
    assert responses >= 7 and first_click["type"] == "click"

    from playwright.sync_api import sync_playwright

    from controller.chromium import launch as launch_chromium

    with sync_playwright() as pw:  # leaving it closes the browser
        page = launch_chromium(pw).new_page(viewport={"width": 1280, "height": 900})
        problems: list[str] = []
        page.on("pageerror", lambda exc: problems.append(f"page error: {exc}"))
        page.on("console", lambda m: problems.append(m.text) if m.type in ("error", "warning") else None)
        page.on("requestfailed", lambda r: problems.append(f"request {r.url[:80]}"))
        # the browser runs as nobody when the tests run as root (controller.chromium), and pytest's
        # tmp_path is private to the test's user: the self-contained page is handed over as content
        page.set_content(Path(out.stdout.strip()).read_text(encoding="utf-8"))
        assert page.locator("article.step[id^=step-]").count() == responses
        for i in range(1, responses + 1):
            step = page.locator(f"#step-{i}")
            step.scroll_into_view_if_needed()
            assert step.is_visible()
            assert step.locator("img").evaluate("i => i.complete && i.naturalWidth") > 0, f"step {i}: no image"
        # the first click is drawn where it was made: its ring's centre over the image at x/W, y/H
        box = page.locator("#step-1 img").bounding_box()
        width, height = next(e for e in entries if e.type == "screenshot").image_size
        ring = page.locator("#step-1 g.mark.click circle.ring").first.bounding_box()
        assert abs(ring["x"] + ring["width"] / 2 - (box["x"] + first_click["x"] / width * box["width"])) < 2
        assert abs(ring["y"] + ring["height"] / 2 - (box["y"] + first_click["y"] / height * box["height"])) < 2
        assert page.locator("#checks tbody tr").count() == 3
        assert not problems, problems


def test_a_call_that_never_ran_is_listed_not_drawn(tmp_path):
    """A denied call (no ``action`` entry of its id) is listed with a ``not run`` badge and has no marks on
    the screenshot; the call that ran in the same record is drawn."""
    rec = RunRecord(tmp_path, "run-denied")
    rec.write("run_started", task={"name": "t"})
    rec.save_screenshot(SHOTS[1], "image/png", image_size=(W, H), frame=(0, 0, W, H))
    rec.write("model_response", response_id="r1")
    rec.write("computer_call", call_id="ran", actions=[{"type": "click", "x": 11, "y": 12, "button": "left"}])
    rec.write("action", call_id="ran", action="click", duration_ms=1.0)
    rec.save_screenshot(SHOTS[2], "image/png", image_size=(W, H), frame=(0, 0, W, H), call_id="ran")
    rec.write("model_response", response_id="r2")
    rec.write("computer_call", call_id="denied", actions=[{"type": "click", "x": 21, "y": 22, "button": "left"}],
              pending_checks=[{"id": "sc", "code": "sensitive_action", "message": "m"}])
    rec.write("approval", what="safety_check", decision="denied", by="console", call_id="denied",
              codes=["sensitive_action"])
    rec.finish("failed", "safety check sensitive_action denied by console")
    rec.close()
    page = Page(render_report(rec.dir))
    first, second = page.step(1), page.step(2)
    assert "not run" not in first["text"] and "not run" in second["text"].lower()
    assert page.find("g", within=first, class_="mark")  # the click that ran is drawn
    assert not page.find("g", within=second, class_="mark")  # the denied one is not


def test_origin_requests_are_shown_with_their_origin_decision_and_the_connection(tmp_path):
    """The gateway held a connection until an origin request was decided: the step shows the approval
    (origin, decision, who, how long, the request id) and the network decision it led to (held for how
    long, the same id); an opt-in from --approve-origin is shown before the first step. Every string
    is escaped."""
    rec = RunRecord(tmp_path / "runs", "run-origins")
    rec.write("run_started", task={"name": "origins"}, mode="offline", model="scripted")
    rec.write("approval", what="opt-in", decision="approved", by="command line", origin="https://opted.test",
              message="--approve-origin https://opted.test")
    rec.save_screenshot(SHOTS[1], "image/png", image_size=(W, H), frame=(0, 0, 640, 400))
    rec.write("model_response", response_id="resp_1", http_status=200)
    rec.write("computer_call", call_id="call_1", form="actions", actions=[{"type": "click", "x": 1, "y": 2,
                                                                           "button": "left"}])
    rec.write("action", call_id="call_1", action="click", duration_ms=3.0)
    rec.write("approval", what="origin_access", decision="timeout", by="timeout",
              origin=f"https://evil.test:8443/{SCRIPT}\u202e", request_id="oreq_one", latency_ms=25000.0)
    rec.write("network", seq=1, origin="https://evil.test:8443", decision="deny", reason="timeout",
              request_id="oreq_one", held_ms=25001)
    rec.write("approval", what="origin_access", decision="cancelled", by="gateway_log",
              origin="https://other.test", request_id="oreq_two")
    rec.finish("passed", "ok")
    rec.close()
    text = render_report(rec.dir)
    page = Page(text)
    step = page.step(1)["text"]
    assert "timeout origin_access https://evil.test:8443/<script>alert(1)</script>\\u202e by timeout" in step
    assert "after 25.0 s" in step and "oreq_one" in step and "held 25001 ms" in step
    assert "cancelled origin_access https://other.test by gateway_log" in step
    assert "\u202e" not in text and "<script>alert" not in text
    before = page.find("section", id="before")[0]["text"]
    assert "approved opt-in https://opted.test by command line" in " ".join(before.split())


def test_a_step_without_a_screenshot_is_flagged_only_when_the_model_should_have_had_one(tmp_path):
    """A run of browser tools sends the model no screenshot unless it asks for one: its steps say so plainly;
    a computer step without one is still flagged as missing (the red ``noshot`` line)."""
    from controller.run.entries import BrowserCall, BrowserResult, ModelResponse

    rec = RunRecord(tmp_path, "run-browser")
    rec.write("run_started", task={"name": "t"})
    rec.write(ModelResponse(response_id="r1", http_status=200))
    rec.write(BrowserCall(step=1, call_id="c1", member="read_page", ok=True, result=BrowserResult(kind="read", elements=3)))
    rec.write(ModelResponse(response_id="r2", http_status=200, text="done"))
    rec.finish("passed", "1 of 1 checks")
    rec.close()
    page = Page(render_report(rec.dir))
    for n in (1, 2):
        plain = page.find("div", within=page.step(n), class_="plain")
        assert plain and "browser tools" in plain[0]["text"], page.step(n)["text"]
    rec = RunRecord(tmp_path, "run-computer")
    rec.write("run_started", task={"name": "t"})
    rec.write("model_response", response_id="r1")
    rec.write("computer_call", call_id="c", actions=[{"type": "wait"}])
    rec.finish("error", "no screenshot")
    rec.close()
    page = Page(render_report(rec.dir))
    flagged = page.find("div", within=page.step(1), class_="noshot")
    assert flagged and "plain" not in flagged[0]["attrs"]["class"] and "browser" not in flagged[0]["text"]


def test_the_typing_and_keys_labels_cover_at_most_a_strip_of_the_screenshot(tmp_path):
    """In chromium, at a wide and a narrow window: the labels of a step's actions without a point
    (typing, keys, waits; as many as a step lists, some long), with their backdrop, cover no more of
    the screenshot than a strip along one edge: where their box overlaps the image it is at most 15% of
    the image's height tall or 15% of its width wide. They are shown all the same."""
    from playwright.sync_api import sync_playwright

    from controller.chromium import launch as launch_chromium
    from controller.model.marks import MAX_NOTES
    from tests.require import require_browser

    require_browser()
    size = (1280, 800)
    rec = RunRecord(tmp_path / "runs", "run-notes")
    rec.write("run_started", task={"name": "notes"}, mode="offline", model="scripted", image="local")
    rec.save_screenshot(_png((40, 90, 160), size), "image/png", image_size=size, frame=(0, 0, *size))
    rec.write("model_response", response_id="resp_1", http_status=200)
    actions = [{"type": "click", "x": 640, "y": 400, "button": "left"}]
    for i in range(MAX_NOTES + 3):
        actions.append({"type": "type", "text_length": 12} if i % 2 else
                       {"type": "keypress", "keys": ["ctrl", "alt", "shift", "super", "F12"] * 3})
    rec.write("computer_call", call_id="call_1", form="actions", actions=actions)
    for action in actions:
        rec.write("action", call_id="call_1", action=action["type"], duration_ms=1.0)
    rec.finish("passed", "ok")
    rec.close()
    html = render_report(rec.dir)

    with sync_playwright() as pw:  # leaving it closes the browser
        page = launch_chromium(pw).new_page(viewport={"width": 1280, "height": 900})
        page.set_content(html)
        for width in (1280, 700):  # the step's details beside the image, and below it
            page.set_viewport_size({"width": width, "height": 900})
            image = page.locator("#step-1 img").bounding_box()
            labels = page.locator("#step-1 .note")
            assert labels.count() == MAX_NOTES, width
            assert labels.first.is_visible() and labels.last.is_visible()
            boxes = [b for b in (el.bounding_box() for el in page.locator("#step-1 .note, #step-1 .notes").all())
                     if b and b["width"] and b["height"]]
            left, top = min(b["x"] for b in boxes), min(b["y"] for b in boxes)
            right = max(b["x"] + b["width"] for b in boxes)
            bottom = max(b["y"] + b["height"] for b in boxes)
            wide = max(0.0, min(right, image["x"] + image["width"]) - max(left, image["x"]))
            tall = max(0.0, min(bottom, image["y"] + image["height"]) - max(top, image["y"]))
            assert wide <= 0.15 * image["width"] or tall <= 0.15 * image["height"], (width, image, boxes)


def test_regions_kept_out_of_pictures_are_told_in_words(tmp_path):
    """A ``redaction`` line -- before the first model response (a sign-in filled at the start) or in a
    step (a person's typing) -- reads as the terminal says it, never as the entry's JSON."""
    rec = RunRecord(tmp_path, "run-redacted")
    rec.write("run_started", task={"name": "t"})
    rec.write("redaction", why="sign_in", box=None)
    rec.save_screenshot(SHOTS[1], "image/png", image_size=(W, H), frame=(0, 0, W, H))
    rec.write("model_response", response_id="r1")
    rec.write("redaction", why="typing", box=(10, 20, 300, 200))
    rec.finish("passed")
    rec.close()
    text = " ".join(Page(render_report(rec.dir)).find("body")[0]["text"].split())
    assert "kept out of every picture: the whole screen: the agent was filling a sign-in form" in text
    assert "kept out of every picture: the region 10,20 300x200: a person typed during a takeover" in text
    assert '"why"' not in text and "held_before" not in text
