"""Command line: ``python -m guest serve ...`` (the agent) and ``python -m guest probe ...``.

serve: ``--display :99 --bind 127.0.0.1:8000 --token-file PATH`` [``--files-root DIR`` (repeatable,
default the user's home)] [``--max-file-bytes N`` (default 16 MiB)] [``--apps FILE`` (JSON
``{name: [argv...]}``)] [``--busy-timeout S``] [``--wait-cap S``] [``--wait-quiet S``] [``--request-timeout S``]
[``--log-level LEVEL``] [``--no-access-log``]; startup checks and logging: :mod:`guest.serve`.

probe: ``--log FILE`` [``--display :99``] [``--pattern``] [``--animate S``]: the event-logging probe window (:mod:`guest.probe`).
"""

from __future__ import annotations

import argparse
import os
import sys


class _Help(argparse.ArgumentDefaultsHelpFormatter):
    """Shows ``(default: ...)`` for options that have a real default."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None or action.nargs == 0 or action.required:
            return action.help
        return super()._get_help_string(action)


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` and run the chosen command; returns the exit status."""
    from .actions import BUSY_TIMEOUT_S, REQUEST_TIMEOUT_S, WAIT_CAP_S, WAIT_QUIET_S
    from .files import DEFAULT_MAX_BYTES
    from .serve import LOG_LEVELS

    parser = argparse.ArgumentParser(prog="python -m guest")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the agent HTTP API", formatter_class=_Help,
                           description="Run the guest agent's HTTP API (contract 1 in docs/ARCHITECTURE.md).")
    serve.add_argument("--display", default=os.environ.get("DISPLAY", ":99"), metavar=":N",
                       help="X display to drive; $DISPLAY when set, else :99")
    serve.add_argument("--bind", default="127.0.0.1:8000", metavar="HOST:PORT", help="address to listen on ([::1]:PORT for IPv6; port 0: any free port)")
    serve.add_argument("--token-file", required=True, metavar="PATH",
                       help="file holding the bearer token (keep it readable by the agent's user only)")
    serve.add_argument("--files-root", action="append", metavar="DIR",
                       help="directory GET /v1/files may read, repeatable (default: the user's home)")
    serve.add_argument("--max-file-bytes", type=int, default=DEFAULT_MAX_BYTES, metavar="N",
                       help="largest file GET /v1/files returns, bytes")
    serve.add_argument("--apps", metavar="FILE", help="JSON file: allowlisted app name -> argv list (default: none)")
    serve.add_argument("--busy-timeout", type=float, default=BUSY_TIMEOUT_S, metavar="S",
                       help="seconds a request waits for the input lock before 409 busy")
    serve.add_argument("--wait-cap", type=float, default=WAIT_CAP_S, metavar="S", help="longest 'wait' action, seconds")
    serve.add_argument("--wait-quiet", type=float, default=WAIT_QUIET_S, metavar="S",
                       help="a 'wait' settles once the X server reported no drawing for this long, seconds")
    serve.add_argument("--request-timeout", type=float, default=REQUEST_TIMEOUT_S, metavar="S",
                       help="longest time one /v1/actions request may hold the input, seconds")
    serve.add_argument("--log-level", choices=LOG_LEVELS, default="info",
                       help="stderr log level; info logs the start line and one line per request")
    serve.add_argument("--no-access-log", dest="access_log", action="store_false",
                       help="do not log a line per request")
    probe = sub.add_parser("probe", help="open the event-logging probe window")
    probe.add_argument("--display", default=os.environ.get("DISPLAY", ":99"))
    probe.add_argument("--log", required=True, help="JSONL file the events are appended to")
    probe.add_argument("--pattern", action="store_true", help="paint rectangles of known colours")
    probe.add_argument("--animate", type=float, default=0.0, help="change colour for this many seconds")
    ns = parser.parse_args(argv)
    if ns.command == "serve":
        from .serve import serve as run_serve

        return run_serve(ns)
    from .probe import run_probe

    return run_probe(ns.display, ns.log, pattern=ns.pattern, animate=ns.animate)


if __name__ == "__main__":
    sys.exit(main())
