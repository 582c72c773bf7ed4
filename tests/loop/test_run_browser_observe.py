"""A browser-only task (``[model] tools = ["browser"]``) gets the run's ``before_capture`` chain -- the wait
for pending origin requests, then the sign-in flow -- once per model step, before the SDK reads the
browser state the model gets after the step's browser calls (contract 9). On a local desktop: Xvfb, the
real agent, Debian's chromium as its channel app (DevTools pipe), the scripted model's ``browser_*`` calls
through the SDK's ``ResponsesToolRunner`` and ``BrowserToolset`` over the run's ``GuestBrowserDriver``.

* Origin wait: chromium's traffic goes through the real gateway in mode ``ask`` (mitmproxy, its control
  API on loopback). A click on the test page makes the page fetch an origin of the ask tier; nobody
  answers, so the gateway's timeout decides it. Its ``approval`` line comes after both calls of that step
  and before the model's next response.
* Sign-in: chromium shows the sign-in demo site (images/signin-demo/site.py) on loopback; the flow asks
  for each of its three forms, a ``--sign-in`` file answers, and the last state the model gets for the
  step is the account page. The step's second call fails (a ref never issued), so the SDK skips its third:
  the flow runs right after the failed call. The site's own session state (a ``page`` check) says signed
  in."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest

from controller.run.record import read_entries
from controller.run.runner import RunOptions, run_task, watching
from controller.run.tasks import load_task
from tests.controller.origin_gateway import AskGateway, start_ask_gateway, until
from tests.helpers import QuietHandler, chromium_desktop, reply, serve_http
from tests.loop.local_sandbox import LocalSandbox

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = "/usr/bin/chromium"
SITE = ROOT / "images" / "signin-demo" / "site.py"

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not os.access(CHROMIUM, os.X_OK) or not shutil.which("setpriv")
                                 or not shutil.which("Xvfb"), reason="needs Debian's chromium, setpriv and Xvfb")]


def write_task(directory: Path, name: str, body: str, turns: list[dict[str, Any]]) -> Path:
    """``directory/name.toml`` with ``body`` and its offline script of ``turns`` beside it."""
    (directory / f"{name}.offline.jsonl").write_text("".join(json.dumps(t) + "\n" for t in turns))
    path = directory / f"{name}.toml"
    path.write_text(f'name = "{name}"\ninstructions = "x"\nmax_steps = 6\n{body}\n'
                    f'[offline]\nscript = "{name}.offline.jsonl"\n')
    return path


def lines(entries: list[Any], kind: str) -> list[int]:
    """The positions of the entries (entry models) of type ``kind``."""
    return [i for i, e in enumerate(entries) if e.type == kind]


# -- the origin wait ----------------------------------------------------------------------------------
class _SyncedAgent:
    """The real agent client; after a browser ``click`` returns it waits until the run's approval registry
    holds the origin request the page's fetch raised (mirrored from the gateway a moment later), so the
    test checks what the run does with a pending request rather than racing the mirror."""

    def __init__(self, agent: Any, sandbox: "AskBrowserSandbox") -> None:
        self._agent, self._sandbox = agent, sandbox

    def __getattr__(self, name: str) -> Any:
        return getattr(self._agent, name)

    def browser_call(self, member: str, arguments: Any) -> Any:
        answer = self._agent.browser_call(member, arguments)
        if member == "click":
            origin = self._sandbox.gateway.origin("ask")
            until(lambda: self._sandbox.live and any(r.origin == origin for r in self._sandbox.live[0].registry.all()),
                  what=f"the origin request for {origin} in the run's registry")
        return answer


class AskBrowserSandbox(LocalSandbox):
    """A local sandbox behind a real gateway in mode ask: its decision log and its control API
    (``gateway_control_url`` / ``gateway_control_token``, as a backend gives them)."""

    def __init__(self, gateway: AskGateway, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.gateway = gateway
        self.gateway_control_url = gateway.control_url
        self.gateway_control_token = gateway.token
        self.live: list[Any] = []  # the run as a view sees it (its approval registry)

    @property
    def agent(self) -> Any:
        return _SyncedAgent(LocalSandbox.agent.fget(self), self)

    def decision_log(self) -> list[dict[str, Any]]:
        return self.gateway.decisions()


def test_a_browser_step_waits_for_the_origin_request_its_page_raised(tmp_path: Path):
    gateway = start_ask_gateway(tmp_path, ("ask",), hold_timeout_s=2.0)
    seen: dict[str, Path] = {}
    page = (f"<!doctype html><title>ask page</title><button id=load onclick=\"fetch('{gateway.url('ask', '/held')}', "
            "{mode: 'no-cors'}).catch(() => {})\">Load</button>"
            "<script>addEventListener('load', () => fetch('/seen'))</script>").encode()

    class Page(QuietHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            if self.path == "/seen":
                (seen["home"] / "page-seen").write_text("seen\n")
                return reply(self, 204, b"")
            reply(self, 200, page, "text/html")

    server = serve_http(Page)
    try:
        policy = gateway.policy
        network = "\n".join(f"{k} = {json.dumps(v)}" for k, v in policy.items())
        task_path = write_task(tmp_path, "browser-ask", (
            '[model]\ntools = ["browser"]\n'
            f'[[launch]]\napp = "chromium"\nargs = ["http://127.0.0.1:{server.server_address[1]}/"]\n'
            '[[ready]]\nfile = "~/page-seen"\ntimeout_s = 60\n'
            f"[network]\n{network}\n"
            '[[checks]]\nkind = "file"\npath = "~/Documents/seed.txt"\nmatch = "text"\nvalue = "seed"\n'), [
            {"browser": [{"member": "read_page", "arguments": {"filter": "interactive"}}]},
            {"browser": [{"member": "click", "arguments": {"target": {"label": "Load", "role": "button"}}},
                         {"member": "get_page_text", "arguments": {}}]},
            {"message": "done"}])
        task = load_task(task_path)
        with chromium_desktop(gateway, sandbox=AskBrowserSandbox,
                              chromium_args=(f"--proxy-server=http://127.0.0.1:{gateway.proxy[1]}",)) as sb:
            seen["home"] = sb.home
            (sb.home / "Documents/seed.txt").write_text("seed\n")
            outcome = run_task(task, lambda t: sb, RunOptions(runs_dir=tmp_path / "runs", live=False, terminal=False),
                               views=[watching(sb.live.append)])
    finally:
        server.shutdown()
        gateway.stop()

    entries = read_entries(outcome.record_dir)
    assert outcome.status == "passed", (outcome.reason, [e for e in entries if e.type == "browser_call"])
    calls = [(i, entries[i]) for i in lines(entries, "browser_call")]
    assert [c.member for _, c in calls] == ["read_page", "click", "get_page_text"]
    assert all(c.ok for _, c in calls), calls
    origin = gateway.origin("ask")
    [(asked, approval)] = [(i, e) for i, e in enumerate(entries)
                           if e.type == "approval" and e.what == "origin_access"]
    assert (approval.origin, approval.decision, approval.by) == (origin, "timeout", "timeout")
    responses = lines(entries, "model_response")
    assert len(responses) == 3
    # decided after the step's last browser call, before the model's next response: once per step, at its end
    assert calls[2][0] < asked < responses[2], [(e.type, getattr(e, "member", None) or getattr(e, "what", None))
                                                for e in entries]


# -- the sign-in flow ---------------------------------------------------------------------------------
@pytest.fixture
def site() -> Iterator[int]:
    """The sign-in demo site on 127.0.0.1 (a free port); yields its port."""
    proc = subprocess.Popen([sys.executable, str(SITE), '{"http": [0], "bind": "127.0.0.1"}'],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        yield json.loads(proc.stdout.readline())["ports"][0]
    finally:
        proc.terminate()
        proc.wait(10)


def test_a_browser_only_task_is_signed_in_before_the_model_looks_again(site: int, tmp_path: Path):
    origin = f"http://127.0.0.1:{site}"
    task_path = write_task(tmp_path, "browser-signin", (
        '[model]\ntools = ["browser"]\n'
        f'[[launch]]\napp = "chromium"\nargs = ["{origin}/"]\n'
        f'[network]\nmode = "allowlist"\nallow = ["{origin}"]\n'
        f'[[checks]]\nkind = "page"\nurl = "{origin}/session"\nmatch = "regex"\n'
        "value = '\"signed_in\": true, \"account\": \"demo-person\"'\n"), [
        {"browser": [{"member": "wait_for", "arguments": {"text": "How do you want to sign in?", "timeout_ms": 20000}},
                     {"member": "click", "arguments": {"target": "d999e999"}},  # never issued: stale_ref
                     {"member": "get_page_text", "arguments": {}}]},  # skipped by the SDK after the failure
        {"message": "signed in"}])
    creds = tmp_path / "sign-in.toml"
    creds.write_text(f'["{origin}"]\nmethod = "password"\nemail = "person@example.test"\n'
                     'password = "sandbox-demo-pass"\n')
    creds.chmod(0o600)
    with chromium_desktop() as sb:
        outcome = run_task(load_task(task_path), lambda t: sb,
                           RunOptions(runs_dir=tmp_path / "runs", live=False, terminal=False, sign_in_file=creds))

    entries = read_entries(outcome.record_dir)
    signins = [(i, entries[i]) for i in lines(entries, "sign_in")]
    assert outcome.status == "passed", (outcome.reason, signins)
    assert [(e.step, e.method, e.submitted, e.outcome, e.by) for _, e in signins] == [
        (1, "password", [], "submitted", "sign-in file"), (2, None, ["email"], "submitted", "sign-in file"),
        (3, None, ["password"], "submitted", "sign-in file")]
    calls = [(i, entries[i]) for i in lines(entries, "browser_call")]
    assert [(c.member, c.ok) for _, c in calls] == [("wait_for", True), ("click", False)]
    assert calls[1][1].error.startswith("stale_ref: ")
    responses = lines(entries, "model_response")
    # once in the step, after its failed call (nothing of the step runs after it), before the next response
    assert calls[-1][0] < signins[0][0] and signins[-1][0] < responses[1]
    # the last state the model got for the step (the skipped call's) shows the account page: read after it
    outputs = {item.get("call_id"): item for request in outcome.scripted_requests for item in request.get("input") or []
               if isinstance(item, dict) and item.get("type") == "function_call_output"}
    first = json.loads(outputs[calls[0][1].call_id]["output"][0]["text"])
    assert first["ok"] and [t["title"] for t in first["state"]["tabs"]] == ["Sign in – Demo"]
    [skipped] = [json.loads(o["output"][0]["text"]) for o in outputs.values()
                 if "Not executed" in o["output"][0]["text"]]
    assert [t["title"] for t in skipped["state"]["tabs"] if t["active"]] == ["Signed in – Demo"], skipped


def test_a_sign_in_form_with_nobody_to_answer_types_nothing_and_the_run_goes_on(site: int, tmp_path: Path):
    """No terminal, no console, no --sign-in file: the form's request ends ``no_approver`` with nothing
    typed, and the model just sees the page (the run is not stopped by the sign-in flow)."""
    origin = f"http://127.0.0.1:{site}"
    task_path = write_task(tmp_path, "browser-signin-nobody", (
        '[model]\ntools = ["browser"]\n'
        f'[[launch]]\napp = "chromium"\nargs = ["{origin}/"]\n'
        f'[network]\nmode = "allowlist"\nallow = ["{origin}"]\n'
        f'[[checks]]\nkind = "page"\nurl = "{origin}/session"\nmatch = "regex"\n'
        "value = '\"signed_in\": false'\n"), [
        {"browser": [{"member": "wait_for", "arguments": {"text": "How do you want to sign in?", "timeout_ms": 20000}}]},
        {"message": "not signed in"}])
    with chromium_desktop() as sb:
        outcome = run_task(load_task(task_path), lambda t: sb,
                           RunOptions(runs_dir=tmp_path / "runs", live=False, terminal=False))
    entries = read_entries(outcome.record_dir)
    signins = [e for e in entries if e.type == "sign_in"]
    assert outcome.status == "passed", (outcome.reason, signins)
    assert [(e.outcome, e.submitted) for e in signins] == [("no_approver", [])]
