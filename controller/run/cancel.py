"""A run's cancellation: signals, a view's Cancel, a service that stayed unreachable.

:class:`Cancellation` is polled by the loop (the SDK's ``cancelled``), by every wait of the run, and
by the thread that withdraws pending questions once it is set; see its docstring for which signal does
what when.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from typing import Callable, Iterator

from rich.console import Console

from controller.run.progress import clean
from controller.run.registry import ApprovalRegistry

WITHDRAW_POLL_S = 0.1
"""How often the run's cancellation thread looks at the signal handler's flag (seconds): the longest a
pending question stays pending after a signal (:meth:`Cancellation.withdraw_on_cancel`)."""


class RunStopped(Exception):
    """The run was cancelled (the flag was set): raised between phases and steps, caught by the run."""


class Cancellation:
    """Cooperative cancellation: first Ctrl-C (or SIGTERM, SIGHUP) sets the flag the SDK polls; a second
    Ctrl-C raises KeyboardInterrupt, but only while ``installed(interruptible=True)`` (the run's body):
    before it and during teardown and the record every signal only sets the flag, so nothing is cut
    short. Signal handlers are installed only in the main thread. The handler only notes; what it
    has to say is printed at the next poll (``announce``), and the pending questions are withdrawn by
    :meth:`withdraw_on_cancel`'s thread (the handler must take no lock). :meth:`fail` stops the run the
    same way when a service it needs stays unreachable; it then ends ``error``."""

    def __init__(self) -> None:
        self.is_set = False  # a plain flag, not a threading.Event: its lock could deadlock the handler
        self.signal: str | None = None
        self.failure: str | None = None
        self.interruptible = False
        self._notes: list[str] = []
        self._console: Console | None = None
        self._on_stop: list[Callable[[], None]] = []  # run by the cancellation thread once the flag is set
        self._stop_ran = False
        self._hooks = threading.Lock()  # between the main thread and the cancellation thread, never the handler
        self._watch: threading.Thread | None = None

    def __call__(self) -> bool:
        self.announce()
        return self.is_set

    @property
    def reason(self) -> str | None:
        """Why the run is stopping (``cancelled by SIGTERM``, ``cancelled by console``, or the
        :meth:`fail` reason); None while it goes on. A request withdrawn on the way out carries it
        (:meth:`controller.run.registry.ApprovalRegistry.wait` reads it from its ``cancelled``)."""
        if self.signal is not None:
            return f"cancelled by {self.signal}"
        return self.failure

    def fail(self, reason: str) -> None:
        """Stop the run as a cancellation does, but to end it ``error`` with ``reason`` (one line naming
        the service that stayed unreachable). From any thread; nothing once the run is stopping."""
        if self.is_set:
            return
        self.failure = clean(reason, 400)
        self.is_set = True
        self._notes.append(f"stopping the run: {self.failure}")

    def withdraw_on_cancel(self, registry: ApprovalRegistry) -> threading.Thread:
        """Start the thread that closes ``registry`` with :attr:`reason` once the flag is set (a signal,
        :meth:`fail`): every pending question is withdrawn within :data:`WITHDRAW_POLL_S`, whoever waits
        for it -- the loop in the main thread (whether or not its callback polls the flag), a terminal
        prompt, the console -- and one asked later is withdrawn as it opens. The thread ends once the
        registry is closed, by it or by the run's end; returns it."""

        def watch() -> None:
            while registry.closed is None:
                if self.is_set:
                    self._stopping()
                    registry.close(self.reason or "run cancelled")
                    return
                time.sleep(WITHDRAW_POLL_S)  # poll interval: the signal handler sets a plain flag only

        thread = threading.Thread(target=watch, name="run-cancel", daemon=True)
        thread.start()
        self._watch = thread
        return thread

    def on_stop(self, hook: Callable[[], None]) -> None:
        """Call ``hook()`` once the run is stopping: from :meth:`withdraw_on_cancel`'s thread within
        :data:`WITHDRAW_POLL_S` of the flag, or now when that thread already saw it."""
        with self._hooks:
            if not self._stop_ran:
                self._on_stop.append(hook)
                return
        with contextlib.suppress(Exception):
            hook()

    def _stopping(self) -> None:
        with self._hooks:
            self._stop_ran = True
            hooks, self._on_stop = self._on_stop, []
        for hook in hooks:
            with contextlib.suppress(Exception):  # a hook that fails stops nothing else
                hook()

    def join_watch(self, timeout: float = 1.0) -> None:
        """Wait for :meth:`withdraw_on_cancel`'s thread to end (it does within :data:`WITHDRAW_POLL_S`
        of the registry's close): no hook runs after this."""
        if self._watch is not None and self._watch is not threading.current_thread():
            self._watch.join(timeout)

    def announce(self) -> None:
        """Print the lines the handler noted. Never from the handler itself: printing there can re-enter
        the console's stream or an import the main thread is in the middle of (rich's emoji table)."""
        while self._notes and self._console is not None:
            self._console.print(self._notes.pop(0), style="yellow", markup=False, emoji=False, highlight=False)

    def set(self, why: str) -> None:
        self.signal = self.signal or why
        self.is_set = True

    def set_by_view(self, by: str, registry: ApprovalRegistry) -> None:
        """Cancel from a view (the web console's **Cancel run**): as a first Ctrl-C, and every pending
        approval is withdrawn at once."""
        registry.close(f"cancelled by {by}", then=lambda: self.set(by))
        self._notes.append(f"{by}: cancelling: the action under way is stopped, inputs released, the sandbox removed")

    @contextlib.contextmanager
    def installed(self, console: Console, interruptible: bool = True) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return

        def handler(signum: int, _frame: object) -> None:
            name = signal.Signals(signum).name
            if self.is_set and signum == signal.SIGINT and self.interruptible:
                raise KeyboardInterrupt
            self.set(name)
            self._notes.append(f"{name}: cancelling: the action under way is stopped, inputs released, the "
                               "sandbox removed" + (" (Ctrl-C again to stop at once)" if signum == signal.SIGINT else "")
                               if self.interruptible else
                               f"{name}: cancelling; the sandbox is removed and the record finished first")

        self._console = console
        previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
        was, self.interruptible = self.interruptible, interruptible
        try:
            yield
        finally:
            self.interruptible = was
            for s, h in previous.items():
                signal.signal(s, h)
