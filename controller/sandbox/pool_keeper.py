"""A warm pool served to other processes on this host: the keeper (``up --pool N``, ``run-suite --pool
N``) holds a :class:`controller.sandbox.pool.WarmPool` and answers claims on a unix socket; a claimer
(``run-task --pool SOCKET``, or ``$DESKTOP_SANDBOX_POOL``) takes a sandbox over with
:func:`claim_from`.

The socket lives in a private directory (0700) and is 0600; the keeper also checks the peer's uid
(``SO_PEERCRED``: the keeper's own, or root). One claim per connection: the claimer sends one JSON line
(at most :data:`MAX_REQUEST_BYTES`) ``{"spec": {screen_width, screen_height, browser_channel, policy,
launch, ready}, "owner_id", "owner"}`` (``launch``/``ready``: the template's apps,
:class:`controller.sandbox.pool.Template`); the keeper takes a pool sandbox for the spec (fresh agent token, the spec's
policy swapped in, :meth:`WarmPool.take`) and answers ``{"source": "pool", "facts", "provenance",
"policy_swap", "release_token"}`` (facts: :meth:`controller.sandbox.Sandbox.handover`, with the tokens:
that is why the socket is private). The claimer, having taken the sandbox over, says so
(``{"taken": true}``); only then does the keeper record the claimer as its owner
(:func:`controller.sandbox.owner.record_claim`, so a killed claimer's sandbox is reaped and a killed
keeper's is not taken from a live claimer), answer ``{"owned": true}`` and forget the sandbox. A keeper
that cannot send its answer, or hears no ``taken`` within :data:`READ_TIMEOUT_S` (the claimer gave up
or died), removes the sandbox; so does a claimer that hears no ``owned`` (the keeper died or gave up):
a sandbox is either the claimer's, recorded so, or removed. With none to give the keeper answers
``{"source": "cold", "reason"}`` and the claimer starts one itself.

A claimer done with a sandbox hands it back for removal (``{"release": id, "token": release_token}``:
the keeper records itself as the owner again, answers ``{"released": true}`` and removes it in the
background, so the run's teardown does not wait for the engine; :func:`release_to`). Only a sandbox the
keeper handed out, and only with the token it gave its claimer, is taken back (another process of the
same user cannot remove a claimer's sandbox); the keeper waits for the removals it took on before it
closes. A claimer talks only to a keeper of its own user (or root): a socket another user serves at the
path is not asked (reason ``keeper_foreign``).

Every wait is bounded: the claimer's whole exchange (:data:`CLAIM_TIMEOUT_S`), the keeper's read of a
request (:data:`READ_TIMEOUT_S`). Messages: :data:`MAX_REQUEST_BYTES` / :data:`MAX_ANSWER_BYTES`.
"""

from __future__ import annotations

import hmac
import json
import logging
import os
import re
import secrets
import shutil
import socket
import struct
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, Optional

from controller.sandbox import Sandbox, SandboxError, SandboxSpec
from controller.sandbox.owner import forget_claim, owner_id, record_claim
from controller.sandbox.pool import Apps, ReadyFiles, Template, WarmPool, policy_problem
from controller.text import clean

ENV = "DESKTOP_SANDBOX_POOL"
"""Environment variable naming a keeper's socket (what ``run-suite --pool`` gives its runs)."""

MAX_REQUEST_BYTES = 256 * 1024
MAX_ANSWER_BYTES = 64 * 1024
READ_TIMEOUT_S = 5.0
"""Seconds the keeper waits for a claimer's request line."""
CLAIM_TIMEOUT_S = 30.0
"""Seconds a claimer waits for the keeper's answer (a hand-over takes a fraction of a second; a busy
keeper may be starting a sandbox on its other thread)."""
MAX_CLAIMS_AT_ONCE = 16
MAX_WORD_BYTES = 1024
"""Largest ``taken`` / ``owned`` line (bytes)."""
_OWNER_ID = re.compile(r"[0-9A-Za-z-]{1,64}(:[0-9A-Za-z-]{1,64}){4}")

log = logging.getLogger("controller.sandbox.pool")


class PoolKeeper:
    """Serve claims from ``pool`` on a unix socket in a new private directory (:attr:`path`). Use as a
    context manager, or :meth:`start` / :meth:`close` (closing the keeper does not close the pool)."""

    def __init__(self, pool: WarmPool) -> None:
        self.pool = pool
        self._dir = Path(tempfile.mkdtemp(prefix="desktop-sandbox-pool-"))
        os.chmod(self._dir, 0o700)
        self.path = self._dir / "claim.sock"
        self._server: Optional[socket.socket] = None
        self._thread: Optional[threading.Thread] = None
        self._slots = threading.BoundedSemaphore(MAX_CLAIMS_AT_ONCE)
        self._closed = threading.Event()
        self._handed: dict[str, str] = {}  # sandbox id -> the release token its claimer holds
        self._removals: list[threading.Thread] = []
        self._serving: dict[threading.Thread, socket.socket] = {}
        self._lock = threading.Lock()

    def start(self) -> "PoolKeeper":
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)
        try:
            server.bind(str(self.path))
        finally:
            os.umask(old)
        server.listen(MAX_CLAIMS_AT_ONCE)
        server.settimeout(0.5)
        self._server = server
        self._thread = threading.Thread(target=self._accept, name="pool-keeper", daemon=True)
        self._thread.start()
        return self

    def __enter__(self) -> "PoolKeeper":
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self, timeout: float = 60.0) -> None:
        """Stop answering: connections still open are cut (a claim not yet owned by its claimer ends
        with its sandbox removed, the claimer starts one itself); wait (at most ``timeout`` seconds) for
        the claims being answered and the removals of sandboxes handed back, and remove the socket's
        directory."""
        self._closed.set()
        if self._thread is not None:
            self._thread.join(5.0)
        deadline = time.monotonic() + timeout
        with self._lock:
            serving = dict(self._serving)
        for conn in serving.values():
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:  # already closed
                pass
        for thread in serving:
            thread.join(max(0.0, deadline - time.monotonic()))
        with self._lock:
            removals = list(self._removals)
        for thread in removals:
            thread.join(max(0.0, deadline - time.monotonic()))
        if self._server is not None:
            self._server.close()
        shutil.rmtree(self._dir, ignore_errors=True)

    def _accept(self) -> None:
        assert self._server is not None
        while not self._closed.is_set():
            try:
                conn, _ = self._server.accept()
            except (socket.timeout, OSError):
                continue
            if not self._slots.acquire(blocking=False):
                conn.close()
                continue
            thread = threading.Thread(target=self._serve, args=(conn,), name="pool-claim", daemon=True)
            with self._lock:
                self._serving[thread] = conn
            thread.start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            with conn:
                if not _peer_allowed(conn):
                    return
                try:
                    request = _read_line(conn, MAX_REQUEST_BYTES, time.monotonic() + READ_TIMEOUT_S)
                except (OSError, ValueError) as exc:  # ValueError: also malformed JSON
                    request = {"malformed": clean(exc, 200)}
                answer, sandbox, claimer = self._answer(request)
                if sandbox is None or claimer is None:
                    conn.settimeout(READ_TIMEOUT_S)
                    conn.sendall((json.dumps(answer) + "\n").encode())
                    return
                self._hand_to(conn, answer, sandbox, claimer)
        except Exception as exc:  # noqa: BLE001 - one bad claim never stops the keeper
            log.warning("pool keeper: a claim failed: %s", clean(exc, 300))
        finally:
            with self._lock:
                self._serving.pop(threading.current_thread(), None)
            self._slots.release()

    def _hand_to(self, conn: socket.socket, answer: dict[str, Any], sandbox: Sandbox,
                 claimer: tuple[str, str]) -> None:
        """Send ``answer`` (a pool sandbox's facts), wait for the claimer's ``taken``, record the sandbox as
        the claimer's and say ``owned``; the sandbox is removed when any step fails or times out."""
        owned = False
        try:
            conn.settimeout(READ_TIMEOUT_S)
            conn.sendall((json.dumps(answer) + "\n").encode())
            word = _read_line(conn, MAX_WORD_BYTES, time.monotonic() + READ_TIMEOUT_S)
            if word != {"taken": True} or self._closed.is_set():
                raise ValueError("the claimer did not take the sandbox over")
            record_claim(sandbox.id, *claimer)
            with self._lock:
                self._handed[sandbox.id] = answer["release_token"]
            conn.sendall(b'{"owned": true}\n')
            owned = True
        except (OSError, ValueError) as exc:
            log.warning("pool claimer did not take %s over (%s); removed", sandbox.id, clean(exc, 200))
        finally:
            if owned:
                sandbox._close_agent_client()  # the claimer's now: forget it, remove nothing
            else:
                with self._lock:
                    self._handed.pop(sandbox.id, None)
                try:
                    sandbox.close()
                finally:
                    forget_claim(sandbox.id)

    def _release(self, sandbox_id: Any, token: Any) -> dict[str, Any]:
        """Take back a sandbox this keeper handed out (``token``: the release token its claimer got) and
        remove it in the background."""
        with self._lock:
            expected = self._handed.get(sandbox_id) if isinstance(sandbox_id, str) else None
            if expected is None or not isinstance(token, str) \
                    or not hmac.compare_digest(token.encode(), expected.encode()):
                return {"released": False}
            del self._handed[sandbox_id]
        record_claim(sandbox_id, owner_id(), f"{socket.gethostname()}:{os.getpid()}")
        backend = self.pool.backend

        def remove() -> None:
            try:
                backend.remove(sandbox_id)
            except Exception as exc:  # noqa: BLE001 - reaped later as the keeper's orphan
                log.warning("pool keeper: removing %s: %s", sandbox_id, clean(exc, 300))
            finally:
                forget_claim(sandbox_id)

        thread = threading.Thread(target=remove, name="pool-release", daemon=True)
        with self._lock:
            self._removals = [t for t in self._removals if t.is_alive()] + [thread]
        thread.start()
        return {"released": True}

    def _answer(self, request: Any) -> tuple[dict[str, Any], Optional[Sandbox], Optional[tuple[str, str]]]:
        """The answer to ``request``, the pool sandbox it hands over (None for any other answer) and the
        claimer ``(owner id, owner)`` to record once it took the sandbox over."""
        if isinstance(request, dict) and "release" in request:
            return self._release(request["release"], request.get("token")), None, None
        try:
            spec, launch, ready = _spec(request.get("spec") if isinstance(request, dict) else None)
            claimer, claimer_label = request["owner_id"], request["owner"]
            if not (isinstance(claimer, str) and _OWNER_ID.fullmatch(claimer) and isinstance(claimer_label, str)
                    and len(claimer_label) < 300 and claimer_label.isprintable()):
                raise ValueError("owner_id must be an owner id and owner a short line of printable text")
        except (KeyError, TypeError, ValueError) as exc:
            return {"source": "cold", "reason": "bad_request", "error": clean(exc, 300)}, None, None
        sandbox, reason = self.pool.take(spec, launch, ready)
        if sandbox is None:
            self.pool.count_cold(reason)
            return {"source": "cold", "reason": reason}, None, None
        try:
            facts = sandbox.handover()
        except Exception as exc:  # noqa: BLE001 - hand it over or remove it, never leave it
            sandbox.close()
            return {"source": "cold", "reason": "claim_failed", "error": clean(exc, 300)}, None, None
        return {"source": "pool", "facts": facts, "provenance": sandbox.provenance,
                "policy_swap": sandbox.policy_swap, "release_token": secrets.token_urlsafe(24)}, sandbox, (
                    claimer, claimer_label)


def _peer_allowed(conn: socket.socket) -> bool:
    """Whether the peer runs as this process's user (or root)."""
    try:
        creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    except OSError:
        return False
    _pid, uid, _gid = struct.unpack("3i", creds)
    return uid in (os.getuid(), 0)


def _read_line(conn: socket.socket, cap: int, deadline: float) -> Any:
    """One JSON line from ``conn`` (at most ``cap`` bytes, by ``deadline``). Raises ValueError."""
    data = bytearray()
    while b"\n" not in data:
        left = deadline - time.monotonic()
        if left <= 0:
            raise ValueError("no complete message in time")
        conn.settimeout(left)
        chunk = conn.recv(65536)
        if not chunk:
            raise ValueError("the peer closed the connection mid-message")
        data += chunk
        if len(data) > cap:
            raise ValueError(f"message over {cap} bytes")
    return json.loads(bytes(data).split(b"\n", 1)[0])


def _spec(data: Any) -> tuple[SandboxSpec, Apps, ReadyFiles]:
    """A claim's spec and the template's apps, checked. Raises ValueError naming what is wrong."""
    fields = {"screen_width", "screen_height", "browser_channel", "policy", "launch", "ready"}
    if not isinstance(data, dict) or set(data) - fields:
        raise ValueError(f"spec must be an object of {', '.join(sorted(fields))}")
    width, height = data.get("screen_width", 1280), data.get("screen_height", 800)
    if not all(isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= 16384 for v in (width, height)):
        raise ValueError("the screen size must be whole screen px")
    policy = data.get("policy", {"mode": "deny-all"})
    if not isinstance(policy, dict):
        raise ValueError("policy must be an object")
    problem = policy_problem(SandboxSpec(policy=policy))
    if problem is not None:  # refused before a pool sandbox is taken for it
        raise ValueError(f"policy: {problem}")
    launch, ready = data.get("launch", []), data.get("ready", [])
    if not (isinstance(launch, list) and all(
            isinstance(item, list) and len(item) == 2 and isinstance(item[0], str) and isinstance(item[1], list)
            and all(isinstance(a, str) for a in item[1]) for item in launch)):
        raise ValueError("launch must be a list of [app, [args...]]")
    if not (isinstance(ready, list) and all(
            isinstance(item, list) and len(item) == 2 and isinstance(item[0], str)
            and isinstance(item[1], (int, float)) and not isinstance(item[1], bool) for item in ready)):
        raise ValueError("ready must be a list of [file, timeout_s]")
    spec = SandboxSpec(screen_width=width, screen_height=height, browser_channel=bool(data.get("browser_channel")),
                       policy=policy)
    return (spec, tuple((app, tuple(args)) for app, args in launch),
            tuple((file, float(timeout)) for file, timeout in ready))


def claim_from(path: str | Path, spec: SandboxSpec, backend: type[Sandbox], *,
               start_cold: Callable[[], Sandbox], launch: Apps = (), ready: ReadyFiles = (),
               timeout: float = CLAIM_TIMEOUT_S) -> Sandbox:
    """A sandbox for ``spec`` (with the template's apps ``launch`` running, ``ready``: their files) from
    the keeper at ``path``, taken over (:meth:`Sandbox.adopt`), or, when
    the keeper has none to give or cannot be reached in ``timeout`` seconds, ``start_cold()``. The
    sandbox's ``provenance`` says which (``reason`` ``empty``, ``no_template``, ``claim_failed``,
    ``bad_request``, ``keeper_unreachable``, ``keeper_foreign``: the socket is served by another user,
    and is asked nothing). A pool sandbox is the caller's only once the keeper said it recorded it so
    (``owned``); one it handed over without saying so in time is removed here. Raises what
    ``start_cold`` raises."""
    t0 = time.monotonic()
    reason = "keeper_unreachable"
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(timeout)
            conn.connect(str(path))
            if not _peer_allowed(conn):
                reason = "keeper_foreign"
                raise OSError("the socket is served by another user")
            request = {"spec": {"screen_width": spec.screen_width, "screen_height": spec.screen_height,
                                "browser_channel": bool(spec.browser_channel), "policy": json.loads(spec.policy_json()),
                                "launch": [[app, list(args)] for app, args in launch],
                                "ready": [[file, timeout_s] for file, timeout_s in ready]},
                       "owner_id": owner_id(), "owner": f"{socket.gethostname()}:{os.getpid()}"}
            conn.sendall((json.dumps(request) + "\n").encode())
            answer = _read_line(conn, MAX_ANSWER_BYTES, t0 + timeout)
            if isinstance(answer, dict) and answer.get("source") == "pool" and isinstance(answer.get("facts"), dict):
                reason = "claim_failed"
                claimed = _take_over(conn, answer, backend, t0 + timeout)
                if claimed is not None:
                    provenance = answer.get("provenance") if isinstance(answer.get("provenance"), dict) else {}
                    claimed.provenance = {**provenance, "source": "pool", "claim_s": round(time.monotonic() - t0, 4)}
                    swap = answer.get("policy_swap")
                    claimed.policy_swap = swap if isinstance(swap, dict) else None
                    token = str(answer.get("release_token") or "")
                    claimed.release_to = lambda: release_to(path, claimed.id, token=token)
                    return claimed
            elif isinstance(answer, dict) and isinstance(answer.get("reason"), str):
                reason = clean(answer["reason"], 40)
    except (OSError, ValueError) as exc:
        log.warning("warm pool at %s: %s; starting a sandbox", clean(str(path), 200), clean(exc, 200))
    sandbox = start_cold()
    sandbox.provenance = {"source": "cold", "claim_s": round(time.monotonic() - t0, 4),
                          "template": Template.of(spec, launch, ready).key(), "reason": reason, "launched": False}
    return sandbox


def _take_over(conn: socket.socket, answer: dict[str, Any], backend: type[Sandbox],
               deadline: float) -> Optional[Sandbox]:
    """Adopt the sandbox ``answer`` hands over, say ``taken`` on ``conn`` and wait (until ``deadline``,
    monotonic seconds) for the keeper's ``owned``: the sandbox, or None when it is not the caller's
    (not adopted: the keeper removes it; adopted but never confirmed: removed here)."""
    try:
        sandbox = backend.adopt(answer["facts"])
    except (SandboxError, KeyError, TypeError, ValueError) as exc:  # gone, or facts that describe none
        log.warning("warm pool: cannot take over %s", clean(exc, 300))
        return None
    try:
        conn.sendall(b'{"taken": true}\n')
        if _read_line(conn, MAX_WORD_BYTES, deadline) == {"owned": True}:
            return sandbox
        problem = "the keeper did not confirm the hand-over"
    except (OSError, ValueError) as exc:
        problem = clean(exc, 200)
    log.warning("warm pool: %s not handed over (%s); removed", sandbox.id, problem)
    sandbox.close()
    return None


def release_to(path: str | Path, sandbox_id: str, timeout: float = 5.0, *, token: str = "") -> bool:
    """Hand sandbox ``sandbox_id`` back to the keeper at ``path`` for removal, with the ``release_token``
    its claim's answer held; True when it took it (the caller then forgets it), False when it did not or
    could not be asked within ``timeout`` seconds (the caller removes it itself)."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(timeout)
            conn.connect(str(path))
            conn.sendall((json.dumps({"release": sandbox_id, "token": token}) + "\n").encode())
            answer = _read_line(conn, MAX_ANSWER_BYTES, time.monotonic() + timeout)
    except (OSError, ValueError):
        return False
    return isinstance(answer, dict) and answer.get("released") is True


__all__ = ["CLAIM_TIMEOUT_S", "ENV", "PoolKeeper", "claim_from", "release_to"]
