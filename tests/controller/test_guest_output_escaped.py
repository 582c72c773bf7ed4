"""Text the guest chooses -- its console, the agent's answers, the guest agent's errors, the labels a
sandbox carries -- reaches an error message or a log record escaped (controller.text), line by line
where it is output: no Docker, no QEMU (the VM backend's processes and channel are stood in for)."""

from __future__ import annotations

import json
import logging
import socket
import threading
from pathlib import Path

import pytest

from controller.sandbox import LABEL_OWNER, SandboxError, reap, wait_agent_ready
from controller.sandbox.vm import VMSandbox
from controller.sandbox.vm_qga import GuestAgentChannel
from tests.controller.hostile_text import EVIL, SHOWN, assert_shown_safely
from tests.helpers import QuietHandler, reply, serve_http


def test_the_warning_about_a_sandbox_left_in_place_shows_its_labels_escaped(caplog):
    removed: list[str] = []
    with caplog.at_level(logging.WARNING, logger="controller.sandbox"):
        assert reap({"ds-" + EVIL: {LABEL_OWNER: EVIL}}, removed.append) == []
    assert removed == [] and len(caplog.records) == 1
    message = caplog.records[0].getMessage()
    assert_shown_safely(message)
    assert "left in place" in message


@pytest.fixture
def hostile_agent():
    """An agent that answers every request 503 with a hostile body; yields its URL."""

    class Handler(QuietHandler):
        def do_GET(self) -> None:  # noqa: N802
            reply(self, 503, EVIL.encode())

    server = serve_http(Handler)
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_a_readiness_timeout_shows_the_agents_answer_and_the_console_escaped(hostile_agent):
    with pytest.raises(SandboxError) as caught:
        wait_agent_ready("ds-x", hostile_agent, "token", timeout=0.2, check_alive=lambda: None,
                         describe=lambda: "console:\n" + EVIL + "\r\nlogin:", timings={}, t0=0.0)
    message = str(caught.value)
    assert_shown_safely(message)
    assert "HTTP 503 " + SHOWN[:40] in message
    console = message.split("console:\n", 1)[1].split("\n")  # its lines kept, each escaped, CRLF read as one break
    assert len(console) == 2 and console[0].startswith(SHOWN) and console[1] == "login:", console


class _Exited:
    """A process that has exited (stands in for QEMU)."""

    returncode = 1

    def poll(self) -> int:
        return self.returncode


def test_a_vm_that_exited_is_reported_with_its_console_escaped_line_by_line(tmp_path: Path):
    (tmp_path / "console.log").write_text("[    0.1] boot\n" + EVIL + "\nlast console line\n")
    (tmp_path / "qemu.log").write_text("qemu: " + EVIL + "\n")
    (tmp_path / "gateway.log").write_text("gateway: " + EVIL + "\n")
    sandbox = VMSandbox("dv-test", tmp_path)
    sandbox.qemu = _Exited()  # type: ignore[assignment]
    with pytest.raises(SandboxError) as caught:
        sandbox._check_alive()
    message = str(caught.value)
    assert_shown_safely(message)
    lines = message.split("\n")
    assert "last console line" in lines and "[    0.1] boot" in lines
    assert SHOWN in message and "qemu: " + SHOWN in message and "gateway: " + SHOWN in message


def test_an_error_from_the_guest_agent_is_shown_escaped(tmp_path: Path):
    """qemu-guest-agent runs in the guest: its error descriptions are the guest's text."""
    path = tmp_path / "qga.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(1)

    def guest_agent() -> None:
        conn, _ = listener.accept()
        with conn, conn.makefile("rwb") as stream:
            for line in stream:
                msg = json.loads(line)
                if msg["execute"] == "guest-sync-delimited":
                    reply = {"return": msg["arguments"]["id"]}
                else:
                    reply = {"error": {"class": "GenericError", "desc": EVIL}}
                stream.write(json.dumps(reply).encode() + b"\n")
                stream.flush()

    thread = threading.Thread(target=guest_agent, daemon=True)
    thread.start()
    channel = GuestAgentChannel(path)
    try:
        with pytest.raises(SandboxError) as caught:
            channel.command("guest-exec", {"path": "/bin/true"}, timeout=10)
    finally:
        channel.close()
        listener.close()
        thread.join(10)
    assert_shown_safely(str(caught.value))
    assert SHOWN[:40] in str(caught.value)


def test_a_decision_whose_origin_holds_a_unicode_line_break_is_not_lost():
    from controller.sandbox import parse_decision_log

    log = ('{"origin": "http://a\u2028b:80", "decision": "deny", "reason": "not-allowlisted"}\n'
           '{"origin": "http://c\x85d:80", "decision": "deny", "reason": "not-allowlisted"}\n')
    assert [d["origin"] for d in parse_decision_log(log)] == ["http://a\u2028b:80", "http://c\x85d:80"]
