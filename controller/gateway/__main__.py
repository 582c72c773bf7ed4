"""``python -m controller.gateway serve --policy FILE --log FILE --listen 0.0.0.0:3128``.

``--decision-log`` is an alias of ``--log``; ``--port N`` is short for ``--listen 0.0.0.0:N``.

Control API (:mod:`controller.gateway.control`): ``--control-listen HOST:PORT`` with
``--control-token-file FILE`` (the bearer token); ``HOST`` ``0.0.0.0`` means every IPv4 address of this
machine outside the ``--control-exclude`` networks (CIDR, repeatable or comma-separated; their peers are
refused too). ``--reserved-port N`` (repeatable): another port of this machine the guest must never
reach through the proxy (the relay's). ``--hosts FILE``: resolve names only from this JSON map
``{"name": ["address", ...]}``, read at every lookup (no DNS at all; tests).

Runs mitmproxy (regular proxy mode, lazy upstream connections, no TLS interception) with the
:class:`~controller.gateway.addon.EgressPolicy` addon. ``--policy`` takes a task or policy TOML file, or a
``.json`` file holding the ``[network]`` table as JSON; ``--policy-json`` takes that JSON inline. Prints
``gateway listening on HOST:PORT`` to stderr once the proxy accepts connections. Exits 2 on a bad policy.
"""

from __future__ import annotations

import argparse
import ipaddress
import sys

from controller.gateway.serve import ControlOptions, hosts_resolver, load_hosts, load_policy, parse_listen, serve


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
    run.add_argument("--control-listen", help="HOST:PORT of the control API (none without it)")
    run.add_argument("--control-token-file", help="file holding the control API's bearer token")
    run.add_argument("--control-exclude", action="append", default=[],
                     help="CIDR(s) the control API never listens on and refuses peers from (repeatable)")
    run.add_argument("--reserved-port", action="append", type=int, default=[],
                     help="another port of this machine the proxy never connects to (repeatable)")
    run.add_argument("--hosts", help="resolve names only from this JSON map of name -> addresses")
    args = parser.parse_args(argv)
    try:
        policy = load_policy(args.policy, args.policy_json)
        host, port = parse_listen(args.listen)
        if args.port is not None:
            host, port = "0.0.0.0", parse_listen(f"0.0.0.0:{args.port}")[1]
        control = None
        if args.control_listen is not None:
            if not args.control_token_file:
                raise ValueError("--control-listen needs --control-token-file")
            control_host, control_port = parse_listen(args.control_listen)
            exclude = tuple(ipaddress.ip_network(c.strip(), strict=False)
                            for arg in args.control_exclude for c in arg.split(",") if c.strip())
            control = ControlOptions(control_host, control_port, args.control_token_file, exclude)
        elif args.control_token_file or args.control_exclude:
            raise ValueError("--control-token-file and --control-exclude need --control-listen")
        if any(not 1 <= p <= 65535 for p in args.reserved_port):
            raise ValueError("--reserved-port must be 1..65535")
        if args.hosts:
            load_hosts(args.hosts)  # refused at start when malformed
        resolver = hosts_resolver(args.hosts) if args.hosts else None
    except (OSError, ValueError) as exc:
        print(f"gateway: {exc}", file=sys.stderr)
        return 2
    return serve(policy, host=host, port=port, log_path=args.log, confdir=args.confdir, control=control,
                 reserved_ports=args.reserved_port, resolver=resolver)


if __name__ == "__main__":
    sys.exit(main())
