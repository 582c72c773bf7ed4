"""The launch broker: ``launcher.py --socket PATH --client USER --user USER --apps FILE``.

Run by supervisord (program ``launcher``) as root, holding only the container's CAP_SETUID,
CAP_SETGID and CAP_KILL. Starts allowlisted apps as the desktop user on behalf of the agent, which
runs as a user of its own (``guest.launch.serve_broker``). Exits 2 on a bad option or allowlist,
1 when the socket cannot be bound (supervisord then retries).
"""

from __future__ import annotations

import argparse
import sys

from guest.launch import serve_broker


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--socket", required=True, help="Unix socket path (its directory closed to --user)")
    parser.add_argument("--client", required=True, help="the only user whose processes may connect")
    parser.add_argument("--user", required=True, help="the user every app runs as (never root)")
    parser.add_argument("--apps", required=True, help="the agent's JSON allowlist file")
    parser.add_argument("--channel-user", default=None,
                        help="the user the allowlist's channel apps (the agent's chromium) run as")
    args = parser.parse_args(argv)
    try:
        serve_broker(args.socket, args.client, args.user, args.apps, args.channel_user)
    except (KeyError, ValueError) as exc:
        print(f"launcher: {exc}", file=sys.stderr, flush=True)
        return 2
    except OSError as exc:
        print(f"launcher: cannot serve on {args.socket}: {exc.strerror or exc}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
