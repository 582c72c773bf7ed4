"""Per-module fixtures of the conformance suite, shared by every place it runs: on a local Xvfb
(``tests/conformance``) and against the agent in a sandbox's guest (``tests/docker``, ``tests/vm``).

Each needs the session's ``desktop`` (an ``AgentDesktop``) and ``target`` fixtures from where it is used.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from .harness import Probe, TextSink


@pytest.fixture(scope="module")
def probe(desktop, target) -> Iterator[Probe]:
    """One probe window for a whole module (tests use marks to see only their own events)."""
    p = desktop.start_probe()
    yield p
    p.stop()


@pytest.fixture(scope="module")
def sink(desktop, target) -> Iterator[TextSink]:
    """One ``xterm`` running ``cat > FILE`` for a whole module."""
    s = desktop.start_text_sink()
    yield s
    s.stop()
