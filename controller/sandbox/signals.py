"""Signals around a sandbox: deferred during steps that must not be cut in half, turned into exceptions
where a ``with`` block should unwind (see ``controller.sandbox``'s docstring)."""

from __future__ import annotations

import contextlib
import signal
import threading
from typing import Callable, Iterator, Sequence


class SandboxInterrupted(BaseException):
    """Raised in the main thread on SIGTERM/SIGHUP while a sandbox is open, so ``with`` blocks unwind.

    A BaseException (like KeyboardInterrupt) so that ``except Exception`` in callers does not swallow it.
    """

    def __init__(self, signum: int) -> None:
        super().__init__(f"interrupted by signal {signal.Signals(signum).name}")
        self.signum = signum


INTERRUPT_SIGNALS: tuple[int, ...] = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
"""The signals that stop a run or a sandbox (Ctrl-C, ``kill``, a closed terminal)."""


def interruption(signum: int) -> BaseException:
    """What a noted signal turns into: KeyboardInterrupt for SIGINT, else ``SandboxInterrupted``."""
    return KeyboardInterrupt() if signum == signal.SIGINT else SandboxInterrupted(signum)


@contextlib.contextmanager
def signals_deferred(signums: Sequence[int] = INTERRUPT_SIGNALS, *, redeliver: bool = True) -> Iterator[list[int]]:
    """Within the block, ``signums`` are only noted (appended to the list this yields), never acted on.

    For steps that must not be cut in half (a teardown, a Docker call whose result must be known). On
    exit the previous handlers come back and, with ``redeliver``, each signal noted is raised once more
    (in the order first seen), so they handle it now; without it the caller acts on the list. Outside the
    main thread it does nothing and yields an empty list (Python delivers signals to the main thread).
    """
    if threading.current_thread() is not threading.main_thread():
        yield []
        return
    noted: list[int] = []

    def _note(signum: int, _frame: object) -> None:
        noted.append(signum)

    previous = {s: signal.signal(s, _note) for s in signums}
    try:
        yield noted
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        if redeliver:
            for s in dict.fromkeys(noted):
                signal.raise_signal(s)


_thread_abort = threading.local()


@contextlib.contextmanager
def abort_starts_when(condition: Callable[[], bool]) -> Iterator[None]:
    """Within the block, on this thread, a sandbox start is abandoned at its next step once
    ``condition()`` is true, as a signal would abandon it in the main thread (``Sandbox._checkpoint``
    raises ``SandboxInterrupted(SIGTERM)``; what the start created is removed). For starts on a
    background thread (a warm pool's filler), where no signal arrives."""
    previous = getattr(_thread_abort, "condition", None)
    _thread_abort.condition = condition
    try:
        yield
    finally:
        _thread_abort.condition = previous


def start_aborted() -> bool:
    """Whether this thread's :func:`abort_starts_when` condition holds (False outside one)."""
    condition = getattr(_thread_abort, "condition", None)
    return bool(condition is not None and condition())


@contextlib.contextmanager
def raise_on_signals(signums: Sequence[int] = (signal.SIGTERM, signal.SIGHUP)) -> Iterator[None]:
    """Within the block, turn ``signums`` into ``SandboxInterrupted`` raised in the main thread.

    Lets ``finally``/``with`` teardown run when a run is stopped with ``kill`` (Ctrl-C already raises
    KeyboardInterrupt). Outside the main thread it does nothing (Python delivers signals there only).
    Previous handlers are restored on exit.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def _raise(signum: int, _frame: object) -> None:
        raise SandboxInterrupted(signum)

    previous = {s: signal.signal(s, _raise) for s in signums}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
