"""Egress gateway: the guest's only way out.

``policy`` (pure) decides; ``addon`` enforces it inside mitmproxy; ``python -m controller.gateway serve``
runs the proxy. See ARCHITECTURE.md, isolation model.
"""

from controller.gateway.policy import Decision, NetworkPolicy, Origin, PolicyError

__all__ = ["Decision", "NetworkPolicy", "Origin", "PolicyError"]
