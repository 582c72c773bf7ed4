"""What every backend writes the same way on what it starts: the labels that name a sandbox, its role and
its starter (read back by ``list_all``, ``down --all --label`` and orphan reaping), and the one command
that reads the gateway's decision log from a line on, where the log lives in a container or a Pod.

The backends the registry (:mod:`controller.sandbox.registry`) hands out build on it: Docker (container
and network labels), Kubernetes (object labels and owner annotations), the VM (the labels of its
``owner.json``). It imports only :mod:`controller.sandbox`'s vocabulary and :mod:`controller.sandbox.owner`.
"""

from __future__ import annotations

import os
import socket
from typing import Any, Mapping

from controller.sandbox import LABEL_DETACHED, LABEL_OWNER, LABEL_OWNER_ID, LABEL_ROLE, LABEL_SANDBOX
from controller.sandbox.owner import owner_id

DECISIONS_SINCE_SCRIPT = 'tail -n +"$1" "$2" 2>/dev/null | head -n "$3" | head -c "$4"'
"""``sh -c`` script: lines ``$1``.. (1-based) of the file ``$2``, at most ``$3`` lines and ``$4`` bytes."""


def owner_labels() -> dict[str, str]:
    """The starter of a sandbox: ``LABEL_OWNER`` (``<hostname>:<pid>``, for people) and ``LABEL_OWNER_ID``
    (what orphan reaping judges, :func:`controller.sandbox.owner.owner_id`)."""
    return {LABEL_OWNER: f"{socket.gethostname()}:{os.getpid()}", LABEL_OWNER_ID: owner_id()}


def sandbox_labels(sandbox_id: str, role: str | None, options: Any, fixed: Mapping[str, str]) -> dict[str, str]:
    """The labels of one thing a sandbox is made of, in this order: ``LABEL_SANDBOX``, ``LABEL_ROLE``
    (left out when ``role`` is None), ``fixed`` (the backend's own), ``options.extra_labels`` (when the
    options have them) and ``LABEL_DETACHED`` ``1`` when ``options.detached``."""
    labels = {LABEL_SANDBOX: sandbox_id, **({LABEL_ROLE: role} if role is not None else {}), **fixed,
              **getattr(options, "extra_labels", {})}
    if options.detached:
        labels[LABEL_DETACHED] = "1"
    return labels


def decisions_since_argv(start: int, max_lines: int, max_bytes: int, log: str) -> list[str]:
    """The command (run in the gateway's container or Pod) that prints lines ``start``.. (0-based) of the
    decision log ``log``, at most ``max_lines`` lines and ``max_bytes`` bytes (:data:`DECISIONS_SINCE_SCRIPT`)."""
    return ["sh", "-c", DECISIONS_SINCE_SCRIPT, "sh", str(start + 1), log, str(max_lines), str(max_bytes)]
