"""Recorded web origins end to end in Docker (docs/replay.md): a task whose page comes from our own origin
(a container of ours on a Docker network of ours, which only the gateway joins) runs with ``[record] web =
true``; the gateway keeps the page and counts what it may not keep (a response that sets a cookie, a body
over the cap); then the origin serves a changed page and ``replay --offline-web --write-task`` reaches the
same verdict with the recorded page, no connection to the origin at all (it logs every request), the
requests the recording lacks denied ``not_recorded`` in the replay's record; then, the origin gone, the
written task passes on its own (its ``[offline] web``); a recording whose body was changed is refused
before any sandbox starts."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

from controller.gateway.web import DEFAULT_MAX_BODY_BYTES
from controller.run.record import read_entries
from controller.run.runner import RunOptions, run_task
from controller.run.tasks import load_task
from tests.helpers import run_server

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.docker, pytest.mark.slow]

NAME, PORT = "web-origin", 8080
ORIGIN = f"http://{NAME}:{PORT}"

ORIGIN_SERVER = r"""
import http.server, json, sys
cfg = json.loads(sys.argv[1])
class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *args):
        pass
    def do_GET(self):
        print(json.dumps({"hit": self.path}), flush=True)
        headers = {"Content-Type": "text/plain"}
        if self.path == "/page":
            body = ("page " + cfg["version"]).encode()
        elif self.path == "/extra":
            body, headers["Set-Cookie"] = b"extra", "visit=1"
        elif self.path == "/huge":
            body = b"h" * cfg["huge"]
        else:
            body = b""
        self.send_response(200 if body else 404)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
server = http.server.ThreadingHTTPServer(("0.0.0.0", cfg["port"]), Handler)
print(json.dumps({"ready": True}), flush=True)
server.serve_forever()
"""

FETCH = (
    "import pathlib, urllib.error, urllib.request\n"
    "home = pathlib.Path.home()\n"
    "def get(path):\n"
    "    try:\n"
    f"        with urllib.request.urlopen('{ORIGIN}' + path, timeout=60) as resp:\n"
    "            return resp.status, resp.read()\n"
    "    except urllib.error.HTTPError as exc:\n"
    "        return exc.code, exc.read()\n"
    "for path in ('/extra', '/huge'):\n"
    "    status, body = get(path)\n"
    "    print(path, status, len(body))\n"
    "status, body = get('/page')\n"
    "(home / 'page.txt').write_bytes(body)\n"
)

TASK = f"""
name = "web-replay"
instructions = "Fetch the page."
max_steps = 3

[[launch]]
app = "terminal"
args = ["-T", "Fetch", "-e", "bash", "-c",
        'mkdir -p ~/.cache && python3 -c "$0" > ~/.cache/fetch.log 2>&1; touch ~/.cache/fetched; exec sleep 900',
        {json.dumps(FETCH)}]

[[ready]]
file = "~/.cache/fetched"
timeout_s = 90

[network]
mode = "allowlist"
allow = ["{ORIGIN}"]
allow_addresses = ["SUBNET"]

[record]
web = true

[[checks]]
kind = "file"
path = "~/page.txt"
match = "text"
value = "page v1"

[offline]
script = "web.offline.jsonl"
"""

SCRIPT = json.dumps({"actions": [{"type": "wait"}]}) + "\n" + json.dumps({"message": "fetched"}) + "\n"


def hits(container) -> list[str]:
    return [json.loads(line)["hit"] for line in container.logs().decode().splitlines() if line.startswith('{"hit"')]


def cli(*args: str) -> subprocess.CompletedProcess:
    """The real command line; no API key in its environment."""
    env = {k: v for k, v in os.environ.items() if k != "OPENAI_API_KEY"}
    env.update(PYTHONPATH=str(ROOT), COLUMNS="200")
    return subprocess.run([sys.executable, "-m", "controller.cli", *args], cwd=ROOT, env=env, stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=400)


@pytest.fixture
def origin_net(docker_client, desktop_image, test_labels):
    """Our internal network and ``start(version)``: our origin container on it (the one before removed)."""
    ident = f"ds-test-web-{secrets.token_hex(4)}"
    network = docker_client.networks.create(ident, driver="bridge", internal=True, labels=test_labels)
    network.reload()
    running: list = []

    def start(version: str):
        for container in running:
            container.remove(force=True)
        running.clear()
        config = json.dumps({"port": PORT, "version": version, "huge": DEFAULT_MAX_BODY_BYTES + 1024})
        running.append(run_server(docker_client, desktop_image, ["python3", "-c", ORIGIN_SERVER], config,
                                  network.name, f"{ident}-{version}", NAME, test_labels))
        return running[0]

    try:
        yield network.name, network.attrs["IPAM"]["Config"][0]["Subnet"], start, running
    finally:
        for container in running:
            container.remove(force=True)
        network.remove()


def test_a_recorded_site_replays_offline_as_recorded(docker_client, desktop_image, test_labels, origin_net, tmp_path):
    from controller.sandbox.docker import DockerOptions, DockerSandbox

    network, subnet, start_origin, running = origin_net
    folder = tmp_path / "task"
    folder.mkdir()
    (folder / "web.toml").write_text(TASK.replace("SUBNET", subnet))
    (folder / "web.offline.jsonl").write_text(SCRIPT)
    origin = start_origin("v1")
    started = []

    def open_(task):
        sb = DockerSandbox.start(task.sandbox_spec(), DockerOptions(image=desktop_image, extra_labels=test_labels),
                                 client=docker_client)
        started.append(sb)
        sb.attach_gateway(network)
        return sb

    try:
        outcome = run_task(load_task(folder / "web.toml"), open_,
                           RunOptions(runs_dir=tmp_path / "runs", live=False, terminal=False))
    finally:
        for sb in started:
            sb.close()
    assert outcome.status == "passed", outcome.reason
    assert sorted(hits(origin)) == ["/extra", "/huge", "/page"]
    [web] = [e for e in read_entries(outcome.record_dir) if e.type == "web_recording"]
    assert (web.mode, web.dir, web.responses, web.origins, web.complete) == ("record", "web", 1, [ORIGIN], True)
    assert web.skipped == {"sets_cookie": 1, "too_large": 1} and web.bytes == len(b"page v1")
    [line] = (outcome.record_dir / "web" / "index.jsonl").read_text().splitlines()
    recorded = json.loads(line)
    assert (recorded["url"], recorded["status"], recorded["headers"]) == (f"{ORIGIN}/page", 200,
                                                                          [["content-type", "text/plain"]])
    assert (outcome.record_dir / "web" / recorded["sha256"]).read_bytes() == b"page v1"
    assert sorted(p.name for p in (outcome.record_dir / "web").iterdir()) == sorted(["index.jsonl", recorded["sha256"]])

    # the site changed: the replay serves the recorded page and never reaches the origin
    changed = start_origin("v2")
    written = tmp_path / "suite" / "web-replay.toml"
    written.parent.mkdir()
    done = cli("replay", str(outcome.record_dir), "--image", desktop_image, "--runs-dir", str(tmp_path / "replays"),
               "--offline-web", "--write-task", str(written))
    output = done.stdout[-3000:] + done.stderr[-3000:]
    assert done.returncode == 0, output
    assert "1 of 1 steps matched; checks: 1 of 1 passed; run passed" in done.stderr, output
    assert hits(changed) == [], "the replay reached the origin"
    entries = read_entries(Path(done.stdout.strip().splitlines()[-1]))
    [served] = [e for e in entries if e.type == "web_recording"]
    assert (served.mode, served.served, served.missing, served.responses) == ("serve", 1, 2, 1)
    assert served.source == str(outcome.record_dir / "web")
    denied = [(e.origin, e.reason) for e in entries if e.type == "network" and e.decision == "deny"]
    assert denied == [(ORIGIN, "not_recorded"), (ORIGIN, "not_recorded")]
    assert not any(e.type == "network" and e.decision == "deny" and e.reason == "offline_web" for e in entries)

    # the origin gone: the written task carries its recording and passes on its own
    for container in running:
        container.remove(force=True)
    running.clear()
    assert load_task(written).offline_web_path() == written.parent / "web-replay.web"
    alone = cli("run-task", str(written), "--offline", "--image", desktop_image, "--runs-dir", str(tmp_path / "suite-runs"))
    assert alone.returncode == 0, alone.stdout[-3000:] + alone.stderr[-3000:]
    [web] = [e for e in read_entries(Path(alone.stdout.strip().splitlines()[-1])) if e.type == "web_recording"]
    assert (web.mode, web.served, web.missing) == ("serve", 1, 2)

    # a recording whose body was changed is refused before any sandbox starts
    body = outcome.record_dir / "web" / recorded["sha256"]
    body.write_bytes(b"page v9")
    refused = cli("replay", str(outcome.record_dir), "--image", desktop_image, "--runs-dir", str(tmp_path / "no"),
                  "--offline-web")
    assert refused.returncode == 2, refused.stderr[-2000:]
    assert "does not have the SHA-256 it is named by" in refused.stderr
    assert not (tmp_path / "no").exists() or not any((tmp_path / "no").iterdir())
