"""A sandbox client for the OpenAI Agents SDK's ``SandboxAgent`` whose sessions run in a desktop-sandbox guest.

The SDK runs a ``SandboxAgent``'s shell and file tools through a *sandbox client* and the *sessions* it
creates (``agents.sandbox.session``). :class:`DesktopSandboxClient` is one, in the SDK's own interface:
pass it as ``RunConfig(sandbox=SandboxRunConfig(client=DesktopSandboxClient(), options=...))`` and the
``Runner`` creates a session, runs the agent's tools in it and closes it. Each session runs in one guest
desktop behind the project's default-deny gateway:

- every command (the ``exec_command`` tool, and the SDK's own ``mkdir``, ``ls``, ``rm``, ...) runs in the
  guest as the desktop user (``sandbox``, uid 1000; never root), with ``HOME`` the guest home, in the
  session's workspace root;
- file reads and writes (``view_image``, ``apply_patch``, the manifest's files, ``session.read`` /
  ``session.write``) go to the guest and are confined to the guest home (``/home/sandbox``): a path outside
  it, lexically or once the guest's symlinks are followed, is refused with :class:`GuestPathError`;
- output is capped (:attr:`DesktopSandboxClientOptions.max_output_bytes` per stream, the excess dropped in
  the guest and a note appended) and every call is bounded in time (a command is killed with its process
  group after its timeout, :attr:`DesktopSandboxClientOptions.exec_timeout_s` when the SDK gives none,
  never more than :attr:`DesktopSandboxClientOptions.max_exec_timeout_s`).

A client either starts a sandbox of its own for each session (the Docker backend by default; network
policy deny-all unless :attr:`DesktopSandboxClientOptions.policy` says otherwise) and removes it when the
session is shut down or deleted, or is given an already started controller sandbox
(``controller.sandbox.Sandbox``) that every session it creates shares and that it never removes::

    from agents import Runner, RunConfig
    from agents.sandbox import SandboxAgent, SandboxRunConfig
    from desktop_sandbox.agents_sandbox import DesktopSandboxClient, DesktopSandboxClientOptions

    agent = SandboxAgent(name="worker", instructions="...")
    config = RunConfig(sandbox=SandboxRunConfig(client=DesktopSandboxClient(),
                                                options=DesktopSandboxClientOptions()))
    result = await Runner.run(agent, "List the files in your home.", run_config=config)

The confinement to the home is a guard for the SDK's file operations, not a security boundary of its own:
the boundary is the guest (its unprivileged user, its container, the gateway). The guest is treated as
hostile: what it prints is capped, framed and checked, and text from it is escaped before it reaches an
error message.

This module needs the optional extra ``desktop-sandbox[agents]`` (``openai-agents``); importing it without
raises ImportError saying so. Importing :mod:`desktop_sandbox` itself never imports the SDK.
"""

from __future__ import annotations

try:
    from agents.sandbox.errors import (
        ConfigurationError,
        ErrorCode,
        ExecTimeoutError,
        ExecTransportError,
        InvalidManifestPathError,
        WorkspaceArchiveReadError,
        WorkspaceArchiveWriteError,
        WorkspaceReadNotFoundError,
        WorkspaceStartError,
    )
    from agents.sandbox.manifest import Manifest
    from agents.sandbox.session import SandboxSession, SandboxSessionState
    from agents.sandbox.session.base_sandbox_session import BaseSandboxSession
    from agents.sandbox.session.dependencies import Dependencies
    from agents.sandbox.session.manager import Instrumentation
    from agents.sandbox.session.sandbox_client import BaseSandboxClient, BaseSandboxClientOptions
    from agents.sandbox.session.workspace_payloads import coerce_write_payload
    from agents.sandbox.snapshot import SnapshotBase, SnapshotSpec, resolve_snapshot
    from agents.sandbox.types import ExecResult, User
    from agents.sandbox.util.tar_utils import UnsafeTarMemberError, validate_tarfile
    from agents.sandbox.workspace_paths import coerce_posix_path, posix_path_as_path, sandbox_path_str
except ImportError as exc:  # pragma: no cover - exercised in a subprocess by the tests
    raise ImportError(
        "desktop_sandbox.agents_sandbox needs the OpenAI Agents SDK (openai-agents 0.24): "
        "install the extra with `pip install 'desktop-sandbox[agents]'`"
        f" ({exc})"
    ) from exc

import asyncio
import base64
import io
import json
import tarfile
import uuid
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Callable, Literal, Sequence

from pydantic import Field, field_validator

from controller.sandbox import (
    DEFAULT_POLICY, LABEL_DETACHED, LABEL_OWNER, LABEL_OWNER_ID, LABEL_ROLE, LABEL_SANDBOX, Sandbox, SandboxSpec,
)
from controller.sandbox.errors import SandboxError as GuestSandboxError
from controller.sandbox.guest import DESKTOP_USER, GUEST_HOME, GUEST_PYTHON
from controller.text import clean

__all__ = [
    "DesktopSandboxClient", "DesktopSandboxClientOptions", "DesktopSandboxSession",
    "DesktopSandboxSessionState", "GuestPathError",
]

BACKEND_ID = "desktop_sandbox"
"""The SDK's ``backend_id`` of this client, and the ``type`` of its options and session state."""

DEFAULT_WORKSPACE_ROOT = "/workspace"
"""The SDK's default ``Manifest.root``; a session given it works in the guest home instead."""

MIB = 1024 * 1024
MAX_OUTPUT_CAP = 4 * MIB
"""The largest :attr:`DesktopSandboxClientOptions.max_output_bytes` (bytes, per stream)."""
MAX_FILE_CAP = 12 * MIB
"""The largest :attr:`DesktopSandboxClientOptions.max_file_bytes`: a read comes back as one exec's
output, which the controller caps at 16 MiB."""
ERR_CAP = 64 * 1024
"""Bytes of stderr kept from the guest's internal file commands (read, write, archive)."""
CALL_GRACE_S = 15.0
"""Seconds a call waits beyond a command's own timeout for the guest to answer (the kill, the output)."""
CONTROL_TIMEOUT_S = 30.0
"""Timeout (seconds) of the guest commands this module runs itself (resolve a path, write a chunk)."""
WRITE_CHUNK_BYTES = 90 * 1024
"""Raw bytes per base64 argument of a write (122,880 characters: under Linux's 128 KiB per argument)."""
WRITE_CHUNKS_PER_CALL = 8
"""Base64 arguments per guest command of a write (under 1 MiB of arguments)."""

HOME_SECRETS = (".Xauthority",)
"""Files of the guest home never put in a workspace archive (the X cookie of the guest's display)."""

_RESERVED_LABELS = frozenset({LABEL_SANDBOX, LABEL_ROLE, LABEL_OWNER, LABEL_OWNER_ID, LABEL_DETACHED})
"""Labels a session's options may not set: the sandbox's id, its parts' roles and its owner (cleanup
and reaping rely on them)."""

_FRAME_MAGIC = b"DSX1 "
_FRAME_HEADER_MAX = 512

# The guest side of every command: runs argv as a child in its own process group, keeps at most
# out_cap/err_cap bytes of its stdout/stderr (drains the rest), kills the group after `limit` seconds,
# and prints one frame: b"DSX1 " + JSON header + b"\n" + stdout + stderr. Run with `python -I` (no user
# site-packages, no PYTHON* variables: the desktop user can write to its home, not to this).
_RUNNER = r"""
import json, os, signal, subprocess, sys, threading
out_cap, err_cap, limit = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
cwd, home, user = sys.argv[4], sys.argv[5], sys.argv[6]
argv = sys.argv[8:]
env = dict(os.environ, HOME=home, USER=user, LOGNAME=user)
for place in (cwd, home, "/"):
    try:
        os.chdir(place)
        break
    except OSError:
        pass
kept = {"out": [bytearray(), False], "err": [bytearray(), False]}
def pump(name, stream, cap):
    slot = kept[name]
    fd = stream.fileno()
    while True:
        try:
            chunk = os.read(fd, 65536)
        except OSError:
            break
        if not chunk:
            break
        room = cap - len(slot[0])
        if room > 0:
            slot[0] += chunk[:room]
        if len(chunk) > room:
            slot[1] = True
code, timed_out = 127, False
try:
    if not argv:
        raise OSError(22, "empty command")
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=env, start_new_session=True)
except OSError as exc:
    kept["err"][0] += ("%s: %s\n" % (argv[0] if argv else "", exc.strerror)).encode("utf-8", "replace")[:err_cap]
else:
    threads = [threading.Thread(target=pump, args=("out", proc.stdout, out_cap), daemon=True),
               threading.Thread(target=pump, args=("err", proc.stderr, err_cap), daemon=True)]
    for t in threads:
        t.start()
    try:
        code = proc.wait(timeout=limit)
    except subprocess.TimeoutExpired:
        timed_out = True
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
        code = proc.wait()
    for t in threads:
        t.join(timeout=1.0)
    if code < 0:
        code = 128 - code
out, err = bytes(kept["out"][0]), bytes(kept["err"][0])
head = json.dumps({"code": code, "timed_out": timed_out, "out": len(out), "err": len(err),
                   "out_cut": kept["out"][1], "err_cut": kept["err"][1]})
sys.stdout.buffer.write(b"DSX1 " + head.encode() + b"\n" + out + err)
sys.stdout.buffer.flush()
os._exit(0)
"""

# Resolve $2 in the guest (symlinks followed, missing parts taken as written) and answer it when it is
# the home $1 or under it (exit 0), else exit 45; the resolved path is printed either way.
_RESOLVE_SCRIPT = r"""
real=$(realpath -m -- "$2") || exit 46
printf '%s' "$real"
case $real in "$1"|"$1"/*) exit 0;; esac
exit 45
"""

# Read at most $3 bytes of the regular file $2 once it resolves under the home $1.
_READ_SCRIPT = r"""
real=$(realpath -e -- "$2" 2>/dev/null) || exit 44
case $real in "$1"|"$1"/*) ;; *) printf '%s' "$real" >&2; exit 45;; esac
[ -f "$real" ] || exit 46
[ -r "$real" ] || exit 47
exec head -c "$3" -- "$real"
"""

# Prepare a write of $2 under the home $1: make its directory, then a temporary file beside it; prints
# the temporary file and the resolved target, one a line.
_WRITE_BEGIN_SCRIPT = r"""
real=$(realpath -m -- "$2") || exit 46
case $real in "$1"/*) ;; *) printf '%s' "$real" >&2; exit 45;; esac
dir=${real%/*}
mkdir -p -- "$dir" || exit 47
rdir=$(realpath -e -- "$dir") || exit 47
case $rdir in "$1"|"$1"/*) ;; *) printf '%s' "$rdir" >&2; exit 45;; esac
[ -d "$rdir/${real##*/}" ] && exit 48
tmp=$(mktemp -- "$rdir/.desktop-sandbox-write.XXXXXX") || exit 47
printf '%s\n%s' "$tmp" "$rdir/${real##*/}"
"""

_WRITE_CHUNK_SCRIPT = r"""
tmp=$1
shift
for c do printf '%s' "$c"; done | base64 -d >> "$tmp"
"""

_WRITE_COMMIT_SCRIPT = r"""
if [ -e "$2" ]; then chmod --reference="$2" -- "$1" 2>/dev/null || chmod 644 -- "$1"; else chmod 644 -- "$1"; fi
mv -f -- "$1" "$2"
"""

_ARCHIVE_SCRIPT = r"""
root=$1
shift
cd -- "$root" || exit 44
exec tar -cf - "$@" .
"""

_EXTRACT_SCRIPT = r"""
mkdir -p -- "$2" || exit 47
tar -x --no-same-owner --no-same-permissions -C "$2" -f "$1"
code=$?
rm -f -- "$1"
exit $code
"""


class GuestPathError(InvalidManifestPathError):
    """A file path of the SDK refused because it lies outside the guest home (as written, or once the
    guest's symlinks are followed). An ``InvalidManifestPathError``, so the SDK's tools answer the model
    with their own "use a path within the workspace" note. ``path``: the path as given; ``home``: the
    guest home; ``resolved``: where the guest resolved it to (escaped, cut), "" when refused as written."""

    def __init__(self, path: str | PurePosixPath | Path, home: str, resolved: str = "") -> None:
        text = clean(str(path), 300)
        super().__init__(rel=text, reason="escape_root",
                         context={"home": home, **({"resolved_path": resolved} if resolved else {})})
        where = f" (it resolves to {resolved})" if resolved else ""
        message = (f"path {text} is outside the guest home {home}{where}: the desktop sandbox's file "
                   f"reads and writes are confined to {home}")
        self.message = message
        self.args = (message,)
        self.path = text
        self.home = home
        self.resolved = resolved


class DesktopSandboxClientOptions(BaseSandboxClientOptions):
    """Options of :class:`DesktopSandboxClient` sessions (``SandboxRunConfig(options=...)``; JSON round-trips).

    For a sandbox the client starts itself: ``image`` (the guest image tag; None: the backend's default,
    ``desktop-sandbox:latest``), ``policy`` (the gateway's network policy as a mapping, like a task's
    ``[network]`` table; default deny-all), ``screen_width``/``screen_height`` (screen px),
    ``ready_timeout_s`` (seconds to wait for the guest), ``labels`` (extra labels on its containers and
    networks; not the sandbox's id, role or owner labels). Limits of every session: ``exec_timeout_s``
    (seconds a command may run when the SDK gives no timeout), ``max_exec_timeout_s`` (ceiling on any
    timeout the SDK gives),
    ``max_output_bytes`` (bytes of stdout, and of stderr, kept from one command; at most 4 MiB),
    ``max_file_bytes`` (largest file read or written, and largest workspace archive, in bytes; at most
    12 MiB). Raises pydantic's ValidationError on a value out of range.
    """

    type: Literal["desktop_sandbox"] = "desktop_sandbox"
    image: str | None = None
    policy: dict[str, Any] = Field(default_factory=lambda: dict(DEFAULT_POLICY))
    screen_width: int = Field(default=1280, ge=64, le=8192)
    screen_height: int = Field(default=800, ge=64, le=8192)
    ready_timeout_s: float = Field(default=120.0, gt=0, le=3600)
    labels: dict[str, str] = Field(default_factory=dict)
    exec_timeout_s: float = Field(default=120.0, gt=0, le=86400)
    max_exec_timeout_s: float = Field(default=600.0, gt=0, le=86400)
    max_output_bytes: int = Field(default=MIB, ge=1024, le=MAX_OUTPUT_CAP)
    max_file_bytes: int = Field(default=8 * MIB, ge=1024, le=MAX_FILE_CAP)

    @field_validator("labels")
    @classmethod
    def _no_project_labels(cls, labels: dict[str, str]) -> dict[str, str]:
        for key in labels:
            if key in _RESERVED_LABELS:
                raise ValueError(f"label {key!r} names the sandbox, its role or its owner; choose another key")
        return labels

    def sandbox_spec(self) -> SandboxSpec:
        """The ``controller.sandbox.SandboxSpec`` of a sandbox started for these options."""
        return SandboxSpec(screen_width=self.screen_width, screen_height=self.screen_height,
                           policy=dict(self.policy), ready_timeout=self.ready_timeout_s)


class DesktopSandboxSessionState(SandboxSessionState):
    """What the SDK keeps of a session (``RunState``, ``serialize_session_state``): the sandbox's id and
    backend, whether the session's client started it (``owned``: removed with the session), the guest
    home, and the options. No token or URL of the sandbox is kept."""

    type: Literal["desktop_sandbox"] = "desktop_sandbox"
    sandbox_id: str
    backend: str = "docker"
    owned: bool = True
    guest_home: str = GUEST_HOME
    options: DesktopSandboxClientOptions = Field(default_factory=DesktopSandboxClientOptions)


@dataclass(frozen=True)
class _Run:
    """One framed guest command: exit status, kept output, whether each was cut, whether it timed out."""

    code: int
    stdout: bytes
    stderr: bytes
    out_cut: bool
    err_cut: bool
    timed_out: bool


def _under(path: PurePosixPath, home: PurePosixPath) -> bool:
    return path == home or home in path.parents


class DesktopSandboxSession(BaseSandboxSession):
    """A session of :class:`DesktopSandboxClient`: the SDK's ``BaseSandboxSession`` over one guest.

    Made by the client (``create``/``resume``), never directly. ``sandbox`` is the controller sandbox
    it runs in (None once an owned one is removed). Commands run as the desktop user; ``exec`` with a
    ``user`` other than it (``SandboxAgent(run_as=...)``) raises ConfigurationError, since the guest has
    no way to switch users. No PTY (``exec_command`` runs one-shot commands), no exposed ports.
    """

    state: DesktopSandboxSessionState

    def __init__(self, *, state: DesktopSandboxSessionState, sandbox: Sandbox,
                 on_removed: Callable[["DesktopSandboxSession"], None] | None = None) -> None:
        self.state = state
        self._sandbox: Sandbox | None = sandbox
        self._on_removed = on_removed
        self._home = PurePosixPath(state.guest_home)
        self._real_home = str(self._home)
        self._remove_lock = asyncio.Lock()

    # -- what callers see -------------------------------------------------------------------------

    @property
    def sandbox(self) -> Sandbox | None:
        """The controller sandbox (``controller.sandbox.Sandbox``) this session runs in; None once the
        session removed the sandbox it owned."""
        return self._sandbox

    @property
    def owned(self) -> bool:
        """True when the session's client started the sandbox (it is removed with the session)."""
        return self.state.owned

    @property
    def guest_home(self) -> str:
        """The guest home (absolute guest path): the only place file reads and writes may go."""
        return str(self._home)

    # -- lifecycle --------------------------------------------------------------------------------

    async def _ensure_backend_started(self) -> None:
        if self._sandbox is None:
            raise WorkspaceStartError(path=Path(self.state.manifest.root),
                                      message=f"sandbox {self.state.sandbox_id} was removed")
        run = await self._run(["realpath", "-e", "--", str(self._home)], timeout=CONTROL_TIMEOUT_S,
                              out_cap=4096, err_cap=ERR_CAP, cwd="/")
        real = run.stdout.decode("utf-8", "replace").strip()
        if run.code != 0 or not real.startswith("/"):
            raise WorkspaceStartError(path=Path(self.state.manifest.root),
                                      message=f"the guest home {self._home} is missing in sandbox "
                                              f"{self.state.sandbox_id}")
        self._real_home = real

    async def running(self) -> bool:
        """True when the guest answers a command within 10 s."""
        if self._sandbox is None:
            return False
        try:
            run = await self._run(["true"], timeout=10.0, out_cap=1024, err_cap=1024, cwd="/")
        except Exception:  # noqa: BLE001 - any failure means: not running
            return False
        return run.code == 0 and not run.timed_out

    async def _shutdown_backend(self) -> None:
        if self.state.owned:
            await self._remove_sandbox()

    async def _remove_sandbox(self) -> None:
        """Close (remove) the sandbox this session owns; idempotent. Not cut short by cancellation."""
        async with self._remove_lock:
            sandbox, self._sandbox = self._sandbox, None
            if sandbox is None:
                return
            try:
                await asyncio.shield(asyncio.get_running_loop().run_in_executor(None, sandbox.close))
            finally:
                if self._on_removed is not None:
                    self._on_removed(self)

    async def provision_manifest_accounts(self) -> None:
        """The guest has one user, the desktop user: a manifest naming any other user or group raises
        ConfigurationError; the desktop user itself needs nothing."""
        names = {user.name for user in self.state.manifest.users} | {g.name for g in self.state.manifest.groups}
        extra = sorted(names - {DESKTOP_USER})
        if extra:
            raise ConfigurationError(
                message=f"the guest has one user, {DESKTOP_USER}; it cannot create {', '.join(extra)}",
                error_code=ErrorCode.SANDBOX_CONFIG_INVALID, op="start", context={"users": extra})

    # -- commands -----------------------------------------------------------------------------------

    def _prepare_exec_command(self, *command: str | Path, shell: bool | list[str],
                              user: str | User | None) -> list[str]:
        name = user.name if isinstance(user, User) else user
        if name and name != DESKTOP_USER:
            raise ConfigurationError(
                message=f"commands run as the guest's desktop user {DESKTOP_USER}; cannot run as {clean(name, 80)}",
                error_code=ErrorCode.SANDBOX_CONFIG_INVALID, op="exec", context={"user": clean(name, 80)})
        return super()._prepare_exec_command(*command, shell=shell, user=None)

    def _timeout(self, timeout: float | None) -> float:
        options = self.state.options
        chosen = options.exec_timeout_s if timeout is None else float(timeout)
        return max(0.1, min(chosen, options.max_exec_timeout_s))

    async def _exec_internal(self, *command: str | Path, timeout: float | None = None) -> ExecResult:
        argv = [str(part) for part in command]
        limit = self._timeout(timeout)
        cap = self.state.options.max_output_bytes
        run = await self._run(argv, timeout=limit, out_cap=cap, err_cap=cap, cwd=self._cwd(), command=command)
        if run.timed_out:
            raise ExecTimeoutError(command=command, timeout_s=limit,
                                   context={"stdout_bytes": len(run.stdout), "stderr_bytes": len(run.stderr)})
        note = f"\n[desktop-sandbox: output cut at {cap} bytes]\n".encode()
        return ExecResult(stdout=run.stdout + (note if run.out_cut else b""),
                          stderr=run.stderr + (note if run.err_cut else b""), exit_code=run.code)

    def _cwd(self) -> str:
        return str(self.state.manifest.root) if self.state.workspace_root_ready else str(self._home)

    async def _run(self, argv: Sequence[str], *, timeout: float, out_cap: int, err_cap: int,
                   cwd: str | None = None, command: Sequence[str | Path] | None = None) -> _Run:
        """Run ``argv`` in the guest through the framing runner: killed with its process group after
        ``timeout`` seconds; at most ``out_cap``/``err_cap`` bytes of stdout/stderr kept. Raises
        ExecTimeoutError when the runner itself had to be killed or the guest does not answer
        :data:`CALL_GRACE_S` (twice) after the timeout, ExecTransportError when the guest cannot be
        reached or answers something that is not a frame, or an argument holds a NUL byte."""
        what = tuple(command if command is not None else argv)
        sandbox = self._sandbox
        if sandbox is None:
            raise ExecTransportError(command=what, message=f"sandbox {self.state.sandbox_id} was removed")
        if any("\x00" in part for part in argv):  # no exec can pass one: refused here, with a reason
            raise ExecTransportError(command=tuple(clean(str(p), 80) for p in what),
                                     message="a command argument (or path) holds a NUL byte, which no guest "
                                             "command can take")
        wrapped = [GUEST_PYTHON, "-I", "-c", _RUNNER, str(out_cap), str(err_cap), f"{timeout:.3f}",
                   cwd or str(self._home), str(self._home), DESKTOP_USER, "--", *argv]
        outer = timeout + CALL_GRACE_S
        loop = asyncio.get_running_loop()
        future = loop.run_in_executor(None, lambda: sandbox.exec_in_guest(wrapped, timeout=outer))
        try:
            result = await asyncio.wait_for(asyncio.shield(future), outer + CALL_GRACE_S)
        except asyncio.TimeoutError:
            raise ExecTimeoutError(command=what, timeout_s=timeout,
                                   context={"reason": "guest_did_not_answer",
                                            "waited_s": outer + CALL_GRACE_S}) from None
        except GuestSandboxError as exc:
            raise ExecTransportError(command=what, message=f"the guest command failed: {clean(exc, 300)}") from None
        if result.exit_code == 124 and not result.stdout.startswith(_FRAME_MAGIC):  # the outer timeout's kill
            raise ExecTimeoutError(command=what, timeout_s=timeout, context={"reason": "runner_killed"})
        return self._unframe(result.exit_code, result.stdout, result.stderr, out_cap, err_cap, what)

    @staticmethod
    def _unframe(code: int, stdout: bytes, stderr: bytes, out_cap: int, err_cap: int,
                 what: tuple[Any, ...]) -> _Run:
        """The guest runner's frame in ``stdout`` checked against the caps. Raises ExecTransportError
        when it is not one (the guest is hostile: lengths must add up exactly)."""
        def refuse(reason: str) -> ExecTransportError:
            return ExecTransportError(command=what, message=f"the guest answered no valid frame: {reason}",
                                      context={"exit_code": code,
                                               "stderr": clean(stderr[:2048].decode("utf-8", "replace"), 500)})

        if code != 0 or not stdout.startswith(_FRAME_MAGIC):
            raise refuse(f"runner exit status {code}")
        end = stdout.find(b"\n", 0, _FRAME_HEADER_MAX)
        if end < 0:
            raise refuse("no header")
        try:
            head = json.loads(stdout[len(_FRAME_MAGIC):end])
            status, n_out, n_err = int(head["code"]), int(head["out"]), int(head["err"])
            timed_out, out_cut, err_cut = (bool(head[k]) for k in ("timed_out", "out_cut", "err_cut"))
        except (ValueError, KeyError, TypeError):
            raise refuse("bad header") from None
        body = stdout[end + 1:]
        if not (0 <= n_out <= out_cap and 0 <= n_err <= err_cap and n_out + n_err == len(body)):
            raise refuse("lengths do not match")
        return _Run(status, body[:n_out], body[n_out:], out_cut, err_cut, timed_out)

    async def _run_control(self, script: str, *args: str, out_cap: int = 64 * 1024,
                           timeout: float = CONTROL_TIMEOUT_S) -> _Run:
        """One of this module's own shell scripts in the guest, with its positional arguments."""
        return await self._run(["sh", "-c", script, "sh", *args], timeout=timeout, out_cap=out_cap,
                               err_cap=ERR_CAP, cwd=str(self._home), command=("sh", "-c", "<desktop-sandbox>"))

    # -- paths ------------------------------------------------------------------------------------

    def normalize_path(self, path: Path | str, *, for_write: bool = False) -> Path:
        """``path`` (relative to the workspace root, or absolute) as an absolute guest path, checked as
        written: under the workspace root (or a granted path), and under the guest home. Raises
        GuestPathError otherwise."""
        try:
            pure = self._workspace_path_policy().normalize_sandbox_path(path, for_write=for_write)
        except InvalidManifestPathError as exc:
            if isinstance(exc, GuestPathError):
                raise
            raise GuestPathError(coerce_posix_path(path), str(self._home)) from None
        if not _under(PurePosixPath(pure.as_posix()), self._home):
            raise GuestPathError(coerce_posix_path(path), str(self._home))
        return posix_path_as_path(pure)

    async def _validate_path_access(self, path: Path | str, *, for_write: bool = False) -> Path:
        normalized = self.normalize_path(path, for_write=for_write)
        run = await self._run_control(_RESOLVE_SCRIPT, self._real_home, sandbox_path_str(normalized), out_cap=8192)
        if run.code == 45:
            raise GuestPathError(coerce_posix_path(path), str(self._home),
                                 clean(run.stdout.decode("utf-8", "replace"), 300))
        if run.code != 0:
            raise ExecTransportError(command=("realpath", sandbox_path_str(normalized)),
                                     message=f"the guest could not resolve {clean(sandbox_path_str(normalized), 300)}")
        return normalized

    # -- files ------------------------------------------------------------------------------------

    async def _read_at_most(self, path: Path | str, limit: int) -> tuple[Path, bytes]:
        normalized = self.normalize_path(path)
        arg = sandbox_path_str(normalized)
        run = await self._run_control(_READ_SCRIPT, self._real_home, arg, str(limit), out_cap=limit)
        if run.code == 44:
            raise WorkspaceReadNotFoundError(path=normalized)
        if run.code == 45:
            raise GuestPathError(coerce_posix_path(path), str(self._home),
                                 clean(run.stderr.decode("utf-8", "replace"), 300))
        if run.code != 0 or run.timed_out:
            reason = {46: "not_a_regular_file", 47: "permission_denied"}.get(run.code, "read_failed")
            raise WorkspaceArchiveReadError(path=normalized, context={
                "reason": reason, "exit_code": run.code, "stderr": clean(run.stderr.decode("utf-8", "replace"), 300)})
        return normalized, run.stdout

    async def read(self, path: Path, *, user: str | User | None = None) -> io.IOBase:
        """The guest file ``path`` (bytes), at most ``max_file_bytes``. Raises GuestPathError (outside the
        home), WorkspaceReadNotFoundError, WorkspaceArchiveReadError (not a regular file, unreadable, or
        larger than ``max_file_bytes``: context ``reason`` ``too_large``)."""
        self._prepare_exec_command("true", shell=False, user=user)
        cap = self.state.options.max_file_bytes
        normalized, data = await self._read_at_most(path, cap + 1)
        if len(data) > cap:
            raise WorkspaceArchiveReadError(path=normalized, context={"reason": "too_large", "max_bytes": cap})
        return io.BytesIO(data)

    async def _read_bounded(self, path: Path, *, max_bytes: int) -> bytes:
        _, data = await self._read_at_most(path, min(max_bytes, self.state.options.max_file_bytes))
        return data

    async def write(self, path: Path, data: io.IOBase, *, user: str | User | None = None) -> None:
        """Write ``data`` (a binary or text stream) to the guest file ``path`` as the desktop user: into a
        temporary file beside it, then renamed over it (an existing file keeps its mode; a new one is
        0644). Missing directories are made. Raises GuestPathError (outside the home),
        WorkspaceArchiveWriteError (larger than ``max_file_bytes``, a directory, or the guest failed)."""
        self._prepare_exec_command("true", shell=False, user=user)
        normalized = self.normalize_path(path, for_write=True)
        payload = coerce_write_payload(path=path, data=data).stream
        cap = self.state.options.max_file_bytes
        blob = _read_capped(payload, cap + 1)
        if len(blob) > cap:
            raise WorkspaceArchiveWriteError(path=normalized, message=f"file larger than {cap} bytes: {normalized}",
                                             context={"reason": "too_large", "max_bytes": cap})
        await self._upload(normalized, blob, original=path)

    async def _upload(self, target: Path, blob: bytes, *, original: Path | str) -> None:
        arg = sandbox_path_str(target)
        begin = await self._run_control(_WRITE_BEGIN_SCRIPT, self._real_home, arg, out_cap=16384)
        if begin.code == 45:
            raise GuestPathError(coerce_posix_path(original), str(self._home),
                                 clean(begin.stderr.decode("utf-8", "replace"), 300))
        lines = begin.stdout.decode("utf-8", "replace").split("\n")
        if begin.code != 0 or len(lines) != 2 or not all(line.startswith(self._real_home + "/") for line in lines):
            reason = {46: "unresolvable", 47: "cannot_create", 48: "is_a_directory"}.get(begin.code, "write_failed")
            raise WorkspaceArchiveWriteError(path=target, context={
                "reason": reason, "exit_code": begin.code,
                "stderr": clean(begin.stderr.decode("utf-8", "replace"), 300)})
        tmp, final = lines
        try:
            step = WRITE_CHUNK_BYTES * WRITE_CHUNKS_PER_CALL
            for start in range(0, len(blob), step):
                part = blob[start:start + step]
                chunks = [base64.b64encode(part[i:i + WRITE_CHUNK_BYTES]).decode("ascii")
                          for i in range(0, len(part), WRITE_CHUNK_BYTES)]
                run = await self._run_control(_WRITE_CHUNK_SCRIPT, tmp, *chunks)
                if run.code != 0 or run.timed_out:
                    raise WorkspaceArchiveWriteError(path=target, context={
                        "reason": "write_failed", "exit_code": run.code,
                        "stderr": clean(run.stderr.decode("utf-8", "replace"), 300)})
            done = await self._run_control(_WRITE_COMMIT_SCRIPT, tmp, final)
            if done.code != 0 or done.timed_out:
                raise WorkspaceArchiveWriteError(path=target, context={
                    "reason": "rename_failed", "exit_code": done.code,
                    "stderr": clean(done.stderr.decode("utf-8", "replace"), 300)})
        except BaseException:
            try:
                await self._run_control("rm -f -- \"$1\"", tmp)
            except Exception:  # noqa: BLE001 - best effort; the original error matters
                pass
            raise

    # -- workspace archives (snapshots) -----------------------------------------------------------

    async def persist_workspace(self) -> io.IOBase:
        """The workspace root as a tar stream (members relative to the root, ``./...``), without the
        manifest's ephemeral paths nor, when the root is the home, :data:`HOME_SECRETS`; at most
        ``max_file_bytes`` (else WorkspaceArchiveReadError)."""
        root = self._workspace_root_path()
        skip = {rel.as_posix() for rel in self._persist_workspace_skip_relpaths()}
        if root == posix_path_as_path(self._home):
            skip |= set(HOME_SECRETS)
        excludes = [f"--exclude=./{rel}" for rel in sorted(skip)]
        cap = self.state.options.max_file_bytes
        run = await self._run(["sh", "-c", _ARCHIVE_SCRIPT, "sh", root.as_posix(), *excludes],
                              timeout=self._timeout(None), out_cap=cap, err_cap=ERR_CAP, cwd=str(self._home))
        if run.code != 0 or run.out_cut or run.timed_out:
            reason = "too_large" if run.out_cut else "archive_failed"
            raise WorkspaceArchiveReadError(path=root, context={
                "reason": reason, "exit_code": run.code, "stderr": clean(run.stderr.decode("utf-8", "replace"), 300)})
        return io.BytesIO(run.stdout)

    async def hydrate_workspace(self, data: io.IOBase) -> None:
        """Extract a tar stream (as :meth:`persist_workspace` makes) into the workspace root, as the desktop
        user; members that would leave the root are refused (WorkspaceArchiveWriteError), as is an
        archive over ``max_file_bytes``."""
        root = self._workspace_root_path()
        cap = self.state.options.max_file_bytes
        blob = _read_capped(coerce_write_payload(path=root, data=data).stream, cap + 1)
        if len(blob) > cap:
            raise WorkspaceArchiveWriteError(path=root, context={"reason": "too_large", "max_bytes": cap})
        try:
            with tarfile.open(fileobj=io.BytesIO(blob), mode="r:*") as tar:
                validate_tarfile(tar, allow_external_symlink_targets=False)
        except UnsafeTarMemberError as exc:
            raise WorkspaceArchiveWriteError(path=root, context={"reason": exc.reason, "member": exc.member},
                                             cause=exc) from exc
        except (tarfile.TarError, OSError) as exc:
            raise WorkspaceArchiveWriteError(path=root, cause=exc) from exc
        staging = self._home / f".desktop-sandbox-hydrate-{uuid.uuid4().hex}.tar"
        await self._upload(posix_path_as_path(staging), blob, original=staging.as_posix())
        run = await self._run_control(_EXTRACT_SCRIPT, staging.as_posix(), root.as_posix(),
                                      timeout=self._timeout(None))
        if run.code != 0 or run.timed_out:
            raise WorkspaceArchiveWriteError(path=root, context={
                "reason": "extract_failed", "exit_code": run.code,
                "stderr": clean(run.stderr.decode("utf-8", "replace"), 300)})


class DesktopSandboxClient(BaseSandboxClient[DesktopSandboxClientOptions | None]):
    """The Agents SDK sandbox client whose sessions run in desktop-sandbox guests.

    ``DesktopSandboxClient(sandbox=None, *, backend="docker", instrumentation=None, dependencies=None)``:

    - ``sandbox`` None: each session starts a sandbox of ``backend`` (``controller.sandbox.registry``
      name) for its options (:meth:`DesktopSandboxClientOptions.sandbox_spec`) and removes it when the
      session is shut down or :meth:`delete`\\ d;
    - ``sandbox`` a started ``controller.sandbox.Sandbox``: every session runs in it; the client never
      removes it (its starter does).

    ``options`` may be None (defaults). A session's workspace root is the guest home unless the
    manifest names a root under it; a root, or an extra path grant, outside the home raises
    GuestPathError at ``create``; host-path grants raise ConfigurationError.
    """

    backend_id = BACKEND_ID
    supports_default_options = True

    def __init__(self, sandbox: Sandbox | None = None, *, backend: str = "docker",
                 instrumentation: Instrumentation | None = None,
                 dependencies: Dependencies | None = None) -> None:
        super().__init__()
        self._given = sandbox
        self._backend = sandbox.backend_name if sandbox is not None else backend
        self._instrumentation = instrumentation if instrumentation is not None else Instrumentation()
        self._dependencies = dependencies
        self._live: dict[uuid.UUID, DesktopSandboxSession] = {}

    @property
    def sessions(self) -> list[DesktopSandboxSession]:
        """The sessions this client created or resumed whose sandbox is not removed yet (a given sandbox
        counts until the session is deleted)."""
        return list(self._live.values())

    # -- the SDK's interface ----------------------------------------------------------------------

    async def create(self, *, snapshot: SnapshotSpec | SnapshotBase | None = None,
                     manifest: Manifest | None = None,
                     options: DesktopSandboxClientOptions | None = None) -> SandboxSession:
        """A session in a new sandbox (or the given one). Starting a sandbox takes seconds (the guest's
        readiness); raises WorkspaceStartError when it cannot start (the reason escaped), GuestPathError
        or ConfigurationError for a manifest it cannot honour."""
        options = options if options is not None else DesktopSandboxClientOptions()
        if not isinstance(options, DesktopSandboxClientOptions):
            raise TypeError(f"DesktopSandboxClient expects DesktopSandboxClientOptions, not {type(options).__name__}")
        manifest = manifest if manifest is not None else Manifest()
        self._validate_manifest_for_create(manifest)
        expected_home = str(self._given.guest_home or GUEST_HOME) if self._given is not None else GUEST_HOME
        self._confine_manifest(manifest, expected_home)  # refused before any sandbox starts
        sandbox, owned = await self._sandbox_for(options)
        try:
            home = str(sandbox.guest_home or GUEST_HOME)
            manifest = self._confine_manifest(manifest, home)
            session_id = uuid.uuid4()
            state = DesktopSandboxSessionState(
                session_id=session_id, manifest=manifest, snapshot=resolve_snapshot(snapshot, str(session_id)),
                sandbox_id=sandbox.id, backend=self._backend, owned=owned, guest_home=home, options=options)
            return self._session(state, sandbox)
        except BaseException:
            if owned:
                await _close_quietly(sandbox)
            raise

    async def delete(self, session: SandboxSession) -> SandboxSession:
        """Release ``session``'s resources: remove its sandbox when it owns one (idempotent)."""
        inner = session._inner
        if not isinstance(inner, DesktopSandboxSession):
            raise TypeError("DesktopSandboxClient.delete expects a DesktopSandboxSession")
        try:
            await inner.shutdown()
        finally:
            if inner.owned:
                await inner._remove_sandbox()
            self._live.pop(inner.state.session_id, None)
        return session

    async def resume(self, state: SandboxSessionState) -> SandboxSession:
        """A session for ``state``: in its sandbox when this client still has it (its given sandbox, or
        one of its live sessions' own), else in a new sandbox whose workspace the SDK restores from the
        state's snapshot."""
        if not isinstance(state, DesktopSandboxSessionState):
            raise TypeError("DesktopSandboxClient.resume expects a DesktopSandboxSessionState")
        state.assert_path_grants_rebound()
        sandbox: Sandbox | None = None
        if self._given is not None and state.sandbox_id == self._given.id:
            sandbox, state.owned = self._given, False
        else:
            for live in self._live.values():
                if live.sandbox is not None and live.sandbox.id == state.sandbox_id:
                    sandbox = live.sandbox
                    break
        reused = sandbox is not None
        if sandbox is None:
            sandbox, owned = await self._sandbox_for(state.options)
            state.sandbox_id, state.owned, state.workspace_root_ready = sandbox.id, owned, False
            state.guest_home = str(sandbox.guest_home or GUEST_HOME)
        try:
            state.manifest = self._confine_manifest(state.manifest, state.guest_home)
            session = self._session(state, sandbox)
        except BaseException:
            if not reused and state.owned:
                await _close_quietly(sandbox)
            raise
        session._inner._set_start_state_preserved(reused)  # type: ignore[attr-defined]
        return session

    def deserialize_session_state(self, payload: dict[str, object]) -> SandboxSessionState:
        """The session state ``serialize_session_state`` made (a JSON-able mapping)."""
        return self._deserialize_session_state_payload(payload, DesktopSandboxSessionState)

    # -- inside -----------------------------------------------------------------------------------

    def _session(self, state: DesktopSandboxSessionState, sandbox: Sandbox) -> SandboxSession:
        inner = DesktopSandboxSession(state=state, sandbox=sandbox, on_removed=self._forget)
        self._live[state.session_id] = inner
        return self._wrap_session(inner, instrumentation=self._instrumentation)

    def _forget(self, inner: DesktopSandboxSession) -> None:
        self._live.pop(inner.state.session_id, None)

    async def _sandbox_for(self, options: DesktopSandboxClientOptions) -> tuple[Sandbox, bool]:
        if self._given is not None:
            return self._given, False
        return await _start_sandbox(self._backend, options), True

    @staticmethod
    def _confine_manifest(manifest: Manifest, home: str) -> Manifest:
        base = PurePosixPath(home)
        root = manifest.root
        if root == DEFAULT_WORKSPACE_ROOT:
            manifest = manifest.model_copy(update={"root": home}, deep=True)
        elif not _under(PurePosixPath(_lexical(root)), base):
            raise GuestPathError(root, home)
        for grant in manifest.extra_path_grants:
            if grant.host_path is not None:
                raise ConfigurationError(
                    message="a path grant with host_path has no meaning in a desktop sandbox guest",
                    error_code=ErrorCode.SANDBOX_CONFIG_INVALID, op="start", context={"path": grant.path})
            if not _under(PurePosixPath(_lexical(grant.path)), base):
                raise GuestPathError(grant.path, home)
        return manifest


def _read_capped(stream: Any, limit: int) -> bytes:
    """At most ``limit`` bytes of the binary ``stream`` (short reads continued until EOF)."""
    out = bytearray()
    while len(out) < limit:
        chunk = stream.read(min(limit - len(out), MIB))
        if not chunk:
            break
        out += chunk
    return bytes(out)


def _lexical(path: str) -> str:
    """``path`` with ``.`` and ``..`` resolved as written (no symlinks); relative paths stay relative."""
    parts: list[str] = []
    for part in PurePosixPath(path).parts:
        if part == "..":
            if len(parts) > 1:
                parts.pop()
        elif part != ".":
            parts.append(part)
    return str(PurePosixPath(*parts)) if parts else "."


async def _start_sandbox(backend: str, options: DesktopSandboxClientOptions) -> Sandbox:
    """Start a sandbox of ``backend`` for ``options`` on a worker thread. Cancelled meanwhile, the start
    goes on and the sandbox it makes is removed. Raises WorkspaceStartError (reason escaped)."""
    from controller.sandbox.registry import get_backend

    cls = get_backend(backend)
    backend_options = cls.make_options(image=options.image)
    if options.labels and hasattr(backend_options, "extra_labels"):
        backend_options.extra_labels = {**backend_options.extra_labels, **options.labels}
    spec = options.sandbox_spec()
    loop = asyncio.get_running_loop()
    future = loop.run_in_executor(None, lambda: cls.start(spec, backend_options))
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        def close_when_started(done: "asyncio.Future[Sandbox]") -> None:
            if not done.cancelled() and done.exception() is None:
                loop.run_in_executor(None, done.result().close)

        future.add_done_callback(close_when_started)
        raise
    except GuestSandboxError as exc:
        raise WorkspaceStartError(path=Path(GUEST_HOME),
                                  message=f"the {backend} sandbox did not start: {clean(exc, 400)}") from None


async def _close_quietly(sandbox: Sandbox) -> None:
    try:
        await asyncio.shield(asyncio.get_running_loop().run_in_executor(None, sandbox.close))
    except Exception:  # noqa: BLE001 - cleanup after another error
        pass
