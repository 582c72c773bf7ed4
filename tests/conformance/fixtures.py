"""Per-module fixtures of the conformance suite, shared by every place it runs: on a local Xvfb
(``tests/conformance``) and against the agent in a sandbox's guest (``tests/docker``, ``tests/vm``).

Each needs the session's ``desktop`` (an ``AgentDesktop``) and ``target`` fixtures from where it is used.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from .harness import Probe, TextSink, poll


@pytest.fixture(scope="module")
def probe(desktop, target) -> Iterator[Probe]:
    """One probe window for a whole module (tests use marks to see only their own events).

    The module starts from a known state, checked here: nothing pressed on the server, and the probe
    has the keyboard focus with no lock or button on (:meth:`Probe.check_ready_state`).
    """
    state = desktop.pressed()
    assert state is None or state == ([], 0), f"module starts with keys/buttons down: {state}"
    p = desktop.start_probe()
    p.check_ready_state()
    yield p
    p.stop()


@pytest.fixture(scope="module")
def sink(desktop, target) -> Iterator[TextSink]:
    """One ``xterm`` running ``cat > FILE`` for a whole module."""
    s = desktop.start_text_sink()
    yield s
    s.stop()


@pytest.fixture(autouse=True)
def _nothing_left_pressed(desktop) -> Iterator[None]:
    """After every test, the X server reports no key and no button down (within 2 s), where the
    desktop can read its key map (``desktop.pressed()`` is not None).

    The wait is for a guest running a window manager: openbox takes a synchronous passive grab for
    click-to-focus on client windows, so the server freezes pointer events until openbox allows them,
    and a release the agent has already sent (and synced) can show in the device state a moment later.
    A stuck key or button stays down and still fails.
    """
    yield
    last: list = []

    def released() -> bool:
        last[:] = [desktop.pressed()]
        return last[0] is None or last[0] == ([], 0)

    try:
        poll(released, 2.0, interval=0.1, what="no key or button pressed")
    except AssertionError:
        keys, buttons = last[0]
        pytest.fail(f"left pressed: keycodes {keys}, button mask {buttons:#x}")
