"""The web console as an audit target: the guest must never reach it, the host must.

The console (controller.console.server.ConsoleServer, ``run-task --ui``) lets a person approve safety
checks and drive the desktop; it listens on the host's 127.0.0.1 on a free port. During an audit a real
one runs on the host (:func:`audit_console`, over an empty temporary runs directory), and
:func:`console_probes` aims every way the audit already uses to reach host-side services at its port:

* direct TCP from the guest to every host address the guest could name (the topology's ``host_ips``:
  the bridge gateway addresses for Docker, QEMU's 10.0.2.2/10.0.2.3 and the host's own addresses for
  the VM), to ``host.docker.internal`` and to the guest's own 127.0.0.1;
* absolute-form HTTP and CONNECT through the gateway's proxy to every loopback spelling
  (``127.0.0.1``, ``localhost``, ``[::1]``, decimal, hex, octal, IPv4-mapped, ``0``, ``0.0.0.0``), to
  ``host.docker.internal`` and to every host address, on the console's port.

Each is expected refused (not connected; the gateway's own 403). The positive control,
:func:`console_control_probe`, is made from the controller: the host reaches the console on
127.0.0.1:PORT before and after the guest's probes, so a console that was not listening cannot pass for
one the guest could not reach. docs/audit.md (``console``) documents them.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import tempfile
from pathlib import Path
from typing import Any, Iterator, Protocol

from controller.audit.errors import ConsoleNotStarted
from controller.audit.judges import LOOPBACK_FORMS, Probe, blocked, connected, host_port, through_proxy
from controller.audit.report import ProbeResult
from controller.audit.topology import AuditTopology

CONSOLE_HOST_NAMES = ["host.docker.internal"]
"""Names of the host some container set-ups resolve (Docker Desktop, ``host-gateway``)."""
CONTROL_NAME = "console-reachable-from-host"
"""Name of the positive control (a summary probe)."""
CONTROL_TIMEOUT = 5.0
"""Seconds the controller's own request to the console may take."""


class ConsoleLike(Protocol):
    """What the audit needs of a running console: the port it listens on (127.0.0.1) and the path of
    its home page (under its secret base: ``ConsoleServer.home_path``)."""

    port: int | None
    home_path: str


@contextlib.contextmanager
def audit_console() -> Iterator[ConsoleLike]:
    """A real ConsoleServer on 127.0.0.1 over an empty temporary runs directory, for the ``with`` block;
    stopped and its directory removed afterwards. Raises ConsoleNotStarted when it does not listen."""
    from controller.console.server import ConsoleServer  # the audit's one use of the console

    with tempfile.TemporaryDirectory(prefix="ds-audit-console-") as runs:
        try:
            server = ConsoleServer(Path(runs)).start()
        except (RuntimeError, OSError) as exc:
            raise ConsoleNotStarted(f"the web console did not start: {exc}") from None
        if not server.port:
            server.stop()
            raise ConsoleNotStarted("the web console started without a port")
        try:
            yield server
        finally:
            server.stop()


def console_probes(topo: AuditTopology, port: int) -> list[Probe]:
    """The ``console`` group for the console listening on the host's 127.0.0.1:``port``: direct TCP
    from the guest to every host address (and the guest's own loopback), absolute-form HTTP and CONNECT
    through the proxy to every loopback spelling, ``host.docker.internal`` and every host address. Every
    one is expected ``blocked``; names are unique."""
    proxy = {"proxy_host": topo.proxy_host, "proxy_port": topo.proxy_port}
    probes: dict[str, Probe] = {}

    def add(name: str, target: str, spec: dict[str, Any], judge: Any) -> None:
        probes.setdefault(name, Probe(name, "console", target, "blocked", {"name": name, **spec}, judge))

    for host in dict.fromkeys([*topo.host_ips, *CONSOLE_HOST_NAMES, "127.0.0.1"]):
        add(f"console-tcp-{host_port(host, port)}", f"console {host_port(host, port)} direct",
            {"kind": "tcp", "host": host, "port": port}, blocked(connected))
    for form in dict.fromkeys([*LOOPBACK_FORMS, *CONSOLE_HOST_NAMES, *topo.host_ips]):
        authority = f"{form}:{port}" if form.startswith("[") else host_port(form, port)  # IPv6 forms: bracketed
        add(f"console-proxy-{authority}", f"console http://{authority}/ via proxy",
            {"kind": "http", **proxy, "url": f"http://{authority}/"}, blocked(through_proxy))
        add(f"console-connect-{authority}", f"console CONNECT {authority} via proxy",
            {"kind": "connect", **proxy, "authority": authority, "tls": False}, blocked(through_proxy))
    return list(probes.values())


def host_check(port: int, path: str = "/", timeout: float = CONTROL_TIMEOUT) -> dict[str, Any]:
    """One GET ``path`` (the console's secret base and ``/``) from the controller to the console at
    127.0.0.1:``port`` (no proxy): ``{"observed": "status:<code>" | "refused" | "timeout" | "error",
    "detail": ...}``; the detail of an answer holds the console's error code when it sent one
    (``unauthenticated``: the request had no session)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", path, headers={"Host": f"127.0.0.1:{port}", "Accept": "application/json"})
        response = conn.getresponse()
        body = response.read(4096)
    except socket.timeout:
        return {"observed": "timeout", "detail": f"no answer within {timeout:g} s"}
    except ConnectionRefusedError as exc:
        return {"observed": "refused", "detail": str(exc)}
    except (OSError, http.client.HTTPException) as exc:
        return {"observed": "error", "detail": f"{type(exc).__name__}: {exc}"}
    finally:
        conn.close()
    try:
        code = json.loads(body)["error"]["code"]
    except (ValueError, TypeError, KeyError):
        code = None
    return {"observed": f"status:{response.status}", "detail": {"status": response.status, "code": code}}


def console_control_probe(port: int, before: dict[str, Any], after: dict[str, Any]) -> ProbeResult:
    """Summary verdict (the positive control): the host got an HTTP answer from the console at
    127.0.0.1:``port`` both before (``before``) and after (``after``) the guest's probes (each a
    :func:`host_check`). Observed: the first failing check's word, else the last answer's; expected
    ``allowed``, never an escape."""
    checks = {"before": before, "after": after}
    failed = [c["observed"] for c in checks.values() if not c["observed"].startswith("status:")]
    return ProbeResult(name=CONTROL_NAME, category="summary", target=f"console 127.0.0.1:{port} from the host",
                       expected="allowed", observed=(failed or [after["observed"]])[0], passed=not failed,
                       escaped=False, detail=checks)
