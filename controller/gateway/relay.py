"""TCP relay in the gateway container: the controller's only way to the guest agent.

``python -m controller.gateway.relay --port 8000 --exclude 172.30.0.0/16 --target desktop:8000``

Listens on ``--port`` on every IPv4 address of the container *except* those inside the ``--exclude``
networks (the guest-facing internal network), so the guest cannot even complete a TCP handshake with it;
Docker publishes that port on the host's 127.0.0.1 only. Each accepted connection is piped to
``--target`` (resolved per connection, so the desktop may start after the relay). Bytes are relayed
unchanged: the agent's bearer token still guards every endpoint but ``/livez``.

Rule source: ARCHITECTURE.md, isolation model ("the controller reaches the agent through a port the
gateway publishes on 127.0.0.1 only"; the gateway's relay port "not reachable from the guest").
"""

from __future__ import annotations

import argparse
import asyncio
import fcntl
import ipaddress
import socket
import struct
import sys

SIOCGIFADDR = 0x8915
"""Linux ioctl: the IPv4 address of an interface (``<linux/sockios.h>``)."""


def interface_addresses() -> dict[str, ipaddress.IPv4Address]:
    """IPv4 address of every interface that has one: ``{"eth0": IPv4Address("172.30.0.2"), ...}``.

    Uses the ``SIOCGIFADDR`` ioctl (the primary address of each interface), so no ``ip``/``ifconfig``
    binary is needed in the image.
    """
    found: dict[str, ipaddress.IPv4Address] = {}
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for _, name in socket.if_nameindex():
            try:
                packed = fcntl.ioctl(sock.fileno(), SIOCGIFADDR, struct.pack("256s", name[:15].encode()))
            except OSError:
                continue  # no IPv4 address on this interface
            found[name] = ipaddress.IPv4Address(packed[20:24])
    return found


def listen_addresses(exclude: list[ipaddress.IPv4Network]) -> list[str]:
    """Addresses to listen on: non-loopback IPv4 addresses outside every ``exclude`` network."""
    return sorted(
        str(addr)
        for addr in interface_addresses().values()
        if not addr.is_loopback and not any(addr in net for net in exclude)
    )


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        try:
            if writer.can_write_eof():
                writer.write_eof()
        except (OSError, RuntimeError):
            pass


async def _handle(target_host: str, target_port: int, client_r: asyncio.StreamReader,
                  client_w: asyncio.StreamWriter) -> None:
    try:
        up_r, up_w = await asyncio.wait_for(asyncio.open_connection(target_host, target_port), 10)
    except (OSError, asyncio.TimeoutError) as exc:
        print(f"relay: cannot reach {target_host}:{target_port}: {exc}", file=sys.stderr, flush=True)
        client_w.close()
        return
    try:
        await asyncio.gather(_pipe(client_r, up_w), _pipe(up_r, client_w))
    finally:
        for w in (up_w, client_w):
            w.close()


async def serve(port: int, exclude: list[ipaddress.IPv4Network], target: str) -> None:
    """Run the relay until cancelled. Raises SystemExit(2) when no address qualifies."""
    host, _, tport = target.rpartition(":")
    hosts = listen_addresses(exclude)
    if not hosts:
        raise SystemExit("relay: no address outside the excluded networks to listen on")
    server = await asyncio.start_server(
        lambda r, w: _handle(host, int(tport), r, w), host=hosts, port=port, reuse_address=True
    )
    print(f"relay: {', '.join(f'{h}:{port}' for h in hosts)} -> {target}", flush=True)
    async with server:
        await server.serve_forever()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="TCP relay from the gateway's egress side to the agent")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--exclude", action="append", default=[], help="CIDR(s), comma-separated, never listened on (repeatable)")
    parser.add_argument("--target", required=True, help="HOST:PORT of the agent")
    args = parser.parse_args(argv)
    exclude = [ipaddress.IPv4Network(c.strip(), strict=False)
               for arg in args.exclude for c in arg.split(",") if c.strip()]
    try:
        asyncio.run(serve(args.port, exclude, args.target))
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
