"""The connection rules (``wire.connections``) of the guest agent (``python -m guest serve`` on a local
Xvfb) with a low descriptor limit: a flood of connections that never finish their request head leaves the
agent answering a client with the token at once and is closed by the head deadline, while a connection
that carried the token stays open past that deadline between requests (the controller keeps agent
connections 240 s)."""

from __future__ import annotations

import socket
import time

import httpx
import pytest

from tests.slow_clients import FLOOD, LOW_LIMIT, Unfinished, descriptors, limit_descriptors
from wire.connections import HEAD_TIMEOUT_S

pytestmark = pytest.mark.slow

ANSWER_S = 5.0
"""Longest a request with the token may take while the flood is held (seconds)."""


def _display(agent, sock: socket.socket | None = None) -> int:
    """Status of ``GET /v1/display`` with the token (on ``sock``, kept alive, when given)."""
    if sock is None:
        return httpx.get(agent.base_url + "/v1/display", headers={"Authorization": f"Bearer {agent.token}"},
                         timeout=ANSWER_S).status_code
    sock.sendall(f"GET /v1/display HTTP/1.1\r\nHost: 127.0.0.1:{agent.port}\r\n"
                 f"Authorization: Bearer {agent.token}\r\n\r\n".encode())
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = sock.recv(1)
        assert chunk, "the agent closed the connection"
        head += chunk
    length = next(int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length:"))
    body = b""
    while len(body) < length:
        body += sock.recv(length - len(body))
    return int(head.split()[1])


def test_unfinished_connections_past_the_descriptor_limit_leave_the_agent_answering(xvfb, make_agent):
    agent = make_agent(xvfb.display)
    pid = agent.proc.pid
    with socket.create_connection(("127.0.0.1", agent.port), timeout=ANSWER_S) as kept:
        assert _display(agent, kept) == 200  # carried the token: no head deadline while it idles
        limit_descriptors(pid)
        flood = Unfinished(("127.0.0.1", agent.port), FLOOD)
        try:
            held = descriptors(pid)
            started = time.monotonic()
            assert _display(agent) == 200
            assert time.monotonic() - started < ANSWER_S
            assert held < LOW_LIMIT, f"{held} descriptors open under a limit of {LOW_LIMIT}"
            closed = flood.wait_all_closed()
            assert closed == FLOOD, f"{closed} of {FLOOD} unfinished connections closed by the head deadline"
        finally:
            flood.close()
        assert time.monotonic() - started > HEAD_TIMEOUT_S
        assert _display(agent, kept) == 200, "an authenticated idle connection must outlive the head deadline"
