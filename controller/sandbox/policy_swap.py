"""The controller's side of a runtime policy swap: ``PUT /v1/policy`` on the gateway's control API
(:mod:`controller.gateway.control`), its answer read with a size cap and a deadline (the gateway sits
next to the hostile guest)."""

from __future__ import annotations

import json
import time
from typing import Any

from controller.sandbox.errors import SandboxError
from controller.text import clean

MAX_ANSWER_BYTES = 256 * 1024
"""Largest answer read from ``PUT /v1/policy`` (bytes)."""


class PolicyRefused(SandboxError):
    """The gateway refused a policy (``code``, ``message``: its words, escaped)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"the gateway refused the policy: {code}: {message}")
        self.code, self.message = code, message


def _exchange(method: str, control_url: str, token: str, body: bytes | None, timeout: float) -> tuple[int, Any, bytes]:
    """One call of ``/v1/policy``: ``(status, parsed JSON or None, raw body)``, the answer read up to
    :data:`MAX_ANSWER_BYTES` within ``timeout`` seconds. Raises SandboxError when there is none."""
    import httpx

    deadline = time.monotonic() + timeout
    raw = bytearray()
    headers = {"Authorization": f"Bearer {token}", **({"Content-Type": "application/json"} if body else {})}
    try:
        with httpx.Client(base_url=control_url, timeout=timeout, trust_env=False) as http:
            with http.stream(method, "/v1/policy", content=body, headers=headers) as resp:
                for chunk in resp.iter_bytes():
                    raw += chunk
                    if len(raw) > MAX_ANSWER_BYTES:
                        raise SandboxError(f"the gateway's policy answer is over {MAX_ANSWER_BYTES} bytes")
                    if time.monotonic() > deadline:
                        raise SandboxError(f"the gateway's policy answer took over {timeout:g} s")
                status = resp.status_code
    except httpx.HTTPError as exc:
        raise SandboxError(f"the gateway's control API did not answer {method} /v1/policy: {clean(exc, 300)}") from None
    try:
        data = json.loads(bytes(raw))
    except (ValueError, RecursionError):
        data = None
    return status, data, bytes(raw)


def put_policy(control_url: str, token: str, policy_json: str, *, timeout: float = 10.0) -> dict[str, Any]:
    """Send ``policy_json`` (a ``[network]`` table as JSON text) to the gateway at ``control_url``
    with bearer ``token``; the gateway's answer ``{"policy", "closed", "pending_refused"}``. Raises
    PolicyRefused for a 4xx with an error body, SandboxError when there is no complete answer of at
    most :data:`MAX_ANSWER_BYTES` within ``timeout`` seconds or it is malformed."""
    status, data, raw = _exchange("PUT", control_url, token, policy_json.encode(), timeout)
    if status >= 400:
        err = data.get("error") if isinstance(data, dict) else None
        if isinstance(err, dict):
            raise PolicyRefused(clean(err.get("code"), 40), clean(err.get("message"), 1000))
        raise SandboxError(f"the gateway answered HTTP {status} to the policy: {clean(raw[:300], 300)}")
    if not isinstance(data, dict) or not isinstance(data.get("policy"), dict) \
            or not isinstance(data.get("closed"), int) or not isinstance(data.get("pending_refused"), int):
        raise SandboxError("the gateway's policy answer is malformed")
    return {"policy": data["policy"], "closed": data["closed"], "pending_refused": data["pending_refused"]}


def get_policy(control_url: str, token: str, *, timeout: float = 10.0) -> dict[str, Any]:
    """The policy the gateway at ``control_url`` enforces now (``GET /v1/policy``). Raises SandboxError
    when there is no complete answer of at most :data:`MAX_ANSWER_BYTES` within ``timeout`` seconds, or
    it is not a policy."""
    status, data, raw = _exchange("GET", control_url, token, None, timeout)
    if status != 200 or not isinstance(data, dict) or not isinstance(data.get("policy"), dict):
        raise SandboxError(f"the gateway answered HTTP {status} to GET /v1/policy: {clean(raw[:200], 200)}")
    return data["policy"]


__all__ = ["MAX_ANSWER_BYTES", "PolicyRefused", "get_policy", "put_policy"]
