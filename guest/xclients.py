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
* **handled**: the process of the client the keys go to sleeps (``/proc/PID/stat`` state ``S``): Xlib
  and the toolkits on it block for input only once every event they have read was handled. That client
  owns the focus window, or, when the keys follow the pointer (focus PointerRoot or the root window),
  the deepest window under the pointer; the X-Resource extension (``XResQueryClientIds``) names its
  process id. Other clients may stay busy: a window manager grabbing its keys anew after a keymap
  change gets none of the typed keys.

It stays a judgement from outside: a client that handles X events on a thread other than its main one,
or whose X connection was made by a process that has since exited, is judged by a process that is not
the one at work. :func:`clients_idle` looks once; :func:`wait_until_idle` polls until it holds, up to a
deadline. This process's own connections never count (it reads its events when it wants, or never).
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


def key_client_pid(dpy: "Display") -> int | None:
    """Process id of the client the keyboard's events go to now (module doc): the owner of the focus
    window, or of the deepest window under the pointer when the focus is PointerRoot or the root; None
    when that is no client's (the root, no focus) or this process. Raises Unknowable when the server has
    no X-Resource extension."""
    if not dpy.has_extension("X-Resource"):
        raise Unknowable("the X server has no X-Resource extension")
    from Xlib.ext import res

    root = dpy.screen().root
    target = dpy.get_input_focus().focus
    if isinstance(target, int):  # None (0): the keys go nowhere; PointerRoot (1): under the pointer
        if target != 1:
            return None
        target = root
    if target.id == root.id:
        for _ in range(64):  # a window tree is never this deep; a bound on a hostile one
            child = target.query_pointer().child
            if not child:
                break
            target = child
        if target.id == root.id:
            return None
    reply = dpy.res_query_client_ids([{"client": target.id, "mask": res.LocalClientPIDMask}])
    pids = [item.value[0] for item in reply.ids if item.value and item.spec.client != 0]
    return pids[0] if pids and pids[0] != os.getpid() else None


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


def clients_idle(dpy: "Display") -> bool:
    """Whether every local client of ``dpy``'s X server but this process has read all the server sent it
    and the client the keys go to sleeps (module doc). Raises Unknowable."""
    if unread_bytes(socket_path(dpy.get_display_name())):
        return False
    pid = key_client_pid(dpy)
    return pid is None or process_state(pid) in IDLE_STATES


def wait_until_idle(dpy: "Display", deadline: float) -> bool:
    """Wait until :func:`clients_idle` holds, or until ``deadline`` (``time.monotonic()`` seconds): True
    once it holds, False at the deadline. Raises Unknowable (a display that is not local included)."""
    try:
        socket_path(dpy.get_display_name())
    except ValueError as exc:
        raise Unknowable(str(exc)) from exc
    while True:
        if clients_idle(dpy):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(POLL_S)  # the interval between two looks at the condition, not a wait for time


__all__ = ["DiagUnavailable", "Unknowable", "clients_idle", "key_client_pid", "own_socket_inodes",
           "process_state", "socket_path", "unread_bytes", "wait_until_idle"]
