"""Egress gateway: the guest's only way out.

``policy`` (pure, with the ``tiers`` of mode ask) decides; ``addon`` enforces it inside mitmproxy and holds
connections that wait for a person on the origin requests of ``holds``; ``control`` is the API the
controller answers them through; ``web`` keeps the responses it let through, or serves them back (recorded
web origins); ``python -m controller.gateway serve`` runs the proxy and that API. See
ARCHITECTURE.md, contract 2 and the isolation model ("Gateway control API").
"""

import importlib.util
import os
import sys
from pathlib import Path

from controller.gateway.policy import Decision, NetworkPolicy, Origin, PolicyError

__all__ = ["Decision", "NetworkPolicy", "Origin", "PolicyError", "gateway_python"]

_REPO = Path(__file__).resolve().parents[2]


def gateway_python() -> str | None:
    """Path of a Python interpreter that can run the gateway (has mitmproxy), or None.

    Looked up in order: ``$DESKTOP_SANDBOX_GATEWAY_PYTHON``; ``build/gateway-venv`` in the source tree
    (mitmproxy pins an h11 older than httpx needs, so ``.ci/run`` gives it its own environment); this
    interpreter, when mitmproxy is importable here.
    """
    env = os.environ.get("DESKTOP_SANDBOX_GATEWAY_PYTHON")
    if env:
        return env
    venv = _REPO / "build" / "gateway-venv" / "bin" / "python"
    if venv.exists():
        return str(venv)
    if importlib.util.find_spec("mitmproxy") is not None:
        return sys.executable
    return None
