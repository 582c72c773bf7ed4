"""Wait for a session's prerequisites, then exec a command: ``await.py [--display] [--file PATH]... -- CMD...``.

Used by supervisord so that X clients start only once the display accepts clients (an X connection
setup completes, via python-xlib) and the agent only once its token file exists. Polls every 50 ms up to
``--timeout`` seconds (default 60); on timeout exits 1 so supervisord retries. Startup only: nothing in
the action path waits here.
"""

from __future__ import annotations

import argparse
import os
import sys
import time


def display_ready(display: str) -> bool:
    """True when an X connection to ``display`` can be set up (the server accepts clients)."""
    try:
        from Xlib import display as xdisplay
        from Xlib.error import DisplayError
    except ImportError:  # python-xlib missing: fall back to the socket's existence
        number = display.lstrip(":").split(".", 1)[0]
        return os.path.exists(f"/tmp/.X11-unix/X{number}")
    try:
        conn = xdisplay.Display(display)
    except (DisplayError, OSError, ConnectionError):
        return False
    conn.close()
    return True


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--display", action="store_true", help="wait for $DISPLAY to accept clients")
    parser.add_argument("--file", action="append", default=[], help="wait until this file exists")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command after --")
    display = os.environ.get("DISPLAY", ":99")
    deadline = time.monotonic() + args.timeout
    pending = ["display"] if args.display else []
    pending += args.file
    while pending:
        pending = [p for p in pending if not (display_ready(display) if p == "display" else os.path.exists(p))]
        if not pending:
            break
        if time.monotonic() > deadline:
            print(f"await: timed out waiting for {', '.join(pending)}", file=sys.stderr, flush=True)
            sys.exit(1)
        time.sleep(0.05)
    sys.stdout.flush()
    os.execvp(command[0], command)


if __name__ == "__main__":
    main()
