"""Command line: ``python -m guest serve ...`` (the agent) and ``python -m guest probe ...``.

serve: ``--display :99 --bind 127.0.0.1:8000 --token-file PATH`` [``--files-root DIR`` (repeatable,
default the user's home)] [``--max-file-bytes N`` (default 16 MiB)] [``--apps FILE`` (JSON
``{name: [argv...]}``)] [``--busy-timeout S``] [``--wait-cap S``] [``--request-timeout S``].

probe: ``--log FILE`` [``--display :99``] [``--pattern``] [``--animate S``]: the event-logging probe window (:mod:`guest.probe`).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys


def _serve(ns: argparse.Namespace) -> int:
    import uvicorn

    from .app import AgentConfig, create_app
    from .files import DEFAULT_MAX_BYTES
    from .launch import load_allowlist

    token = open(ns.token_file, encoding="utf-8").read().strip()
    if not token:
        print(f"token file {ns.token_file} is empty", file=sys.stderr)
        return 2
    host, sep, port = ns.bind.rpartition(":")
    if not sep or not port.isdigit():
        print(f"--bind must be HOST:PORT, not {ns.bind!r}", file=sys.stderr)
        return 2
    config = AgentConfig(
        display=ns.display,
        token=token,
        files_roots=ns.files_root or [os.path.expanduser("~")],
        max_file_bytes=ns.max_file_bytes if ns.max_file_bytes is not None else DEFAULT_MAX_BYTES,
        apps=load_allowlist(ns.apps),
        busy_timeout=ns.busy_timeout,
        wait_cap=ns.wait_cap,
        request_timeout=ns.request_timeout,
    )
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    app = create_app(config)
    uvicorn.run(app, host=host.strip("[]"), port=int(port), log_level="warning", access_log=False)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` and run the chosen command; returns the exit status."""
    from .actions import BUSY_TIMEOUT_S, REQUEST_TIMEOUT_S, WAIT_CAP_S

    parser = argparse.ArgumentParser(prog="python -m guest")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the agent HTTP API")
    serve.add_argument("--display", default=os.environ.get("DISPLAY", ":99"))
    serve.add_argument("--bind", default="127.0.0.1:8000", help="HOST:PORT")
    serve.add_argument("--token-file", required=True)
    serve.add_argument("--files-root", action="append", help="directory /v1/files may read (repeatable)")
    serve.add_argument("--max-file-bytes", type=int, default=None)
    serve.add_argument("--apps", help="JSON file: allowlisted app name -> argv list")
    serve.add_argument("--busy-timeout", type=float, default=BUSY_TIMEOUT_S,
                       help="seconds a request waits for the input lock before 409 busy")
    serve.add_argument("--wait-cap", type=float, default=WAIT_CAP_S, help="longest 'wait' action, seconds")
    serve.add_argument("--request-timeout", type=float, default=REQUEST_TIMEOUT_S,
                       help="longest time one /v1/actions request may hold the input, seconds")
    probe = sub.add_parser("probe", help="open the event-logging probe window")
    probe.add_argument("--display", default=os.environ.get("DISPLAY", ":99"))
    probe.add_argument("--log", required=True, help="JSONL file the events are appended to")
    probe.add_argument("--pattern", action="store_true", help="paint rectangles of known colours")
    probe.add_argument("--animate", type=float, default=0.0, help="change colour for this many seconds")
    ns = parser.parse_args(argv)
    if ns.command == "serve":
        return _serve(ns)
    from .probe import run_probe

    return run_probe(ns.display, ns.log, pattern=ns.pattern, animate=ns.animate)


if __name__ == "__main__":
    sys.exit(main())
