"""Fixtures for the console tests: a real ConsoleServer on 127.0.0.1 (uvicorn in its thread), a
logged-in httpx session against it, LiveRuns with a real ApprovalRegistry, run records on disk, and
(for frames and input) a private desktop: Xvfb + the real agent + the event-logging probe window."""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from controller.chromium import launch as launch_chromium
from controller.console.server import ConsoleServer
from controller.run.live import LiveRun
from controller.run.registry import ApprovalRegistry
from tests.conformance.harness import poll
from tests.helpers import QuietHandler, reply, serve_http
from tests.require import require_commands

LIVE_ID = "20300101-000000-live-abcd"

from tests.require import require_browser  # noqa: F401 - used by the browser tests


class Session:
    """An httpx client logged in through the console's one-time URL; ``csrf`` from the page's meta.
    :meth:`post` sends what the page sends (Origin, X-CSRF-Token) unless told otherwise."""

    def __init__(self, server: ConsoleServer) -> None:
        self.server = server
        self.client = httpx.Client(base_url=server.base, timeout=httpx.Timeout(15.0))
        login = self.client.get(server.url)
        assert login.status_code == 303 and login.headers["location"] == server.auth.base + "/", login.text
        page = self.client.get("/")
        assert page.status_code == 200, page.text
        found = re.search(r'<meta name="csrf-token" content="([^"]+)">', page.text)
        assert found, page.text
        self.csrf = found.group(1)

    def get(self, path: str, **kwargs: Any) -> httpx.Response:
        return self.client.get(path, **kwargs)

    def post(self, path: str, body: Any = None, *, raw: bytes | None = None,
             headers: dict[str, str] | None = None, drop: tuple[str, ...] = ()) -> httpx.Response:
        sent = {"Origin": self.server.origin, "X-CSRF-Token": self.csrf, "Content-Type": "application/json"}
        sent.update(headers or {})
        for name in drop:
            sent.pop(name, None)
        content = raw if raw is not None else json.dumps({} if body is None else body).encode()
        return self.client.post(path, content=content, headers=sent)

    def close(self) -> None:
        self.client.close()


@pytest.fixture
def runs_dir(tmp_path: Path) -> Path:
    runs = tmp_path / "runs"
    runs.mkdir()
    return runs


@pytest.fixture
def console(runs_dir: Path) -> Iterator[ConsoleServer]:
    server = ConsoleServer(runs_dir).start()
    yield server
    server.stop()


@pytest.fixture
def session(console: ConsoleServer) -> Iterator[Session]:
    s = Session(console)
    yield s
    s.close()


def make_live(runs_dir: Path, run_id: str = LIVE_ID, timeout_s: float | None = 300.0) -> LiveRun:
    """A LiveRun (with a real ApprovalRegistry) whose record directory is ``runs_dir/run_id``."""
    (runs_dir / run_id).mkdir(exist_ok=True)
    return LiveRun(run_id, runs_dir / run_id, ApprovalRegistry(timeout_s))


class Runner:
    """What the runner gives a LiveRun: the cancel callback and the human-action recorder, and the
    model loop's step boundary (:meth:`pause_at_boundary`: a thread in ``live.checkpoint``)."""

    def __init__(self, live: LiveRun) -> None:
        self.live = live
        self.cancelled_by: list[str] = []
        self.human: list[dict[str, Any]] = []
        self._cancel = threading.Event()
        self.thread: threading.Thread | None = None

    def attach(self, agent: Any, screen: tuple[int, int]) -> None:
        self.live.attach(agent, screen, cancel=self.cancel, record_human=self.human.append, task_name="console-test")

    def cancel(self, by: str) -> None:
        self.cancelled_by.append(by)
        self._cancel.set()

    def pause_at_boundary(self) -> None:
        """Start the loop's thread at a step boundary (it waits there while a person has control)."""
        self.thread = threading.Thread(target=self.live.checkpoint, args=(self._cancel.is_set,),
                                       kwargs={"screenshot": True}, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self._cancel.set()
        if self.thread is not None:
            self.thread.join(10)


def wait_state(live: LiveRun, state: str, timeout: float = 10.0) -> None:
    """Wait (events, not sleeps) until ``live.state == state``; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    seq = 0
    while live.state != state:
        left = deadline - time.monotonic()
        if left <= 0:
            pytest.fail(f"the run never reached state {state!r} (it is {live.state!r})")
        for event in live.events_after(seq, min(left, 1.0)):
            seq = event["seq"]


def until(predicate: Any, timeout: float = 10.0, what: str = "condition") -> Any:
    """Call ``predicate`` until it is truthy; return it, or fail after ``timeout`` seconds
    (:func:`tests.conformance.harness.poll`)."""
    return poll(predicate, timeout=timeout, what=what)


def image_bytes(fmt: str = "PNG", size: tuple[int, int] = (8, 6)) -> bytes:
    """A small real image (``PNG`` or ``JPEG``), as a run's screenshot file holds."""
    import io

    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", size, (40, 90, 160)).save(out, fmt)
    return out.getvalue()


def write_record(runs_dir: Path, run_id: str, started: str, task: str, status: str | None) -> Path:
    """A record on disk: ``run_started`` at ``started`` (UTC ISO) and, unless ``status`` is None,
    ``run_finished`` with it."""
    run = runs_dir / run_id
    run.mkdir()
    lines = [{"type": "run_started", "ts": started, "format": 1, "task": {"name": task}, "mode": "offline"}]
    if status is not None:
        lines.append({"type": "run_finished", "ts": started, "status": status, "reason": "because"})
    (run / "record.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    return run


class Desktop:
    """A private desktop for frames and input (tests.loop.conftest.Desk: Xvfb, the agent, the probe)."""

    def __init__(self) -> None:
        from tests.loop.conftest import Desk

        self.desk = Desk(1280, 800)
        self.client = self.desk.client
        self.probe = self.desk.probe
        self.size = (self.desk.xvfb.width, self.desk.xvfb.height)

    def close(self) -> None:
        self.desk.close()


@pytest.fixture(scope="module")
def desktop() -> Iterator[Desktop]:
    require_commands("X", "Xvfb", install="apt-get install xvfb")
    d = Desktop()
    yield d
    d.close()


@pytest.fixture
def live_desktop(runs_dir: Path, console: ConsoleServer, desktop: Desktop) -> Iterator[tuple[LiveRun, Runner]]:
    """A LiveRun attached to the real desktop and registered in the console."""
    live = make_live(runs_dir)
    runner = Runner(live)
    runner.attach(desktop.client, desktop.size)
    console.add_run(live)
    yield live, runner
    runner.close()
    live.finish("cancelled")


__all__ = ["LIVE_ID", "Runner", "Session", "make_live", "require_browser", "until", "wait_state",
           "write_record"]


@pytest.fixture
def live(runs_dir: Path, console: ConsoleServer) -> LiveRun:
    """A LiveRun (:func:`make_live`) shown in ``console``."""
    run = make_live(runs_dir)
    console.add_run(run)
    return run


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Debian's chromium through Playwright (:func:`tests.require.require_browser`), headless, its sandbox
    on (:func:`controller.chromium.launch`); one per module (each test opens its own pages or contexts)."""
    require_browser()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = launch_chromium(playwright)
        yield chromium
        chromium.close()


@pytest.fixture
def other_site() -> Iterator[tuple[str, dict[str, str], list[str]]]:
    """Another program's web server on 127.0.0.1 (another port): serves whatever page is put in
    ``pages`` and notes every request it gets (``seen``), with its Cookie header."""
    pages: dict[str, str] = {}
    seen: list[str] = []

    class Handler(QuietHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            seen.append(f"{self.path} cookie={self.headers.get('Cookie')}")
            body = pages.get(self.path.split("?")[0], "").encode()
            reply(self, 200 if body else 404, body, "text/html")

    server = serve_http(Handler)
    yield f"http://127.0.0.1:{server.server_address[1]}", pages, seen
    server.shutdown()
