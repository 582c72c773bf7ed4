"""The audit's targets: throwaway containers on a private ``internal`` Docker network of their own that
only the sandbox's gateway is attached to (never real internet addresses).

* ``allowed.audit.test`` — HTTP on 8080 and 8081; ``/redirect?to=URL`` answers 302. The origin
  ``http://allowed.audit.test:8080`` is what an allowlist names to exercise the allowed and redirect
  probes; ``http://allowed.audit.test:8081`` (:data:`SWAP_ORIGIN`) is what the policy a swapped audit
  starts with names (controller.audit.swap). For a policy naming either, the audit adds an
  ``allow_addresses`` rule for that target's private address.
* recorder (``denied.audit.test``, ``doh.audit.test``, ``dot.audit.test`` and the run's random DNS canary
  name) — accepts TCP on 22, 53, 80, 443, 853, 3128, 8000, 8080 and UDP on 53, 123, 443, 853, 9999 and
  records every hit. The gateway *can* reach it, so only the policy keeps the guest from it.

Both run ``target_server.py`` (next to this file, passed to ``python3 -c``; nothing of it is in the image).
"""

from __future__ import annotations

import json
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from controller.audit.errors import AuditTargetsFailed
from controller.gateway.policy import NetworkPolicy, Origin
from controller.text import clean_lines

if TYPE_CHECKING:  # pragma: no cover
    from docker import DockerClient
    from docker.models.containers import Container
    from docker.models.networks import Network

TARGET_DOMAIN = "audit.test"
ALLOWED_NAME = f"allowed.{TARGET_DOMAIN}"
DENIED_NAME = f"denied.{TARGET_DOMAIN}"
DOH_NAME = f"doh.{TARGET_DOMAIN}"
DOT_NAME = f"dot.{TARGET_DOMAIN}"
TARGET_HTTP_PORT = 8080
FIXTURE_ORIGIN = f"http://{ALLOWED_NAME}:{TARGET_HTTP_PORT}"
"""The allowed target's origin; an allowlist that names it gets the allowed and redirect probes."""
SWAP_PORT = 8081
SWAP_ORIGIN = f"http://{ALLOWED_NAME}:{SWAP_PORT}"
"""The allowed target's second origin: what the policy a swapped audit starts with lets the guest reach
before the swap (its probe, and the connection held open across the swap; controller.audit.swap)."""
RECORDER_TCP_PORTS = [22, 53, 80, 443, 853, 3128, 8000, 8080]
RECORDER_UDP_PORTS = [53, 123, 443, 853, 9999]
MAX_LOG_LINES = 5000
"""Lines of a target's output read back (each hit is one line; guest-chosen bytes in it are capped at 64)."""

_SERVER = Path(__file__).resolve().parent / "target_server.py"


def new_canary_name() -> str:
    """A fresh random DNS canary name, ``c<12 hex>.canary.audit.test``."""
    return f"c{secrets.token_hex(6)}.canary.{TARGET_DOMAIN}"


@dataclass
class AuditTargets:
    """The audit's target containers on their own ``internal`` network (labelled like a sandbox, so
    ``desktop-sandbox down --all`` and the orphan reaper remove leftovers).

    ``allowed_ip``/``recorder_ip``: IPv4 addresses on the targets network; ``*_ip6``: IPv6 addresses when
    the engine could give the network one, else None. ``gateway_ip``/``gateway_ip6``: the sandbox
    gateway's addresses there, once it is connected. ``canary``: the run's random DNS canary name (an
    alias of the recorder, so a gateway that resolved and connected to it leaves a hit).
    """

    client: Optional["DockerClient"]
    id: str
    canary: str
    network: Optional["Network"] = None
    allowed: Optional["Container"] = None
    recorder: Optional["Container"] = None
    allowed_ip: str = ""
    allowed_ip6: Optional[str] = None
    recorder_ip: str = ""
    recorder_ip6: Optional[str] = None
    gateway_ip: str = ""
    gateway_ip6: Optional[str] = None
    _flush_tokens: set[str] = field(default_factory=set, repr=False)

    @classmethod
    def start(cls, client: "DockerClient", image: str,
              owner_labels: Optional[dict[str, str]] = None) -> "AuditTargets":
        """Create the network and both targets from ``image`` and wait until they listen.

        Raises AuditTargetsFailed (a target exited or was not ready in 30 s) or docker.errors.DockerException;
        removes what it created on any failure.
        """
        from controller.sandbox import LABEL_ROLE, LABEL_SANDBOX

        ident = f"ds-audit-{secrets.token_hex(4)}"
        targets = cls(client=client, id=ident, canary=new_canary_name())
        labels = {LABEL_SANDBOX: ident, **(owner_labels or {})}
        try:
            network = targets.network = targets._create_network({**labels, LABEL_ROLE: "audit-targets"})
            common = dict(
                user="1000:1000",
                entrypoint=["python3", "-c", _SERVER.read_text(encoding="utf-8")],
                detach=True,
                read_only=True,
                cap_drop=["ALL"],
                security_opt=["no-new-privileges:true"],
                sysctls={"net.ipv4.ip_unprivileged_port_start": "0"},
                pids_limit=128,
                mem_limit="128m",
                network=network.name,
            )
            targets.allowed = client.containers.run(
                image,
                command=[json.dumps({"role": "allowed", "http": [TARGET_HTTP_PORT, SWAP_PORT]})],
                name=f"{ident}-allowed",
                labels={**labels, LABEL_ROLE: "audit-allowed"},
                networking_config={network.name: client.api.create_endpoint_config(aliases=[ALLOWED_NAME])},
                **common,
            )
            targets.recorder = client.containers.run(
                image,
                command=[json.dumps({"role": "recorder", "tcp": RECORDER_TCP_PORTS, "udp": RECORDER_UDP_PORTS})],
                name=f"{ident}-recorder",
                labels={**labels, LABEL_ROLE: "audit-recorder"},
                networking_config={
                    network.name: client.api.create_endpoint_config(
                        aliases=[DENIED_NAME, DOH_NAME, DOT_NAME, targets.canary]
                    )
                },
                **common,
            )
            targets._wait_ready()
            targets.allowed_ip, targets.allowed_ip6 = _addresses(targets.allowed, network.name)
            targets.recorder_ip, targets.recorder_ip6 = _addresses(targets.recorder, network.name)
        except BaseException:
            targets.close()
            raise
        return targets

    def _create_network(self, labels: dict[str, str]) -> "Network":
        import docker.errors
        import docker.types

        assert self.client is not None
        ipv6 = "fd%02x:%04x:%04x::/64" % (secrets.randbelow(256), secrets.randbelow(65536), secrets.randbelow(65536))
        try:
            pool = docker.types.IPAMPool(subnet=ipv6)
            return self.client.networks.create(
                f"{self.id}-targets", driver="bridge", internal=True, enable_ipv6=True,
                ipam=docker.types.IPAMConfig(pool_configs=[pool]), labels=labels,
            )
        except docker.errors.APIError:  # an engine without IPv6 support: IPv4 targets only
            return self.client.networks.create(f"{self.id}-targets", driver="bridge", internal=True, labels=labels)

    def _wait_ready(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        delay = 0.05
        for container in (self.allowed, self.recorder):
            assert container is not None
            while not any(record.get("ready") is True for record in _records(container)):
                container.reload()
                if container.status not in ("created", "running"):
                    output = container.logs(tail=20).decode("utf-8", "replace")
                    raise AuditTargetsFailed(f"audit target {container.name} exited; last output:\n"
                                             f"{clean_lines(output, 2000)}")
                if time.monotonic() > deadline:
                    raise AuditTargetsFailed(f"audit target {container.name} not ready after {timeout:.0f}s")
                time.sleep(delay)  # poll interval of a condition wait (target ready), bounded by the deadline
                delay = min(delay * 1.5, 0.5)

    @property
    def network_name(self) -> str:
        """The targets network's name (``<id>-targets``)."""
        return f"{self.id}-targets"

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until every hit that reached the recorder before this call is in its output.

        Runs ``target_server.py`` in flush mode inside the recorder container: it sends one marker (a
        random token, from loopback) to each of the recorder's listeners, which handle their queues in
        order; then waits until the recorder has recorded every marker. Returns True when it has within
        ``timeout`` seconds, False otherwise (a listener still busy, with hits). Markers never appear in
        :meth:`hits`. Raises docker.errors.DockerException when the container cannot be reached.
        """
        if self.recorder is None:
            return True
        token = secrets.token_hex(8)
        self._flush_tokens.add(token)
        config = {"role": "flush", "token": token, "tcp": RECORDER_TCP_PORTS, "udp": RECORDER_UDP_PORTS}
        result = self.recorder.exec_run(["python3", "-c", _SERVER.read_text(encoding="utf-8"), json.dumps(config)],
                                        user="1000:1000")
        try:
            sent = {(m["hit"], m["port"], m["peer"]) for m in json.loads(result.output[-65536:])["sent"]}
        except (ValueError, KeyError, TypeError):
            return False
        deadline = time.monotonic() + timeout
        delay = 0.02
        while True:
            seen = {(r.get("hit"), r.get("port"), r.get("peer")) for r in _records(self.recorder)
                    if r.get("head") == token}
            if sent <= seen:
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(delay)  # poll interval of a condition wait (hits recorded), bounded by the deadline
            delay = min(delay * 1.5, 0.25)

    def hits(self) -> list[dict[str, Any]]:
        """Everything the targets recorded: ``{"target": "allowed"|"recorder", "hit", "port", "peer", ...}``
        (the last :data:`MAX_LOG_LINES` lines of each target's output; :meth:`flush` markers left out)."""
        out = []
        for role, container in (("allowed", self.allowed), ("recorder", self.recorder)):
            if container is None:
                continue
            out.extend({"target": role, **record} for record in _records(container)
                       if "hit" in record and record.get("head") not in self._flush_tokens)
        return out

    def close(self) -> None:
        """Remove the targets and their network (idempotent, ignores parts already gone)."""
        from controller.sandbox.docker import remove_sandbox

        if self.client is not None:
            remove_sandbox(self.client, self.id)


def _records(container: "Container") -> list[dict[str, Any]]:
    """The JSON object lines of the last :data:`MAX_LOG_LINES` lines of ``container``'s output."""
    records = []
    for line in container.logs(tail=MAX_LOG_LINES).decode("utf-8", "replace").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict):
            records.append(record)
    return records


def _addresses(container: "Container", network: str) -> tuple[str, Optional[str]]:
    """``container``'s (IPv4, IPv6 or None) address on ``network``."""
    container.reload()
    endpoint = container.attrs["NetworkSettings"]["Networks"][network]
    return endpoint["IPAddress"], endpoint.get("GlobalIPv6Address") or None


def effective_policy(policy: NetworkPolicy, targets: Optional[AuditTargets]) -> NetworkPolicy:
    """``policy`` plus address rules for the allowed target (its IPv4 and, when it has one, IPv6 address)
    when there are targets and the policy names one of its origins (:data:`FIXTURE_ORIGIN`,
    :data:`SWAP_ORIGIN`), to allow or (mode ask) to ask for: the gateway refuses a name if ANY of its
    addresses is refused. ``policy`` itself otherwise."""
    if targets is None or not any(
            origin in policy.origins or (policy.ask_match(origin) is not None and policy.quiet_match(origin) is None)
            for origin in (Origin.parse(FIXTURE_ORIGIN), Origin.parse(SWAP_ORIGIN))):
        return policy
    data = policy.model_dump(mode="json")
    own = [a for a in (targets.allowed_ip, targets.allowed_ip6) if a]
    data["allow_addresses"] = [*data.get("allow_addresses", []), *own]
    return NetworkPolicy.model_validate(data)
