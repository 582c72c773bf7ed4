"""Sign-in the model never sees, end to end in Docker (contract 8): tasks/sign-in-demo.toml through
run-task's code path, the agent's chromium (as user ``browser``, its sandbox on, under the desktop's
seccomp profile) on the demo site of ours (a container on a Docker network of ours that only the gateway
joins), answered from a ``--sign-in`` file. Afterwards no value typed is anywhere: not in the run
directory (record, screenshots), not in what the controller printed, not in the scripted server's
captured requests, not in the gateway's decision log. Cancels at each of the three steps type nothing
more; the browser's DevTools pipe is out of the desktop user's reach."""

from __future__ import annotations

import io
import json
import os
import secrets
import threading
from datetime import datetime, timedelta
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from controller.run.record import read_entries
from controller.run.runner import RunOptions, run_task, watching
from controller.run.tasks import load_task
from tests.helpers import run_signin_site

pytestmark = [pytest.mark.docker, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
ORIGIN = "http://signin-demo:8080"
VALUES = ("sandbox-demo-pass", "424242", "person@example.test")


@pytest.fixture(scope="module")
def site(docker_client, desktop_image, test_labels):
    """(network name, subnet, site container, site URL from the host)."""
    ident = f"ds-test-signin-{secrets.token_hex(4)}"
    network = docker_client.networks.create(ident, driver="bridge", internal=True, labels=test_labels)
    container = None
    try:
        network.reload()
        subnet = network.attrs["IPAM"]["Config"][0]["Subnet"]
        container = run_signin_site(docker_client, desktop_image, network.name, f"{ident}-site", test_labels)
        container.reload()
        address = container.attrs["NetworkSettings"]["Networks"][network.name]["IPAddress"]
        yield network.name, subnet, container, f"http://{address}:8080"
    finally:
        if container is not None:
            container.remove(force=True)
        network.remove()


def stats(site_url: str) -> dict:
    with urllib.request.urlopen(site_url + "/stats", timeout=10) as resp:
        return json.loads(resp.read())


def run(site, docker_client, desktop_image, test_labels, tmp_path: Path, table: str, *, expect_account: bool = True,
        on_sandbox=None, video=None):
    """Run the demo task answered from ``table`` (a --sign-in file); without ``expect_account`` the scripted
    model looks once and stops (a cancelled sign-in never shows the account page the task's script waits for)."""
    from controller.sandbox.docker import DockerOptions, DockerSandbox

    network_name, subnet, _container, _url = site
    task = load_task(ROOT / "tasks" / "sign-in-demo.toml")
    task = task.model_copy(update={"network": task.network.model_copy(update={"allow_addresses": (subnet,)})})
    creds = tmp_path / "sign-in.toml"
    creds.write_text(table)
    creds.chmod(0o600)
    out = io.StringIO()

    def open_(t):
        sb = DockerSandbox.start(t.sandbox_spec(), DockerOptions(image=desktop_image, extra_labels=test_labels),
                                 client=docker_client)
        sb.attach_gateway(network_name)
        if on_sandbox is not None:
            on_sandbox(sb)
        return sb

    script = None
    if not expect_account:
        script = tmp_path / "look-once.jsonl"
        script.write_text('{"actions": [{"type": "wait"}]}\n{"message": "not signed in"}\n')
    outcome = run_task(task, open_, RunOptions(runs_dir=tmp_path / "runs", live=False, sign_in_file=creds, terminal=False,
                                               script=script, video=video),
                       console=Console(file=out, width=200))
    return outcome, out.getvalue()


def leaks(paths: list[Path], texts: list[str]) -> list[str]:
    """Where a value of :data:`VALUES` occurs: in the bytes of ``paths`` (files, recursively) or ``texts``."""
    found = []
    for path in paths:
        for file in ([path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())):
            data = file.read_bytes()
            found += [f"{file}: {v}" for v in VALUES if v.encode() in data]
    for n, text in enumerate(texts):
        found += [f"text {n}: {v}" for v in VALUES if v in text]
    return found


def test_the_leak_search_finds_a_planted_value(tmp_path):
    (tmp_path / "record.jsonl").write_text('{"type": "note", "x": "sandbox-demo-pass"}\n')
    assert leaks([tmp_path], ["code 424242"]) == [f"{tmp_path / 'record.jsonl'}: sandbox-demo-pass", "text 0: 424242"]


def test_signed_in_from_a_file_and_no_value_anywhere(site, docker_client, desktop_image, test_labels, tmp_path):
    table = f'["{ORIGIN}"]\nmethod = "password"\nemail = "{VALUES[2]}"\npassword = "{VALUES[0]}"\n'
    outcome, printed = run(site, docker_client, desktop_image, test_labels, tmp_path, table)
    entries = read_entries(outcome.record_dir / "record.jsonl")
    signins = [e for e in entries if e.type == "sign_in"]
    assert outcome.status == "passed", (outcome.reason, signins)
    assert [(e.step, e.method, e.submitted, e.outcome, e.by) for e in signins] == [
        (1, "password", [], "submitted", "sign-in file"), (2, None, ["email"], "submitted", "sign-in file"),
        (3, None, ["password"], "submitted", "sign-in file")]
    assert all(e.origin == ORIGIN for e in signins)
    scripted = json.dumps(outcome.scripted_requests)
    decisions = json.dumps([e.as_json() for e in entries if e.type == "network"])
    assert leaks([outcome.record_dir], [printed, scripted, decisions]) == []
    assert [e for e in entries if e.type == "check"][0].passed


class Grabber:
    """Grabs the screen the way the console's live view does (a JPEG through the run's own agent client,
    :meth:`controller.run.live.LiveRun.frame`), back to back from its own thread until stopped: each grab as
    ``(started, ended, image)`` on the redactor's clock."""

    def __init__(self) -> None:
        self.frames: list[tuple[float, float, Any]] = []
        self.stop = threading.Event()
        self.agent: Any = None
        self._thread: threading.Thread | None = None

    def __call__(self, sb: Any) -> None:
        self.agent = sb.agent
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self.stop.is_set() and len(self.frames) < 3000:
            started = time.monotonic()
            try:
                shot = self.agent.screenshot(format="jpeg", quality=60, max_width=640)
            except Exception:  # noqa: BLE001 - the sandbox goes away at the run's end
                self.stop.wait(0.05)
                continue
            self.frames.append((started, time.monotonic(), shot))

    def close(self) -> None:
        self.stop.set()
        if self._thread is not None:
            self._thread.join(30)


def _all_fill(data: bytes) -> bool:
    from PIL import Image

    from controller.redaction import FILL
    with Image.open(io.BytesIO(data)) as image:
        extrema = image.convert("RGB").getextrema()
    return all(abs(lo - f) <= 8 and abs(hi - f) <= 8 for (lo, hi), f in zip(extrema, FILL))


def test_every_picture_taken_while_a_fill_runs_is_filled(site, docker_client, desktop_image, test_labels, tmp_path):
    """The console's live view grabbing all the time, and the run's video: each frame whose grab overlapped
    a fill (the agent typing values into the page) is the fill colour whole, the others show the desktop;
    one ``redaction`` line per fill; no value in any file of the run, the video included. Without the
    redaction these frames show the page being filled."""
    from controller.run.video import VideoSettings

    grabber = Grabber()
    table = f'["{ORIGIN}"]\nmethod = "password"\nemail = "{VALUES[2]}"\npassword = "{VALUES[0]}"\n'
    try:
        outcome, printed = run(site, docker_client, desktop_image, test_labels, tmp_path, table, on_sandbox=grabber,
                               video=VideoSettings(fps=10))
    finally:
        grabber.close()
    assert outcome.status == "passed", outcome.reason
    entries = read_entries(outcome.record_dir / "record.jsonl")
    assert [(e.why, e.box) for e in entries if e.type == "redaction"] == [("sign_in", None)] * 3
    fills = [(since, until) for why, _box, since, until in grabber.agent.redactor.spans() if why == "sign_in"]
    assert len(fills) == 3 and all(until is not None for _, until in fills)
    during = [shot for started, ended, shot in grabber.frames
              if any(started <= until and ended >= since for since, until in fills)]
    others = [shot for started, ended, shot in grabber.frames if shot not in during]
    assert during, f"no grab overlapped a fill ({len(grabber.frames)} grabs)"
    assert all(shot.redacted and _all_fill(shot.data) for shot in during)
    assert not all(_all_fill(shot.data) for shot in others)
    assert leaks([outcome.record_dir], [printed]) == []
    # the video's frames grabbed inside a fill (between its redaction line and its sign_in line, which is
    # written once the fill answered) are the fill colour whole, marks included
    import av

    video = next(e for e in entries if e.type == "video")
    assert video.file == "run.webm" and video.started_at, video
    zero = datetime.fromisoformat(video.started_at)
    lines = [e for e in entries if e.type in ("redaction", "sign_in") and (e.type != "sign_in" or e.by)]
    spans = [(datetime.fromisoformat(a.ts), datetime.fromisoformat(b.ts)) for a, b in zip(lines, lines[1:])
             if a.type == "redaction" and b.type == "sign_in"]
    assert len(spans) == 3, [e.type for e in lines]
    with av.open(str(outcome.record_dir / video.file)) as container:
        stream = container.streams.video[0]
        for frame in container.decode(stream):
            when = zero + timedelta(seconds=float(frame.pts * stream.time_base))
            if any(a + timedelta(seconds=0.1) <= when <= b - timedelta(seconds=0.1) for a, b in spans):
                buffer = io.BytesIO()
                frame.to_image().save(buffer, "PNG")
                assert _all_fill(buffer.getvalue()), when


@pytest.mark.parametrize("table, step, posts", [
    ('["http://elsewhere.test"]\nmethod = "password"\n', 1, {"/method": 0, "/email": 0, "/password": 0}),
    (f'["{ORIGIN}"]\nmethod = "password"\n', 2, {"/method": 1, "/email": 0, "/password": 0}),
    (f'["{ORIGIN}"]\nmethod = "password"\nemail = "{VALUES[2]}"\n', 3, {"/method": 1, "/email": 1, "/password": 0}),
], ids=["method", "email", "password"])
def test_a_cancel_at_any_step_types_nothing_more(site, docker_client, desktop_image, test_labels, tmp_path,
                                                 table, step, posts):
    before = stats(site[3])["posts"]
    outcome, printed = run(site, docker_client, desktop_image, test_labels, tmp_path, table, expect_account=False)
    after = stats(site[3])["posts"]
    entries = read_entries(outcome.record_dir / "record.jsonl")
    signins = [e for e in entries if e.type == "sign_in"]
    assert outcome.status == "failed" and signins[-1].step == step and signins[-1].outcome == "cancelled"
    assert {path: after[path] - before[path] for path in posts} == posts
    assert leaks([outcome.record_dir], [printed]) == []


def test_the_devtools_pipe_is_out_of_the_desktop_users_reach(docker_client, desktop_image, test_labels):
    """The audit's probe from the desktop user's shell: chromium runs as ``browser``, so its /proc (and
    the pipe ends there) are closed to ``sandbox``; no process of ``browser`` listens on any TCP port, so
    neither a page nor a shell can reach a DevTools endpoint."""
    from controller.sandbox import SandboxSpec
    from controller.sandbox.docker import DockerOptions, DockerSandbox
    from guest.cdp import wait_until

    with DockerSandbox.start(SandboxSpec(browser_channel=True), DockerOptions(image=desktop_image, extra_labels=test_labels),
                             client=docker_client) as sb:
        sb.agent.launch("chromium", ["about:blank"])
        pid = wait_until(lambda: sb.desktop.exec_run(["pgrep", "-u", "browser", "-o", "chromium"]).output.strip(), 30, 0.2)
        assert pid, "chromium did not start as browser"
        pid = int(pid)
        probe = sb.desktop.exec_run(["sh", "-c", f"ls /proc/{pid}/fd/3; cat /proc/{pid}/fd/4 </dev/null; echo rc=$?"],
                                    user="1000:1000").output.decode()
        assert "Permission denied" in probe and "rc=1" in probe, probe
        listening = sb.desktop.exec_run(["sh", "-c", "cat /proc/net/tcp /proc/net/tcp6 2>/dev/null"]).output.decode()
        rows = [line.split() for line in listening.splitlines()[1:] if line.split() and line.split()[0] != "sl"]
        assert not [r for r in rows if len(r) > 7 and r[3] == "0A" and r[7] == "1003"], listening
        assert sb.agent._request("GET", "/v1/browser", 4096).status == 200
        # The desktop user may make a user namespace (chromium's sandbox needs them) but not mount in it.
        ns = sb.desktop.exec_run(["sh", "-c", "unshare -Ur true && echo userns-ok; unshare -Urm true || echo mount-refused"],
                                 user="1000:1000").output.decode()
        assert "userns-ok" in ns and "mount-refused" in ns, ns


def test_answered_on_the_terminal_with_the_values_never_echoed(site, docker_client, desktop_image, tmp_path):
    """run-task in a pty (the person's terminal): the three questions answered there; what the terminal
    showed, the run directory and stdout hold no value (the values are read with the echo off)."""
    import pty
    import select
    import subprocess
    import sys

    network_name, subnet, _container, _url = site
    task = (ROOT / "tasks" / "sign-in-demo.toml").read_text().replace('allow_addresses = ["10.213.78.0/24"]',
                                                                       f'allow_addresses = ["{subnet}"]')
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "sign-in-demo.toml").write_text(task)
    (tmp_path / "tasks" / "sign-in-demo.offline.jsonl").write_text(
        (ROOT / "tasks" / "sign-in-demo.offline.jsonl").read_text())
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "controller.cli", "run-task", str(tmp_path / "tasks" / "sign-in-demo.toml"), "--offline",
         "--image", desktop_image, "--attach-network", network_name, "--runs-dir", str(tmp_path / "runs")],
        stdin=slave, stdout=subprocess.PIPE, stderr=slave, cwd=ROOT, env={**os.environ, "COLUMNS": "200"})
    os.close(slave)
    answers = [("verified the sign-in destination", "y"), ("Choose a sign-in method", "2"),
               ("verified the sign-in destination", "y"), ("E-mail address", VALUES[2]),
               ("verified the sign-in destination", "y"), ("Password", VALUES[0])]
    shown, deadline = b"", time.monotonic() + 240
    try:
        while proc.poll() is None and time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.2)
            if ready:
                try:
                    shown += os.read(master, 65536)
                except OSError:
                    break
            if answers and answers[0][0].encode() in shown.split(b"\n")[-1]:
                os.write(master, (answers.pop(0)[1] + "\n").encode())
                shown += b"\n"  # the question is answered: look for the next one on a new line
        out, _ = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(master)
    text = shown.decode("utf-8", "replace")
    assert proc.returncode == 0 and not answers, text[-3000:]
    assert "Credential origin: http://signin-demo:8080" in text
    assert leaks([tmp_path / "runs"], [text, out.decode()]) == []


def test_answered_in_the_console_by_a_person_in_a_browser(site, docker_client, desktop_image, test_labels, tmp_path):
    """run-task's code path with the web console as its view (``run-task --ui``, no terminal): a person in
    Debian's chromium (Playwright) answers the three cards (the method by its radio button, then the
    e-mail, then the password, typed with key events); the run passes and no value is anywhere."""
    import threading

    from controller.chromium import launch as launch_chromium
    from controller.console.server import ConsoleServer
    from controller.sandbox.docker import DockerOptions, DockerSandbox
    from tests.require import require_browser

    require_browser()
    from playwright.sync_api import expect, sync_playwright

    network_name, subnet, _container, _url = site
    task = load_task(ROOT / "tasks" / "sign-in-demo.toml")
    task = task.model_copy(update={"network": task.network.model_copy(update={"allow_addresses": (subnet,)})})
    runs = tmp_path / "runs"
    runs.mkdir()
    server = ConsoleServer(runs).start()
    lives: list = []
    ended: dict = {}
    out = io.StringIO()

    def open_(t):
        sb = DockerSandbox.start(t.sandbox_spec(), DockerOptions(image=desktop_image, extra_labels=test_labels),
                                 client=docker_client)
        sb.attach_gateway(network_name)
        return sb

    def on_live(live):
        server.add_run(live)
        lives.append(live)

    def run() -> None:
        try:
            ended["outcome"] = run_task(task, open_, RunOptions(runs_dir=runs, live=False, terminal=False),
                                        console=Console(file=out, width=200), views=[watching(on_live)])
        except BaseException as exc:  # noqa: BLE001 - reported below
            ended["error"] = exc
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        with sync_playwright() as playwright:
            browser = launch_chromium(playwright)
            page = browser.new_context().new_page()
            page.goto(server.url)
            deadline = time.monotonic() + 120
            while not lives and time.monotonic() < deadline:
                time.sleep(0.1)  # poll interval of a bounded condition wait (the run's live view)
            assert lives, "the run never showed itself in the console"
            page.goto(f"{server.base}/runs/{lives[0].run_id}")
            for value in (None, VALUES[2], VALUES[0]):
                card = page.locator(".card[data-request-id]").filter(has=page.locator("h3", has_text="Sign in"))
                expect(card).to_have_count(1, timeout=90_000)
                expect(card.locator("code.credential-origin")).to_have_text(ORIGIN)
                if value is None:
                    card.get_by_label("Use a password").check()
                else:
                    card.locator("input[type=password]").first.press_sequentially(value)
                card.get_by_role("button", name="Submit").click()
                expect(card).to_have_count(0, timeout=30_000)
            browser.close()
        thread.join(120)
    finally:
        server.stop()
    assert "error" not in ended, ended.get("error")
    outcome = ended["outcome"]
    signins = [e for e in read_entries(outcome.record_dir / "record.jsonl") if e.type == "sign_in"]
    assert outcome.status == "passed", (outcome.reason, signins)
    assert [(e.step, e.outcome, e.by) for e in signins] == [(n, "submitted", "console") for n in (1, 2, 3)]
    assert leaks([outcome.record_dir], [out.getvalue()]) == []
