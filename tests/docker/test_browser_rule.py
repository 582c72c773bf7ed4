"""The agent's chromium in Docker, as the task's run sets it up (contract 9): chromium behind the gateway
with the image's managed policy (everything through the gateway, loopback included, but the one loopback
origin the task opens, which the agent makes direct as it launches chromium), and the URL rule the run
hands the agent before the launch. A page on that origin redirects the browser to the agent's own port,
to the demo app the task does not open, to loopback spelled as a number, and to the gateway: each time
the model's next read is the refusal page naming the reason, never the page it was sent to. Another page
there opens WebSockets to the agent's port and to another loopback service (in several spellings) and
WebRTC connections over TURN (TCP) and STUN (UDP) to loopback ports, and offers loopback candidates:
nothing reaches the listeners, and the gateway records its refusal of what went through it. The scripted
model's calls go through the SDK's ``BrowserToolset``."""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import quote

import pytest

from controller.run.record import read_entries
from controller.run.runner import RunOptions, run_task
from controller.run.tasks import load_task
from wire.browser_tools import REFUSED_AGENT, REFUSED_GATEWAY, REFUSED_LOCAL

pytestmark = [pytest.mark.docker, pytest.mark.slow]

START = "http://127.0.0.1:9000"
PROBES = """<!doctype html><title>Probes</title><p id=state>probing</p><script>
const sockets = ["ws://127.0.0.1:8000/v1/display", "ws://127.0.0.1:9001/a", "ws://localhost:9001/b",
                 "ws://127.1:9001/c", "ws://[::1]:9001/d"];
let open = sockets.length, gathered = false, late = false;
const check = () => {
  if (open === 0 && (gathered || late)) document.getElementById("state").textContent = "probes done";
};
for (const url of sockets) { const ws = new WebSocket(url); ws.onclose = () => { open--; check(); }; }
const pc = new RTCPeerConnection({iceServers: [
  {urls: "turn:127.0.0.1:9002?transport=tcp", username: "u", credential: "p"},
  {urls: "turn:127.0.0.1:9003?transport=udp", username: "u", credential: "p"}, {urls: "stun:127.0.0.1:9003"}]});
pc.createDataChannel("d");
pc.onicegatheringstatechange = () => { if (pc.iceGatheringState === "complete") { gathered = true; check(); } };
pc.createOffer().then(offer => pc.setLocalDescription(offer));
(async () => {
  const a = new RTCPeerConnection(), b = new RTCPeerConnection();
  a.createDataChannel("x");
  const offer = await a.createOffer(); await a.setLocalDescription(offer);
  await b.setRemoteDescription(offer); await a.setRemoteDescription(await b.createAnswer());
  for (const candidate of ["candidate:1 1 udp 2122260223 127.0.0.1 9003 typ host",
                           "candidate:2 1 tcp 1518280447 127.0.0.1 9001 typ host tcptype passive"])
    await a.addIceCandidate({candidate, sdpMid: "0", sdpMLineIndex: 0});
})();
setTimeout(() => { late = true; check(); }, 8000);
</script>"""
"""The hostile page: WebSockets to the agent's port and to the loopback service on 9001 (as 127.0.0.1,
localhost, 127.1 and [::1]); WebRTC with TURN over TCP (9002) and over UDP and STUN (9003) on loopback,
and a connection offered loopback candidates (UDP 9003, TCP 9001). Done once every socket closed and
the gathering completed (or 8 s passed: a direct STUN or TURN server that never answers is waited for
that long)."""
SERVER = (
    "import http.server, json, os, pathlib, socket, threading, urllib.parse\n"
    "hits, lock = {}, threading.Lock()\n"
    "out = pathlib.Path.home() / 'loopback-hits'\n"
    "def hit(name):\n"
    "    with lock:\n"
    "        hits[name] = hits.get(name, 0) + 1\n"
    "        out.with_suffix('.part').write_text(json.dumps(hits, sort_keys=True))\n"
    "        os.replace(out.with_suffix('.part'), out)\n"
    "def tcp(port):\n"
    "    s = socket.create_server(('127.0.0.1', port))\n"
    "    while True:\n"
    "        c, _ = s.accept(); hit(f'tcp {port}'); c.close()\n"
    "def udp(port):\n"
    "    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(('127.0.0.1', port))\n"
    "    while True:\n"
    "        s.recv(4096); hit(f'udp {port}')\n"
    "out.write_text('{}')\n"
    "for target, port in ((tcp, 9001), (tcp, 9002), (udp, 9003)):\n"
    "    threading.Thread(target=target, args=(port,), daemon=True).start()\n"
    "class H(http.server.BaseHTTPRequestHandler):\n"
    "    def do_GET(self):\n"
    "        if self.path.startswith('/go?to='):\n"
    "            self.send_response(302); self.send_header('Location', urllib.parse.unquote(self.path[7:]))\n"
    "            self.send_header('Content-Length', '0'); self.end_headers(); return\n"
    f"        body = {PROBES!r}.encode() if self.path == '/probes' else b'<title>Start</title><p>start page</p>'\n"
    "        self.send_response(200); self.send_header('Content-Type', 'text/html')\n"
    "        self.send_header('Content-Length', str(len(body))); self.end_headers(); self.wfile.write(body)\n"
    "server = http.server.ThreadingHTTPServer(('127.0.0.1', 9000), H)\n"
    "pathlib.Path.home().joinpath('start-served').write_text('ok')\n"
    "server.serve_forever()\n")
"""The guest's own services, started from the task's terminal: the start page (with the redirect and
:data:`PROBES`) on 9000, and the listeners the probes aim at: TCP on 9001 and 9002, UDP on 9003, each
connection or datagram counted in ``~/loopback-hits`` (JSON, ``{}`` while none came)."""
TARGETS = [("http://127.0.0.1:8000/livez", REFUSED_AGENT), ("http://127.0.0.1:8080/", REFUSED_LOCAL),
           ("http://2130706433:8000/v1/display", REFUSED_AGENT), ("http://gateway:3128/", REFUSED_GATEWAY)]


def write_task(directory: Path) -> Path:
    """A browser task on the guest's own start page (a server the terminal starts) whose script opens
    and reads it, then follows each of :data:`TARGETS` through the start page's redirect and reads the page,
    then opens :data:`PROBES` and waits for it to finish; its check: nothing reached the listeners."""
    turns = [{"browser": [{"member": "navigate", "arguments": {"url": f"{START}/"}},
                          {"member": "get_page_text", "arguments": {}}]}]
    for target, _ in TARGETS:
        url = f"{START}/go?to={quote(target, safe='')}"
        turns.append({"browser": [{"member": "navigate", "arguments": {"url": url}},
                                  {"member": "get_page_text", "arguments": {}}]})
    turns.append({"browser": [{"member": "navigate", "arguments": {"url": f"{START}/probes"}},
                              {"member": "wait_for", "arguments": {"text": "probes done", "timeout_ms": 30000}}]})
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
        '[[checks]]\nkind = "file"\npath = "~/loopback-hits"\nmatch = "exact"\nvalue = "{}"\n'
        '[offline]\nscript = "rule.offline.jsonl"\n')
    return path


def test_a_page_on_the_tasks_loopback_origin_reaches_no_other_guest_local_service(task_sandbox, tmp_path):
    outcome = run_task(load_task(write_task(tmp_path)), task_sandbox,
                       RunOptions(runs_dir=tmp_path / "runs", live=False, terminal=False))
    entries = read_entries(outcome.record_dir)
    calls = [e for e in entries if e.type == "browser_call"]
    assert outcome.status == "passed", (outcome.reason, calls[-3:])
    outputs = {item.get("call_id"): json.loads(item["output"][0]["text"]) for request in outcome.scripted_requests
               for item in request.get("input") or []
               if isinstance(item, dict) and item.get("type") == "function_call_output"}
    reads = [outputs[c.call_id]["result"]["text"] for c in calls if c.member == "get_page_text"]
    assert len(reads) == 1 + len(TARGETS) and "start page" in reads[0], reads  # the task's origin loads directly
    for (target, reason), text in zip(TARGETS, reads[1:]):
        assert "The sandbox did not load this address" in text and reason in text, (target, text)
        assert '"status"' not in text and "Pickup desk" not in text and "unauthorized" not in text, (target, text)
    assert [c.ok for c in calls if c.member == "navigate"] == [True] * (2 + len(TARGETS))
    assert [c.ok for c in calls if c.member == "wait_for"] == [True]  # the probes ran to their end
    assert [(c["target"], c["observed"]) for c in outcome.checks][1] == ("/home/sandbox/loopback-hits", "{}")
    refused = {e.origin for e in entries if e.type == "network" and e.decision == "deny"}
    # through the gateway, which refused them: the WebSockets (the agent's port, the service in its
    # spellings), TURN over TCP, the loopback TCP candidate
    assert {"https://127.0.0.1:8000", "https://127.0.0.1:9001", "https://localhost:9001",
            "https://127.0.0.1:9002"} <= refused, refused
