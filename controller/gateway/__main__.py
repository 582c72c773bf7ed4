"""``python -m controller.gateway serve --policy FILE --log FILE --listen 0.0.0.0:3128``.

``--decision-log`` is an alias of ``--log``; ``--port N`` is short for ``--listen 0.0.0.0:N``.

Runs mitmproxy (regular proxy mode, lazy upstream connections, no TLS interception) with the
:class:`~controller.gateway.addon.EgressPolicy` addon. ``--policy`` takes a task or policy TOML file, or a
``.json`` file holding the ``[network]`` table as JSON; ``--policy-json`` takes that JSON inline. Prints
``gateway listening on HOST:PORT`` to stderr once the proxy accepts connections. Exits 2 on a bad policy.
"""

from __future__ import annotations

import argparse
import sys

from controller.gateway.serve import load_policy, parse_listen, serve


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the process exit status."""
    parser = argparse.ArgumentParser(prog="python -m controller.gateway")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("serve", help="run the egress policy proxy")
    source = run.add_mutually_exclusive_group()
    source.add_argument("--policy", help="task or policy file (TOML, or JSON with a .json suffix)")
    source.add_argument("--policy-json", help="the [network] table as inline JSON")
    run.add_argument("--log", "--decision-log", dest="log", help="decision log (JSONL), appended to")
    run.add_argument("--listen", default="0.0.0.0:3128", help="HOST:PORT to listen on (default 0.0.0.0:3128)")
    run.add_argument("--port", type=int, help="shorthand for --listen 0.0.0.0:PORT")
    run.add_argument("--confdir", help="mitmproxy state directory (default: a private temporary directory)")
    args = parser.parse_args(argv)
    try:
        policy = load_policy(args.policy, args.policy_json)
        host, port = parse_listen(args.listen)
        if args.port is not None:
            host, port = "0.0.0.0", parse_listen(f"0.0.0.0:{args.port}")[1]
    except (OSError, ValueError) as exc:
        print(f"gateway: {exc}", file=sys.stderr)
        return 2
    return serve(policy, host=host, port=port, log_path=args.log, confdir=args.confdir)


if __name__ == "__main__":
    sys.exit(main())
