"""Network audit of the VM backend: the audit's one probe list (controller.audit.probes), run and judged
by controller.audit.runner, against the VM's topology (controller.audit.topology.audit_topology).

In the VM the guest sits on QEMU's user-mode network with ``restrict=on``: the only address it can open a
connection to is the gateway's guest-forwarded address (10.0.2.100:3128); the gateway itself runs on the
host's loopback. There are no target containers; the host canary (on every host address) records any
connection or datagram that got through, so "refused in the guest" is never the only evidence. The web
console runs on the host's 127.0.0.1 for the audit's duration: 10.0.2.2 is QEMU's alias of exactly that
loopback, and the gateway's own loopback is the host's, so its ``console`` probes matter most here.

Rule source: ARCHITECTURE.md ("VM path"), docs/audit.md (report format).
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from controller.audit.canary import HostCanary
from controller.audit.console import ConsoleLike, audit_console
from controller.audit.report import AuditReport
from controller.audit.runner import run_audit
from controller.audit.topology import audit_topology
from controller.gateway.policy import NetworkPolicy

if TYPE_CHECKING:  # pragma: no cover
    from controller.sandbox.vm import VMSandbox

VM_PROBE_TIMEOUT = 600.0
"""Seconds the probe run may take in a VM guest (slower than a container under plain emulation)."""


def audit_vm(policy: NetworkPolicy, *, image: Optional[Path] = None, ready_timeout: float = 600.0,
             sandbox: Optional["VMSandbox"] = None, console: Optional[ConsoleLike] = None) -> AuditReport:
    """Start the host canary, the web console (unless ``console``, one already listening, is given) and
    a VM sandbox with ``policy`` from ``image`` (the VM image directory; default the built one), or use
    ``sandbox``, already started with it; run the audit, stop what it started; return the report.

    ``ready_timeout``: seconds for the VM to become ready. Raises AuditError or SandboxError when the
    audit cannot run.
    """
    from controller.sandbox import SandboxSpec
    from controller.sandbox.vm import VMOptions, VMSandbox

    with contextlib.ExitStack() as stack:
        canary = stack.enter_context(HostCanary())
        console = console if console is not None else stack.enter_context(audit_console())
        if sandbox is not None:
            return run_audit(audit_topology(sandbox), policy, host_canary=canary, console=console,
                             timeout=VM_PROBE_TIMEOUT)
        spec = SandboxSpec(policy=policy, ready_timeout=ready_timeout)
        with VMSandbox.start(spec, VMOptions(image=image)) as started:
            return run_audit(audit_topology(started), policy, host_canary=canary, console=console,
                             timeout=VM_PROBE_TIMEOUT)
