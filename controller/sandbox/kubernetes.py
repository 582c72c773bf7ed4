"""Kubernetes backend: the guest desktop and its gateway as Pods in a namespace the user names (the
official ``kubernetes`` client, extra ``[kubernetes]``).

Per sandbox (id ``dk-<8 hex>``), every object labelled ``desktop-sandbox.sandbox=<id>``,
``desktop-sandbox.role=<role>`` and ``app.kubernetes.io/managed-by=desktop-sandbox``, with the starter
in annotations (``desktop-sandbox.owner``, ``desktop-sandbox.owner-id``: their values are not valid label
values), all in ``$DESKTOP_SANDBOX_K8S_NAMESPACE`` (or the kubeconfig context's namespace; never a
default chosen here):

* Secret ``<id>-agent`` (role ``secret``): the agent's bearer token and the X cookie. The token is
  mounted into the desktop Pod's ``agent`` container only; the cookie into both of its containers.
* ConfigMap ``<id>-policy`` (role ``policy``): the network policy, mounted into the gateway only;
  ConfigMap ``<id>-session`` (role ``session``): the desktop container's supervisord configuration and
  launch broker, mounted into that container only.
* NetworkPolicy ``<id>-desktop``: the desktop Pod takes no connection at all (the controller's only way
  in is the port-forward through the Kubernetes API, which no Pod network reaches) and may open only
  TCP to the gateway Pod's proxy port: no DNS, nothing else. NetworkPolicy ``<id>-gateway``: the gateway
  takes connections only from its desktop on the proxy port; its way out follows the task's policy
  (:func:`gateway_egress`): nothing for ``deny-all``; DNS to the cluster's resolver plus the allowed
  origins' ports to public addresses (private, link-local, CGNAT and loopback ranges excepted, unless an
  ``allow_addresses`` rule names them) for ``allowlist`` / ``ask``.
* Pod ``<id>-gateway`` (role ``gateway``, uid 1001) running the egress proxy (the image's
  ``images/session/gateway.sh``), and Service ``<id>-gateway`` (its proxy port).
* Pod ``<id>-desktop`` (role ``desktop``): two containers, no user switching inside either, so both run
  without any capability: ``desktop`` (uid 1000, the desktop user: Xvfb, openbox, the demo app, a launch
  broker that starts the agent's allowlisted apps as itself) and ``agent`` (uid 1002: the guest agent).
  Containers of a Pod have their own PID namespaces and file systems: the desktop user can neither see
  nor signal the agent, nor read its token. They share only emptyDir volumes: the X socket directory,
  the broker's socket directory, and the home (read-only in the agent container, for ``/v1/files``).
  ``gateway`` resolves to the Service's cluster IP through ``hostAliases``; the Pod has no DNS
  (``dnsPolicy: None``, resolver 127.0.0.1).

Every container: ``runAsNonRoot``, ``readOnlyRootFilesystem``, capabilities ``drop: [ALL]``,
``allowPrivilegeEscalation: false``, ``seccompProfile: RuntimeDefault``; Pods:
``automountServiceAccountToken: false``, ``enableServiceLinks: false``, requests and limits on every
container, emptyDir volumes sized like the Docker backend's tmpfs budget
(:data:`controller.sandbox.docker_hardening.DESKTOP_TMPFS_MIB`; memory-backed, so they count against the
memory limit as tmpfs does under Docker).

Start: NetworkPolicies before the Pods (they apply from a Pod's first packet), then the gateway and its
Service, then the desktop with ``hostAliases`` to the Service's cluster IP; both Pods running; a local
listener on 127.0.0.1 forwards each connection through a port-forward of the Kubernetes API to the
agent's port (:class:`PortForwarder`); the agent answers (``wait_agent_ready``); then the **enforcement
probe** (:func:`probe_network_policy`): from the desktop container, the gateway's proxy port must
answer and the cluster's API server (``KUBERNETES_SERVICE_HOST``, which every Pod is told) must not. A
cluster whose network plugin ignores NetworkPolicy fails the second check and the start is refused,
everything removed. Teardown deletes every object carrying the sandbox's label (also after a failed
start, Ctrl-C, SIGTERM); ``down --all --backend kubernetes`` deletes every sandbox's objects in the
namespace.

This module is the backend's class and its start sequence; the manifests (and the options, names and
paths they share) are :mod:`controller.sandbox.kubernetes_manifests`, the cluster plumbing (client,
exec, port-forward, enforcement probe, listing and deletion by label) :mod:`controller.sandbox.kubernetes_cluster`;
both are re-exported here, so ``controller.sandbox.kubernetes`` still names all of it.

What this module could not be run against here: a cluster (none can run on the development machine).
The manifests are validated against the Kubernetes OpenAPI schemas, and the start and teardown logic
runs against the official client over a recorded-API test double (``tests/kubernetes``).
"""

from __future__ import annotations

import json
import os
import secrets
import time
from typing import Any, Callable, Sequence

from controller.sandbox import (
    Capabilities,
    DECISIONS_READ_MAX_BYTES, BackendUnavailable, ExecResult, NetworkTopology, Sandbox, SandboxError, SandboxSpec,
    parse_decision_lines, parse_decision_log, signals_deferred, wait_agent_ready,
)
from controller.sandbox.backend_setup import decisions_since_argv, owner_labels
from controller.sandbox.kubernetes_cluster import (  # noqa: F401 - re-exported: the backend's cluster API
    EXEC_MAX_BYTES, PROBE, Apis, PortForwarder, _api_error, _delete, _import_client, _list, _KINDS, connect,
    list_sandboxes, probe_network_policy, remove_sandbox, resolve_namespace, stream_exec,
)
from controller.sandbox.kubernetes_manifests import (  # noqa: F401 - re-exported: the backend's manifest API
    AGENT_DIR, AGENT_PORT, AGENT_UID, ASK_REFUSED, BROKER_PY, CONTEXT_ENV, DECISION_LOG, DEFAULT_IMAGE, DESKTOP_UID,
    GATEWAY_HOSTNAME, GATEWAY_UID, ID_PREFIX, IMAGE_ENV, LABEL_MANAGED, LABEL_NAME, LAUNCH_DIR, MANAGED_BY,
    NAMESPACE_ENV, POLICY_DIR, PRIVATE_RANGES, PROXY_PORT, PULL_SECRET_ENV, PYTHON, RENDER_NOTE, SECRETS_DIR,
    SESSION_CONF, SESSION_DIR, SRC, KubernetesOptions, gateway_egress, labels, render_for_task, render_manifests,
    render_yaml,
)
from controller.text import clean, clean_lines

POD_POLL_S = 1.0
"""Seconds between two reads of a starting Pod (scheduling and image pulls take seconds)."""


class KubernetesSandbox(Sandbox):
    """A sandbox on a Kubernetes cluster (module docstring). Create with ``KubernetesSandbox.start``."""

    backend_name = "kubernetes"
    id_prefix = ID_PREFIX
    default_ready_timeout = 300.0  # includes the image pull on a fresh node
    capabilities = Capabilities()  # rendered pools only (render --pool): nothing at runtime

    def __init__(self, apis: Apis, namespace: str, sandbox_id: str) -> None:
        self.apis = apis
        self.namespace = namespace
        self.id = sandbox_id
        self.timings: dict[str, float] = {}
        self._forwarder: PortForwarder | None = None
        self._gateway_ip = ""
        self._closed = False
        self.created: list[str] = []
        """``kind/name`` of every object this start created, in order."""

    # -- class side -------------------------------------------------------------------------------------

    @classmethod
    def make_options(cls, *, image: str | None = None, detached: bool = False) -> KubernetesOptions:
        return KubernetesOptions(image=image or os.environ.get(IMAGE_ENV) or DEFAULT_IMAGE, detached=detached,
                                 context=os.environ.get(CONTEXT_ENV) or None,
                                 pull_secret=os.environ.get(PULL_SECRET_ENV) or None)

    @classmethod
    def ensure_image(cls, options: KubernetesOptions, say: Callable[[str], None]) -> KubernetesOptions:
        """Nothing is built here: the cluster pulls ``options.image``. Resolves the namespace (refusing
        when none is named) and warns when the image names no registry."""
        options.namespace = resolve_namespace(options)
        if "/" not in options.image.split(":", 1)[0]:
            say(f"image {options.image} names no registry: the cluster's nodes must already have it "
                "(docs/kubernetes.md, \"Setting it up\": push it to a registry)")
        return options

    @classmethod
    def _apis(cls, options: KubernetesOptions) -> Apis:
        return connect(options)

    @classmethod
    def start(cls, spec: SandboxSpec | None = None, options: KubernetesOptions | None = None,
              apis: Apis | None = None) -> "KubernetesSandbox":
        """Create the sandbox's objects, wait until the agent answers and NetworkPolicy enforcement is
        proven (:func:`probe_network_policy`). Raises SandboxError (also for a task in mode ``ask``,
        :data:`ASK_REFUSED`, before anything is contacted); everything created is deleted first
        (also on Ctrl-C/SIGTERM). Raises BackendUnavailable when no cluster or namespace is configured."""
        spec = spec or SandboxSpec()
        if json.loads(spec.policy_json()).get("mode") == "ask":
            raise SandboxError(ASK_REFUSED)  # before anything is contacted
        options = options or cls.make_options()
        options.namespace = resolve_namespace(options)
        apis = apis or cls._apis(options)
        sandbox = cls(apis, options.namespace, f"{ID_PREFIX}{secrets.token_hex(4)}")
        sandbox._start_or_close(lambda: sandbox._start(spec, options))
        return sandbox

    @classmethod
    def _configured(cls) -> tuple[Apis, str] | None:
        """The cluster and namespace when one is configured; None when the user never set one up (no
        sandbox of this backend can exist then)."""
        options = cls.make_options()
        try:
            namespace = resolve_namespace(options)
        except BackendUnavailable:
            return None
        options.namespace = namespace
        return connect(options), namespace

    @classmethod
    def list_all(cls) -> dict[str, dict[str, str]]:
        configured = cls._configured()
        if configured is None:
            return {}
        try:
            return list_sandboxes(*configured)
        except Exception as exc:  # noqa: BLE001 - ApiException, connection errors
            raise BackendUnavailable(f"cannot list sandboxes in the cluster: {_api_error(exc)}") from None

    @classmethod
    def remove(cls, sandbox_id: str) -> list[str]:
        configured = cls._configured()
        if configured is None:
            return []
        try:
            return remove_sandbox(*configured, sandbox_id)
        except Exception as exc:  # noqa: BLE001
            raise BackendUnavailable(f"cannot remove {clean(sandbox_id, 40)} from the cluster: "
                                     f"{_api_error(exc)}") from None

    # -- start sequence -----------------------------------------------------------------------------------

    def _create(self, manifest: dict[str, Any]) -> Any:
        kind = manifest["kind"]
        name = manifest["metadata"]["name"]
        method = {"Secret": (self.apis.core, "create_namespaced_secret"),
                  "ConfigMap": (self.apis.core, "create_namespaced_config_map"),
                  "NetworkPolicy": (self.apis.networking, "create_namespaced_network_policy"),
                  "Pod": (self.apis.core, "create_namespaced_pod"),
                  "Service": (self.apis.core, "create_namespaced_service")}[kind]
        self.created.append(f"{kind}/{name}")  # before the call: a half-known outcome is deleted too
        try:
            return getattr(method[0], method[1])(self.namespace, manifest)
        except Exception as exc:  # noqa: BLE001 - ApiException: forbidden, quota, invalid
            raise SandboxError(f"cannot create {kind} {name} in {self.namespace}: {_api_error(exc)}") from None

    def _start(self, spec: SandboxSpec, options: KubernetesOptions) -> None:
        t0 = time.monotonic()
        from controller.sandbox import reap

        apis, namespace = self.apis, self.namespace
        try:
            reap(list_sandboxes(apis, namespace), lambda sid: remove_sandbox(apis, namespace, sid))
        except Exception as exc:  # noqa: BLE001 - ApiException (forbidden, namespace missing), connection errors
            raise SandboxError(f"cannot list sandboxes in namespace {namespace}: {_api_error(exc)}") from None
        self._checkpoint()
        self._token = secrets.token_urlsafe(32)
        self._image_id = options.image
        cookie = secrets.token_hex(16)
        # the Service's address is known only once it exists: render with a placeholder, create in order,
        # and fill the desktop's hostAliases in just before it is created
        manifests = render_manifests(self.id, spec, options, token=self._token, x_cookie=cookie,
                                     gateway_ip="192.0.2.1", owner=owner_labels())
        desktop_pod = manifests.pop()
        for manifest in manifests:
            created = self._create(manifest)
            self._checkpoint()
            if manifest["kind"] == "Service":
                self._gateway_ip = created.spec.cluster_ip
        if not self._gateway_ip or self._gateway_ip == "None":
            raise SandboxError(f"the gateway Service {self.id}-gateway has no cluster IP")
        desktop_pod["spec"]["hostAliases"][0]["ip"] = self._gateway_ip
        self._create(desktop_pod)
        self._checkpoint()
        self.timings["objects_created"] = time.monotonic() - t0
        deadline = t0 + spec.ready_timeout
        for role in ("gateway", "desktop"):
            self._wait_running(f"{self.id}-{role}", deadline)
        self.timings["pods_running"] = time.monotonic() - t0
        self._forwarder = self.apis.forward(f"{self.id}-desktop", AGENT_PORT)
        self._agent_url = self._forwarder.url
        wait_agent_ready(self.id, self._agent_url, self._token, timeout=max(1.0, deadline - time.monotonic()),
                         check_alive=self._check_alive, timings=self.timings, t0=t0,
                         describe=lambda: "desktop output:\n" + self.logs("desktop", 40) + "\nagent output:\n"
                         + self.logs("agent", 20) + "\ngateway output:\n" + self.logs("gateway", 20))
        self._checkpoint()
        probe_network_policy(lambda argv: self.exec_in_guest(argv, timeout=30), self._gateway_ip,
                             deadline_s=options.netpol_probe_s)
        self.timings["network_policy_proven"] = time.monotonic() - t0

    def _pod_problem(self, pod: Any) -> str | None:
        """Why a Pod will not come up (image pull, crash, failed), or None while it may still."""
        status = pod.status
        if status is None:
            return None
        if status.phase in ("Failed", "Succeeded"):
            return f"phase {status.phase}: {status.reason or ''} {status.message or ''}".strip()
        for cs in status.container_statuses or []:
            waiting = cs.state.waiting if cs.state else None
            if waiting and waiting.reason in ("ErrImagePull", "ImagePullBackOff", "InvalidImageName",
                                              "CreateContainerConfigError", "CrashLoopBackOff",
                                              "CreateContainerError"):
                return f"container {cs.name}: {waiting.reason}: {waiting.message or ''}".strip()
            terminated = cs.state.terminated if cs.state else None
            if terminated is not None:
                return f"container {cs.name} exited ({terminated.exit_code}): {terminated.reason or ''}".strip()
        return None

    def _wait_running(self, name: str, deadline: float) -> None:
        while True:
            self._checkpoint()
            try:
                pod = self.apis.core.read_namespaced_pod(name, self.namespace)
            except Exception as exc:  # noqa: BLE001
                raise SandboxError(f"cannot read Pod {name}: {_api_error(exc)}") from None
            problem = self._pod_problem(pod)
            if problem:
                role = name.rsplit("-", 1)[-1]
                raise SandboxError(f"Pod {name} will not start: {clean(problem, 500)}\n"
                                   + clean_lines(self.logs(role, 40)))
            if pod.status is not None and pod.status.phase == "Running" and all(
                    cs.ready or (cs.state and cs.state.running) for cs in pod.status.container_statuses or []):
                if name.endswith("-desktop"):  # what runs the guest: the digest the node pulled
                    self._image_id = next((cs.image_id for cs in pod.status.container_statuses or []
                                           if cs.name == "desktop" and cs.image_id), self._image_id)
                return
            if time.monotonic() > deadline:
                raise SandboxError(f"Pod {name} not running within the start timeout "
                                   f"(phase {getattr(pod.status, 'phase', None)})")
            time.sleep(POD_POLL_S)  # poll interval: scheduling and image pulls take seconds

    def _check_alive(self) -> None:
        self._checkpoint()
        for role in ("gateway", "desktop"):
            try:
                pod = self.apis.core.read_namespaced_pod(f"{self.id}-{role}", self.namespace)
            except Exception as exc:  # noqa: BLE001
                raise SandboxError(f"cannot read Pod {self.id}-{role}: {_api_error(exc)}") from None
            problem = self._pod_problem(pod)
            if problem:
                raise SandboxError(f"Pod {self.id}-{role} stopped: {clean(problem, 500)}")

    # -- instance side ------------------------------------------------------------------------------------

    def logs(self, role: str = "desktop", tail: int = 200) -> str:
        """The last ``tail`` lines of output: ``desktop`` (the session), ``agent``, or ``gateway``."""
        pod, container = (f"{self.id}-gateway", "gateway") if role == "gateway" else (f"{self.id}-desktop", role)
        try:
            return self.apis.core.read_namespaced_pod_log(pod, self.namespace, container=container, tail_lines=tail)
        except Exception:  # noqa: BLE001 - not started yet, or gone
            return ""

    def topology(self) -> NetworkTopology:
        if not self._gateway_ip:
            raise SandboxError(f"sandbox {self.id} has no gateway")
        try:
            gateway = self.apis.core.read_namespaced_pod(f"{self.id}-gateway", self.namespace)
        except Exception as exc:  # noqa: BLE001
            raise SandboxError(f"sandbox {self.id} is gone: {_api_error(exc)}") from None
        return NetworkTopology(
            backend=self.backend_name, proxy_host=self._gateway_ip, proxy_port=PROXY_PORT,
            gateway_guest_ip=self._gateway_ip, gateway_egress_ip=(gateway.status.pod_ip if gateway.status else None),
            agent_port=AGENT_PORT, agent_host_port=self._forwarder.local_port if self._forwarder else 0,
            networks={"namespace": self.namespace},
        )

    def exec_in_guest(self, argv: Sequence[str], *, timeout: float | None = None) -> ExecResult:
        """Run ``argv`` in the desktop container (its user is the desktop user's, uid 1000)."""
        return self.apis.exec(f"{self.id}-desktop", "desktop", list(argv), timeout)

    def decision_log(self) -> list[dict[str, Any]]:
        result = self.apis.exec(f"{self.id}-gateway", "gateway", ["cat", DECISION_LOG], 30)
        if result.exit_code != 0:
            return []
        return parse_decision_log(result.stdout.decode("utf-8", "replace"))

    def decisions_since(self, start: int, max_lines: int = 1000,
                        max_bytes: int = DECISIONS_READ_MAX_BYTES) -> list[Any]:
        """Lines ``start``.. of the gateway's decision log, read in the gateway container (one exec)."""
        result = self.apis.exec(f"{self.id}-gateway", "gateway",
                                decisions_since_argv(start, max_lines, max_bytes, DECISION_LOG), 30)
        return parse_decision_lines(result.stdout)

    def close(self) -> None:
        if self._closed:
            return
        with signals_deferred():  # a second Ctrl-C waits until everything is deleted
            self._close_agent_client()
            if self._forwarder is not None:
                self._forwarder.close()
            try:
                remove_sandbox(self.apis, self.namespace, self.id)
            except Exception as exc:  # noqa: BLE001 - the API is unreachable: say what stays
                raise SandboxError(f"cannot delete sandbox {self.id} from {self.namespace}: {_api_error(exc)}; "
                                   f"`desktop-sandbox down --all --backend kubernetes` removes it later") from None
            self._closed = True

