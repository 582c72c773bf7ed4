"""Signals never cut a sandbox's start or teardown in half (controller.sandbox): during ``start`` they are
noted and acted on at the next checkpoint, after which what was created is removed; during ``close`` they
wait until it is done. Real signals sent to this process (the main thread), a fake backend, no Docker.
run-task's own handler only notes a signal and prints at the next poll, never from inside the signal.
The same against Docker, with the real command line: tests/docker/test_signal_sweep.py."""

from __future__ import annotations

import io
import signal
from typing import Any

import pytest
from rich.console import Console

from controller.sandbox import Sandbox, SandboxError, SandboxInterrupted, signals_deferred


class FakeSandbox(Sandbox):
    """A backend whose start is a list of steps, each noted in ``done`` once it ran to its end."""

    def __init__(self, steps: list[Any]) -> None:
        self.id = "fake"
        self.steps = steps
        self.done: list[str] = []
        self.closed = 0
        self.close_hook = None

    def _start(self) -> None:
        for step in self.steps:
            step(self)
            self._checkpoint()

    @classmethod
    def make_options(cls, *, image=None, detached=False):  # noqa: ANN001, ANN206
        return None

    @classmethod
    def ensure_image(cls, options, say):  # noqa: ANN001, ANN206
        return options

    @classmethod
    def start(cls, spec=None, options=None):  # noqa: ANN001, ANN206
        raise NotImplementedError

    @classmethod
    def list_all(cls) -> dict[str, dict[str, str]]:
        return {}

    @classmethod
    def remove(cls, sandbox_id: str) -> list[str]:
        return []

    def logs(self, role: str = "desktop", tail: int = 200) -> str:
        return ""

    def topology(self):  # noqa: ANN201
        raise NotImplementedError

    def exec_in_guest(self, argv, *, timeout=None):  # noqa: ANN001, ANN201
        raise NotImplementedError

    def decision_log(self) -> list[dict[str, Any]]:
        return []

    def close(self) -> None:
        with signals_deferred():
            if self.close_hook:
                self.close_hook()
            self.closed += 1


def step(name: str, signum: int | None = None, fail: bool = False):  # noqa: ANN201
    def run(sb: FakeSandbox) -> None:
        if signum is not None:
            signal.raise_signal(signum)  # arrives in the middle of this step ...
        sb.done.append(name)  # ... which still runs to its end
        if fail:
            raise SandboxError(f"{name} failed")
    return run


@pytest.fixture(autouse=True)
def _handlers_restored():
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    yield
    assert {s: signal.getsignal(s) for s in before} == before


@pytest.mark.parametrize("signum, raised", [(signal.SIGTERM, SandboxInterrupted), (signal.SIGINT, KeyboardInterrupt),
                                            (signal.SIGHUP, SandboxInterrupted)])
def test_a_signal_during_start_finishes_the_step_then_abandons_the_start(signum, raised):
    sb = FakeSandbox([step("networks"), step("gateway", signum), step("desktop")])
    with pytest.raises(raised):
        sb._start_or_close(sb._start)
    assert sb.done == ["networks", "gateway"] and sb.closed == 1


def test_a_signal_after_the_last_checkpoint_still_abandons_the_start():
    sb = FakeSandbox([step("networks")])
    sb.steps.append(lambda s: signal.raise_signal(signal.SIGTERM))  # after the last step, no checkpoint
    sb._start = lambda: [f(sb) for f in sb.steps]  # type: ignore[method-assign]
    with pytest.raises(SandboxInterrupted):
        sb._start_or_close(sb._start)
    assert sb.closed == 1


def test_a_failed_start_with_a_signal_meanwhile_is_an_interruption():
    def close_with_signal() -> None:
        signal.raise_signal(signal.SIGINT)  # the user presses Ctrl-C while the failed start is removed

    sb = FakeSandbox([step("networks", fail=True)])
    sb.close_hook = close_with_signal
    with pytest.raises(KeyboardInterrupt) as info:
        sb._start_or_close(sb._start)
    assert isinstance(info.value.__cause__, SandboxError) and sb.closed == 1


def test_a_start_without_signals_returns_and_keeps_the_sandbox():
    sb = FakeSandbox([step("networks"), step("gateway")])
    sb._start_or_close(sb._start)
    assert sb.done == ["networks", "gateway"] and sb.closed == 0


def test_close_is_not_cut_short_and_the_signal_reaches_the_previous_handler_after_it():
    got: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda signum, _f: got.append(signum))
    try:
        sb = FakeSandbox([])
        sb.close_hook = lambda: (signal.raise_signal(signal.SIGTERM), signal.raise_signal(signal.SIGTERM),
                                 got.append(0))
        sb.close()
        assert got == [0, signal.SIGTERM]  # close went on to its end; then the signal was handled once
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_run_task_handler_never_prints_from_inside_the_signal():
    """A Ctrl-C that lands while the console is writing: printing from the handler would re-enter the
    write (for sys.stderr: "reentrant call inside BufferedWriter") or an import under way."""
    from controller.run.cancel import Cancellation as _Cancel

    class Stream(io.StringIO):
        depth = 0

        def write(self, text: str) -> int:
            self.depth += 1
            try:
                assert self.depth == 1, "the signal handler wrote while a write was under way"
                if "step 1" in text:
                    signal.raise_signal(signal.SIGINT)  # lands in the middle of this write
                return super().write(text)
            finally:
                self.depth -= 1

    stream = Stream()
    console = Console(file=stream, width=200)
    cancel = _Cancel()
    with cancel.installed(console):
        console.print("step 1")
        assert cancel()  # the poll: the flag is set, and the note is printed now
    assert stream.getvalue().splitlines() == [
        "step 1", "SIGINT: cancelling: the action under way is stopped, inputs released, the sandbox removed "
        "(Ctrl-C again to stop at once)"]
