"""Start the X server for the session: Xvfb on $DISPLAY at $SCREEN_WIDTHx$SCREEN_HEIGHTx$SCREEN_DEPTH.

Run by supervisord (program ``xvfb``) as the desktop user. Before exec'ing Xvfb it removes a stale
``/tmp/.X<n>-lock`` (and the matching ``/tmp/.X11-unix/X<n>`` socket), but only when the pid written in
the lock is no longer alive: a live server keeps its lock and Xvfb then refuses to start, which
supervisord reports. Clients wait for the display with ``await.py --display``.

Environment: ``DISPLAY`` (default ``:99``), ``SCREEN_WIDTH``/``SCREEN_HEIGHT`` (screen px, default
1280x800), ``SCREEN_DEPTH`` (bits, default 24), ``XSERVER_AUTH``: an X authority file (images/session/
xauth.py) passed as ``-auth``, so only clients holding its cookie connect (unset: no authorization).
"""

from __future__ import annotations

import errno
import os
import sys


def display_number(display: str) -> int:
    """``":99"`` or ``":99.0"`` -> 99. Raises ValueError for anything else (remote displays included)."""
    if not display.startswith(":"):
        raise ValueError(f"not a local display: {display!r}")
    return int(display[1:].split(".", 1)[0])


def pid_alive(pid: int) -> bool:
    """True when a process with ``pid`` exists (signal 0; EPERM still means it exists)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except OSError as exc:
        return exc.errno == errno.EPERM
    return True


def remove_stale_lock(number: int, tmp: str = "/tmp") -> bool:
    """Remove the X lock and socket of display ``number`` when the lock's pid is dead.

    Returns True when a stale lock was removed, False when there was none or its server is alive.
    An unreadable lock (empty, garbage) counts as stale: Xvfb writes the pid before it listens.
    """
    lock = os.path.join(tmp, f".X{number}-lock")
    try:
        with open(lock, encoding="ascii", errors="replace") as fh:
            text = fh.read().strip()
    except FileNotFoundError:
        return False
    try:
        pid = int(text)
    except ValueError:
        pid = -1
    if pid_alive(pid):
        return False
    for path in (lock, os.path.join(tmp, ".X11-unix", f"X{number}")):
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
    print(f"xserver: removed stale lock of display :{number} (pid {text or '?'} is gone)", flush=True)
    return True


def main() -> None:
    display = os.environ.get("DISPLAY", ":99")
    number = display_number(display)
    width = int(os.environ.get("SCREEN_WIDTH", "1280"))
    height = int(os.environ.get("SCREEN_HEIGHT", "800"))
    depth = int(os.environ.get("SCREEN_DEPTH", "24"))
    remove_stale_lock(number)
    # As a non-root user Xvfb does not create the socket directory itself (it then listens on the
    # abstract socket only); create it sticky and world-writable as the X server would.
    sock_dir = "/tmp/.X11-unix"
    try:
        os.mkdir(sock_dir, 0o1777)
        os.chmod(sock_dir, 0o1777)
    except FileExistsError:
        pass
    argv = [
        "Xvfb", f":{number}",
        "-screen", "0", f"{width}x{height}x{depth}",
        "-nolisten", "tcp",
        "-dpi", "96",
        "+extension", "XTEST",
        "-noreset",
    ]
    auth = os.environ.get("XSERVER_AUTH")
    if auth:
        argv += ["-auth", auth]
    print("xserver: exec " + " ".join(argv), flush=True)
    sys.stdout.flush()
    os.execvp(argv[0], argv)


if __name__ == "__main__":
    main()
