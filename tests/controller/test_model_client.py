"""The model clients stop with the run (``controller.run.model_client``): against a loopback server that
never answers, answers its head and then nothing, or asks for a retry a minute later, a request ends
with ``ModelRequestStopped`` within a few polls of the run's ``stopping`` flag turning true, and is not
sent again; a server that answers is read as before (the usage meter sees the response)."""

from __future__ import annotations

import json
import socket
import threading
import time
from typing import Iterator

import pytest

from controller.run.model_client import ModelRequestStopped, UsageMeter, live_client, offline_client

STOP_AFTER_S = 0.3
"""When the test's flag turns true (seconds after the request was sent)."""
ENDS_WITHIN_S = 1.0
"""Longest a request may take from the flag to its end (polls every 0.1 s)."""

ANSWER = json.dumps({"id": "resp_1", "object": "response", "created_at": 0, "status": "completed", "model": "m",
                     "output": [], "parallel_tool_calls": False, "tool_choice": "auto", "tools": [],
                     "usage": {"input_tokens": 1, "output_tokens": 2, "total_tokens": 3}}).encode()


class Server:
    """A loopback HTTP server answering every request as ``mode`` says: ``never`` (reads, never
    answers), ``head`` (the status line and headers of a 1000-byte body, then nothing), ``retry`` (429
    with ``Retry-After: 60``), ``ok`` (a Responses answer). ``requests``: how many came."""

    def __init__(self, mode: str) -> None:
        self.mode, self.requests = mode, 0
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.port = self.sock.getsockname()[1]
        self.held: list[socket.socket] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.held.append(conn)
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = conn.recv(65536)
            if not chunk:
                return
            data += chunk
        self.requests += 1
        if self.mode == "head":
            conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 1000\r\n\r\n{")
        elif self.mode == "retry":
            conn.sendall(b"HTTP/1.1 429 Too Many Requests\r\nretry-after: 60\r\ncontent-length: 2\r\n\r\n{}")
        elif self.mode == "ok":
            conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: "
                         + str(len(ANSWER)).encode() + b"\r\n\r\n" + ANSWER)

    def close(self) -> None:
        self.sock.close()
        for conn in self.held:
            conn.close()


@pytest.fixture
def server(request: pytest.FixtureRequest) -> Iterator[Server]:
    served = Server(request.param)
    yield served
    served.close()


class Flag:
    """The run's stopping flag, turned true :data:`STOP_AFTER_S` after :meth:`arm`."""

    def __init__(self) -> None:
        self.value, self.at = False, None

    def __call__(self) -> bool:
        return self.value

    def arm(self) -> "Flag":
        def turn() -> None:
            time.sleep(STOP_AFTER_S)
            self.at = time.monotonic()
            self.value = True
        threading.Thread(target=turn, daemon=True).start()
        return self


def _clients(port: int, flag: Flag, monkeypatch: pytest.MonkeyPatch, meter: UsageMeter | None = None):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    monkeypatch.setenv("OPENAI_BASE_URL", f"http://127.0.0.1:{port}/v1")
    return {"live": live_client(meter, stopping=flag),
            "offline": offline_client(f"http://127.0.0.1:{port}/v1", meter, api_key="sk-test", stopping=flag)}


@pytest.mark.parametrize("server, which", [("never", "live"), ("head", "live"), ("retry", "live"),
                                           ("never", "offline"), ("head", "offline")],
                         indirect=["server"])  # the offline client never retries
def test_a_request_ends_once_the_run_stops_and_is_not_sent_again(server, which, monkeypatch):
    flag = Flag()
    client = _clients(server.port, flag, monkeypatch)[which]
    flag.arm()
    with pytest.raises(ModelRequestStopped):
        client.responses.create(model="m", input="hi")
    took = time.monotonic() - flag.at
    assert took < ENDS_WITHIN_S, f"{took:.2f}s from the flag to the end"
    assert server.requests == 1


@pytest.mark.parametrize("server", ["never"], indirect=True)
def test_a_request_is_not_sent_once_the_run_is_stopping(server, monkeypatch):
    flag = Flag()
    flag.value = True
    with pytest.raises(ModelRequestStopped):
        _clients(server.port, flag, monkeypatch)["live"].responses.create(model="m", input="hi")
    time.sleep(0.2)
    assert server.requests == 0


@pytest.mark.parametrize("server", ["ok"], indirect=True)
@pytest.mark.parametrize("which", ["live", "offline"])
def test_an_answer_is_read_as_before(server, which, monkeypatch):
    meter = UsageMeter()
    client = _clients(server.port, Flag(), monkeypatch, meter)[which]
    response = client.responses.create(model="m", input="hi")
    assert response.id == "resp_1"
    assert [(r.response_id, r.status, r.total_tokens) for r in meter.requests] == [("resp_1", 200, 3)]
