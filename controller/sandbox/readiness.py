"""Helpers every backend uses: waiting for the agent and the gateway's control API, reading the decision log,
bounding guest commands."""

from __future__ import annotations

import json
import time
from typing import Any, Callable, Sequence

from controller.sandbox.errors import SandboxError
from controller.text import clean, clean_lines


def wait_agent_ready(
    sandbox_id: str,
    agent_url: str,
    token: str,
    *,
    timeout: float,
    check_alive: Callable[[], None],
    describe: Callable[[], str],
    timings: dict[str, float],
    t0: float,
    first_delay: float = 0.05,
) -> None:
    """Poll the agent's ``GET /livez`` and then ``GET /v1/display`` until each answers 200.

    ``agent_url``/``token``: as ``Sandbox.agent_url``/``agent_token``. ``timeout``: seconds for both.
    ``check_alive()`` runs after every poll that did not answer 200 and raises SandboxError when what runs
    the guest or the gateway has exited. ``describe()``: the backend's last output, appended to the
    timeout error with each line escaped (:func:`controller.text.clean_lines`; the agent's answer too,
    :func:`controller.text.clean`): both come from the guest. ``timings["agent_live"]``/``timings["display_ready"]``: seconds since ``t0``
    (``time.monotonic()``) when each answered. Polls back off from ``first_delay`` (the first stage) or
    0.05 s (the second) to 0.5 s. Raises SandboxError on timeout.
    """
    import httpx

    deadline = time.monotonic() + timeout
    headers = {"Authorization": f"Bearer {token}"}
    stage, path = "agent_live", "/livez"
    delay = first_delay
    last_error = ""
    with httpx.Client(base_url=agent_url, timeout=5.0, trust_env=False) as http:
        while True:
            try:
                resp = http.get(path, headers=headers)
                if resp.status_code == 200:
                    timings[stage] = time.monotonic() - t0
                    if stage == "display_ready":
                        return
                    stage, path, delay = "display_ready", "/v1/display", 0.05
                    continue
                last_error = f"{path}: HTTP {resp.status_code} {clean(resp.text, 200)}"
            except httpx.HTTPError as exc:
                last_error = f"{path}: {type(exc).__name__}: {clean(exc, 300)}"
            check_alive()
            if time.monotonic() > deadline:
                raise SandboxError(
                    f"sandbox {sandbox_id} not ready after {timeout:.0f}s ({last_error}); {clean_lines(describe())}"
                )
            time.sleep(delay)  # poll interval of a condition wait (agent ready), bounded by the deadline
            delay = min(delay * 1.5, 0.5)


def wait_control_ready(
    sandbox_id: str,
    control_url: str,
    token: str,
    *,
    timeout: float,
    check_alive: Callable[[], None],
    describe: Callable[[], str],
) -> None:
    """Poll the gateway control API's ``GET /v1/origin-requests?state=pending`` until it answers 200
    (ARCHITECTURE.md, "Gateway control API").

    ``control_url``/``token``: as ``Sandbox.gateway_control_url``/``gateway_control_token``; ``timeout``:
    seconds; ``check_alive()`` runs after every unanswered poll (raises SandboxError when the gateway
    exited); ``describe()``: the gateway's last output, appended to the timeout error escaped
    (:func:`controller.text.clean_lines`). Raises SandboxError on timeout.
    """
    import httpx

    deadline = time.monotonic() + timeout
    delay = 0.02
    last_error = ""
    with httpx.Client(base_url=control_url, timeout=5.0, trust_env=False) as http:
        while True:
            try:
                resp = http.get("/v1/origin-requests?state=pending", headers={"Authorization": f"Bearer {token}"})
                if resp.status_code == 200:
                    return
                last_error = f"HTTP {resp.status_code} {clean(resp.text, 200)}"
            except httpx.HTTPError as exc:
                last_error = f"{type(exc).__name__}: {clean(exc, 300)}"
            check_alive()
            if time.monotonic() > deadline:
                raise SandboxError(f"gateway control API of sandbox {sandbox_id} not ready after {timeout:.0f}s "
                                   f"({last_error}); {clean_lines(describe())}")
            time.sleep(delay)  # poll interval of a condition wait (control API ready), bounded by the deadline
            delay = min(delay * 1.5, 0.5)


DIRECT_PROBE_S = 2.0
"""Longest :func:`direct_control_url` waits for the control API's answer on a direct address (seconds)."""


def direct_control_url(url: str, token: str, probe_timeout: float = DIRECT_PROBE_S) -> str | None:
    """``url`` (the gateway control API at an address that may not be routable from the controller, such
    as a Docker bridge address) when an authenticated ``GET /v1/origin-requests?state=pending`` there
    answers 200 within ``probe_timeout`` seconds, else None (the caller keeps its published URL)."""
    import httpx

    try:
        with httpx.Client(base_url=url, timeout=probe_timeout, trust_env=False) as http:
            resp = http.get("/v1/origin-requests?state=pending", headers={"Authorization": f"Bearer {token}"})
    except httpx.HTTPError:
        return None
    return url if resp.status_code == 200 else None


def parse_decision_log(text: str) -> list[dict[str, Any]]:
    """The gateway's JSONL decision log as one dict per line (oldest first); a line being written right
    now (not yet valid JSON) and blank lines are skipped. Lines end at ``\n`` only: a raw U+2028 or
    U+0085 in a string (the gateway writes non-ASCII text as it is) stays in its line."""
    entries = []
    for line in text.split("\n"):
        line = line.strip()
        if line:
            try:
                entries.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return entries


DECISIONS_READ_MAX_BYTES = 4 * 1024 * 1024
"""Most bytes of the gateway's decision log one ``decisions_since`` read returns."""

MAX_DECISION_LINE_CHARS = 64 * 1024
"""Longest decision-log line kept as text when it is not JSON (the rest is cut)."""


def parse_decision_lines(data: bytes) -> list[Any]:
    """One item per complete line of ``data`` (a piece of the gateway's JSONL decision log, starting at
    a line boundary): the parsed JSON value, or, for a line that is not JSON, its text (cut to
    :data:`MAX_DECISION_LINE_CHARS`) so that line numbers stay those of the log. Bytes after the last
    newline (a line being written, or cut by a read cap) are not returned."""
    end = data.rfind(b"\n")
    if end < 0:
        return []
    items: list[Any] = []
    for raw in data[:end].split(b"\n"):
        text = raw.decode("utf-8", "replace")
        try:
            items.append(json.loads(text))
        except ValueError:
            items.append(text[:MAX_DECISION_LINE_CHARS])
    return items


def with_timeout(argv: Sequence[str], timeout: float | None) -> list[str]:
    """``argv`` run under coreutils ``timeout`` in the guest when ``timeout`` (seconds) is given: killed
    after it (SIGTERM, SIGKILL 2 s later), exit status 124. See ``Sandbox.exec_in_guest``."""
    if timeout is None:
        return list(argv)
    return ["timeout", "--kill-after=2", f"{timeout:g}", *argv]
