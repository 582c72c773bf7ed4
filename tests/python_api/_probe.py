"""What the guest's input-event probe logged, read through a :class:`desktop_sandbox.Sandbox`, and the
bounded wait the public API's tests use (:func:`tests.conformance.harness.poll`)."""

from __future__ import annotations

import json
from typing import Any, Callable

from tests.conformance.harness import poll


def probe_events(sb: Any, log: str) -> list[dict[str, Any]]:
    """Every complete line the probe wrote to ``log`` so far (none before it wrote one)."""
    try:
        text = sb.read_file(log).decode()
    except Exception:  # noqa: BLE001 - not written yet
        return []
    return [json.loads(line) for line in text[: text.rfind("\n") + 1].splitlines() if line]


def wait(predicate: Callable[[], Any], what: str, timeout: float = 15.0) -> Any:
    """``predicate()``'s first true value, polled every 50 ms; AssertionError past ``timeout`` seconds."""
    return poll(predicate, timeout, interval=0.05, what=what)
