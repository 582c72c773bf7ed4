"""One MCP session, one sandbox: started on the session's first tool call, removed when the session ends.

:class:`McpSession` holds a :class:`desktop_sandbox.Sandbox` (started with ``runner="mcp"`` and the
client's name, so ``run_started`` of its record says who drove it) and the calls made on it; every
call runs on a worker thread as a step of the sandbox's attended run (:mod:`controller.run.attended`:
recorded in ``runs/<id>/record.jsonl``, asked about by the run's action gate). When the client declared
the elicitation capability, the session subscribes to each attended run's approval registry, adds the
view ``mcp`` to it (so the gate knows someone can answer) and asks its pending questions through
:class:`controller.mcp.elicit.Elicitor`; the questions of a ``run_task`` model loop (whose registry this
API does not expose) reach the same asking through the sandbox's approver hook. Without elicitation
nothing of the session answers: a confirmed action is denied by the gate's "nobody to ask" rule.

:class:`SessionHub` keeps the sessions of one server: on stdio the process's one session, over HTTP one
per MCP session (the transport's ``Mcp-Session-Id``), ended by the connection's teardown (the client's
``DELETE``, the idle timeout, the server's stop). Ending a session removes its sandbox on a thread of its
own (the event loop is never blocked; :meth:`SessionHub.close_all` waits for every removal): a call
still waiting on an approval is withdrawn first (the run ends ``cancelled``: the action never runs);
the attended run's end releases every key and button and finishes the record.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import threading
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, TypeVar

from controller.mcp.elicit import Elicitor, question_of
from controller.model.errors import DesktopSandboxError
from controller.model.requests import ACTION, SAFETY_CHECK, request_kind
from controller.run.tasks import CHECKS_OPTIONAL, MAX_TASK_BYTES, Task, TaskError
from controller.text import clean
from controller.validation import describe_validation_error, read_input_or_raise

log = logging.getLogger(__name__)

T = TypeVar("T")

DEFAULT_MAX_EDGE = 1568
"""Longest edge of a screenshot the server returns, by default (px of the image)."""
DEFAULT_MAX_BYTES = 750_000
"""Most bytes of image data a screenshot carries, by default: its base64 stays within 1,000,000 characters."""
CLOSE_TIMEOUT_S = 120.0
"""Longest :meth:`SessionHub.close_all` waits for the sandboxes being removed (seconds)."""
STOP_POLL_S = 0.25
"""How often :meth:`McpSession.stop_model_loop` cancels again (seconds)."""
CALL_QUESTION_KINDS = (ACTION, SAFETY_CHECK)
"""The request kinds a call's own action waits on (:meth:`McpSession.withdraw_questions`)."""


@dataclass(frozen=True)
class McpOptions:
    """What every session's sandbox is started with.

    ``backend`` / ``image``: as ``run-task``'s; ``task``: the screen, network policy and apps of the
    sandbox (None: an empty 1280x800 desktop under deny-all); ``pool``: a warm pool keeper's claim socket
    (claimed from it when it holds one of the task's template, else a cold start); ``confirm_actions`` /
    ``step``: action types asked about before they run (every one in step mode); ``approval_timeout_s``:
    how long a question waits; ``runs_dir``: where run records go; ``max_edge`` / ``max_bytes``: the
    screenshot limits (px of the image, bytes of image data); ``apps_file``: the guest agent's app
    allowlist inside the image (None: the image's own); ``workdir``: the folder ``run_task`` files must
    be under (the server's current directory); ``start_timeout_s``: how long a start may take;
    ``max_sessions``: sessions with a sandbox at once (a session counts from its first tool call until its
    sandbox is removed)."""

    backend: str = "docker"
    image: str | None = None
    task: Task | None = None
    pool: Path | None = None
    confirm_actions: tuple[str, ...] = ()
    step: bool = False
    approval_timeout_s: float = 300.0
    runs_dir: Path = Path("runs")
    max_edge: int = DEFAULT_MAX_EDGE
    max_bytes: int = DEFAULT_MAX_BYTES
    apps_file: str | None = None
    workdir: Path = field(default_factory=Path.cwd)
    start_timeout_s: float = 180.0
    max_sessions: int = 8


def load_session_task(path: str | Path) -> Task:
    """A task file for a session's sandbox: its ``[screen]``, ``[network]``, ``[[launch]]`` and
    ``[[ready]]`` are used; ``name`` and ``instructions`` may be left out and ``[[checks]]`` are optional
    (given, they are verified when the session ends). Raises :class:`TaskError` naming the file."""
    path = Path(path)
    text = read_input_or_raise(path, MAX_TASK_BYTES, TaskError)
    try:
        data = tomllib.loads(text)
    except (tomllib.TOMLDecodeError, ValueError) as exc:
        raise TaskError(f"{path}: TOML syntax error: {clean(exc, 200)}") from None
    if "source" in data:
        raise TaskError(f"{path}: source: unknown key (the loader sets it from the file's location)")
    data.setdefault("name", "mcp-session")
    data.setdefault("instructions", "A desktop driven through MCP.")
    try:
        task = Task.model_validate(data, context={CHECKS_OPTIONAL: True})
    except Exception as exc:  # pydantic ValidationError
        describe = getattr(exc, "errors", None)
        message = describe_validation_error(exc) if callable(describe) else clean(exc, 300)
        raise TaskError(f"{path}: {message}") from None
    return task.model_copy(update={"source": path.resolve()})


class SessionClosed(DesktopSandboxError, RuntimeError):
    """The session has ended: its sandbox is removed (or being removed) and takes no more calls."""


class CallAbandoned(DesktopSandboxError, RuntimeError):
    """The client cancelled the call before it began: nothing of it ran."""


class SessionsFull(SessionClosed):
    """A new session would exceed the server's ``--max-sessions``: nothing was started for it."""


def _stale() -> Any:
    raise SessionClosed("the session's run changed under the call: try again")


class McpSession:
    """One MCP session's sandbox and its calls (module docstring).

    ``key``: the session's name in logs; ``client``: the client's name (``clientInfo.name``) or None;
    ``elicitor``: asks the client the run's questions (None: the client cannot be asked).
    """

    def __init__(self, options: McpOptions, key: str, *, client: str | None, elicitor: Elicitor | None) -> None:
        self.options = options
        self.key = key
        self.client = client
        self.elicitor = elicitor
        self.sandbox: Any = None
        """The :class:`desktop_sandbox.Sandbox`, once started."""
        self.last_shot: Any = None
        """The last :class:`desktop_sandbox.Screenshot` returned in the current run (None: points are screen px)."""
        self._start_lock = threading.Lock()
        self._lock = threading.Lock()
        self._closed = False
        self._run: Any = None
        self._unsubscribe: Callable[[], None] | None = None
        self._calls = 0
        self._model_loops = 0
        self.cut_off = False
        """The session's last call was cut off before its answer (its client cancelled it, or went away
        mid-call): a session that ends then ends its run ``cancelled``, not ``passed``."""

    # -- the sandbox --------------------------------------------------------------------------------
    def ensure_sandbox(self) -> Any:
        """The session's sandbox, started now when this is the first call (blocking; seconds). Raises
        :class:`SessionClosed` after :meth:`close`, and what :meth:`desktop_sandbox.Sandbox.start`
        raises (a failed start leaves nothing behind; the next call tries again)."""
        with self._start_lock:
            if self._closed:
                raise SessionClosed("the session has ended")
            if self.sandbox is not None:
                return self.sandbox
            from desktop_sandbox import Sandbox

            o = self.options
            extra = {"apps_file": o.apps_file} if o.apps_file else None
            t0 = time.monotonic()
            sandbox = Sandbox.start(backend=o.backend, task=o.task, pool=str(o.pool) if o.pool else None,
                                    image=o.image, confirm_actions=list(o.confirm_actions), step=o.step,
                                    approver=self._approve if self.elicitor is not None else None,
                                    approver_name="mcp",
                                    approval_timeout_s=o.approval_timeout_s, runs_dir=o.runs_dir,
                                    start_timeout_s=o.start_timeout_s, runner="mcp", client=self.client,
                                    options=extra)
            with self._lock:
                closed = self._closed
                if not closed:
                    self.sandbox = sandbox
            if closed:  # the session ended while it started
                sandbox.close()
                raise SessionClosed("the session has ended")
            log.warning("session %s: sandbox %s ready in %.1f s for %s (record %s)", self.key, sandbox.id,
                        time.monotonic() - t0, clean(self.client or "a client", 80), sandbox.record_dir)
            return sandbox

    def call(self, fn: Callable[[Any], T], *, attended: bool = True, gone: threading.Event | None = None) -> T:
        """Run ``fn(sandbox)`` (blocking): the sandbox started if needed; with ``attended`` the sandbox's
        attended run (started anew after a model loop) is the session's, its questions asked through
        the elicitor. ``gone``: set when the caller stopped waiting (its client cancelled the call):
        checked once the sandbox and its run are up, so a call given up on meanwhile never runs. Raises what
        ``fn`` raises, :class:`SessionClosed` once the session ended, :class:`CallAbandoned` when ``gone``."""
        sandbox = self.ensure_sandbox()
        with self._lock:
            if self._closed:
                raise SessionClosed("the session has ended")
            self._calls += 1
            self._model_loops += not attended
        try:
            if attended:
                self._attend(sandbox.attended_run)
            if gone is not None and gone.is_set():
                raise CallAbandoned("the client cancelled the call before it began: nothing of it ran")
            return fn(sandbox)
        finally:
            with self._lock:
                self._calls -= 1
                self._model_loops -= not attended

    def submit(self, fn: Callable[[Any, Any], T]) -> "concurrent.futures.Future[T] | None":
        """``fn(sandbox, run)`` handed to the attended run's thread without blocking (for the event loop:
        no worker thread in between), when the sandbox is up and its attended run already the session's;
        None otherwise (then :meth:`call`, which starts what is missing), and None at once while another
        thread holds the sandbox (a ``run_task`` model loop, a run being started or ended), never waiting
        for it: the caller is the server's event loop, which every session shares. Counted as a call
        under way."""
        with self._lock:
            sandbox = self.sandbox
            if self._closed or sandbox is None or self._run is None:
                return None
            run = self._run
            self._calls += 1
        held = sandbox._lock.acquire(blocking=False)  # the lock Sandbox._submit takes (re-entrant)
        try:
            future = sandbox._submit(lambda current: fn(sandbox, current) if current is run else _stale()) \
                if held else None
        finally:
            if held:
                sandbox._lock.release()
        if future is None:
            with self._lock:
                self._calls -= 1
            return None

        def done(_future: Any) -> None:
            with self._lock:
                self._calls -= 1

        future.add_done_callback(done)
        return future

    def prepare(self) -> None:
        """Start what a call on the attended run's thread needs (blocking; seconds): the sandbox, and its
        attended run made the session's, so that :meth:`submit` can take the call. Raises what
        :meth:`call` raises."""
        self.call(lambda _sandbox: None)

    def withdraw_questions(self, why: str) -> int:
        """Withdraw the pending questions about actions (``action``, ``safety_check``) of the session's
        attended run, for a call under way that its client cancelled: the action it waits on is then
        refused (nothing of it runs later, and the run's thread is free for the next call). Origin and
        sign-in requests are left to their own deadlines. Returns how many were withdrawn."""
        with self._lock:
            run = self._run
        if run is None:
            return 0
        registry = run.registry
        return sum(bool(registry.withdraw(request, why)) for request in registry.pending()
                   if request.kind in CALL_QUESTION_KINDS)

    def stop_model_loop(self, finished: threading.Event, why: str, timeout_s: float = CLOSE_TIMEOUT_S) -> None:
        """Cancel the sandbox's model loop for a ``run_task`` call its client cancelled (blocking): again
        every :data:`STOP_POLL_S` seconds while a model loop of the session is under way, until the call
        has ``finished`` (it may be just about to begin the loop) or ``timeout_s`` seconds passed."""
        deadline = time.monotonic() + timeout_s
        while not finished.is_set() and time.monotonic() < deadline:
            with self._lock:
                sandbox = self.sandbox if self._model_loops else None
            if sandbox is not None:
                sandbox.cancel(why)
            finished.wait(STOP_POLL_S)

    # -- the attended run's questions ----------------------------------------------------------------
    def _attend(self, run: Any) -> None:
        """Make ``run`` the session's: the model space starts anew (screen px), and with an elicitor its
        registry gets the view ``mcp`` and a subscription that offers each pending question."""
        with self._lock:
            if run is self._run:
                return
            if self._unsubscribe is not None:
                self._unsubscribe()
                self._unsubscribe = None
            self._run, self.last_shot = run, None
            if self.elicitor is None:
                return
            registry = run.registry
            registry.views.add("mcp")
            self._unsubscribe = registry.subscribe(lambda request: self._changed(registry, request))
            pending = registry.pending()
        for request in pending:
            self._changed(registry, request)

    def _changed(self, registry: Any, request: Any) -> None:
        """A registry change (on the thread that made it; must not block): offer a pending decision
        question, withdraw a decided one."""
        assert self.elicitor is not None
        if request_kind(request.kind).form:
            return  # sign-in values never pass through the client
        if not request.pending:
            self.elicitor.withdraw(request.id)
            return

        def decide(word: str, request_id: str = request.id) -> None:
            registry.answer(request_id, word, by="mcp")

        self.elicitor.offer(question_of(request, decide))

    def _approve(self, request: Any) -> bool | None:
        """The sandbox's approver hook (a thread of its own per question): a question of the attended run
        is left to the registry subscription (None); one of a ``run_task`` model loop is asked through the
        elicitor and its answer returned (True approves; None when no answer came in time)."""
        assert self.elicitor is not None
        with self._lock:
            run = self._run
        if run is not None:
            with contextlib.suppress(Exception):
                run.registry.get(request.id)
                return None
        answer: concurrent.futures.Future[str] = concurrent.futures.Future()

        def decide(word: str) -> None:
            if not answer.done():
                answer.set_result(word)

        self.elicitor.offer(question_of(request, decide))
        try:
            word = answer.result(timeout=self.options.approval_timeout_s + 5)
        except concurrent.futures.TimeoutError:
            return None
        return word == "approve"

    # -- the end ------------------------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        return self._closed

    def close(self, why: str) -> None:
        """End the session (blocking, seconds; safe to call twice): a call waiting on a question is
        withdrawn (the run ends ``cancelled``), a model loop under way is stopped by the sandbox's
        removal, the attended run's record is finished (keys and buttons released), the sandbox removed."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            sandbox, run = self.sandbox, self._run
            busy, loops = self._calls, self._model_loops
            if self._unsubscribe is not None:
                self._unsubscribe()
                self._unsubscribe = None
        with self._start_lock:  # a start under way ends first (and removes what it started)
            sandbox = self.sandbox if sandbox is None else sandbox
        if sandbox is None:
            return
        log.warning("session %s: %s: removing sandbox %s", self.key, why, sandbox.id)
        try:
            if (busy or self.cut_off) and run is not None:
                run.cancel_by_view(f"mcp: {why}")
            if loops:
                sandbox.cancel(f"mcp: {why}")  # the model loop stops within a step; its record says so
            sandbox.close()
        except Exception as exc:  # noqa: BLE001 - logged; the orphan reaper takes what is left
            log.error("session %s: removing sandbox %s failed: %s", self.key, sandbox.id, clean(exc, 500))


class SessionHub:
    """The sessions of one server (module docstring). ``options``: every sandbox's."""

    def __init__(self, options: McpOptions) -> None:
        self.options = options
        self._lock = threading.Lock()
        self._sessions: dict[str, McpSession] = {}
        self._closing: list[threading.Thread] = []
        self._count = 0
        self.stopping = False

    def open(self, *, client: str | None, elicitor: Elicitor | None) -> McpSession:
        """A new session (its sandbox starts with its first call). Raises :class:`SessionClosed` once the
        server is stopping."""
        with self._lock:
            if self.stopping:
                raise SessionClosed("the server is stopping")
            held = len(self._sessions) + sum(t.is_alive() for t in self._closing)
            if held >= self.options.max_sessions:
                raise SessionsFull(f"the server holds its {self.options.max_sessions} sessions (--max-sessions), "
                                    "each with a sandbox: end one (DELETE its session) and call again")
            self._count += 1
            session = McpSession(self.options, f"s{self._count}", client=client, elicitor=elicitor)
            self._sessions[session.key] = session
        return session

    def end(self, session: McpSession, why: str) -> None:
        """End ``session`` without blocking: its sandbox is removed on a thread of its own."""
        with self._lock:
            if self._sessions.pop(session.key, None) is None:
                return
            thread = threading.Thread(target=session.close, args=(why,), name=f"mcp-end-{session.key}")
            self._closing.append(thread)
        thread.start()

    def close_all(self, why: str, timeout_s: float = CLOSE_TIMEOUT_S) -> None:
        """End every session and wait (at most ``timeout_s``) until every sandbox is removed."""
        with self._lock:
            self.stopping = True
            sessions = list(self._sessions.values())
        for session in sessions:
            self.end(session, why)
        deadline = time.monotonic() + timeout_s
        with self._lock:
            threads = list(self._closing)
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))

    def sessions(self) -> list[McpSession]:
        """The sessions not ended yet."""
        with self._lock:
            return list(self._sessions.values())


__all__ = ["CallAbandoned", "DEFAULT_MAX_BYTES", "DEFAULT_MAX_EDGE", "McpOptions", "McpSession", "SessionClosed", "SessionHub",
           "load_session_task"]
