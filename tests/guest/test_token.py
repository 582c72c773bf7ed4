"""``POST /v1/token`` on the real agent (``python -m guest serve`` on a local Xvfb): the new token is the
only one accepted from then on (also on a connection opened with the old one), the token file holds it
(a restarted agent reads it), the connection guard counts it as the key (a connection carrying it idles
past the head deadline), and a malformed token is refused with nothing changed."""

from __future__ import annotations

import secrets
import socket
import time
from pathlib import Path

import httpx
import pytest

from wire.connections import HEAD_TIMEOUT_S

from .test_connections import _display

pytestmark = pytest.mark.slow


def _post(agent, token: str, body) -> int:  # noqa: ANN001
    return httpx.post(agent.base_url + "/v1/token", json=body, timeout=10,
                      headers={"Authorization": f"Bearer {token}"}).status_code


def test_a_new_token_replaces_the_old_one_everywhere(xvfb, make_agent):
    agent = make_agent(xvfb.display)
    old, new = agent.token, secrets.token_urlsafe(32)
    with socket.create_connection(("127.0.0.1", agent.port), timeout=10) as kept:
        assert _display(agent, kept) == 200
        for bad in ({"token": "short"}, {"token": "é" * 40}, {"token": new, "more": 1}, {"tok": new}, [new],
                    {"token": "x y" * 20}):
            assert _post(agent, old, bad) == 400, bad
        assert _post(agent, "wrong-token-" + "x" * 30, {"token": new}) == 401
        assert _display(agent) == 200  # nothing changed yet
        assert _post(agent, old, {"token": new}) == 204
        assert _display(agent, kept) == 401  # the connection opened with the old token gains nothing
    assert _display(agent) == 401
    agent.token = new
    assert _display(agent) == 200
    token_file = Path(agent._dir.name) / "token"
    assert token_file.read_text().strip() == new
    assert token_file.stat().st_mode & 0o777 == 0o400
    with socket.create_connection(("127.0.0.1", agent.port), timeout=10) as kept:
        assert _display(agent, kept) == 200
        time.sleep(HEAD_TIMEOUT_S + 1.0)  # idle past the head deadline: the guard took the new token as the key
        assert _display(agent, kept) == 200
