"""Whether the X server's clients have taken in the key events sent so far: read them, and handled them.

An X client translates a key event's keycode with the keymap it holds when it looks the event up, and
Xlib refreshes that keymap as soon as it *reads* a keymap change (``MappingNotify``), whether or not
it has looked up the key events read before it. So a keycode may be bound to another keysym only once
the client that got the key events has handled them: a client that lags (a busy or emulated guest, a
stopped process) would otherwise look its earlier presses up in the new keymap and see other
characters (:mod:`guest.keyboard`). Two things the kernel can tell together say so, with no help from
the client:

* **read**: nothing waits in the receive queue of any client's end of its Unix socket. The kernel
  reports those queues for every Unix socket of the network namespace through ``sock_diag`` (netlink,
  ``NETLINK_SOCK_DIAG``, ``<linux/unix_diag.h>``), with no privilege: the X server's accepted sockets
  carry its listening path as their name and the client's socket as their peer. Which socket is whose
  cannot be told (another user's ``/proc/PID/fd`` is closed), so this holds for every client;
* **handled**: the processes of the clients the keys may go to sleep (``/proc/PID/stat`` state ``S``),
  and go on sleeping, not scheduled at all (``/proc/PID/schedstat`` unchanged), for :data:`QUIET_S`:
  Xlib and the toolkits on it block for input once every event they have read was handled, and a
  client caught asleep in the middle of that work (on a round trip to the server) runs again soon. Those
  clients own the windows from the deepest one under the pointer up to the focus window (or the focus
  window alone when the pointer is elsewhere): the path a key event takes; the X-Resource extension
  (``XResQueryClientIds``) names their process ids. Other clients may stay busy: a window manager
  grabbing its keys anew after a keymap change gets none of the typed keys.

It stays a judgement from outside: a client that sleeps while it still has key events to handle (a
blocking call per key), handles X events on a thread other than its main one, or whose X connection was
made by a process that has since exited, is judged idle too early; a client that never reads its
socket (stopped, or a script holding an idle connection) would be waited for in vain, so a caller
passes those found at one wait's deadline as ``ignore`` to the next. :func:`clients_idle` looks once;
:func:`wait_until_idle` polls until it holds, up to a deadline. This process's own connections never count (it reads its events when it wants, or never).
Where the kernel or the server cannot tell (no ``sock_diag``, no X-Resource, processes hidden by
``hidepid``), :class:`Unknowable` is raised and the caller falls back to a rule of its own.
"""

from __future__ import annotations

import os
import re
import socket
import struct
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from Xlib.display import Display

NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
NLM_F_REQUEST, NLM_F_DUMP = 0x1, 0x300
NLMSG_ERROR, NLMSG_DONE = 2, 3
UDIAG_SHOW_NAME, UDIAG_SHOW_PEER, UDIAG_SHOW_RQLEN = 0x01, 0x04, 0x10
UNIX_DIAG_NAME, UNIX_DIAG_PEER, UNIX_DIAG_RQLEN = 0, 2, 4
TCP_ESTABLISHED = 1
_NLMSGHDR = struct.Struct("=IHHII")
_UNIX_DIAG_REQ = struct.Struct("=BBHIIIII")
_UNIX_DIAG_MSG = struct.Struct("=BBBBIII")
_RTATTR = struct.Struct("=HH")

X_SOCKET_DIR = "/tmp/.X11-unix"
POLL_S = 0.005
"""Seconds between two looks while waiting (each look is one netlink dump, well under a millisecond)."""

MAX_REPLY_BYTES = 8 * 1024 * 1024
"""Most bytes of dump replies read for one look: a namespace with a hundred thousand sockets or more is
cut off there (:class:`DiagUnavailable`: the caller's fallback rule applies)."""

_DISPLAY = re.compile(r"^(?:unix/?)?:(\d+)(?:\.\d+)?$")


class Unknowable(OSError):
    """What clients have read or handled cannot be known here (no ``sock_diag``, no X-Resource
    extension, another client's process not visible)."""


class DiagUnavailable(Unknowable):
    """The kernel did not answer the socket-diagnostics request (no ``sock_diag``, or refused)."""


def socket_path(display: str) -> str:
    """The Unix socket path of a local X display (``":99"``, ``"unix:99"``, ``"unix/:99.0"`` ->
    ``/tmp/.X11-unix/X99``); ValueError for a display that is not local (``host:0``)."""
    m = _DISPLAY.match(display)
    if m is None:
        raise ValueError(f"not a local X display: {display!r}")
    return f"{X_SOCKET_DIR}/X{m.group(1)}"


def _unix_sockets() -> list[tuple[int, int, str | None, int | None, int | None]]:
    """Every Unix socket of this network namespace: ``(inode, state, name, peer inode, unread bytes)``
    (name: the bound path, an abstract one with a leading ``@``). Raises DiagUnavailable."""
    try:
        sock = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_SOCK_DIAG)
    except OSError as exc:
        raise DiagUnavailable(f"no socket diagnostics: {exc}") from exc
    with sock:
        sock.settimeout(1.0)
        req = _UNIX_DIAG_REQ.pack(socket.AF_UNIX, 0, 0, 0xFFFFFFFF, 0,
                                  UDIAG_SHOW_NAME | UDIAG_SHOW_PEER | UDIAG_SHOW_RQLEN, 0xFFFFFFFF, 0xFFFFFFFF)
        sock.send(_NLMSGHDR.pack(_NLMSGHDR.size + len(req), SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST | NLM_F_DUMP, 1, 0)
                  + req)
        found: list[tuple[int, int, str | None, int | None, int | None]] = []
        received = 0
        while True:
            try:
                data = sock.recv(65536)
            except OSError as exc:
                raise DiagUnavailable(f"socket diagnostics did not answer: {exc}") from exc
            received += len(data)
            if not data or received > MAX_REPLY_BYTES:
                raise DiagUnavailable("socket diagnostics answered too much or nothing")
            offset = 0
            while offset + _NLMSGHDR.size <= len(data):
                length, kind, _, _, _ = _NLMSGHDR.unpack_from(data, offset)
                if length < _NLMSGHDR.size or offset + length > len(data):
                    raise DiagUnavailable("malformed socket diagnostics reply")
                if kind == NLMSG_DONE:
                    return found
                if kind == NLMSG_ERROR:
                    (errno,) = struct.unpack_from("=i", data, offset + _NLMSGHDR.size)
                    raise DiagUnavailable(f"socket diagnostics refused: {os.strerror(-errno)}")
                if kind == SOCK_DIAG_BY_FAMILY:
                    found.append(_parse(data[offset + _NLMSGHDR.size:offset + length]))
                offset += (length + 3) & ~3


def _parse(msg: bytes) -> tuple[int, int, str | None, int | None, int | None]:
    _, _, state, _, inode, _, _ = _UNIX_DIAG_MSG.unpack_from(msg)
    name = peer = unread = None
    offset = _UNIX_DIAG_MSG.size
    while offset + _RTATTR.size <= len(msg):
        length, kind = _RTATTR.unpack_from(msg, offset)
        if length < _RTATTR.size:
            break
        value = msg[offset + _RTATTR.size:offset + length]
        if kind == UNIX_DIAG_NAME:
            name = "@" + value[1:].decode("utf-8", "replace") if value[:1] == b"\0" \
                else value.split(b"\0", 1)[0].decode("utf-8", "replace")
        elif kind == UNIX_DIAG_PEER and len(value) >= 4:
            (peer,) = struct.unpack_from("=I", value)
        elif kind == UNIX_DIAG_RQLEN and len(value) >= 8:
            unread, _ = struct.unpack_from("=II", value)
        offset += (length + 3) & ~3
    return inode, state, name, peer, unread


def own_socket_inodes() -> set[int]:
    """Inodes of the sockets this process holds open (from ``/proc/self/fd``)."""
    found: set[int] = set()
    try:
        fds = os.listdir("/proc/self/fd")
    except OSError:
        return found
    for fd in fds:
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            found.add(int(target[8:-1]))
    return found


def unread_bytes(path: str) -> dict[int, int]:
    """``{client socket inode: bytes not yet read}`` for every client connected to the Unix socket server
    listening at ``path`` (its abstract twin ``@path`` too), except this process's own connections;
    clients with nothing unread are left out. Raises DiagUnavailable when the kernel cannot tell."""
    sockets = _unix_sockets()
    names = {path, "@" + path}
    clients = {peer for _, state, name, peer, _ in sockets
               if name in names and state == TCP_ESTABLISHED and peer}
    clients -= own_socket_inodes()
    return {inode: unread for inode, _, _, _, unread in sockets if inode in clients and unread}


MAX_TREE_DEPTH = 64
"""Deepest window under the pointer looked for: real trees are a few levels deep; a bound on a hostile one."""


def key_client_pids(dpy: "Display") -> set[int]:
    """Process ids of the clients whose windows a key event may be delivered to now (module doc), this
    process's left out: the owners of every window from the deepest one under the pointer up to the
    focus window when the pointer is inside it (the focus PointerRoot or the root: up to the root's
    child), else of the focus window; empty when the keys go nowhere or to the root alone. Every window
    of that path counts, since which of them selected key events (the core mask or XInput 2) is not
    told apart: a window of another client laid over the target cannot hide the target's lag. Raises
    Unknowable when the server has no X-Resource extension, ``Xlib.error.XError`` when a window of the
    path went away meanwhile (look again)."""
    if not dpy.has_extension("X-Resource"):
        raise Unknowable("the X server has no X-Resource extension")
    from Xlib.ext import res

    root = dpy.screen().root
    focus = dpy.get_input_focus().focus
    if isinstance(focus, int):  # None (0): the keys go nowhere; PointerRoot (1): as the root
        if focus != 1:
            return set()
        focus = root
    chain = [root]
    for _ in range(MAX_TREE_DEPTH):
        child = chain[-1].query_pointer().child
        if not child:
            break
        chain.append(child)
    ids = [w.id for w in chain]
    path = chain[ids.index(focus.id):] if focus.id in ids else [focus]
    path = [w for w in path if w.id != root.id]
    if not path:
        return set()
    reply = dpy.res_query_client_ids([{"client": w.id, "mask": res.LocalClientPIDMask} for w in path])
    # client 0 is the X server itself (it owns the root window)
    pids = {item.value[0] for item in reply.ids if item.value and item.spec.client != 0}
    pids.discard(os.getpid())
    return pids


def process_state(pid: int) -> str:
    """The scheduler state letter of process ``pid`` (``R``, ``S``, ``D``, ``T``, ``Z`` ...; ``X`` when
    it is gone). Raises Unknowable when its ``/proc`` entry exists but cannot be read (``hidepid``)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read(4096)
    except FileNotFoundError:
        return "X"
    except OSError as exc:
        raise Unknowable(f"process {pid} is not visible: {exc}") from exc
    return stat[stat.rfind(b")") + 2:][:1].decode("ascii", "replace")


IDLE_STATES = frozenset("SXZ")
"""States of a client process that has handled what it read: asleep (waiting for input), or gone."""


def process_runs(pid: int) -> tuple[int, ...] | None:
    """How much process ``pid`` has run so far: ``/proc/PID/schedstat`` (nanoseconds on a CPU, time
    slices), which changes whenever it is scheduled at all; None where the kernel does not keep it or the
    process is gone."""
    try:
        with open(f"/proc/{pid}/schedstat", "rb") as fh:
            return tuple(int(f) for f in fh.read(256).split())
    except (OSError, ValueError):
        return None


QUIET_S = 0.025
"""How long the clients the keys may go to must be seen asleep, their sockets read and they not run at all
in between (:func:`wait_until_idle`): one look can catch a client in the middle of its work, asleep on a
round trip to the server or a short sleep."""


def _look(dpy: "Display", path: str, ignore: dict[int, int]) -> dict[int, tuple[int, ...] | None] | None:
    """One look: None when some client has unread bytes (beyond ``ignore``), a client the keys may go to
    is not asleep, or a window went away meanwhile; else ``{pid: process_runs(pid)}`` of those clients."""
    unread = unread_bytes(path)
    if any(n < ignore.get(inode, n + 1) for inode, n in unread.items()):
        return None
    from Xlib.error import XError

    try:
        pids = key_client_pids(dpy)
    except XError:
        return None
    if not all(process_state(pid) in IDLE_STATES for pid in pids):
        return None
    return {pid: process_runs(pid) for pid in pids}


def clients_idle(dpy: "Display", ignore: dict[int, int] | None = None) -> bool:
    """One look (:func:`wait_until_idle` looks until it holds for :data:`QUIET_S`): whether every local
    client of ``dpy``'s X server but this process has read all the server sent it and the clients the
    keys may go to sleep (module doc). ``ignore``: ``{socket inode: unread bytes}`` of clients found not
    reading before, which do not count while they still have at least that much unread (they read
    nothing since). False, to look again, when a window went away during the look. Raises Unknowable."""
    return _look(dpy, socket_path(dpy.get_display_name()), ignore or {}) is not None


def wait_until_idle(dpy: "Display", deadline: float, ignore: dict[int, int] | None = None) -> dict[int, int] | None:
    """Wait until :func:`clients_idle` holds (with ``ignore``) on looks :data:`QUIET_S` apart with none
    of the clients the keys may go to run in between, or until ``deadline`` (``time.monotonic()``
    seconds). None once it holds; at the deadline, ``{socket inode: unread bytes}`` of the clients that
    had not read everything then (callers pass them as ``ignore`` later: one that never reads costs one
    wait, not every one). Raises Unknowable (a display that is not local included)."""
    try:
        path = socket_path(dpy.get_display_name())
    except ValueError as exc:
        raise Unknowable(str(exc)) from exc
    ignore = ignore or {}
    since: tuple[float, dict[int, tuple[int, ...] | None]] | None = None
    while True:
        seen = _look(dpy, path, ignore)
        now = time.monotonic()
        if seen is None or since is None or seen != since[1]:
            since = None if seen is None else (now, seen)
        elif now - since[0] >= QUIET_S:
            return None
        if now >= deadline:
            return unread_bytes(path)
        time.sleep(POLL_S)  # the interval between two looks at the condition, not a wait for time


__all__ = ["DiagUnavailable", "Unknowable", "clients_idle", "key_client_pids", "own_socket_inodes",
           "process_runs", "process_state", "socket_path", "unread_bytes", "wait_until_idle"]
