"""Run mitmproxy with the egress policy addon (programmatic ``DumpMaster``), and beside it, on the same
event loop, the gateway's control API (:mod:`controller.gateway.control`)."""

from __future__ import annotations

import asyncio
import ipaddress
import json
import signal
import socket
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Optional, Sequence

from controller.gateway.addresses import IPAddress, IPNetwork
from controller.gateway.policy import NetworkPolicy, OwnEndpoint, Resolver, system_resolver


def load_policy(path: Optional[str], inline_json: Optional[str]) -> NetworkPolicy:
    """Policy from a TOML task/policy file, a ``.json`` file, inline JSON, or deny-all when none is given.

    JSON may be the ``[network]`` table itself or an object with a ``network`` key. Raises OSError or
    ValueError (incl. pydantic.ValidationError) when unreadable or malformed.
    """
    if inline_json is not None:
        data = json.loads(inline_json)
    elif path is None:
        return NetworkPolicy()
    elif path.endswith(".json"):
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    else:
        return NetworkPolicy.from_toml(path)
    return NetworkPolicy.model_validate(_network_table(data))


def _network_table(data: object) -> object:
    """A policy document as :func:`load_policy` reads one: the ``[network]`` table, or an object with a
    ``network`` key holding it."""
    if isinstance(data, dict) and "network" in data:
        return data["network"]
    return data


def parse_listen(text: str) -> tuple[str, int]:
    """``HOST:PORT`` or ``[V6]:PORT`` -> (host, port). Raises ValueError when malformed."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"--listen must be HOST:PORT, got {text!r}")
    return host.strip("[]") or "0.0.0.0", int(port)


def load_hosts(path: str) -> dict[str, list[str]]:
    """A hosts map file: a JSON object ``{"name": ["address", ...]}``. Raises OSError or ValueError."""
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    if not isinstance(data, dict) or not all(
            isinstance(k, str) and isinstance(v, list) and all(isinstance(a, str) for a in v) for k, v in data.items()):
        raise ValueError(f"{path}: a hosts map is a JSON object of name -> list of addresses")
    for addresses in data.values():
        for address in addresses:
            ipaddress.ip_address(address)
    return data


def hosts_resolver(path: str) -> Resolver:
    """A resolver that knows only the names of the hosts map file ``path`` (:func:`load_hosts`; read at
    every lookup, so a test can change an answer; names compared case-insensitively without a trailing
    dot) and fails every other name: with it, the gateway sends no DNS query at all. A file that cannot
    be read fails every lookup."""

    def resolve(host: str, port: int) -> list[str]:
        try:
            table = {name.lower().rstrip("."): addresses for name, addresses in load_hosts(path).items()}
        except (OSError, ValueError) as exc:
            raise socket.gaierror(socket.EAI_FAIL, f"hosts map unreadable: {exc}") from None
        addresses = table.get(host.lower().rstrip("."))
        if not addresses:
            raise socket.gaierror(socket.EAI_NONAME, f"{host} is not in the gateway's hosts map")
        return list(addresses)

    return resolve


def own_endpoint_check(ports: Iterable[int]) -> OwnEndpoint:
    """``(address, port) -> bool``: True when ``port`` is one of ``ports`` (the gateway's proxy, relay and
    control ports) and ``address`` is this machine's: loopback, unspecified, or an IPv4 address of one of
    its interfaces (read at each call, so networks attached later count too)."""
    own_ports = frozenset(ports)

    def check(address: IPAddress, port: int) -> bool:
        if port not in own_ports:
            return False
        if address.is_loopback or address.is_unspecified:
            return True
        try:
            from controller.gateway.relay import interface_addresses

            mine = set(interface_addresses().values())
        except OSError:  # pragma: no cover - no interface list on this system
            mine = set()
        return address in mine

    return check


@dataclass(frozen=True)
class ControlOptions:
    """The control API of a gateway: ``host``/``port`` to listen on (``0.0.0.0``: every IPv4 address
    outside ``exclude``, see :func:`controller.gateway.control.listen_sockets`), ``token_file`` (the
    bearer token), ``exclude``: networks it never listens on and whose peers it refuses."""

    host: str
    port: int
    token_file: str
    exclude: tuple[IPNetwork, ...] = ()


def serve(
    policy: NetworkPolicy,
    *,
    host: str = "0.0.0.0",
    port: int = 3128,
    log_path: Optional[str] = None,
    confdir: Optional[str] = None,
    control: Optional[ControlOptions] = None,
    reserved_ports: Sequence[int] = (),
    resolver: Optional[Resolver] = None,
) -> int:
    """Run the proxy (and, with ``control``, the control API on the same event loop) until
    SIGINT/SIGTERM; returns 0, or 2 when the control API cannot start. Upstream connections are opened
    lazily (only after the policy allowed them) and TLS is never intercepted. ``reserved_ports``: other
    ports of this machine's own addresses the guest must never reach through the proxy (the relay's);
    the proxy's and the control API's are always refused. ``resolver``: name resolution (default:
    getaddrinfo)."""
    from mitmproxy.options import Options
    from mitmproxy.tools.dump import DumpMaster

    from controller.gateway.addon import EgressPolicy
    from controller.gateway.web import WebStore
    from controller.gateway.control import (
        ControlConfigError, ControlServer, PolicyAccess, listen_sockets, make_app, read_token,
    )

    state_dir = confdir or tempfile.mkdtemp(prefix="gateway-mitmproxy-")
    sockets = []
    token = ""
    if control is not None:
        try:
            token = read_token(control.token_file)
            sockets = listen_sockets(control.host, control.port, control.exclude)
        except (ControlConfigError, OSError) as exc:
            print(f"gateway: control API: {exc}", file=sys.stderr, flush=True)
            return 2
    own_ports = {port, *reserved_ports, *(s.getsockname()[1] for s in sockets)}
    status = 0

    async def run() -> None:
        nonlocal status
        options = Options(listen_host=host, listen_port=port, mode=["regular"], confdir=state_dir)
        master = DumpMaster(options, with_termlog=True, with_dumper=False)
        # options owned by addons exist only once DumpMaster has loaded them
        master.options.update(connection_strategy="lazy", termlog_verbosity="warn")
        addon = EgressPolicy(policy, Path(log_path) if log_path else None, resolver=resolver or system_resolver,
                             own_endpoint=own_endpoint_check(own_ports), web=WebStore())
        master.addons.add(addon)
        server = None
        if control is not None:
            access = PolicyAccess(lambda: addon.policy.model_dump(mode="json"),
                                  lambda data: addon.set_policy(NetworkPolicy.model_validate(_network_table(data))))
            server = ControlServer(make_app(addon.requests, token, control.exclude, policy=access, web=addon.web),
                                   sockets)
            try:
                await server.start()
            except ControlConfigError as exc:
                print(f"gateway: {exc}", file=sys.stderr, flush=True)
                status = 2
                return
            for address, bound in server.addresses:
                print(f"gateway control API listening on {address}:{bound}", file=sys.stderr, flush=True)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, master.shutdown)
        task = asyncio.create_task(master.run())
        try:
            await _announce_when_listening(host, port, task)
            await task
        finally:
            if server is not None:
                await server.stop()

    asyncio.run(run())
    return status


async def _announce_when_listening(host: str, port: int, task: asyncio.Task) -> None:
    probe_host = "127.0.0.1" if host in ("0.0.0.0", "") else ("::1" if host == "::" else host)
    while not task.done():
        try:
            _reader, writer = await asyncio.open_connection(probe_host, port)
        except OSError:
            await asyncio.sleep(0.02)
            continue
        writer.close()
        print(f"gateway listening on {host}:{port}", file=sys.stderr, flush=True)
        return
