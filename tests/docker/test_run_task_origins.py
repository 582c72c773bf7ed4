"""Origin access end to end in Docker: run-task's code path with a task in ``[network] mode = "ask"``
and ``--approve-origin``. The origin is our own: a container of ours (the audit's target server, role
``allowed``) on a Docker network of ours, to which only the gateway is attached, and which the policy's
``allow_addresses`` names. While the run waits for its ``[[ready]]`` file, the guest fetches a page
from that origin through its proxy; the gateway holds the connection and asks; the controller mirrors
the request and answers it at once, ``by: command line``; the guest gets the page and writes it to the
file the task checks. The record holds the opt-in, the ``approval`` line and the ``network`` line of
the same request id, and reconciles.

Before that the gateway also joins a second network of ours, one that is not internal and whose name
sorts before the sandbox's egress network: Docker then publishes the gateway's ports to its address on
that network, where nothing listens, as an ``--attach-network`` of such a network does. The run must
still reach the control API."""

from __future__ import annotations

import json
import secrets
import threading

import pytest

from controller.gateway.policy import NetworkPolicy, Origin
from controller.run.record import read_entries
from controller.run.runner import RunOptions, run_task
from controller.run.tasks import FileCheck, Ready, Task
from tests.helpers import run_origin_target

pytestmark = [pytest.mark.docker, pytest.mark.slow]

NAME, PORT = "ask-target", 8080
ORIGIN = f"http://{NAME}:{PORT}"

FETCH = (
    "import sys, urllib.request\n"
    "with urllib.request.urlopen(sys.argv[1], timeout=60) as resp:\n"
    "    body = resp.read().decode()\n"
    "open(sys.argv[2], 'w').write(body)\n"
    "print(resp.status, body)\n"
)


@pytest.fixture
def origin_network(docker_client, desktop_image, test_labels):
    """Our network (internal: no way out) with our origin container on it, and an empty network that is not
    internal, named to sort before any sandbox's egress network (``ds-0-...``); yields (network name,
    subnet, container, the second network's name). Removed afterwards."""
    ident = f"ds-test-origin-{secrets.token_hex(4)}"
    network = docker_client.networks.create(ident, driver="bridge", internal=True, labels=test_labels)
    first = docker_client.networks.create(f"ds-0-{ident}", driver="bridge", labels=test_labels)
    container = None
    try:
        network.reload()
        subnet = network.attrs["IPAM"]["Config"][0]["Subnet"]
        container = run_origin_target(docker_client, desktop_image, network.name, f"{ident}-target", NAME, PORT,
                                      test_labels)
        yield network.name, subnet, container, first.name
    finally:
        if container is not None:
            container.remove(force=True)
        network.remove()
        first.remove()


def test_an_ask_origin_approved_from_the_command_line_end_to_end(docker_client, desktop_image, test_labels,
                                                                origin_network, tmp_path):
    from controller.sandbox import SandboxSpec
    from controller.sandbox.docker import GATEWAY_CONTROL_PORT, DockerOptions, DockerSandbox
    from controller.sandbox.readiness import direct_control_url

    def published_control(sb: DockerSandbox) -> str:
        """The control API's published URL as Docker has it now."""
        ports = docker_client.api.inspect_container(sb.gateway.id)["NetworkSettings"]["Ports"]
        return f"http://127.0.0.1:{ports[f'{GATEWAY_CONTROL_PORT}/tcp'][0]['HostPort']}"

    network_name, subnet, target, first = origin_network
    policy = NetworkPolicy.model_validate({"mode": "ask", "ask": [ORIGIN], "quiet": [], "allow_addresses": [subnet],
                                           "hold_timeout_s": 25})
    task = Task(name="origin-ask", instructions="x", network=policy,
                ready=[Ready(file="~/fetched.txt", timeout_s=60.0)],
                checks=[FileCheck(kind="file", path="~/fetched.txt", match="text",
                                  value="audit-allowed /page")])
    script = tmp_path / "script.jsonl"
    script.write_text(json.dumps({"actions": [{"type": "wait"}]}) + "\n" + json.dumps({"message": "done"}) + "\n")
    started: list[DockerSandbox] = []
    fetched: list[object] = []
    moved: list[bool] = []  # whether the published control port stopped answering after the first attach

    def open_(t: Task) -> DockerSandbox:
        spec = SandboxSpec(screen_width=t.screen.width, screen_height=t.screen.height,
                           policy=t.network.model_dump(mode="json"))
        sb = DockerSandbox.start(spec, DockerOptions(image=desktop_image, extra_labels=test_labels),
                                 client=docker_client)
        started.append(sb)
        assert sb.gateway_control_url, "this image's gateway has no control API"
        sb.attach_gateway(first)
        moved.append(direct_control_url(published_control(sb), sb.gateway_control_token) is None)
        sb.attach_gateway(network_name)
        # the guest asks for the page now; the gateway holds it until the controller's watch answers
        threading.Thread(target=lambda: fetched.append(sb.exec_in_guest(
            ["/opt/desktop-sandbox/bin/python", "-c", FETCH, f"{ORIGIN}/page",
             f"{sb.guest_home}/fetched.txt"], timeout=90)), daemon=True).start()
        return sb

    try:
        outcome = run_task(task, open_, RunOptions(runs_dir=tmp_path / "runs", live=False, terminal=False, script=script,
                                                   approve_origins=[Origin.parse(ORIGIN)]))
    finally:
        for sb in started:
            sb.close()
    assert moved == [True], "the published control port still answers after the attach: this test shows nothing"
    assert fetched and fetched[0].exit_code == 0, fetched
    assert fetched[0].stdout.decode().startswith("200 audit-allowed /page"), fetched[0].stdout
    assert outcome.status == "passed", outcome.reason
    entries = read_entries(outcome.record_dir)
    approvals = [e for e in entries if e.type == "approval"]
    assert [(a.what, a.decision, a.by, a.origin) for a in approvals] == [
        ("opt-in", "approved", "command line", ORIGIN), ("origin_access", "approved", "command line", ORIGIN)]
    network = [e for e in entries if e.type == "network" and e.origin == ORIGIN]
    assert [(n.decision, n.reason) for n in network] == [("allow", "approved")]
    assert network[0].request_id == approvals[1].request_id and network[0].request_id.startswith("oreq_")
    assert network[0].held_ms is not None
    [netlog] = [e for e in entries if e.type == "network_log"]
    assert netlog.complete is True
    ids = {e.request_id for e in entries if e.type == "network" and e.request_id}
    assert ids <= {a.request_id for a in approvals}, "a request in the gateway's log has no approval line"
    hits = [json.loads(line) for line in target.logs().decode().splitlines() if line.startswith("{")]
    assert [h["head"] for h in hits if h.get("hit") == "http"] == ["GET /page HTTP/1.1"]  # exactly one, after approval
