"""Cleanup of the Docker backend: remove one sandbox's containers and networks, all of them, or the
provably abandoned ones (see ``controller.sandbox.owner``). Every part is found by its
``desktop-sandbox.sandbox`` label; parts already gone are skipped."""

from __future__ import annotations

import time
from typing import Any

import docker
import docker.errors

from controller.sandbox import LABEL_SANDBOX, reap


def remove_sandbox(client: docker.DockerClient, sandbox_id: str) -> list[str]:
    """Remove every container (forcefully) and then every network labelled with ``sandbox_id``.

    Returns the names removed. Parts already gone are skipped silently.
    """
    return _remove(client, {"label": f"{LABEL_SANDBOX}={sandbox_id}"})


def remove_all(client: docker.DockerClient | None = None) -> list[str]:
    """Remove every container and network carrying the ``desktop-sandbox.sandbox`` label (any sandbox).

    What ``desktop-sandbox down --all`` does. Returns the names removed.
    """
    return _remove(client or docker.from_env(), {"label": LABEL_SANDBOX})


def list_sandboxes(client: docker.DockerClient | None = None) -> dict[str, dict[str, str]]:
    """Sandboxes on this engine: ``{id: labels of one of its containers or networks}``."""
    client = client or docker.from_env()
    found: dict[str, dict[str, str]] = {}
    for c in client.containers.list(all=True, ignore_removed=True, filters={"label": LABEL_SANDBOX}):
        found.setdefault(c.labels[LABEL_SANDBOX], dict(c.labels))
    for n in client.networks.list(filters={"label": LABEL_SANDBOX}):
        found.setdefault(n.attrs["Labels"][LABEL_SANDBOX], dict(n.attrs["Labels"]))
    return found


def reap_orphans(client: docker.DockerClient) -> list[str]:
    """Remove sandboxes whose starting process is provably dead and was on this host (a killed run).

    The rule is ``controller.sandbox.reap`` on the ``desktop-sandbox.owner-id`` label: detached
    sandboxes and live owners are left alone; owners that cannot be proven dead (another machine or
    container on a shared engine, a reused pid, a label without an owner id) are reported in a warning
    and left alone. Returns the ids removed.
    """
    return reap(list_sandboxes(client), lambda sandbox_id: remove_sandbox(client, sandbox_id))


ENDPOINTS_GONE_S = 15.0
"""Longest wait (seconds) for a network's endpoints to go when another remover (a second process reaping
the same abandoned sandbox, ``down`` beside a start) is still removing its containers."""


def _remove(client: docker.DockerClient, filters: dict[str, str]) -> list[str]:
    removed = []
    for container in client.containers.list(all=True, ignore_removed=True, filters=filters):
        try:
            container.remove(force=True, v=True)
            removed.append(container.name)
        except docker.errors.NotFound:
            pass
        except docker.errors.APIError as exc:
            if exc.status_code != 409:  # 409: removal already in progress
                raise
    for network in client.networks.list(filters=filters):
        if _remove_network(network):
            removed.append(network.name)
    return removed


def _remove_network(network: Any) -> bool:
    """Remove ``network``; True when this call removed it, False when it was gone already. A network
    whose containers another remover is still removing ("has active endpoints") is removed once they are
    gone, waited for at most :data:`ENDPOINTS_GONE_S` (then the engine's error is raised)."""
    deadline = time.monotonic() + ENDPOINTS_GONE_S
    while True:
        try:
            network.remove()
            return True
        except docker.errors.NotFound:
            return False
        except docker.errors.APIError as exc:
            if "active endpoints" not in str(exc) or time.monotonic() >= deadline:
                raise
        time.sleep(0.2)  # poll interval: the engine has no event to wait on for one network's endpoints
