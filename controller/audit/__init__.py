"""Network audit: probes run from inside the guest prove what the sandbox lets out (and what it does not).

``audit(policy)`` (Docker) starts audit targets on a private network of their own, a sandbox with the
policy, attaches the gateway (only the gateway) to the targets' network, runs ``guest/netprobe.py`` in the
guest as the desktop user, and judges every observation together with what the targets and a host canary
recorded (a probe that "failed" in the guest but left a hit on a target still escaped). ``audit_vm(policy)``
does the same on the VM backend, without targets (its gateway is a host process). Both run a real web
console (controller.console) on the host's loopback for the audit's duration and prove the guest cannot
reach it while the host can.

Modules: ``backends`` (each backend's audit by its registry name; not imported here, it imports this
package), ``topology`` (what the audit knows of a sandbox, per backend), ``probes`` (the one probe
list) and ``judges`` (its verdict parts), ``targets`` (the target containers; ``target_server.py``
runs in them), ``canary`` (the host canary), ``console`` (the host's web console as a target: its
probes and the host's positive control), ``runner`` (running and judging), ``swap`` (a policy swapped
in at runtime across a held connection, a sandbox claimed from a warm pool), ``report`` (JSON model and
text table), ``errors``.

Rules come from ARCHITECTURE.md (isolation model) and docs/audit.md, which also documents the JSON report.
"""

from controller.audit.canary import HostCanary
from controller.audit.errors import (
    AuditError,
    AuditImageMissing,
    AuditTargetsFailed,
    ConsoleNotStarted,
    GatewayNotListening,
    ProbeRunFailed,
    SwapFailed,
)
from controller.audit.judges import DENY_BODY, Probe, _proxy_refused, host_port, ip_forms, through_proxy
from controller.audit.probes import ProbePlan, build_probes
from controller.audit.report import REPORT_VERSION, AuditReport, ProbeResult, render_table
from controller.audit.runner import audit, run_audit
from controller.audit.swap import SwapRecord
from controller.audit.vm import audit_vm
from controller.audit.targets import (
    ALLOWED_NAME,
    DENIED_NAME,
    FIXTURE_ORIGIN,
    SWAP_ORIGIN,
    TARGET_DOMAIN,
    TARGET_HTTP_PORT,
    AuditTargets,
    effective_policy,
)
from controller.audit.topology import AuditTopology, audit_topology

__all__ = [
    "ALLOWED_NAME", "DENIED_NAME", "DENY_BODY", "FIXTURE_ORIGIN", "REPORT_VERSION", "SWAP_ORIGIN", "TARGET_DOMAIN",
    "TARGET_HTTP_PORT", "AuditError", "AuditImageMissing", "AuditReport", "AuditTargets", "AuditTargetsFailed",
    "AuditTopology", "ConsoleNotStarted", "GatewayNotListening", "HostCanary", "Probe", "ProbePlan", "ProbeResult",
    "ProbeRunFailed", "SwapFailed", "SwapRecord",
    "_proxy_refused", "audit", "audit_vm", "build_probes", "audit_topology",
    "effective_policy", "host_port", "ip_forms", "render_table", "run_audit", "through_proxy",
]
