"""Many viewers of one run: the page's one socket (``/runs/{id}/live``: events and frames on one
WebSocket) and the run's one grab loop (:class:`controller.console.frames.FrameFeed`), on the private
desktop (Xvfb, the real agent) and in a real browser (Debian's chromium through Playwright).

* **Six tabs** of one browser on a run page with a pending approval: each shows the card, and Approve
  in the first decides the request at once (a browser keeps six HTTP/1.1 connections per host: tabs
  holding HTTP streams would leave the POST none).
* **A hidden tab** asks for no frame: with only that tab watching, the grabs stop until it shows again.
* **One grab loop**: viewers of both kinds (the page's socket, ``screen.mjpeg``) share one loop -- never
  two screenshots at once, the grab rate of one viewer -- and each still gets its frames.
* **A page socket that never reads** (its receive buffer full) drives no grabs once a frame or two
  fill its buffers: the grabs stop while it stays connected, it is dropped after the send deadline, and
  a viewer that reads gets fresh frames.
* **The socket's protocol**: the events in order as the event stream sends them, a frame only when
  asked for, ``{"frames": 0}`` stops them, a message of another shape closes it (1008); who may open
  it: the session cookie, the Host and the console's own Origin (a refusal is the JSON error).
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import ClientConnection, connect

from controller.console import streams
from tests.console.conftest import LIVE_ID, Runner, make_live, until

JPEG = b"\xff\xd8\xff"
WINDOW_S = 3.0
"""How long the viewers are watched (seconds)."""
FPS = 5.0


class Counting:
    """The desktop's own agent client, noting its screenshots: how many in all and at most at once
    (every other call goes straight through)."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self._lock = threading.Lock()
        self._now = 0
        self.most = 0
        self.total = 0

    def screenshot(self, **kwargs: Any) -> Any:
        with self._lock:
            self._now += 1
            self.total += 1
            self.most = max(self.most, self._now)
        try:
            return self._client.screenshot(**kwargs)
        finally:
            with self._lock:
                self._now -= 1

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


@pytest.fixture
def counted(runs_dir, console, desktop) -> Iterator[tuple[Any, Counting]]:
    """A LiveRun on the private desktop whose screenshots are counted, shown in ``console``."""
    live = make_live(runs_dir)
    agent = Counting(desktop.client)
    runner = Runner(live)
    runner.attach(agent, desktop.size)
    console.add_run(live)
    yield live, agent
    runner.close()
    live.finish("cancelled")


def socket_url(console, path: str = f"/runs/{LIVE_ID}/live") -> str:
    return f"ws://127.0.0.1:{console.port}{console.auth.base}{path}"


def open_socket(session, path: str = f"/runs/{LIVE_ID}/live", *, sock: socket.socket | None = None,
                **kwargs: Any) -> ClientConnection:
    """The page's socket as the logged-in browser opens it (its cookie, the console's Origin)."""
    cookie = "; ".join(f"{c.name}={c.value}" for c in session.client.cookies.jar)
    return connect(socket_url(session.server, path), origin=session.server.origin, sock=sock,
                   additional_headers={"Cookie": cookie}, open_timeout=10, **kwargs)


def recv_json(ws: ClientConnection) -> dict[str, Any]:
    message = ws.recv(timeout=10)
    assert isinstance(message, str), "a frame came where an event was due"
    return json.loads(message)


def settled(agent: Counting) -> bool:
    """Whether the agent took no screenshot over one second."""
    before = agent.total
    time.sleep(1.0)  # a span of wall time without a grab is what is checked
    return agent.total == before


# -- six tabs -----------------------------------------------------------------------------------------
def test_six_tabs_each_show_the_card_and_approve_in_the_first_decides_it(browser, console, live_desktop):
    from playwright.sync_api import expect

    live, _runner = live_desktop
    request = live.registry.open("safety_check", "Go on?", call_id="call_1",
                                 checks=[{"id": "c1", "code": "malicious_instructions", "message": "odd page"}])
    context = browser.new_context(viewport={"width": 1200, "height": 800})
    context.set_default_timeout(15_000)
    try:
        login = context.new_page()
        login.goto(console.url)
        tabs = [login] + [context.new_page() for _ in range(5)]
        for tab in tabs:
            tab.goto(f"{console.base}/runs/{LIVE_ID}", wait_until="domcontentloaded")
        for n, tab in enumerate(tabs):
            expect(tab.locator("#conn"), f"tab {n + 1}").to_have_text("live")
            expect(tab.locator(f'.card[data-request-id="{request.id}"]'), f"tab {n + 1}").to_be_visible()
            tab.wait_for_function("() => document.getElementById('screen-img').naturalWidth > 0")
        started = time.monotonic()
        tabs[0].locator(".card").get_by_role("button", name="Approve").click()
        until(lambda: request.state == "approved", timeout=5.0, what="Approve in the first tab to decide the request")
        assert request.by == "console" and time.monotonic() - started < 5.0
        for n, tab in enumerate(tabs):  # every view is told
            expect(tab.locator(".card"), f"tab {n + 1}").to_have_count(0)
            expect(tab.locator("#no-approvals"), f"tab {n + 1}").to_be_visible()
    finally:
        context.close()


HIDE_JS = """(hidden) => {
  Object.defineProperty(document, "visibilityState", {value: hidden ? "hidden" : "visible", configurable: true});
  document.dispatchEvent(new Event("visibilitychange"));
}"""
"""Hide or show the page as the browser does when its tab goes to the background (headless tabs stay visible)."""


def test_a_hidden_tab_asks_for_no_frames(browser, console, counted):
    live, agent = counted
    page = browser.new_page()
    try:
        page.goto(console.url)
        page.goto(f"{console.base}/runs/{LIVE_ID}", wait_until="domcontentloaded")
        page.wait_for_function("() => window.DSScreen.frames() >= 3")
        page.evaluate(HIDE_JS, True)
        until(lambda: settled(agent), what="the grabs to stop while the only tab is hidden")
        shown = page.evaluate("() => window.DSScreen.frames()")
        page.evaluate(HIDE_JS, False)
        page.wait_for_function("(n) => window.DSScreen.frames() >= n + 3", arg=shown)
    finally:
        page.close()


# -- one grab loop --------------------------------------------------------------------------------------
class Viewer(threading.Thread):
    """One viewer reading frames at :data:`FPS` until :meth:`stop`: ``kind`` ``socket`` (the page's
    socket, asking for each frame) or ``mjpeg`` (``screen.mjpeg``); ``frames``: arrival times."""

    def __init__(self, session, kind: str) -> None:
        super().__init__(daemon=True)
        self.session, self.kind = session, kind
        self.frames: list[float] = []
        self.error: BaseException | None = None
        self._done = threading.Event()

    def stop(self) -> None:
        self._done.set()
        self.join(10)
        assert not self.is_alive() and self.error is None, self.error

    def run(self) -> None:
        try:
            self._socket() if self.kind == "socket" else self._mjpeg()
        except BaseException as exc:  # noqa: BLE001 - reported by stop()
            self.error = exc

    def _socket(self) -> None:
        with open_socket(self.session) as ws:
            ws.send(json.dumps({"frames": FPS}))
            while not self._done.is_set():
                message = ws.recv(timeout=5)
                if isinstance(message, bytes):
                    assert message.startswith(JPEG)
                    self.frames.append(time.monotonic())
                    ws.send(json.dumps({"frames": FPS}))

    def _mjpeg(self) -> None:
        with self.session.client.stream("GET", f"/runs/{LIVE_ID}/screen.mjpeg", params={"fps": FPS},
                                        timeout=httpx.Timeout(10.0)) as resp:
            assert resp.status_code == 200
            seen = 0
            for chunk in resp.iter_bytes():
                seen += chunk.count(b"--" + streams.BOUNDARY.encode() + b"\r\n")
                while len(self.frames) < seen - 1:  # a part is whole once the next one opens
                    self.frames.append(time.monotonic())
                if self._done.is_set():
                    return


def watch(session, kinds: list[str], agent: Counting) -> tuple[int, list[Viewer]]:
    """Start a viewer of each kind, let each get a frame, then count the grabs over :data:`WINDOW_S`."""
    viewers = [Viewer(session, kind) for kind in kinds]
    for viewer in viewers:
        viewer.start()
    until(lambda: all(v.frames for v in viewers) or any(v.error for v in viewers), what="every viewer's first frame")
    before, started = agent.total, time.monotonic()
    time.sleep(WINDOW_S)  # the measuring window: grabs are counted over a span of wall time
    grabs = agent.total - before
    for viewer in viewers:
        viewer.stop()
        got = [t for t in viewer.frames if t >= started]
        assert len(got) >= FPS * WINDOW_S * 0.5, (viewer.kind, len(got))  # each still gets its frames
    return grabs, viewers


def test_viewers_of_both_kinds_share_one_grab_loop(session, counted, console):
    live, agent = counted
    one, _ = watch(session, ["socket"], agent)
    six, _ = watch(session, ["socket", "socket", "socket", "mjpeg", "mjpeg", "mjpeg"], agent)
    assert agent.most == 1, f"{agent.most} screenshots at once: more than one grab loop"
    # six viewers at 5 fps cost about what one does (a loop of their own each: six times as much)
    assert six <= one * 1.6 + 3 and six <= streams.FPS_MAX * WINDOW_S + 2, (one, six)
    feed = console.state.feeds[LIVE_ID]
    until(lambda: not feed.running, what="the grab loop to end once nobody watches")
    assert settled(agent)  # and no grab without a viewer


# -- a viewer that never reads --------------------------------------------------------------------------
def small_socket(console) -> socket.socket:
    """A client socket to the console whose receive buffer is small (it never reads)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(10)
    sock.connect(("127.0.0.1", console.port))
    return sock


def test_a_socket_viewer_that_never_reads_drives_no_grabs_and_is_dropped(session, counted, console, monkeypatch):
    """A page socket that asks for frames over and over and reads none (its client queues one message,
    its receive buffer is small): a frame or two fill its buffers, then no grab; a send waits past
    SEND_TIMEOUT_S and the socket is dropped; a viewer that reads gets fresh frames all along."""
    live, agent = counted
    monkeypatch.setattr(streams, "SEND_TIMEOUT_S", 3.0)
    asking = threading.Event()
    with open_socket(session, sock=small_socket(console), max_queue=1) as stalled:
        def ask() -> None:
            while not asking.is_set():
                try:
                    stalled.send(json.dumps({"frames": streams.FPS_MAX}))
                except ConnectionClosed:
                    return
                asking.wait(0.05)  # as often as a page that shows 20 frames a second would ask

        threading.Thread(target=ask, daemon=True).start()
        try:
            until(lambda: agent.total > 0, what="the first frame")
            until(lambda: settled(agent), timeout=10.0, what="the grabs to stop while nobody reads")
            stalled_at = agent.total
            assert stalled_at <= 30, stalled_at
            until(lambda: console.state.sockets == 0, timeout=15.0, what="the stalled socket to be dropped")
        finally:
            asking.set()
        with pytest.raises(ConnectionClosed):  # what it had in its buffers, then the end
            while True:
                stalled.recv(timeout=10)
    viewer = Viewer(session, "socket")
    viewer.start()
    until(lambda: len(viewer.frames) >= 3, what="a reading viewer's frames")
    viewer.stop()


# -- the socket's protocol ------------------------------------------------------------------------------
def test_the_socket_carries_the_events_in_order_and_frames_only_when_asked(session, live, console):
    Runner(live).attach(None, (1280, 800))
    live.on_entry({"type": "action", "ts": "2030-01-01T00:00:01.000+00:00", "action": "click (1,2) left"})
    request = live.registry.open("action", "ok <b>?</b>")
    with open_socket(session, f"/runs/{LIVE_ID}/live?after=1") as ws:
        snapshot, state, *replayed = (recv_json(ws) for _ in range(4))
        assert snapshot["event"] == "approvals" and snapshot["id"] is None
        assert snapshot["data"]["snapshot"]["version"] == 1
        assert [r["id"] for r in snapshot["data"]["snapshot"]["pending"]] == [request.id]
        assert state["event"] == "state" and state["data"]["state"] == "running" and state["data"]["last_seq"] == 3
        assert [(e["event"], e["id"]) for e in replayed] == [("record", 2), ("approvals", 3)]
        assert replayed[1]["data"]["snapshot"]["pending"][0]["question"] == "ok <b>?</b>"
        live.registry.answer(request.id, "deny", by="terminal")
        assert recv_json(ws)["id"] == 4
        live.on_forward([{"type": "type", "text": "secret words"}])
        action = recv_json(ws)
        assert action["event"] == "action" and action["data"]["action"] == {"type": "type", "text_length": 12}
        live.finish("passed")
        assert [(m["event"], m["data"].get("state") or m["data"].get("status")) for m in
                (recv_json(ws), recv_json(ws))] == [("control", "finished"), ("end", "passed")]
        with pytest.raises(ConnectionClosed):
            ws.recv(timeout=10)
        assert ws.close_code == 1000


def test_frames_come_one_per_request_and_stop_on_zero(session, counted):
    live, agent = counted
    with open_socket(session) as ws:
        assert [recv_json(ws)["event"] for _ in range(3)] == ["approvals", "state", "control"]
        with pytest.raises(TimeoutError):
            ws.recv(timeout=1.0)  # nothing asked: no frame
        ws.send(json.dumps({"frames": 10}))
        frame = ws.recv(timeout=10)
        assert isinstance(frame, bytes) and frame.startswith(JPEG) and len(frame) > 1000
        grabs = agent.total
        # the next at 1 fps (due a second after the last one's grab), but the tab is hidden before
        ws.send(json.dumps({"frames": 1}))
        ws.send(json.dumps({"frames": 0}))
        with pytest.raises(TimeoutError):
            ws.recv(timeout=1.5)
        assert agent.total == grabs  # nothing grabbed for it either
        ws.send(json.dumps({"frames": 1}))  # shown again
        frame = ws.recv(timeout=10)
        assert isinstance(frame, bytes) and frame.startswith(JPEG)
        with pytest.raises(TimeoutError):
            ws.recv(timeout=1.5)  # one frame per request


@pytest.mark.parametrize("message", ["junk", "[]", '{"frames": -1}', '{"frames": "5"}', '{"frames": true}',
                                     '{"frames": 5, "more": 1}', '{"fps": 5}', "NaN", b"\x00binary"])
def test_a_message_of_another_shape_closes_the_socket(session, live, message):
    with open_socket(session) as ws:
        [recv_json(ws) for _ in range(2)]
        ws.send(message)
        error = recv_json(ws)
        assert error["event"] == "error" and error["data"]["code"] == "invalid_message", error
        with pytest.raises(ConnectionClosed):
            ws.recv(timeout=10)
        assert ws.close_code == 1008


def test_a_message_over_the_cap_closes_the_socket(session, live):
    with open_socket(session) as ws:
        [recv_json(ws) for _ in range(2)]
        ws.send(json.dumps({"frames": 1, "pad": "x" * streams.MAX_CLIENT_MESSAGE}))
        with pytest.raises(ConnectionClosed):
            ws.recv(timeout=10)
        assert ws.close_code == 1009


def _refused(console, path: str, **kwargs: Any) -> tuple[int, dict[str, Any], Any]:
    with pytest.raises(InvalidStatus) as caught:
        connect(socket_url(console, path), open_timeout=10, **kwargs).close()
    response = caught.value.response
    return response.status_code, json.loads(bytes(response.body)), response.headers


def test_who_may_open_the_socket(session, live, console):
    cookie = {"Cookie": "; ".join(f"{c.name}={c.value}" for c in session.client.cookies.jar)}
    run = f"/runs/{LIVE_ID}/live"
    cases = [
        ({"origin": console.origin}, 401, "unauthenticated"),  # no cookie
        ({"additional_headers": cookie}, 403, "bad_origin"),  # no Origin at all
        ({"origin": "http://127.0.0.1:1", "additional_headers": cookie}, 403, "bad_origin"),  # another local site
        ({"origin": "null", "additional_headers": cookie}, 403, "bad_origin"),
        ({"origin": f"http://localhost:{console.port}", "additional_headers": cookie}, 403, "bad_origin"),
        ({"origin": console.origin, "additional_headers": {**cookie, "Sec-Fetch-Site": "same-site"}}, 403,
         "cross_site"),
    ]
    for kwargs, status, code in cases:
        got_status, body, headers = _refused(console, run, **kwargs)
        assert (got_status, body["error"]["code"]) == (status, code), kwargs
        assert headers["Cross-Origin-Resource-Policy"] == "same-origin"
    for path, status, code in ((f"/runs/nope/live", 404, "unknown_run"), (f"{run}?after=x", 400, "invalid_event_id"),
                               ("/runs/a..b/live", 404, "unknown_run")):
        got = _refused(console, path, origin=console.origin, additional_headers=cookie)
        assert (got[0], got[1]["error"]["code"]) == (status, code), path
    # the console's own page, addressed as localhost: its own Origin is the console's
    with connect(f"ws://localhost:{console.port}{console.auth.base}{run}", origin=f"http://localhost:{console.port}",
                 additional_headers=cookie, open_timeout=10) as ws:
        assert recv_json(ws)["event"] == "approvals"


def test_a_socket_outlives_the_deadlines_of_the_http_request_it_came_as(session, live, monkeypatch):
    """The handshake is an HTTP request; once upgraded, no deadline of the HTTP connection (its next
    request's head, a body's rate: wire.connections) closes the socket."""
    from wire import connections

    monkeypatch.setattr(connections, "HEAD_TIMEOUT_S", 0.3)
    monkeypatch.setattr(connections, "BODY_WINDOW_S", 0.3)
    with open_socket(session) as ws:
        [recv_json(ws) for _ in range(2)]
        with pytest.raises(TimeoutError):
            ws.recv(timeout=1.0)  # three head deadlines pass without a message
        live.on_entry({"type": "action", "ts": "2030-01-01T00:00:01.000+00:00", "action": "later"})
        assert recv_json(ws)["data"]["entry"]["action"] == "later"


def test_stopping_the_console_closes_open_sockets(session, live, console):
    Runner(live).attach(None, (1280, 800))
    with open_socket(session) as ws:
        [recv_json(ws) for _ in range(3)]
        ws.send(json.dumps({"frames": 5}))
        started = time.monotonic()
        console.stop()
        assert time.monotonic() - started < 2.5 and not console._thread.is_alive()
        with pytest.raises(ConnectionClosed):
            ws.recv(timeout=5)
