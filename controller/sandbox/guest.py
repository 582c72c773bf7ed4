"""What the guest image fixes and every backend shares: users, homes, display, ports and paths.

The guest image (``images/provision.sh``, ``images/supervisor/*.conf``, ``images/entrypoint.sh``, the
VM's ``scripts/vm/guest/*`` units) creates these users and directories and starts its programs on this
display and port; the Docker, VM and Kubernetes backends (and the runner, the checks and the benchmark)
read them from here, so a backend cannot drift from the others. The guest side (``guest/``,
``images/``) keeps its own copies: it never imports the controller.

Pure: no imports, importable anywhere in the controller. ``tests/controller/test_constants.py`` fails on
a literal copy of these values elsewhere under ``controller/``.
"""

from __future__ import annotations

__all__ = [
    "AGENT_PORT", "AGENT_UID", "BROWSER_UID", "DECISION_LOG", "DESKTOP_UID", "DESKTOP_USER", "GATEWAY_HOME",
    "GATEWAY_HOSTNAME", "GATEWAY_LOG_DIR", "GATEWAY_PROXY_PORT", "GATEWAY_UID", "GUEST_DISPLAY", "GUEST_HOME",
    "GUEST_NO_PROXY", "GUEST_PYTHON", "RUN_DIR",
]

DESKTOP_USER = "sandbox"
"""The desktop user: Xvfb, openbox, the demo app, the apps the agent launches, ``exec_in_guest``."""
GUEST_HOME = "/home/sandbox"
"""The desktop user's home inside the guest (absolute path): its files, the browser profile, the base
of a task's ``~/`` paths. A tmpfs of ``DESKTOP_UID``, mode 0750 (group ``sandbox``, i.e. the agent,
reads it)."""
DESKTOP_UID = 1000
"""The desktop user's uid (and its group's gid)."""
GATEWAY_UID = 1001
"""The gateway's user ``gateway`` (uid and gid): the egress proxy, the relay, the control API."""
AGENT_UID = 1002
"""The guest agent's user ``agent`` (uid and gid; also a member of group ``sandbox``)."""
BROWSER_UID = 1003
"""The agent's chromium's user ``browser`` (uid and gid; docs/ARCHITECTURE.md, contract 8)."""
GATEWAY_HOME = "/home/gateway"
"""The gateway user's home inside the gateway's container or pod (absolute path)."""

GUEST_DISPLAY = ":99"
"""The X display the guest's session runs (Xvfb) and the agent drives."""
AGENT_PORT = 8000
"""The guest agent's TCP port inside the guest (Docker: also the relay's port inside the gateway)."""
RUN_DIR = "/run/desktop-sandbox"
"""Each role's private run directory. In the desktop the agent's own (agent, 0700: its token and its X
cookie; the desktop user cannot open it); in the gateway the gateway's (its policy, its control token,
its supervisord's socket)."""
GUEST_PYTHON = "/opt/desktop-sandbox/bin/python"
"""The guest's Python interpreter (the agent's virtual environment, which has the ``guest`` package)."""

GATEWAY_HOSTNAME = "gateway"
"""The gateway's name as the guest sees it (an /etc/hosts entry: the guest needs no DNS); also in
images/firefox/policies.json and images/chromium/policies.json."""
GATEWAY_PROXY_PORT = 3128
"""The egress proxy's port on the gateway's guest-facing address: the guest's HTTP(S)_PROXY (also in
images/firefox/policies.json and images/chromium/policies.json)."""
GUEST_NO_PROXY = "127.0.0.1,localhost"
"""The guest's NO_PROXY: only its own loopback bypasses the proxy."""
GATEWAY_LOG_DIR = "/var/log/desktop-sandbox"
"""The gateway's log directory inside its container or pod (gateway, 0755)."""
DECISION_LOG = f"{GATEWAY_LOG_DIR}/decisions.jsonl"
"""The gateway's JSONL decision log inside its container or pod (the VM's gateway, a host process, writes
its own in the sandbox's private directory)."""
