"""The web console end to end: real runs (the real SDK loop against the scripted model, a real desktop)
and a real browser (Debian's chromium through Playwright) doing what a person does in the console.

* **Approve** in the page: the call's actions run and the task passes; the record says ``by: console``.
* **Deny** in the page: not one input event of that call reaches the desktop (the event-logging probe
  window covers the screen and logs what X delivers).
* **Cancel run** through the real CLI on Docker (``run-task --ui`` with stdin not a terminal): the URL
  it prints opens the run's page, the card goes, the command exits 130, the record ends ``cancelled``
  with the approval ``withdrawn`` and nothing of the sandbox remains.
* **Take over, click, Resume**: the person's click on the live screen lands at the scaled spot, is
  recorded between the two ``takeover`` lines, and the model's next screenshot shows it.

Every wait is on a condition (a page element, a record line, a probe event, the process) with a deadline.
``DESKTOP_SANDBOX_SCREENSHOTS=DIR`` (e.g. ``docs``) also writes ``DIR/console.png``: the approval-demo
run's live page with its card open, 1280 px wide (the README's picture).
"""

from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from PIL import Image

from controller.console.server import ConsoleServer
from controller.run.live import LiveRun
from controller.run.progress import make_console
from controller.run.record import read_entries
from controller.run.runner import RunOptions, RunOutcome, run_task, watching
from controller.run.tasks import Task, load_task
from tests.loop.local_sandbox import LocalSandbox
from tests.require import require_commands, unavailable
from wire.screen_match import changed_share

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
TASKS = ROOT / "tasks"
DEADLINE_MS = 60_000
"""Longest wait for anything in the page (ms): a run's card, a state, the end of a run."""
EXPECT_DEFAULT_MS = 5_000
"""Playwright's own default for ``expect`` (other modules' tests rely on it)."""
RUN_DEADLINE_S = 90.0
"""Longest wait for a run (or the CLI) to end once the person has acted."""
TERMINAL_ARGS = ["-T", "Terminal", "-fa", "DejaVu Sans Mono", "-fs", "11", "-e", "bash", "-c",
                 'mkdir -p ~/.cache && touch ~/.cache/terminal-ready && cd && exec env PS1="sandbox:\\w\\$ " bash --norc -i']
"""tasks/approval-demo.toml's terminal: the strip at the bottom (images/openbox/rc.xml), prompt ``sandbox:~$``."""
TITLE_ACTIVE = "#8eb1dd"
"""The terminal's title bar when it has the focus (openbox's Clearlooks theme, as tasks/*.offline.jsonl)."""


# -- the browser -------------------------------------------------------------------------------------
@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    """A fresh browser context (no console cookie yet), 1280 px wide; page errors fail the test."""
    from playwright.sync_api import expect

    expect.set_options(timeout=DEADLINE_MS)  # global in Playwright: set back below
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    context.set_default_timeout(DEADLINE_MS)
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    try:
        yield page
    finally:
        expect.set_options(timeout=EXPECT_DEFAULT_MS)
        context.close()
    assert errors == [], f"errors in the console's page: {errors}"


def open_run(page: Any, url: str, run_id: str) -> None:
    """Log in with the one-time URL, then open the run from the runs list, as a person does."""
    from playwright.sync_api import expect

    page.goto(url)
    page.locator("#runs a", has_text=run_id).click()
    expect(page.locator("#conn")).to_have_text("live")


def wait_card(page: Any) -> Any:
    """The approval card once it is shown, with the screenshot the model had loaded in it."""
    from playwright.sync_api import expect

    card = page.locator(".card")
    expect(card).to_have_count(1)
    page.wait_for_function("() => { const i = document.querySelector('.card img');"
                           " return i !== null && i.complete && i.naturalWidth === 1280; }")
    return card


# -- a run in this process, the console beside it ----------------------------------------------------
class Run:
    """``run_task`` in a thread with a :class:`ConsoleServer` as its view (``server.add_run`` as
    ``watching``, no terminal asker), as ``run-task --ui`` sets it up."""

    def __init__(self, task: Task, sandbox: Any, runs_dir: Path, server: ConsoleServer) -> None:
        self.server = server
        self.live: LiveRun | None = None
        self.outcome: RunOutcome | None = None
        self.error: BaseException | None = None
        self._started = threading.Event()
        # --approval-timeout's default: a test that fails while a card is open cancels the run (abandon)
        options = RunOptions(runs_dir=runs_dir, live=False, terminal=False, approval_timeout_s=300.0)
        self._thread = threading.Thread(target=self._run, args=(task, sandbox, options), daemon=True)
        self._thread.start()
        assert self._started.wait(30), "the run never gave its LiveRun to the console"

    def _on_live(self, live: LiveRun) -> None:
        self.server.add_run(live)
        self.live = live
        self._started.set()

    def _run(self, task: Task, sandbox: Any, options: RunOptions) -> None:
        try:
            self.outcome = run_task(task, lambda _task: sandbox, options, console=make_console(stderr=True),
                                    views=[watching(self._on_live)])
        except BaseException as exc:  # noqa: BLE001 - reported by finish()
            self.error = exc

    @property
    def run_id(self) -> str:
        assert self.live is not None
        return self.live.run_id

    def finish(self) -> RunOutcome:
        """The outcome once the run has ended (at most :data:`RUN_DEADLINE_S`)."""
        self._thread.join(RUN_DEADLINE_S)
        assert not self._thread.is_alive(), f"the run did not end within {RUN_DEADLINE_S:g} s"
        if self.error is not None:
            raise self.error
        assert self.outcome is not None
        return self.outcome

    def abandon(self) -> None:
        """After a failed test: cancel the run if it still goes, and wait for its teardown."""
        if self._thread.is_alive() and self.live is not None:
            try:
                self.live.cancel("test")
            except Exception:  # noqa: BLE001 - not started or already over
                pass
        self._thread.join(RUN_DEADLINE_S)


class KeptOpen:
    """A sandbox the run may not close (its ``close`` does nothing): the test reads the desktop after
    the run, then closes it itself."""

    def __init__(self, sandbox: Any) -> None:
        self._sandbox = sandbox

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sandbox, name)

    def close(self) -> None:
        pass


@contextmanager
def console_run(task: Task, sandbox: Any, runs_dir: Path) -> Iterator[Run]:
    with ConsoleServer(runs_dir) as server:
        run = Run(task, sandbox, runs_dir, server)
        try:
            yield run
        finally:
            run.abandon()


def desktop_apps() -> None:
    require_commands("X", "Xvfb", "openbox", "xterm", install="apt-get install xvfb openbox xterm")


def write_task(directory: Path, name: str, toml: str, turns: list[dict[str, Any]]) -> Task:
    """A task file and its offline script (contract 2 and 3) in ``directory``, loaded."""
    (directory / f"{name}.offline.jsonl").write_text("".join(json.dumps(t) + "\n" for t in turns))
    path = directory / f"{name}.toml"
    path.write_text(toml + f'\n[offline]\nscript = "{name}.offline.jsonl"\n')
    return load_task(path)


def entries_of(outcome: RunOutcome, kind: str) -> list[Any]:
    return [e for e in read_entries(outcome.record_dir) if e.type == kind]


# -- a. Approve --------------------------------------------------------------------------------------
def test_approve_in_the_console_and_the_actions_run(tmp_path, page):
    from playwright.sync_api import expect

    desktop_apps()
    task = load_task(TASKS / "approval-demo.toml")
    with LocalSandbox(openbox=True) as sb, console_run(task, sb, tmp_path / "runs") as run:
        open_run(page, run.server.url, run.run_id)
        card = wait_card(page)
        expect(card.locator(".checks .code")).to_have_text("sensitive_action")
        expect(card.locator(".checks")).to_contain_text("The model wants to write a file in your home directory.")
        expect(card.locator(".actions li")).to_have_text(
            ["type 'mkdir -p ~/Documents && echo approved > ~/Documents/approval.txt'", "keypress Return"])
        page.wait_for_function("() => document.getElementById('screen-img').naturalWidth > 0")
        shots = os.environ.get("DESKTOP_SANDBOX_SCREENSHOTS")
        if shots:
            Path(shots).mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(Path(shots) / "console.png"))
        card.get_by_role("button", name="Approve", exact=True).click()
        expect(card).to_have_count(0)
        outcome = run.finish()
        expect(page.locator("#takeover")).to_have_count(0)  # the finished run's page: its report

    assert outcome.status == "passed", outcome.reason
    assert [(c["target"].endswith("/Documents/approval.txt"), c["passed"]) for c in outcome.checks] == [(True, True)]
    (approval,) = entries_of(outcome, "approval")
    assert (approval.decision, approval.by, approval.codes) == ("approved", "console", ["sensitive_action"])


# -- b. Deny -----------------------------------------------------------------------------------------
PROBE_TASK = """
name = "deny-probe"
instructions = "Click on the window and type a line into it."
max_steps = 4

# the event-logging probe window (python -m guest probe --log FILE): it covers the screen, takes the
# keyboard focus and logs every event X delivers to it
[[launch]]
app = "probe"
args = ["{log}"]

[[ready]]
file = "~/probe.jsonl"
timeout_s = 20

[[checks]]
kind = "file"
path = "~/probe.jsonl"
match = "regex"
value = '"type": ?"ready"'
"""

PROBE_TURNS = [
    {"comment": "once the probe's white window covers the screen, click it: the probe must log this one",
     "expect": [{"kind": "color", "x": 0, "y": 0, "w": 1280, "h": 800, "rgb": "#ffffff", "tolerance": 8,
                 "fraction": 0.99}],
     "actions": [{"type": "click", "x": 100, "y": 100, "button": "left"}]},
    {"comment": "a call with a pending safety check: none of it may reach the desktop unless a person approves",
     "actions": [{"type": "click", "x": 900, "y": 500, "button": "left"},
                 {"type": "type", "text": "never typed"},
                 {"type": "keypress", "keys": ["Return"]}],
     "pending_safety_checks": [{"id": "sc_probe_1", "code": "sensitive_action",
                                "message": "The model wants to click and type on the probe window."}]},
    {"message": "done"},
]
INPUT = ("KeyPress", "ButtonPress", "MotionNotify")


def probe_events(log: Path) -> list[dict[str, Any]]:
    """The probe's complete lines so far."""
    text = log.read_text() if log.exists() else ""
    return [json.loads(line) for line in text[: text.rfind("\n") + 1].splitlines() if line]


def wait_probe(log: Path, predicate: Any, what: str, timeout: float = 20.0) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while True:
        events = probe_events(log)
        if predicate(events):
            return events
        assert time.monotonic() < deadline, f"timed out waiting for the probe to log {what}: {events[-5:]}"
        # poll interval: the probe's log is a file, with nothing to wait on
        time.sleep(0.02)


def test_deny_in_the_console_and_no_input_reaches_the_desktop(tmp_path, page):
    from playwright.sync_api import expect

    require_commands("X", "Xvfb", install="apt-get install xvfb")
    with LocalSandbox() as sb:
        log = sb.home / "probe.jsonl"
        task = write_task(tmp_path, "deny-probe", PROBE_TASK.replace("{log}", str(log)), PROBE_TURNS)
        with console_run(task, KeptOpen(sb), tmp_path / "runs") as run:
            open_run(page, run.server.url, run.run_id)
            card = wait_card(page)
            expect(card.locator(".actions li")).to_have_text(
                ["click (900,500) left", "type 'never typed'", "keypress Return"])
            # the first call's click reached the probe: it sees what the run sends
            wait_probe(log, lambda ev: any(e["type"] == "ButtonPress" and (e["x"], e["y"]) == (100, 100)
                                           for e in ev), "the first call's click")
            mark = len(probe_events(log))
            card.get_by_role("button", name="Deny", exact=True).click()
            expect(card).to_have_count(0)
            outcome = run.finish()
            # a sentinel move straight to the agent: once the probe logged it, it logged all before it
            sb.agent.actions([{"type": "move", "x": 1277, "y": 798}])
            events = wait_probe(log, lambda ev: any(e["type"] == "MotionNotify" and (e["x"], e["y"]) == (1277, 798)
                                                    for e in ev[mark:]), "the sentinel move")[mark:]

    sentinel = next(i for i, e in enumerate(events) if e["type"] == "MotionNotify" and (e["x"], e["y"]) == (1277, 798))
    assert [e for e in events[:sentinel] if e["type"] in INPUT] == [], "input of the denied call reached the desktop"
    assert outcome.status == "failed", outcome.reason
    assert [c["passed"] for c in outcome.checks] == [True]  # the probe ran: only the denial failed the run
    (approval,) = entries_of(outcome, "approval")
    assert (approval.decision, approval.by) == ("denied", "console")
    assert [e for e in entries_of(outcome, "action") if e.call_id == approval.call_id] == []


# -- c. Cancel run, through the CLI on Docker ---------------------------------------------------------
def docker_client() -> Any:
    """The engine's client, after :func:`unavailable` (``IMAGE``) without an engine or the guest image."""
    image = os.environ.get("DESKTOP_SANDBOX_IMAGE", "desktop-sandbox:latest")
    try:
        import docker

        client = docker.from_env()
        client.ping()
    except Exception as exc:  # noqa: BLE001 - any failure means: no engine here
        unavailable("IMAGE", f"no Docker engine: {exc}")
    try:
        client.images.get(image)
    except Exception:  # noqa: BLE001 - ImageNotFound, or the engine refused
        unavailable("IMAGE", f"image {image} missing: build it with `make desktop`")
    return client


class Cli:
    """``desktop-sandbox ARGS`` in a subprocess, stdin not a terminal; stderr read line by line."""

    URL = re.compile(r"console: (http://127\.0\.0\.1:[0-9]+/\S*login\?t=\S+)")

    def __init__(self, *args: str) -> None:
        command = Path(sys.executable).parent / "desktop-sandbox"
        argv = [str(command)] if command.exists() else [sys.executable, "-m", "controller.cli"]
        env = {k: v for k, v in os.environ.items() if k not in ("OPENAI_API_KEY", "COLUMNS", "FORCE_COLOR")}
        self.proc = subprocess.Popen([*argv, *args], cwd=ROOT, env=env, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.stderr: list[str] = []
        self.url: str | None = None
        self._got_url = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.stderr.append(line.rstrip("\n"))
            found = self.URL.match(line)
            if found and self.url is None:
                self.url = found.group(1)
                self._got_url.set()
        self._got_url.set()

    def console_url(self, timeout: float = 60.0) -> str:
        self._got_url.wait(timeout)
        assert self.url, "no `console: URL` line on stderr:\n" + "\n".join(self.stderr)
        return self.url

    def wait_line(self, prefix: str, timeout: float = 60.0) -> str:
        """The first stderr line starting with ``prefix``, waiting for it (the process's own pace)."""
        deadline = time.monotonic() + timeout
        while True:
            found = next((line for line in list(self.stderr) if line.startswith(prefix)), None)
            if found is not None:
                return found
            assert self.proc.poll() is None and time.monotonic() < deadline, \
                f"no line {prefix!r} on stderr:\n" + "\n".join(self.stderr)
            # poll interval: the reader thread appends lines; there is nothing else to wait on
            time.sleep(0.02)

    def wait(self, timeout: float = RUN_DEADLINE_S) -> tuple[int, str]:
        out, _ = self.proc.communicate(timeout=timeout)
        self._reader.join(10)
        return self.proc.returncode, out

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)  # the run is cancelled and its sandbox removed
            try:
                self.proc.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.communicate()


@pytest.mark.docker
def test_cancel_run_with_a_card_open_through_the_cli_on_docker(tmp_path, page):
    from playwright.sync_api import expect

    client = docker_client()
    runs = tmp_path / "runs"
    cli = Cli("run-task", "tasks/approval-demo.toml", "--ui", "--offline", "--runs-dir", str(runs))
    try:
        url = cli.console_url()
        run_id = parse_qs(urlsplit(url).query)["next"][0].removeprefix("/runs/")
        cli.wait_line("run-task approval-demo")  # printed once the run is in the console
        page.goto(url)  # the login leads to the run's page itself, not to the runs list
        expect(page).to_have_url(re.compile(rf"/runs/{re.escape(run_id)}$"))
        card = wait_card(page)
        expect(card.locator(".checks .code")).to_have_text("sensitive_action")
        page.once("dialog", lambda dialog: dialog.accept())  # "Cancel this run?"
        page.get_by_role("button", name="Cancel run", exact=True).click()
        expect(card).to_have_count(0)
        expect(page.locator("#no-approvals")).to_be_visible()
        code, out = cli.wait()
        # the page says the run ended: in place once the console has stopped with the command (stdin is
        # not a terminal), or as the run's report when the console still answered the page's check
        expect(page.locator("#ended, header.run").first).to_contain_text("cancelled")
    finally:
        cli.stop()
    stderr = "\n".join(cli.stderr)
    assert code == 130, stderr
    assert Path(out.strip()).parent.name == run_id
    entries = read_entries(Path(out.strip()))
    assert (entries[-1].type, entries[-1].status) == ("run_finished", "cancelled"), stderr
    (approval,) = [e for e in entries if e.type == "approval"]
    assert (approval.decision, approval.by) == ("withdrawn", "cancel")
    assert [e for e in entries if e.type == "action" and e.call_id == approval.call_id] == []
    sandbox_id = entries[0].sandbox
    assert re.fullmatch(r"ds-[0-9a-f]{8}", sandbox_id), sandbox_id
    label = {"label": f"desktop-sandbox.sandbox={sandbox_id}"}
    left = ([c.name for c in client.containers.list(all=True, ignore_removed=True, filters=label)]
            + [n.name for n in client.networks.list(filters=label)])
    assert left == [], f"left behind by the cancelled run: {left}"


# -- d. Take over, click, Resume ---------------------------------------------------------------------
SCRATCH_ARGS = ["-class", "Scratch", "-T", "Scratch", "-geometry", "60x8+200+150", "-fa", "DejaVu Sans Mono",
                "-fs", "11", "-e", "bash", "-c", "mkdir -p ~/.cache && touch ~/.cache/scratch-ready && exec bash --norc -i"]
TAKEOVER_TASK = f"""
name = "takeover-demo"
instructions = "In the terminal at the bottom, save the word takeover into ~/Documents/takeover.txt."
max_steps = 6

# the terminal strip at the bottom (as tasks/approval-demo.toml), and a second terminal that is not
# the window manager's XTerm class, so it stays where its geometry puts it: in the middle of the screen
[[launch]]
app = "terminal"
args = {json.dumps(TERMINAL_ARGS)}

[[launch]]
app = "terminal"
args = {json.dumps(SCRATCH_ARGS)}

[[ready]]
file = "~/.cache/terminal-ready"
timeout_s = 30

[[ready]]
file = "~/.cache/scratch-ready"
timeout_s = 30

[[checks]]
kind = "file"
path = "~/Documents/takeover.txt"
match = "text"
value = "takeover"
"""
PERSON_CLICK = (400, 590)
"""Where the person clicks (screen px): the bottom terminal's title bar, left of its title."""
TITLE_REGION = (380, 586, 40, 8)
"""x, y, w, h around :data:`PERSON_CLICK` on that title bar."""

TAKEOVER_TURNS = [
    {"comment": "once the bottom terminal shows its prompt and the scratch terminal is up, click into the scratch "
                "terminal: it has the focus, the bottom terminal's title bar shows inactive (grey)",
     "expect": [{"kind": "not_color", "x": 3, "y": 603, "w": 150, "h": 16, "rgb": "#ffffff", "tolerance": 48,
                 "fraction": 0.1},
                {"kind": "color", "x": 210, "y": 240, "w": 500, "h": 60, "rgb": "#ffffff", "tolerance": 8}],
     "actions": [{"type": "click", "x": 470, "y": 260, "button": "left"}]},
    {"comment": "the model cannot go on until the bottom terminal has the focus again, which only the person gives "
                "it: Take over in the console, click its title bar, Resume. Then type the command there",
     "expect": [{"kind": "color", "x": 100, "y": 585, "w": 400, "h": 11, "rgb": TITLE_ACTIVE, "tolerance": 24}],
     "expect_timeout_s": 60,
     "actions": [{"type": "type", "text": "mkdir -p ~/Documents && echo takeover > ~/Documents/takeover.txt"},
                 {"type": "keypress", "keys": ["Return"]}]},
    {"comment": "once the command has run (the next prompt on the terminal's second line), say so",
     "expect": [{"kind": "not_color", "x": 3, "y": 621, "w": 150, "h": 16, "rgb": "#ffffff", "tolerance": 48,
                 "fraction": 0.1}],
     "message": "saved ~/Documents/takeover.txt"},
]


def rgb_of(hex_rgb: str) -> tuple[int, int, int]:
    """``#rrggbb`` as (r, g, b)."""
    return tuple(int(hex_rgb[i:i + 2], 16) for i in (1, 3, 5))  # type: ignore[return-value]


def share_of(image: Image.Image, region: tuple[int, int, int, int], hex_rgb: str, tolerance: int = 24) -> float:
    """Share (0-1) of the region's pixels (x, y, w, h, screen px) within ``tolerance`` of ``hex_rgb`` in
    every channel."""
    x, y, w, h = region
    crop = image.convert("RGB").crop((x, y, x + w, y + h))
    return 1.0 - changed_share(Image.new("RGB", crop.size, rgb_of(hex_rgb)), crop, tolerance)


def wait_live_shows(page: Any, region: tuple[int, int, int, int], hex_rgb: str, fraction: float = 0.9,
                    tolerance: int = 32) -> None:
    """Wait (Playwright's polling, :data:`DEADLINE_MS`) until the console's live screen (the MJPEG
    ``#screen-img``, drawn at the 1280x800 screen size) shows ``hex_rgb`` (within ``tolerance`` per
    channel: JPEG) on at least ``fraction`` of ``region`` (screen px), as a person would see it."""
    page.wait_for_function(
        """([x, y, w, h, rgb, fraction, tolerance]) => {
             const img = document.getElementById('screen-img');
             if (!img || !img.naturalWidth) return false;
             const c = document.createElement('canvas');
             c.width = 1280; c.height = 800;
             const g = c.getContext('2d');
             g.drawImage(img, 0, 0, 1280, 800);
             const d = g.getImageData(x, y, w, h).data;
             let hits = 0;
             for (let i = 0; i < d.length; i += 4)
               if (Math.abs(d[i] - rgb[0]) <= tolerance && Math.abs(d[i + 1] - rgb[1]) <= tolerance
                   && Math.abs(d[i + 2] - rgb[2]) <= tolerance) hits++;
             return hits >= fraction * w * h;
           }""",
        arg=[*region, list(rgb_of(hex_rgb)), fraction, tolerance], timeout=DEADLINE_MS)


def test_take_over_click_and_resume_and_the_model_sees_the_click(tmp_path, page):
    from playwright.sync_api import expect

    desktop_apps()
    task = write_task(tmp_path, "takeover-demo", TAKEOVER_TASK, TAKEOVER_TURNS)
    with LocalSandbox(openbox=True) as sb, console_run(task, sb, tmp_path / "runs") as run:
        open_run(page, run.server.url, run.run_id)
        # the model has clicked the scratch terminal and waits for the bottom one to get the focus
        expect(page.locator("#log li", has_text="computer_call call_0001_wait_").first).to_be_visible()
        state = page.locator("#state")
        page.get_by_role("button", name="Take over", exact=True).click()
        expect(state).to_have_text("human")
        screen = page.locator("#screen-img")
        page.wait_for_function("() => document.getElementById('screen-img').naturalWidth > 0")
        box = screen.bounding_box()
        x, y = PERSON_CLICK
        screen.click(position={"x": (x + 0.5) * box["width"] / 1280, "y": (y + 0.5) * box["height"] / 800})
        expect(page.locator("#log")).to_contain_text("person (console): click (")
        # as a person would: Resume once the live screen shows the title bar active
        wait_live_shows(page, TITLE_REGION, TITLE_ACTIVE, tolerance=24)
        page.get_by_role("button", name="Resume", exact=True).click()
        expect(state).to_have_text("running")  # never the state Resume answered while the loop woke up
        outcome = run.finish()

    assert outcome.status == "passed", outcome.reason
    entries = read_entries(outcome.record_dir)
    kinds = [e.type for e in entries]
    takeovers = [i for i, e in enumerate(entries) if e.type == "takeover"]
    assert [entries[i].control for i in takeovers] == ["human", "model"]
    human, model = takeovers
    between = entries[human + 1:model]
    assert [e.type for e in between] == ["human_action"], kinds  # the person's click, nothing of the model's
    found = re.fullmatch(r"click \((\d+),(\d+)\) left", between[0].action)
    assert found and abs(int(found.group(1)) - x) <= 1 and abs(int(found.group(2)) - y) <= 1, between[0]
    assert between[0].by == "console"
    before = [e for e in entries[:human] if e.type == "screenshot"][-1]
    after = next(e for e in entries[model:] if e.type == "screenshot")

    def shot(entry: Any) -> Image.Image:
        return Image.open(io.BytesIO((outcome.record_dir / entry.file).read_bytes())).convert("RGB")

    assert share_of(shot(before), TITLE_REGION, TITLE_ACTIVE) < 0.1, "the title bar was active before the click"
    assert share_of(shot(after), TITLE_REGION, TITLE_ACTIVE) >= 0.9, "the model's next screenshot misses the click"
    # the run went on from there: turn 1's expectation met on that screenshot, its typing saved the file
    assert any(e.type == "computer_call" and e.call_id == "call_0001" for e in entries[model:]), kinds
    assert [c["passed"] for c in outcome.checks] == [True]
