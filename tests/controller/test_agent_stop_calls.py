"""A stopping caller shortens the agent client's calls (``AgentClient.stop_calls``): against an agent
that reads each request and never answers (what a desktop program holding the X server grabbed makes
of every call), a call in flight ends ``interrupted`` once the grace has passed, each later call ends
``deadline`` within the grace, and ``stop_calls(None)`` gives calls their own deadline again."""

from __future__ import annotations

import socket
import threading
import time
from typing import Iterator

import pytest

from controller.agent_client import AgentClient, AgentError

GRACE_S = 0.3
CALL_S = 20.0
"""The client's own per-call deadline here: far past anything the test waits for."""


@pytest.fixture
def silent_agent() -> Iterator[tuple[str, list[socket.socket]]]:
    """``http://127.0.0.1:PORT`` of a peer that reads every request and never answers."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    held: list[socket.socket] = []

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            held.append(conn)

    threading.Thread(target=serve, daemon=True).start()
    yield f"http://127.0.0.1:{server.getsockname()[1]}", held
    server.close()
    for conn in held:
        conn.close()


def _timed(call) -> tuple[float, AgentError]:  # noqa: ANN001
    started = time.monotonic()
    with pytest.raises(AgentError) as caught:
        call()
    return time.monotonic() - started, caught.value


def test_a_call_in_flight_is_cut_after_the_grace_and_later_calls_get_no_more(silent_agent):
    url, _held = silent_agent
    client = AgentClient(url, "t", timeout=CALL_S)
    result: dict[str, object] = {}

    def in_flight() -> None:
        result["took"], result["error"] = _timed(client.display)

    thread = threading.Thread(target=in_flight)
    thread.start()
    time.sleep(0.3)  # the call is under way
    stopped = time.monotonic()
    client.stop_calls(GRACE_S)
    thread.join(5)
    assert not thread.is_alive(), "the call in flight was not cut"
    assert result["error"].code == "interrupted"
    assert time.monotonic() - stopped < GRACE_S + 0.5
    took, error = _timed(client.display)
    assert error.code == "deadline" and took < GRACE_S + 0.5
    client.stop_calls(None)
    later = threading.Thread(target=lambda: result.update(late=_timed(client.display)), daemon=True)
    later.start()
    later.join(GRACE_S + 1.0)
    assert later.is_alive(), "a call after stop_calls(None) ended before its own deadline"
    client.close()
