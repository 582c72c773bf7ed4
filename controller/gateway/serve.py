"""Run mitmproxy with the egress policy addon (programmatic ``DumpMaster``)."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import tempfile
from pathlib import Path
from typing import Optional

from controller.gateway.policy import NetworkPolicy


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
    if isinstance(data, dict) and "network" in data:
        data = data["network"]
    return NetworkPolicy.model_validate(data)


def parse_listen(text: str) -> tuple[str, int]:
    """``HOST:PORT`` or ``[V6]:PORT`` -> (host, port). Raises ValueError when malformed."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"--listen must be HOST:PORT, got {text!r}")
    return host.strip("[]") or "0.0.0.0", int(port)


def serve(
    policy: NetworkPolicy,
    *,
    host: str = "0.0.0.0",
    port: int = 3128,
    log_path: Optional[str] = None,
    confdir: Optional[str] = None,
) -> int:
    """Run the proxy until SIGINT/SIGTERM; returns 0. Upstream connections are opened lazily (only after
    the policy allowed them) and TLS is never intercepted."""
    from mitmproxy.options import Options
    from mitmproxy.tools.dump import DumpMaster

    from controller.gateway.addon import EgressPolicy

    state_dir = confdir or tempfile.mkdtemp(prefix="gateway-mitmproxy-")

    async def run() -> None:
        options = Options(listen_host=host, listen_port=port, mode=["regular"], confdir=state_dir)
        master = DumpMaster(options, with_termlog=True, with_dumper=False)
        # options owned by addons exist only once DumpMaster has loaded them
        master.options.update(connection_strategy="lazy", termlog_verbosity="warn")
        master.addons.add(EgressPolicy(policy, Path(log_path) if log_path else None))
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, master.shutdown)
        task = asyncio.create_task(master.run())
        await _announce_when_listening(host, port, task)
        await task

    asyncio.run(run())
    return 0


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
