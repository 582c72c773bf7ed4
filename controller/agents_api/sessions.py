"""Sessions: each one a sandbox, its turns run by ``run-task``'s runner, its events and items stored.

:class:`SessionHub` owns every live session of the server. A session (:class:`LiveSession`):

* **create** stores it and starts its sandbox on a thread of its own (``agent.session.created``,
  ``agent.session.environment.pending``, then ``…environment.ready`` or ``…environment.failed`` with
  the reason and ``agent.session.failed``). The sandbox is the backend's (``--backend``), started from
  the session's task: for ``agent.model = "offline:TASK_FILE"`` that task (screen, apps, network
  policy, checks, offline script); otherwise a desktop with the browser, its network from
  ``environment.network.access`` (``disabled``: the gateway's deny-all; ``enabled``: mode ``ask`` with
  every origin in the ask tier, so each new origin becomes a ``browser_origin_access`` request).
* **a user message** queues a turn; the session's thread runs turns one at a time, each a
  :class:`controller.run.runner.Run` on the session's sandbox (the session owns it: a run never removes
  it; the task's apps are launched on the first turn only), the live model with
  ``OPENAI_API_KEY`` or the task's offline script. A session is one model conversation: the first
  turn's run starts with the session's instructions and the message, each later one with the
  conversation the turn before left (:attr:`LiveSession.conversation`, Responses items, its older
  screenshots left out) and its own message (:meth:`LiveSession._carry` says what a cancelled or
  failed turn leaves). Each turn writes its own run record
  (``runs/<id>/record.jsonl``, named in the session's metadata); what the run publishes on its bus
  becomes events as it happens (:class:`_TurnEvents`, a subscriber of the run's bus: no polling, and a
  screenshot's bytes go to the event without being read back from disk): screenshots and computer calls as ``computer_use_call``
  items, approvals as ``agent.session.requires_action``, a sign-in request also as its history items
  (``computer_use_approval_request`` when it opens, ``computer_use_approval_request_result`` once it is
  submitted or cancelled: ids and the chosen option, never a value); the end as the answer's text
  (with the task's checks for an offline task) and ``agent.session.turn.completed`` | ``failed`` | ``cancelled``.
* **approvals**: the turn's approval registry (:class:`controller.run.registry.ApprovalRegistry`) is
  the one every view answers in -- this API (``by: agents-api``), the web console when the server has
  one -- so the first answer counts and every other gets 409. A sign-in submit's values go from the
  request body straight to :meth:`ApprovalRegistry.answer_signin` (which keeps them for the run's
  sign-in step alone): they are never stored, emitted, written to the record or logged here.
* **delete** (and the server's shutdown) cancels the turn under way and removes the sandbox.
* **the count**: a session holds one of ``max_sessions`` places from its create until its thread has
  ended (its sandbox start finished) and its sandbox is closed -- also while a delete waits for that,
  so creating and deleting at once never has more sandboxes than places.
* **recovery** (:meth:`SessionHub.recover`, at start): every part of a session's sandbox is labelled
  with the session (:data:`LABEL_SESSION`) and this database (:data:`LABEL_STORE`), so a sandbox a
  killed server was still starting is found by its labels, not by an id the server never stored.

Threads: one per session (sandbox start, then its turns), the bus's one for each turn's events; routes call in from
uvicorn's threads. Events are stored, then announced (:class:`Notifier`).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import os
import queue
import threading
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from rich.console import Console

from controller.agents_api import shapes
from controller.agents_api.errors import ApiError, invalid
from controller.agents_api.requests import SessionParams, confined_task_file, offline_task_path
from controller.agents_api.store import Store, now, owner_label
from controller.run.live import LiveRun
from controller.model.requests import request_kind
from controller.run.registry import SIGN_IN, AnswerRefused
from controller.run.shots import decode_shot, read_shot, shot_name, shot_type
from controller.text import clean

BY = "agents-api"
"""Who decided, in the registry and the record, for an answer that came through this API."""
MAX_SHOT_BYTES = 16 * 1024 * 1024
"""Largest screenshot file read back from a run record for an event (bytes)."""
RECENT_EVENTS = 256
"""Events of each session kept in memory for its streams (the store holds them all)."""
MAX_SHOTS_KEPT = 32
"""Screenshots kept in memory for the event streams (the latest ones, all sessions together)."""
DEFAULT_APPS = [{"app": "browser", "args": ["about:blank"]}]
LABEL_SESSION = "desktop-sandbox.agents-session"
"""Label on every part of a session's sandbox (containers, networks, a VM's owner record): the session id."""
LABEL_STORE = "desktop-sandbox.agents-store"
"""Label on every part of a session's sandbox: the id of the database the session is kept in
(:attr:`controller.agents_api.store.Store.store_id`), so a server on another database never takes it
for one of its own."""


class Notifier:
    """Wakes the event streams waiting on a session: :meth:`notify` from any thread, :meth:`wait`
    in the stream's event loop. A stream takes :meth:`version` before it reads the store, then waits
    for a version above it: an event stored in between is never missed."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._versions: dict[str, int] = {}
        self._waiters: dict[str, set[tuple[asyncio.AbstractEventLoop, asyncio.Event]]] = {}

    def version(self, session_id: str) -> int:
        """How many notifications the session has had."""
        with self._lock:
            return self._versions.get(session_id, 0)

    def notify(self, session_id: str) -> None:
        with self._lock:
            self._versions[session_id] = self._versions.get(session_id, 0) + 1
            waiters = list(self._waiters.get(session_id, ()))
        for loop, event in waiters:
            with contextlib.suppress(RuntimeError):  # a loop already closed
                loop.call_soon_threadsafe(event.set)

    def notify_all(self) -> None:
        """:meth:`notify` every session a stream waits on (the server stops)."""
        with self._lock:
            sessions = list(self._waiters)
        for session_id in sessions:
            self.notify(session_id)

    async def wait(self, session_id: str, since: int, timeout: float) -> None:
        """Return once the session's version is above ``since``, or after ``timeout`` seconds."""
        event = asyncio.Event()
        key = (asyncio.get_running_loop(), event)
        with self._lock:
            if self._versions.get(session_id, 0) > since:
                return
            self._waiters.setdefault(session_id, set()).add(key)
        try:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(event.wait(), timeout)
        finally:
            with self._lock:
                self._waiters.get(session_id, set()).discard(key)


@dataclass
class Turn:
    """One user message and its run: ``id``, ``text``, ``status`` (the ``Turn`` statuses), times,
    ``run`` (its :class:`controller.run.runner.Run` while it goes on), ``cancelled`` (asked before it
    started), ``record`` (the run's record), ``ended`` (its last event was sent)."""

    id: str
    text: str
    created_at: int
    status: str = "queued"
    started_at: int | None = None
    completed_at: int | None = None
    error: dict[str, str] | None = None
    run: Any = None
    cancelled: bool = False
    record: Any = None
    ended: bool = False

    def as_json(self, session_id: str) -> dict[str, Any]:
        return shapes.turn(self.id, session_id, status=self.status, created_at=self.created_at,
                           started_at=self.started_at, completed_at=self.completed_at, error=self.error)


@dataclass
class HubOptions:
    """How sessions run: ``runs_dir`` (run records), ``backend`` (a name of the backends registry),
    ``image`` (None: the backend's default), ``extra_labels`` (added to every sandbox, Docker),
    ``approval_timeout_s`` (a safety check unanswered this long is denied), ``on_live`` (also given
    each turn's LiveRun: the web console's ``add_run``), ``attach_networks`` (Docker networks each
    session's gateway joins, only the gateway: origins of the operator's on them can be asked for, as
    the task's policy allows), ``max_sessions`` (sessions holding a sandbox at once, counted until
    the sandbox is gone, see the module docstring; one more is 429 ``too_many_sessions``),
    ``tasks_dir`` (the folder ``offline:`` task files must be in, relative to the working directory
    at start: :func:`controller.agents_api.requests.confined_task_file`), ``pool`` (sandboxes of the
    default template kept warm, :mod:`controller.sandbox.pool`; a session's sandbox is claimed from
    them, or started cold when none is ready; 0: none)."""

    runs_dir: Path = Path("runs")
    backend: str = "docker"
    image: str | None = None
    extra_labels: dict[str, str] = field(default_factory=dict)
    approval_timeout_s: float = 300.0
    on_live: Callable[[LiveRun], None] | None = None
    attach_networks: list[str] = field(default_factory=list)
    max_sessions: int = 8
    tasks_dir: Path = Path("tasks")
    pool: int = 0


class SessionHub:
    """Every session of this server (see the module docstring) over ``store``."""

    def __init__(self, store: Store, options: HubOptions) -> None:
        self.store = store
        self.options = options
        self.notifier = Notifier()
        self.live: dict[str, LiveSession] = {}
        self.holding: set[str] = set()
        """Sessions holding one of ``max_sessions`` places (see the module docstring)."""
        self.tasks_dir = Path(os.path.realpath(options.tasks_dir))
        self._lock = threading.Lock()
        self._deleting = threading.Lock()  # one delete at a time: the second of two finds it gone
        self.stopping = False
        self._shots: OrderedDict[str, str] = OrderedDict()
        self._shots_lock = threading.Lock()
        self._recent: dict[str, tuple[int, deque[tuple[int, dict[str, Any]]]]] = {}
        self._emit_lock = threading.Lock()
        self.owner = owner_label()
        self.pool: Any = None
        """The warm pool sessions claim from (:meth:`start_pool`), or None."""

    def start_pool(self) -> None:
        """Start keeping ``options.pool`` sandboxes of the default template warm (after :meth:`recover`:
        the pool's sandboxes are this server's). Raises CapabilityMissing when the backend keeps none."""
        if not self.options.pool:
            return
        from controller.sandbox.pool import Template, WarmPool
        from controller.sandbox.registry import get_backend

        cls = get_backend(self.options.backend)
        options = cls.make_options(image=self.options.image)
        if hasattr(options, "extra_labels"):
            options.extra_labels = {**options.extra_labels, **self.options.extra_labels,
                                    LABEL_STORE: self.store.store_id}
        self.pool = WarmPool(cls, options, [Template()], self.options.pool).start()

    # -- events ----------------------------------------------------------------------------------------
    def emit(self, session_id: str, event: dict[str, Any]) -> int:
        """Store ``event`` for the session, keep it among the session's recent events (what its streams
        send without reading the store back, :meth:`recent_after`) and wake its streams; returns its
        number."""
        stored = {**event, "session_id": session_id} if "session" not in event else event
        with self._emit_lock:  # stored and kept in one order
            seq = self.store.add_event(session_id, stored)
            floor, ring = self._recent.get(session_id) or (seq - 1, deque())
            if len(ring) == RECENT_EVENTS:
                floor = ring.popleft()[0]
            ring.append((seq, stored))
            self._recent[session_id] = (floor, ring)
        self.notifier.notify(session_id)
        return seq

    def recent_after(self, session_id: str, seq: int) -> list[tuple[int, dict[str, Any]]] | None:
        """The session's events numbered above ``seq`` from memory, or None when some of them are only
        in the store (older than the :data:`RECENT_EVENTS` kept, or stored by an earlier server)."""
        with self._emit_lock:
            kept = self._recent.get(session_id)
            if kept is None or seq < kept[0]:
                return None
            return [(number, event) for number, event in kept[1] if number > seq]

    def forget_events(self, session_id: str) -> None:
        """Let the session's recent events go (it is deleted or failed: its streams read the store)."""
        with self._emit_lock:
            self._recent.pop(session_id, None)

    def has_shot(self, path: str) -> bool:
        """Whether the screenshot ``path`` is in memory (:meth:`screenshot_url` then reads no file)."""
        with self._shots_lock:
            return path in self._shots

    def remember_shot(self, path: str, data: bytes, mime: str) -> None:
        """Keep a screenshot the model was just sent (its bytes from the run's bus) for the events that
        carry it, as the stream sends it (:meth:`shot_url`): it is never read back from the record."""
        url = shot_url(data, mime)
        if url is None:
            return
        with self._shots_lock:
            self._shots[path] = url
            while len(self._shots) > MAX_SHOTS_KEPT:
                self._shots.popitem(last=False)

    def screenshot_url(self, path: str) -> str | None:
        """A record's screenshot as ``data:image/jpeg;base64,…`` (:func:`shot_url`): from memory when the
        turn's events kept it (:meth:`remember_shot`), else read from the run record (a stream reading
        older events) under the rule every reader of a record's screenshots follows
        (:mod:`controller.run.shots`: ``path`` is the run directory and a ``shot-NNNN.png|jpg`` name in
        it); None when the file is gone, too large or refused."""
        with self._shots_lock:
            if path in self._shots:
                return self._shots[path]
        if os.path.normpath(path) != path:  # a ``..`` inside: not a name in its run directory
            return None
        data, _why = read_shot(os.path.dirname(path), os.path.basename(path), MAX_SHOT_BYTES)
        if data is None:
            return None
        url = shot_url(data, shot_type(os.path.basename(path)))
        if url is not None:
            with self._shots_lock:
                self._shots[path] = url
                while len(self._shots) > MAX_SHOTS_KEPT:
                    self._shots.popitem(last=False)
        return url

    # -- sessions --------------------------------------------------------------------------------------
    def create(self, params: SessionParams) -> dict[str, Any]:
        """Store a new session, start its sandbox (on its thread) and queue ``params.input`` as the first
        turn; returns the session. :class:`ApiError` 400 for an offline task that does not load, or a
        live model without ``OPENAI_API_KEY``."""
        task, task_file = self._task_for(params)
        session_id = shapes.new_id("sess")
        session = LiveSession(self, session_id, params, task, task_file)
        with self._lock:
            if self.stopping:
                raise ApiError(503, "server_stopping", "the server is stopping: it starts no session now")
            holding = len(self.holding)
            if holding >= self.options.max_sessions:
                raise ApiError(429, "too_many_sessions", f"{holding} sessions hold a sandbox or are still "
                               f"removing it (at most {self.options.max_sessions}, serve --max-sessions): "
                               "delete one first")
            self.live[session_id] = session
            self.holding.add(session_id)
        try:
            self.store.add_session(session_id, session.settings(), owner=self.owner, backend=self.options.backend)
            self.emit(session_id, {"type": "agent.session.created", "session": session.as_json()})
            self.emit(session_id, {"type": "agent.session.environment.pending",
                                   "environment": shapes.environment_state(session.env_id, "pending")})
            if params.input is not None:
                session.add_turn(params.input)
            session.start()
        except BaseException:
            with self._lock:
                if not session.started:
                    self.live.pop(session_id, None)
                    self.holding.discard(session_id)
            raise
        return session.as_json()

    def release(self, session_id: str) -> None:
        """The session's sandbox is gone and its thread ended: its place is free (and its recent events
        are read from the store from now on)."""
        with self._lock:
            self.holding.discard(session_id)
        self.forget_events(session_id)

    def _task_for(self, params: SessionParams) -> tuple[Any, str | None]:
        from controller.offline.script import ScriptError, load_task_script
        from controller.run.tasks import TaskError, load_task

        task_file = offline_task_path(params.model)
        if task_file is not None:
            path = confined_task_file(params.model, self.tasks_dir)
            # a refusal says which part does not load, never what the file holds
            try:
                task = load_task(path)
            except (TaskError, OSError):
                raise invalid(f"agent.model {params.model!r}: not a task file this server can run (`desktop-sandbox "
                              "run-task FILE` on the server says why)", "agent.model") from None
            try:
                load_task_script(task)
            except (TaskError, ScriptError, OSError):
                raise invalid(f"agent.model {params.model!r}: the task's offline script does not load "
                              "(`desktop-sandbox run-task FILE` on the server says why)", "agent.model") from None
            return task, task_file
        if not os.environ.get("OPENAI_API_KEY"):
            raise ApiError(400, "model_unavailable", f"agent.model {params.model!r} needs OPENAI_API_KEY on the "
                           "server; without it use \"offline:TASK_FILE\" (e.g. offline:tasks/pickup.toml)",
                           "agent.model")
        return live_task(params), None

    def get(self, session_id: str) -> "LiveSession | None":
        with self._lock:
            return self.live.get(session_id)

    def session_json(self, session_id: str) -> dict[str, Any]:
        """The session as the API shows it (live, or as stored); 404 when unknown or deleted."""
        live = self.get(session_id)
        if live is not None and not live.deleted:
            return live.as_json()
        row = self.store.session(session_id) if isinstance(session_id, str) and len(session_id) < 100 else None
        if row is None or row["deleted"]:
            raise ApiError(404, "session_not_found", "no session with this id")
        return stored_json(row)

    def delete(self, session_id: str) -> dict[str, Any]:
        """Mark the session deleted, cancel its turn, remove its sandbox; 404 when unknown or already
        deleted (of two deletes at once, one gets 404)."""
        with self._deleting:
            self.session_json(session_id)
            self.store.update_session(session_id, deleted=True)
            with self._lock:
                live = self.live.pop(session_id, None)
        if live is not None:
            live.shut("session deleted")
        self.notifier.notify(session_id)
        return shapes.session_deleted(session_id)

    def shutdown(self) -> int:
        """The server stops: no new session; every live session's turn cancelled and sandbox removed;
        each is then ``failed`` (its sandbox is gone: ``agent.session.failed`` ends its streams).
        Returns how many sessions were stopped."""
        with self._lock:
            self.stopping = True
            sessions = list(self.live.values())
        for session in sessions:
            session.shut("the server stopped", fail=True)
        if self.pool is not None:
            self.pool.close()
        return len(sessions)

    def recover(self) -> list[str]:
        """At start: sessions a previous server left running (its process is gone) are ``failed`` (their
        sandbox died with it), with ``agent.session.failed``; the sandboxes it left are removed, found by
        their labels on each backend a stored session names (:meth:`_left_behind`), so also one whose
        start the server did not live to finish. A backend that cannot be asked now is asked at the
        next start. Returns the names removed."""
        from controller.sandbox.registry import get_backend

        rows = self.store.sessions(include_deleted=True)
        theirs = [row for row in rows if row["owner"] != self.owner]
        known = {row["id"] for row in rows}
        stored_ids = {row["sandbox_id"] for row in theirs if row["sandbox_id"]}
        removed: list[str] = []
        asked: set[str] = set()
        for name in sorted({row["backend"] for row in rows}):
            try:
                backend = get_backend(name)
                found = backend.list_all()
            except Exception:  # noqa: BLE001 - the backend cannot be asked now: the next start tries again
                continue
            asked.add(name)
            for sandbox_id, labels in found.items():
                if self._left_behind(sandbox_id, labels, known, stored_ids):
                    with contextlib.suppress(Exception):  # what stays is found again at the next start
                        removed += backend.remove(sandbox_id)
        for row in theirs:
            if row["sandbox_id"] and row["backend"] in asked:
                self.store.update_session(row["id"], sandbox_id="")
            if row["status"] != "failed":
                data = dict(row["data"], error="the server that ran this session stopped; its sandbox is gone")
                self.store.update_session(row["id"], status="failed", data=data)
                row = self.store.session(row["id"]) or row
                self.store.add_event(row["id"], {"type": "agent.session.failed", "session": stored_json(row)})
        return removed

    def _left_behind(self, sandbox_id: str, labels: dict[str, str], known: set[str], stored_ids: set[str]) -> bool:
        """Whether the sandbox ``sandbox_id`` (its ``labels`` as the backend lists them) is one a previous
        server on this database left: labelled with this database's :data:`LABEL_STORE` and a session
        (or, started before that label, with a session of ``known``, or stored as the sandbox of a
        previous server's session in ``stored_ids``), not one of this server's live sessions, and not
        started by a process that is still alive (a server on a copy of this database keeps its own)."""
        from controller.sandbox import LABEL_OWNER_ID
        from controller.sandbox.owner import owner_state

        session = labels.get(LABEL_SESSION)
        store = labels.get(LABEL_STORE)
        if session:
            ours = store == self.store.store_id if store is not None else session in known
        else:
            ours = store is None and sandbox_id in stored_ids
        if not ours or (session and session in self.live):
            return False
        return owner_state(labels.get(LABEL_OWNER_ID))[0] != "alive"


def live_task(params: SessionParams) -> Any:
    """The task of a live session: a desktop with the browser, the network from ``environment.network``
    (``enabled``: every origin asks; ``restricted``: the ``allowed_domains`` (http and https, default
    ports) ask, nothing else; ``disabled``: deny-all -- the gateway's hard refusals always hold), the
    instructions the agent's; no checks (nothing to verify: a turn ends with the model's answer).
    :class:`ApiError` 400 for a domain the gateway's policy refuses."""
    from controller.gateway.policy import NetworkPolicy
    from controller.run.tasks import FileCheck, Launch, Task

    if params.network == "enabled":
        policy = NetworkPolicy.model_validate({"mode": "ask", "ask": ["*"]})
    elif params.network == "restricted":
        origins = [f"{scheme}://{domain}" for domain in params.domains for scheme in ("https", "http")]
        try:
            policy = NetworkPolicy.model_validate({"mode": "ask", "ask": origins})
        except ValueError as exc:
            raise invalid(f"environment.network.allowed_domains: {exc}", "environment.network.allowed_domains") from None
    else:
        policy = NetworkPolicy()
    placeholder = FileCheck(kind="file", path="~/.desktop-sandbox-none", match="exact", value="")
    task = Task(name="agents-session", instructions=params.instructions or "Use the computer.", network=policy,
                launch=[Launch(**app) for app in DEFAULT_APPS], checks=[placeholder])
    return task.model_copy(update={"checks": []})


def stored_json(row: dict[str, Any]) -> dict[str, Any]:
    """A session as the database holds it (no live state: no required actions)."""
    data = row["data"]
    return {"id": row["id"], "object": "agent.session", "created_at": row["created_at"],
            "last_active_at": data.get("last_active_at", row["created_at"]), "agent": data["agent"],
            "environment": data["environment"], "error": data.get("error"), "metadata": data.get("metadata", {}),
            "required_actions": [], "status": row["status"], "usage": None, "vault_ids": [],
            "spend_control": dict(shapes.SPEND_CONTROL)}


class LiveSession:
    """One session of this server process (see the module docstring)."""

    def __init__(self, hub: SessionHub, session_id: str, params: SessionParams, task: Any,
                 task_file: str | None) -> None:
        self.hub, self.id, self.params, self.task, self.task_file = hub, session_id, params, task, task_file
        self.env_id = "env_" + session_id[len("sess_"):]
        self.created_at = self.last_active_at = now()
        self.status = "idle"
        self.error: str | None = None
        self.metadata = dict(params.metadata)
        self.sandbox: Any = None
        self.deleted = False
        self.turns: dict[str, Turn] = {}
        self.current: Turn | None = None
        self.requests: dict[str, tuple[Any, str]] = {}  # request id -> (registry, turn id)
        self._queue: queue.Queue[Turn | None] = queue.Queue()
        self._lock = threading.RLock()
        self._thread = threading.Thread(target=self._main, name=f"agents-{session_id}", daemon=True)
        self._stopped = threading.Event()
        self._turns_run = 0
        self.conversation: list[dict[str, Any]] = []
        """The model conversation the next turn continues (Responses input items; see :meth:`_carry`);
        read and written by the session's thread only."""
        self.started = False
        self._ended = False  # the session's thread has ended: no sandbox start is under way
        self._released = False  # its place under max_sessions is given back

    # -- what the API shows ------------------------------------------------------------------------------
    def settings(self) -> dict[str, Any]:
        """What the database keeps of the session (the API's fields that do not change with each step)."""
        return {"created_at": self.created_at, "last_active_at": self.last_active_at,
                "agent": shapes.agent(self.params.model, self.params.instructions, self.params.include_screenshots),
                "environment": shapes.environment(self.env_id, self.params.network if self.task_file is None
                                                  else ("enabled" if self.task.network.mode == "ask" else "disabled"),
                                                  self.params.domains if self.task_file is None else []),
                "metadata": self.metadata, "error": self.error, "task": self.task_file}

    def required_actions(self) -> list[dict[str, Any]]:
        """The pending requests of this session: those its events named, and those of the turn under way
        (also one whose event is still on its way)."""
        with self._lock:
            pending = {rid: (reg.get(rid), turn_id) for rid, (reg, turn_id) in self.requests.items()}
            turn = self.current
            run = turn.run if turn is not None else None
        if run is not None:
            for request in run.registry.pending():
                pending.setdefault(request.id, (request, turn.id))
        return [shapes.approval_action(r, t) for r, t in pending.values() if r.pending]

    def as_json(self) -> dict[str, Any]:
        """``AgentSession``."""
        settings = self.settings()
        actions = self.required_actions() if self.status != "failed" else []
        status = "requires_action" if actions else self.status
        return {"id": self.id, "object": "agent.session", "created_at": self.created_at,
                "last_active_at": self.last_active_at, "agent": settings["agent"],
                "environment": settings["environment"], "error": self.error, "metadata": dict(self.metadata),
                "required_actions": actions, "status": status, "usage": None, "vault_ids": [],
                "spend_control": dict(shapes.SPEND_CONTROL)}

    def _save(self) -> None:
        self.hub.store.update_session(self.id, status=self.status, data=self.settings())

    def _emit(self, event: dict[str, Any]) -> int:
        return self.hub.emit(self.id, event)

    def _session_event(self, kind: str) -> None:
        if self.deleted and kind == "agent.session.idle":
            return  # a deleted session is never idle again
        self._emit({"type": kind, "session": self.as_json()})

    # -- input ---------------------------------------------------------------------------------------------
    def add_turn(self, text: str) -> Turn:
        """Queue a turn for ``text``. 409 ``turn_in_progress`` while one is queued or running, 409
        ``session_failed`` after the session failed."""
        with self._lock:
            if self.status == "failed" or self.deleted:
                raise ApiError(409, "session_failed", f"the session failed: {self.error or 'its sandbox is gone'}")
            if self.current is not None or not self._queue.empty():
                raise ApiError(409, "turn_in_progress", "a turn is in progress: wait for it to end, or cancel it")
            turn = Turn(id=shapes.new_id("turn"), text=text, created_at=now())
            self.turns[turn.id] = turn
            self.current = turn
            self.status = "in_progress"
            self.last_active_at = now()
        for event in ({"type": "agent.session.turn.created", "turn": turn.as_json(self.id), "turn_id": turn.id},
                      {"type": "agent.session.turn.item.added", "output_index": None, "turn_id": turn.id,
                       "item": shapes.user_message(shapes.new_id("msg"), turn.id, clean(text, 20000))}):
            if "item" in event:
                self.hub.store.put_item(self.id, event["item"])
            self.hub.emit(self.id, event)
        self._save()
        self._queue.put(turn)
        return turn

    def cancel(self) -> None:
        """Cancel the turn under way (as Ctrl-C does a run: its pending approvals withdrawn, inputs
        released); nothing to cancel is 409 ``no_turn``."""
        with self._lock:
            turn = self.current
            if turn is None:
                raise ApiError(409, "no_turn", "no turn is in progress")
            turn.cancelled = True
            run = turn.run
        if run is not None:
            run.cancel_by_view(BY)

    def _registry_for(self, request_id: str, response_type: str) -> Any:
        """The registry holding this session's request ``request_id``; 404 ``unknown_request`` (also for
        another session's), 400 when ``response_type`` does not fit the request."""
        with self._lock:
            known = self.requests.get(request_id)
            run = self.current.run if self.current is not None else None
        if known is None and run is not None:  # opened by the turn under way, its event not yet sent
            try:
                run.registry.get(request_id)
                known = (run.registry, self.current.id if self.current else "")
            except (KeyError, AnswerRefused):
                known = None
        if known is None:
            raise ApiError(404, "unknown_request", "no approval request with this id in this session",
                           "request_id")
        registry, _turn_id = known
        request = registry.get(request_id)
        wanted = request_kind(request.kind).api_type  # the response type an answer to its kind carries
        if wanted != response_type:
            raise invalid(f"request {request_id} is a {wanted} request: answer with response.type {wanted}",
                          "response.type")
        return registry

    def answer(self, request_id: str, response_type: str, decision: str) -> None:
        """Answer an approval request of this session; 404 ``unknown_request`` (also for another
        session's), 400 when the response type does not fit the request, the registry's refusals
        (409 ``already_decided`` / ``withdrawn`` / ``expired``, 502) passed through."""
        registry = self._registry_for(request_id, response_type)
        try:
            registry.answer(request_id, decision, by=BY)
        except AnswerRefused as exc:
            raise ApiError(exc.status, exc.code, exc.message, "request_id") from None

    def answer_signin(self, request_id: str, action: str, fields: list[dict[str, str]],
                      selected_option: str | None) -> None:
        """Answer a sign-in request of this session: ``action`` submit (``fields``: ``[{"field_id",
        "value"}]``, ``selected_option`` or None) | cancel, handed to
        :meth:`controller.run.registry.ApprovalRegistry.answer_signin` (``by: agents-api``). Refusals as
        :meth:`answer`'s; the registry's 400 ``invalid_answer`` names the rule and the field ids, never
        a value (param ``response``). ``fields`` is emptied afterwards: this server keeps no value."""
        try:
            registry = self._registry_for(request_id, "browser_authentication")
            response: dict[str, Any] = {"action": action}
            if action == "submit":
                response["fields"] = fields
                if selected_option is not None:
                    response["selected_option"] = selected_option
            try:
                registry.answer_signin(request_id, response, by=BY)
            except AnswerRefused as exc:
                raise ApiError(exc.status, exc.code, exc.message,
                               "response" if exc.status == 400 else "request_id") from None
            finally:
                response.clear()
        finally:
            for entry in fields:
                entry.clear()
            fields.clear()

    # -- the session's thread ----------------------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()
        self.started = True

    def _main(self) -> None:
        try:
            try:
                self._open_sandbox()
            except Exception as exc:  # noqa: BLE001 - any start failure fails the session, with its reason
                self._fail(f"the sandbox did not start: {type(exc).__name__}: {clean(exc, 800)}", environment=True)
                return
            while not self._stopped.is_set() and self.status != "failed":
                turn = self._queue.get()
                if turn is None:
                    break
                self._run_turn(turn)
            if self.status == "failed":  # the sandbox stopped answering: what is left of it goes now
                self._remove_sandbox()
        finally:
            with self._lock:
                self._ended = True
            self._release_if_gone()

    def _remove_sandbox(self) -> None:
        """Close the session's sandbox, if it still has one, and forget it in the store."""
        with self._lock:
            sandbox, self.sandbox = self.sandbox, None
        if sandbox is not None:
            with contextlib.suppress(Exception):
                sandbox.close()
            self.hub.store.update_session(self.id, sandbox_id="")
        self._release_if_gone()

    def _release_if_gone(self) -> None:
        """Give the session's place under ``max_sessions`` back once its thread has ended and it holds no
        sandbox (once)."""
        with self._lock:
            if self._released or not self._ended or self.sandbox is not None:
                return
            self._released = True
        self.hub.release(self.id)

    def _open_sandbox(self) -> None:
        from controller.sandbox.registry import get_backend

        cls = get_backend(self.hub.options.backend)
        options = cls.make_options(image=self.hub.options.image)
        if hasattr(options, "extra_labels"):
            options.extra_labels = {**options.extra_labels, **self.hub.options.extra_labels,
                                    LABEL_SESSION: self.id, LABEL_STORE: self.hub.store.store_id}
        t = self.task
        spec = t.sandbox_spec(cls.default_ready_timeout)
        with self._lock:
            if self.deleted or self._stopped.is_set():  # deleted (or the server stops) before it began
                return
        pool = self.hub.pool
        sandbox = pool.claim(spec, cold_options=options) if pool is not None else cls.start(spec, options)
        try:
            for network in self.hub.options.attach_networks:
                sandbox.attach_gateway(network)
        except Exception:
            sandbox.close()
            raise
        with self._lock:
            gone = self.deleted or self._stopped.is_set()  # deleted, or the server stops, meanwhile
            if not gone:
                self.sandbox = sandbox
        if gone:
            sandbox.close()
            return
        self.hub.store.update_session(self.id, sandbox_id=sandbox.id)
        self._emit({"type": "agent.session.environment.ready",
                    "environment": shapes.environment_state(self.env_id, "ready")})

    def _fail(self, reason: str, *, environment: bool) -> None:
        with self._lock:
            self.status, self.error = "failed", clean(reason, 1000)
            for turn in [self.current] if self.current else []:
                self._end_turn(turn, "failed", error={"code": "sandbox_error", "message": self.error})
        self._save()
        if environment:
            self._emit({"type": "agent.session.environment.failed",
                        "environment": shapes.environment_state(self.env_id, "failed", self.error)})
        self._session_event("agent.session.failed")
        while True:  # turns queued meanwhile end failed too
            try:
                queued = self._queue.get_nowait()
            except queue.Empty:
                break
            if queued is not None and queued.status == "queued":
                self._end_turn(queued, "failed", error={"code": "sandbox_error", "message": self.error})

    def _end_turn(self, turn: Turn, status: str, error: dict[str, str] | None = None) -> None:
        turn.status, turn.error, turn.completed_at = status, error, now()
        self._emit({"type": f"agent.session.turn.{status}", "turn": turn.as_json(self.id), "turn_id": turn.id,
                    "usage": None})
        with self._lock:
            if self.current is turn:
                self.current = None

    def _run_turn(self, turn: Turn) -> None:
        from controller.run.runner import Run, RunOptions

        if turn.cancelled or self.sandbox is None:
            self._end_turn(turn, "cancelled")
            if self.status != "failed":
                self.status = "idle"
                self._save()
                self._session_event("agent.session.idle")
            return
        task = self.task.model_copy(update={"instructions": self._turn_text(turn)})
        if self._turns_run:
            task = task.model_copy(update={"launch": [], "ready": []})  # the desktop is up from the first turn
        self._turns_run += 1
        options = RunOptions(runs_dir=self.hub.options.runs_dir, live=self.task_file is None,
                             model=self.params.model if self.task_file is None else None, terminal=False,
                             approval_timeout_s=self.hub.options.approval_timeout_s, conversation=self.conversation)
        quiet = Console(file=open(os.devnull, "w"), force_terminal=False)  # noqa: SIM115 - the record says it all
        events: _TurnEvents | None = None
        try:
            run = Run(task, options, quiet)
            view = run.watch()  # the console's, when the server has one; this API follows the bus itself
            events = _TurnEvents(self, turn, run)
            with self._lock:
                turn.run, turn.record = run, run.record
                cancelled = turn.cancelled
            if cancelled:
                run.cancel_by_view(BY)
            if self.hub.options.on_live is not None:
                with contextlib.suppress(Exception):
                    self.hub.options.on_live(view)
            outcome = run.execute(lambda _t: self.sandbox, own=False)
            events.subscription.join(TURN_EVENTS_DRAIN_S)  # every event of the run sent before the turn's end
            self._carry(outcome.conversation)
            self._finish_turn(turn, outcome.status, outcome.reason, outcome.final_message, outcome.checks,
                              events.outputs)
        except Exception as exc:  # noqa: BLE001 - execute returns its outcome; anything else fails the turn
            failure = f"{type(exc).__name__}: {clean(exc, 500)}"
            if not turn.ended:  # the run never reached its end: the turn fails here
                self._finish_turn(turn, "error", failure, None, [], events.outputs if events else 0)
        finally:
            quiet.file.close()
            with self._lock:
                turn.run = turn.record = None  # the record's path is in the metadata; its events kept no image

    def _turn_text(self, turn: Turn) -> str:
        """What the turn's run says to the model before its first screenshot: the turn's text, after the
        session's instructions (``agent.instructions``, or an offline task's ``instructions``) when the
        run starts the conversation (:attr:`conversation` is empty: the first turn, or every turn
        before it left nothing)."""
        if self.conversation:
            return turn.text
        instructions = self.params.instructions if self.task_file is None else self.task.instructions
        instructions = (instructions or "").strip()
        return f"{instructions}\n\n{turn.text}" if instructions else turn.text

    def _carry(self, items: list[dict[str, Any]]) -> None:
        """Keep the conversation a turn's run left (:attr:`controller.run.runner.RunOutcome.conversation`)
        for the next turn: a call no output answered cut (:func:`controller.run.conversation.continuable`),
        the screenshots of all but the last :data:`controller.run.conversation.KEEP_IMAGE_TURNS` turns
        left out (:func:`controller.run.conversation.bound_images`), only items the API takes back and
        no lone surrogate (:func:`controller.run.conversation.sanitized`: an answer of a hostile model
        never breaks the next turn), the oldest turns left out past
        :data:`controller.run.conversation.MAX_CONVERSATION_BYTES` (:func:`controller.run.conversation.trimmed`).
        A run that left none (cancelled or failed before the model answered) changes nothing: the next
        turn continues from the one before."""
        from controller.run.conversation import bound_images, continuable, sanitized, trimmed

        items = trimmed(bound_images(continuable(sanitized(list(items)))))
        if items:
            self.conversation = items

    def _finish_turn(self, turn: Turn, status: str, reason: str, final_message: str | None,
                     checks: list[dict[str, Any]], index: int) -> None:
        """The turn's end: the answer (with the task's checks for an offline task), the turn's last event,
        the session idle -- or failed, when the sandbox stopped answering."""
        turn.ended = True
        if turn.record is not None:
            self.metadata["desktop_sandbox.record"] = clean(str(turn.record.path), 512)
        reason = clean(reason, 500)
        text = final_message or ""
        if self.task_file is not None and status != "cancelled":
            passed = sum(1 for c in checks if c.get("passed"))
            verdict = f"checks: {passed} of {len(checks)} passed; run {status}"
            lines = [f"- {'passed' if c.get('passed') else 'FAILED'}: {c.get('kind')} {c.get('target')}"
                     for c in checks]
            text = "\n".join([text, "", verdict, *lines]).strip()
            self.metadata["desktop_sandbox.task"] = clean(self.task_file, 512)
            self.metadata["desktop_sandbox.verdict"] = status
            self.metadata["desktop_sandbox.checks"] = f"{passed}/{len(checks)}"
        elif status not in ("passed", "failed"):
            text = text or reason
        if text:
            item = shapes.assistant_message(shapes.new_id("msg"), turn.id, clean_text(text))
            self.hub.store.put_item(self.id, item)
            self._emit({"type": "agent.session.turn.item.done", "item": item, "output_index": index,
                        "turn_id": turn.id})
            self._emit({"type": "agent.session.turn.output_text.done", "item_id": item["id"],
                        "output_index": index, "content_index": 0, "text": item["content"][0]["text"],
                        "turn_id": turn.id})
        alive = self._sandbox_alive()
        if status == "cancelled" or turn.cancelled:
            self._end_turn(turn, "cancelled")
        elif status == "error":
            self._end_turn(turn, "failed", error={"code": "sandbox_error" if not alive else "internal_error",
                                                  "message": reason})
        else:  # passed, or failed: the loop ran to its end (the verdict is in the text and the metadata)
            self._end_turn(turn, "completed")
        self.last_active_at = now()
        if not alive and not self.deleted:
            self._fail(f"the sandbox stopped answering: {reason}", environment=True)
            return
        if self.status != "failed":
            self.status = "idle"
        self._save()
        self._session_event("agent.session.idle")

    def _sandbox_alive(self) -> bool:
        if self.sandbox is None:
            return False
        try:
            return bool(self.sandbox.agent.livez())
        except Exception:  # noqa: BLE001 - whatever the guest answered, it is not alive for us
            return False

    # -- the end ---------------------------------------------------------------------------------------
    def shut(self, reason: str, *, fail: bool = False) -> None:
        """Cancel the turn under way, wait for the session's thread (bounded), remove the sandbox."""
        with self._lock:
            self.deleted = not fail
            turn = self.current
            run = turn.run if turn is not None else None
            if turn is not None:
                turn.cancelled = True
        if run is not None:
            with contextlib.suppress(Exception):
                run.cancel_by_view(BY)
        self._stopped.set()
        self._queue.put(None)
        if self._thread.is_alive():
            self._thread.join(120)
        self._remove_sandbox()
        if fail and self.status != "failed":
            self._fail(reason, environment=False)


def shot_url(data: bytes, mime: str) -> str | None:
    """A screenshot as the hosted API sends one: ``data:image/jpeg;base64,…`` (a JPEG as it is, a PNG
    re-encoded at quality 80); None when the bytes are not the image they claim, or past the pixel
    cap (:func:`controller.run.shots.decode_shot`)."""
    if mime != "image/jpeg":
        image, _why = decode_shot(data)
        if image is None:
            return None
        out = io.BytesIO()
        image.save(out, format="JPEG", quality=80)
        data = out.getvalue()
    return "data:image/jpeg;base64," + base64.b64encode(data).decode("ascii")


def clean_text(text: str) -> str:
    """The answer's text with control characters escaped line by line (newlines kept)."""
    return "\n".join(clean(line, 20000) for line in text.split("\n"))[:40000]


TURN_ENTRIES = frozenset({"run_started", "computer_call", "screenshot"})
"""The record entries a turn's events are made of (:class:`_TurnEvents`)."""
TURN_EVENTS_DRAIN_S = 120.0
"""At a turn's end, the most its events may take to be sent after the run returned (seconds; each store
write has its own deadline): the turn's last event comes after every other of the turn."""


class _TurnEvents:
    """What a turn's run publishes on its bus, as the session's events, on the bus's thread for this
    subscriber (queued: the run never waits for it): the run's start (``agent.session.turn.in_progress``),
    each computer call and screenshot as a ``computer_use_call`` item (the screenshot's image from the
    event itself, kept in memory for the stream: :meth:`SessionHub.remember_shot`), each change of the
    approval registry (``agent.session.requires_action`` while something is pending,
    ``agent.session.in_progress`` once nothing is) and a sign-in request's history items. The run's
    bus is drained when the run returns: every event of the turn is sent by then."""

    def __init__(self, session: "LiveSession", turn: Turn, run: Any) -> None:
        from controller.run.bus import ApprovalChanged, EntryWritten

        self.session, self.turn, self.run = session, turn, run
        self._calls: dict[str, dict[str, Any]] = {}
        self.outputs = 0
        self._waiting = False
        self._signin_items: set[str] = set()  # sign-in requests whose request item was written
        self._signin_results: set[str] = set()  # ... and whose result item was
        self._entry, self._approval = EntryWritten, ApprovalChanged
        # only what becomes events counts against the queue: a flood of network decisions never drops it
        self.subscription = run.bus.subscribe(
            self._handle, name=f"agents-api {session.id}",
            accepts=lambda event: isinstance(event, ApprovalChanged) or (
                isinstance(event, EntryWritten) and event.entry.type in TURN_ENTRIES))

    def _handle(self, published: Any) -> None:
        event = published.event
        try:
            if isinstance(event, self._approval):
                self._approval_changed(event.request)
            else:
                self._entry_written(event)
        except Exception:  # noqa: BLE001 - one odd event never stops the ones that follow
            pass

    def _approval_changed(self, request: Any) -> None:
        session, turn_id = self.session, self.turn.id
        with session._lock:
            session.requests.setdefault(request.id, (self.run.registry, turn_id))
        if request.kind == SIGN_IN:
            self._signin_history(request)
        pending = session.required_actions()
        if pending:
            self._waiting = True
            session._session_event("agent.session.requires_action")
        elif self._waiting:
            self._waiting = False
            session._session_event("agent.session.in_progress")

    def _entry_written(self, written: Any) -> None:
        entry, session, turn = written.entry, self.session, self.turn
        if entry.type == "run_started":
            turn.status, turn.started_at = "in_progress", now()
            session._emit({"type": "agent.session.turn.in_progress", "turn": turn.as_json(session.id),
                           "turn_id": turn.id})
            session._session_event("agent.session.in_progress")
        elif entry.type == "computer_call":
            item = shapes.computer_call(shapes.new_id("cu"), turn.id, title=call_title(entry.actions),
                                        status="in_progress")
            self._calls[entry.call_id or ""] = item
            session.hub.store.put_item(session.id, item)
            session._emit({"type": "agent.session.turn.item.added", "item": item, "output_index": self.outputs,
                           "turn_id": turn.id})
        elif entry.type == "screenshot":
            item = self._calls.pop(entry.call_id or "", None)
            if item is None:  # the first look at the screen, before any call
                item = shapes.computer_call(shapes.new_id("cu"), turn.id, title="screenshot", status="completed")
            item = dict(item, status="completed")
            session.hub.store.put_item(session.id, item)
            shot = None
            if session.params.include_screenshots:
                name = shot_name(entry.file)  # "": a name no reader opens, sent without its image
                shot = str(self.run.record.dir / name) if name else ""
                if name and written.image is not None:
                    session.hub.remember_shot(shot, written.image, written.mime or shot_type(name))
            event_item = dict(item, _shot=shot) if shot is not None else item
            session._emit({"type": "agent.session.turn.item.done", "item": event_item, "output_index": self.outputs,
                           "turn_id": turn.id})
            self.outputs += 1

    def _signin_history(self, request: Any) -> None:
        """A sign-in request's history items, each written once: the request item (an output of the turn:
        ``item.added`` and ``item.done``) when it is first seen, then the result item (``item.added``)
        once it is ``submitted`` or ``cancelled`` by an answer -- the request's shape, its id and the
        option chosen, never a value (the registry's :class:`Request` holds them apart). A request
        withdrawn, timed out or cancelled because nobody could answer (``no-approver``) gets no result
        item: no answer was taken."""
        session, turn_id = self.session, self.turn.id
        if request.id not in self._signin_items:
            self._signin_items.add(request.id)
            item = shapes.signin_request_item(shapes.new_id("authreq"), request, turn_id)
            session.hub.store.put_item(session.id, item)
            for kind in ("agent.session.turn.item.added", "agent.session.turn.item.done"):
                session._emit({"type": kind, "item": item, "output_index": self.outputs, "turn_id": turn_id})
            self.outputs += 1
        answered = request.state == "submitted" or (request.state == "cancelled" and request.by != "no-approver")
        if answered and request.id not in self._signin_results:
            self._signin_results.add(request.id)
            item = shapes.signin_result_item(shapes.new_id("authres"), request, turn_id)
            session.hub.store.put_item(session.id, item)
            session._emit({"type": "agent.session.turn.item.added", "item": item, "output_index": None,
                           "turn_id": turn_id})


def call_title(actions: list[dict[str, Any]]) -> str:
    """A computer call's actions in a few words (``click (640, 261); type 12 characters``), at most
    200 characters; coordinates in model px, typed text as its length (the record has no text)."""
    parts = []
    for action in actions[:8]:
        kind = str(action.get("type", "?"))
        if "x" in action and "y" in action:
            parts.append(f"{kind} ({action.get('x')}, {action.get('y')})")
        elif kind == "type":
            parts.append(f"type {action.get('text_length', '?')} characters")
        elif kind == "keypress":
            parts.append("keypress " + "+".join(str(k) for k in action.get("keys") or []))
        else:
            parts.append(kind)
    if len(actions) > 8:
        parts.append(f"{len(actions) - 8} more")
    return clean("; ".join(parts) or "computer call", 200)
