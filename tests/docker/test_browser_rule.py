"""The agent's chromium in Docker, as the task's run sets it up (contract 9): chromium behind the gateway
with the image's managed policy, which leaves guest-local hosts to chromium's direct connection, and the
URL rule the run hands the agent before the launch. A page on the one loopback origin the task opens
redirects the browser to the agent's own port, to the demo app the task does not open, to loopback
spelled as a number, and to the gateway: each time the model's next read is the refusal page naming the
reason, never the page it was sent to. The scripted model's calls go through the SDK's ``BrowserToolset``."""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import quote

import pytest

from controller.run.record import read_record
from controller.run.runner import RunOptions, run_task
from controller.run.tasks import load_task
from wire.browser_tools import REFUSED_AGENT, REFUSED_GATEWAY, REFUSED_LOCAL

pytestmark = [pytest.mark.docker, pytest.mark.slow]

START = "http://127.0.0.1:9000"
SERVER = (
    "import http.server, pathlib, urllib.parse\n"
    "class H(http.server.BaseHTTPRequestHandler):\n"
    "    def do_GET(self):\n"
    "        if self.path.startswith('/go?to='):\n"
    "            self.send_response(302); self.send_header('Location', urllib.parse.unquote(self.path[7:]))\n"
    "            self.send_header('Content-Length', '0'); self.end_headers(); return\n"
    "        body = b'<title>Start</title><p>start page</p>'\n"
    "        self.send_response(200); self.send_header('Content-Type', 'text/html')\n"
    "        self.send_header('Content-Length', str(len(body))); self.end_headers(); self.wfile.write(body)\n"
    "server = http.server.HTTPServer(('127.0.0.1', 9000), H)\n"
    "pathlib.Path.home().joinpath('start-served').write_text('ok')\n"
    "server.serve_forever()\n")
TARGETS = [("http://127.0.0.1:8000/livez", REFUSED_AGENT), ("http://127.0.0.1:8080/", REFUSED_LOCAL),
           ("http://2130706433:8000/v1/display", REFUSED_AGENT), ("http://gateway:3128/", REFUSED_GATEWAY)]


def write_task(directory: Path) -> Path:
    """A browser task on the guest's own start page (a server the terminal starts) whose script opens
    and reads it, then follows each of :data:`TARGETS` through the start page's redirect and reads the page."""
    turns = [{"browser": [{"member": "navigate", "arguments": {"url": f"{START}/"}},
                          {"member": "get_page_text", "arguments": {}}]}]
    for target, _ in TARGETS:
        url = f"{START}/go?to={quote(target, safe='')}"
        turns.append({"browser": [{"member": "navigate", "arguments": {"url": url}},
                                  {"member": "get_page_text", "arguments": {}}]})
    turns.append({"message": "done"})
    (directory / "rule.offline.jsonl").write_text("".join(json.dumps(t) + "\n" for t in turns))
    path = directory / "rule.toml"
    path.write_text(
        'name = "browser-rule"\ninstructions = "Read the pages."\nmax_steps = 8\n'
        '[model]\ntools = ["browser"]\n'
        f'[[launch]]\napp = "terminal"\nargs = ["-e", "python3", "-c", {json.dumps(SERVER)}]\n'
        '[[ready]]\nfile = "~/start-served"\ntimeout_s = 60\n'
        f'[[launch]]\napp = "chromium"\nargs = ["{START}/"]\n'
        '[network]\nmode = "deny-all"\nallow = []\n'
        '[[checks]]\nkind = "file"\npath = "~/start-served"\nmatch = "exact"\nvalue = "ok"\n'
        '[offline]\nscript = "rule.offline.jsonl"\n')
    return path


def test_a_redirect_to_a_guest_local_or_gateway_address_shows_the_model_the_refusal(task_sandbox, tmp_path):
    outcome = run_task(load_task(write_task(tmp_path)), task_sandbox,
                       RunOptions(runs_dir=tmp_path / "runs", live=False, asker=None))
    calls = [e for e in read_record(outcome.record_dir) if e["type"] == "browser_call"]
    assert outcome.status == "passed", (outcome.reason, calls[-3:])
    outputs = {item.get("call_id"): json.loads(item["output"][0]["text"]) for request in outcome.scripted_requests
               for item in request.get("input") or []
               if isinstance(item, dict) and item.get("type") == "function_call_output"}
    reads = [outputs[c["call_id"]]["result"]["text"] for c in calls if c["member"] == "get_page_text"]
    assert len(reads) == 1 + len(TARGETS) and "start page" in reads[0], reads  # the task's origin loads directly
    for (target, reason), text in zip(TARGETS, reads[1:]):
        assert "The sandbox did not load this address" in text and reason in text, (target, text)
        assert '"status"' not in text and "Pickup desk" not in text and "unauthorized" not in text, (target, text)
    assert [c["ok"] for c in calls if c["member"] == "navigate"] == [True] * (1 + len(TARGETS))
