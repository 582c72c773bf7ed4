"""A kept-alive connection to a real agent outlives the idle time between model steps: uvicorn's
default keep-alive (5 s) would close it while a live model thinks, and every step would pay a new
connection. The agent keeps an idle connection 300 s (``guest/serve.py``); the client gives it up at
``KEEPALIVE_EXPIRY_S``, safely before."""

from __future__ import annotations

import json
import socket

import pytest

from controller.agent_client import AgentClient
from controller.agent_transport import KEEPALIVE_EXPIRY_S

OLD_KEEPALIVE_S = 5.0  # uvicorn's default, what the agent used before
IDLE_WAIT_S = 6.5      # how long the connection must stay open while idle: past the old keep-alive


def _answer(sock: socket.socket) -> tuple[int, bytes]:
    """Read one Content-Length answer: its status and body."""
    buf = b""
    while b"\r\n\r\n" not in buf:
        data = sock.recv(65536)
        assert data, "the agent closed the connection before answering"
        buf += data
    head, _, body = buf.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    length = int(headers["content-length"])
    while len(body) < length:
        data = sock.recv(65536)
        assert data, "the agent closed the connection inside an answer"
        body += data
    assert len(body) == length
    return int(lines[0].split()[1]), body


def test_an_idle_connection_to_the_agent_stays_open_past_the_old_keep_alive(xvfb, make_agent):
    agent = make_agent(xvfb.display)
    host, port = agent.base_url.removeprefix("http://").rsplit(":", 1)
    request = (f"GET /v1/display HTTP/1.1\r\nHost: {host}:{port}\r\nAuthorization: Bearer {agent.token}\r\n"
               "\r\n").encode()
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(request)
        status, body = _answer(sock)
        assert status == 200 and json.loads(body)["width"] == 1280
        # The property under test: no EOF (and nothing else) while the connection idles past 5 s.
        sock.settimeout(IDLE_WAIT_S)
        with pytest.raises(TimeoutError):
            data = sock.recv(1)
            pytest.fail(f"the agent ended the idle connection ({data!r}) within {IDLE_WAIT_S} s")
        sock.settimeout(10)
        sock.sendall(request)
        status, body = _answer(sock)
        assert status == 200 and json.loads(body)["height"] == 800


def test_the_client_keeps_its_connection_across_calls_to_a_real_agent(xvfb, make_agent):
    """Calls reuse one connection: the agent sees one client port for all of them."""
    agent = make_agent(xvfb.display)
    assert OLD_KEEPALIVE_S < IDLE_WAIT_S < KEEPALIVE_EXPIRY_S
    with AgentClient(agent.base_url, agent.token, timeout=20) as client:
        ports = set()
        for _ in range(5):
            client.display()
            ((conn,),) = [client._transport._idle]  # the one kept-alive connection, idle between calls
            ports.add(conn.sock.getsockname()[1])
        step = client.actions_screenshot([{"type": "move", "x": 10, "y": 10}], max_width=1280, max_height=800)
        assert step.executed == 1 and step.screenshot.image_size == (1280, 800)
        ((conn,),) = [client._transport._idle]
        ports.add(conn.sock.getsockname()[1])
    assert len(ports) == 1
