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

Over 400 lines: the manifests and the start sequence that creates them in order are one unit (the
backend's promises are read in the manifests), beside the cluster plumbing (port-forward, exec) they need.

What this module could not be run against here: a cluster (none can run on the development machine).
The manifests are validated against the Kubernetes OpenAPI schemas, and the start and teardown logic
runs against the official client over a recorded-API test double (``tests/kubernetes``).
"""

from __future__ import annotations

import ipaddress
import json
import os
import secrets
import select
import shlex
import socket
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from controller.sandbox import (
    DECISIONS_READ_MAX_BYTES,
    LABEL_DETACHED,
    LABEL_OWNER,
    LABEL_OWNER_ID,
    LABEL_ROLE,
    LABEL_SANDBOX,
    BackendUnavailable,
    ExecResult,
    NetworkTopology,
    Sandbox,
    SandboxError,
    SandboxSpec,
    parse_decision_lines,
    parse_decision_log,
    signals_deferred,
    wait_agent_ready,
    with_timeout,
)
from controller.sandbox.docker_hardening import DESKTOP_TMPFS_MIB
from controller.text import clean, clean_lines

NAMESPACE_ENV = "DESKTOP_SANDBOX_K8S_NAMESPACE"
"""The namespace sandboxes go in (else the kubeconfig context's namespace)."""
IMAGE_ENV = "DESKTOP_SANDBOX_K8S_IMAGE"
"""The guest image as the cluster pulls it (a registry reference), when ``--image`` is not given."""
CONTEXT_ENV = "DESKTOP_SANDBOX_K8S_CONTEXT"
"""The kubeconfig context to use (default: the current one); ``KUBECONFIG`` names the file as usual."""
PULL_SECRET_ENV = "DESKTOP_SANDBOX_K8S_PULL_SECRET"
"""Name of an image pull Secret in the namespace, when the registry needs one."""

DEFAULT_IMAGE = "desktop-sandbox:latest"
ID_PREFIX = "dk-"
LABEL_MANAGED = "app.kubernetes.io/managed-by"
LABEL_NAME = "app.kubernetes.io/name"
MANAGED_BY = "desktop-sandbox"

AGENT_PORT = 8000
PROXY_PORT = 3128
GATEWAY_HOSTNAME = "gateway"
DESKTOP_UID, GATEWAY_UID, AGENT_UID = 1000, 1001, 1002
SRC = "/opt/desktop-sandbox/src"
PYTHON = "/opt/desktop-sandbox/bin/python"
SECRETS_DIR = "/run/desktop-sandbox-secrets"
SESSION_DIR = "/etc/desktop-sandbox/session"
POLICY_DIR = "/etc/desktop-sandbox/policy"
LAUNCH_DIR = "/run/desktop-sandbox-launch"
AGENT_DIR = "/run/desktop-sandbox"
DECISION_LOG = "/var/log/desktop-sandbox/decisions.jsonl"
POD_POLL_S = 1.0
"""Seconds between two reads of a starting Pod (scheduling and image pulls take seconds)."""
EXEC_MAX_BYTES = 16 * 1024 * 1024
"""Most output (bytes, stdout and stderr together) collected from one command run in a Pod."""

PRIVATE_RANGES = ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "169.254.0.0/16", "100.64.0.0/10",
                  "127.0.0.0/8", "0.0.0.0/8", "192.0.0.0/24", "198.18.0.0/15", "224.0.0.0/4", "240.0.0.0/4")
"""IPv4 ranges the gateway's egress NetworkPolicy excludes from ``0.0.0.0/0`` (the gateway refuses them
too; this keeps the Pod network from reaching them should the proxy be wrong)."""

SESSION_CONF = f"""\
; The desktop container's session on Kubernetes (controller/sandbox/kubernetes.py): everything runs as
; the desktop user, the container's own uid; no program switches users. The agent runs in a container of
; its own and reaches the display through the shared X socket directory and this container's launch
; broker through the shared {LAUNCH_DIR}.
[supervisord]
nodaemon=true
logfile=/dev/null
logfile_maxbytes=0
pidfile=/tmp/supervisord.pid
childlogdir=/tmp

[program:xvfb]
command={PYTHON} {SRC}/images/session/xserver.py
environment=XSERVER_AUTH="/home/sandbox/.Xauthority"
priority=10
autorestart=true
startsecs=1
stdout_logfile=/dev/fd/1
stdout_logfile_maxbytes=0
redirect_stderr=true

[program:openbox]
command={PYTHON} {SRC}/images/session/await.py --display -- openbox
priority=20
autorestart=true
startsecs=0
stdout_logfile=/dev/fd/1
stdout_logfile_maxbytes=0
redirect_stderr=true

[program:launcher]
command={PYTHON} {SESSION_DIR}/broker.py --socket {LAUNCH_DIR}/launch.sock --client agent --user sandbox --apps %(ENV_AGENT_APPS_FILE)s
priority=25
autorestart=true
startsecs=0
stdout_logfile=/dev/fd/1
stdout_logfile_maxbytes=0
redirect_stderr=true

[program:pickup]
command={PYTHON} {SRC}/images/session/pickup.py
priority=40
autorestart=unexpected
exitcodes=0
startsecs=0
stdout_logfile=/dev/fd/1
stdout_logfile_maxbytes=0
redirect_stderr=true
"""
"""supervisord configuration of the desktop container (ConfigMap ``<id>-session``)."""

BROKER_PY = '''\
"""The launch broker of the desktop container on Kubernetes: guest.launch.serve_broker (same allowlist,
same peer check: only the agent's uid may ask), run as the desktop user itself, so an app is started
without switching users (which would need capabilities this container does not have)."""
import subprocess
import sys

import guest.launch as launch

_popen = subprocess.Popen


def _as_self(argv, **kwargs):
    for key in ("user", "group", "extra_groups"):
        kwargs.pop(key, None)
    return _popen(argv, **kwargs)


launch.subprocess.Popen = _as_self
sys.argv[0] = "launcher"
sys.path.insert(0, "/opt/desktop-sandbox/src/images/session")
import launcher  # noqa: E402

sys.exit(launcher.main())
'''
"""The broker wrapper (ConfigMap ``<id>-session``, ``broker.py``)."""


@dataclass
class KubernetesOptions:
    """Where and how sandboxes run on the cluster.

    ``image``: the guest image as the cluster pulls it (push ``desktop-sandbox:latest`` to a registry:
    README, operators). ``namespace``: required (``$DESKTOP_SANDBOX_K8S_NAMESPACE`` or the kubeconfig
    context's). ``context``: kubeconfig context (None: current). ``image_pull_policy``, ``pull_secret``
    (an image pull Secret's name or None). Requests and limits (Kubernetes quantities): ``desktop_memory``
    (limit = request, as Docker's ``mem_limit``), ``desktop_cpu`` / ``desktop_cpu_limit``,
    ``agent_memory``, ``gateway_memory``, ``gateway_cpu`` / ``gateway_cpu_limit``. ``detached``: outlives
    its starter, never reaped. ``apps_file``: the agent's allowlist in the image; ``agent_args``: extra
    ``python -m guest serve`` options; ``extra_labels``: more labels on every object (valid label values);
    ``netpol_probe_s``: see :func:`probe_network_policy`.
    """

    image: str = DEFAULT_IMAGE
    namespace: str = ""
    context: str | None = None
    image_pull_policy: str = "IfNotPresent"
    pull_secret: str | None = None
    desktop_memory: str = "2Gi"
    desktop_cpu: str = "500m"
    desktop_cpu_limit: str = "2"
    agent_memory: str = "256Mi"
    gateway_memory: str = "512Mi"
    gateway_cpu: str = "100m"
    gateway_cpu_limit: str = "1"
    detached: bool = False
    apps_file: str = ""
    agent_args: list[str] = field(default_factory=list)
    extra_labels: dict[str, str] = field(default_factory=dict)
    netpol_probe_s: float = 30.0
    """Seconds the enforcement probe waits for the network plugin to block the API server."""


# -- manifests -----------------------------------------------------------------------------------------

def labels(sandbox_id: str, role: str, options: KubernetesOptions) -> dict[str, str]:
    """The labels of one object: sandbox id, role, the app's name and manager, ``detached``, extras."""
    out = {LABEL_SANDBOX: sandbox_id, LABEL_ROLE: role, LABEL_NAME: "desktop-sandbox", LABEL_MANAGED: MANAGED_BY,
           **options.extra_labels}
    if options.detached:
        out[LABEL_DETACHED] = "1"
    return out


def _meta(name: str, sandbox_id: str, role: str, options: KubernetesOptions, owner: Mapping[str, str]) -> dict:
    return {"name": name, "namespace": options.namespace, "labels": labels(sandbox_id, role, options),
            "annotations": dict(owner)}


def _select(sandbox_id: str, role: str) -> dict[str, Any]:
    return {"matchLabels": {LABEL_SANDBOX: sandbox_id, LABEL_ROLE: role}}


def _security() -> dict[str, Any]:
    return {"runAsNonRoot": True, "readOnlyRootFilesystem": True, "allowPrivilegeEscalation": False,
            "privileged": False, "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"}}


def _empty_dir(name: str, mib: int) -> dict[str, Any]:
    return {"name": name, "emptyDir": {"medium": "Memory", "sizeLimit": f"{mib}Mi"}}


def _origin_ports(origins: Sequence[str]) -> list[int]:
    ports = set()
    for origin in origins:
        parsed = urllib.parse.urlsplit(origin)
        port = parsed.port or {"http": 80, "https": 443}.get(parsed.scheme)
        if port:
            ports.add(port)
    return sorted(ports)


ASK_REFUSED = ("[network] mode \"ask\" is not available on the kubernetes backend: its gateway Pod runs the "
               "proxy without the control API through which a person answers origin requests (every held "
               "connection would be refused at its deadline); use --backend docker or vm, or mode allowlist")
"""Why a task in mode ``ask`` is refused here (render and start alike)."""


def gateway_egress(policy: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The gateway NetworkPolicy's egress rules for ``policy`` (the task's ``[network]`` table as a
    mapping): ``[]`` (nothing out) for ``deny-all``; for ``allowlist``: DNS (UDP and TCP 53) to the
    cluster's resolver (``kube-system`` Pods ``k8s-app=kube-dns``), then TCP to public IPv4 addresses
    (``0.0.0.0/0`` except :data:`PRIVATE_RANGES`) on the allowed origins' ports, and to each
    ``allow_addresses`` network on those ports. Raises ValueError for mode ``ask`` (:data:`ASK_REFUSED`)."""
    mode = policy.get("mode", "deny-all")
    if mode == "deny-all":
        return []
    if mode == "ask":
        raise ValueError(ASK_REFUSED)
    ports = set(_origin_ports(policy.get("allow") or ()))
    if not ports:
        return []
    dns = {"to": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
                   "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}],
           "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]}
    tcp = [{"protocol": "TCP", "port": p} for p in sorted(ports)]
    rules = [dns, {"to": [{"ipBlock": {"cidr": "0.0.0.0/0", "except": list(PRIVATE_RANGES)}}], "ports": tcp}]
    blocks = []
    for address in policy.get("allow_addresses") or ():
        net = ipaddress.ip_network(address, strict=False)
        blocks.append({"ipBlock": {"cidr": str(net)}})
    if blocks:
        rules.append({"to": blocks, "ports": tcp})
    return rules


def render_manifests(sandbox_id: str, spec: SandboxSpec, options: KubernetesOptions, *, token: str,
                     x_cookie: str, gateway_ip: str, owner: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
    """Every object of one sandbox as a Kubernetes manifest (JSON-ready dicts), in the order the backend
    creates them: Secret, the two ConfigMaps, the two NetworkPolicies, the gateway Pod, its Service, the
    desktop Pod. ``token``: the agent's bearer token; ``x_cookie``: 32 hex digits; ``gateway_ip``: the
    gateway Service's cluster IP (the desktop's ``hostAliases``); ``owner``: annotations naming the
    starter. Raises ValueError for a policy whose ``allow_addresses`` are not addresses, or in mode
    ``ask`` (:data:`ASK_REFUSED`)."""
    owner = dict(owner or {})
    policy = json.loads(spec.policy_json())
    if policy.get("mode") == "ask":
        raise ValueError(ASK_REFUSED)
    pull = [{"name": options.pull_secret}] if options.pull_secret else []
    tmpfs = DESKTOP_TMPFS_MIB
    secret = {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
              "metadata": _meta(f"{sandbox_id}-agent", sandbox_id, "secret", options, owner),
              "stringData": {"token": token, "xcookie": x_cookie}}
    policy_cm = {"apiVersion": "v1", "kind": "ConfigMap",
                 "metadata": _meta(f"{sandbox_id}-policy", sandbox_id, "policy", options, owner),
                 "data": {"policy.json": spec.policy_json()}}
    session_cm = {"apiVersion": "v1", "kind": "ConfigMap",
                  "metadata": _meta(f"{sandbox_id}-session", sandbox_id, "session", options, owner),
                  "data": {"session.conf": SESSION_CONF, "broker.py": BROKER_PY}}
    desktop_np = {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
                  "metadata": _meta(f"{sandbox_id}-desktop", sandbox_id, "desktop", options, owner),
                  "spec": {"podSelector": _select(sandbox_id, "desktop"), "policyTypes": ["Ingress", "Egress"],
                           "ingress": [],
                           "egress": [{"to": [{"podSelector": _select(sandbox_id, "gateway")}],
                                       "ports": [{"protocol": "TCP", "port": PROXY_PORT}]}]}}
    gateway_np = {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
                  "metadata": _meta(f"{sandbox_id}-gateway", sandbox_id, "gateway", options, owner),
                  "spec": {"podSelector": _select(sandbox_id, "gateway"), "policyTypes": ["Ingress", "Egress"],
                           "ingress": [{"from": [{"podSelector": _select(sandbox_id, "desktop")}],
                                        "ports": [{"protocol": "TCP", "port": PROXY_PORT}]}],
                           "egress": gateway_egress(policy)}}
    pod_common = {"automountServiceAccountToken": False, "enableServiceLinks": False, "restartPolicy": "Never",
                  "terminationGracePeriodSeconds": 5, **({"imagePullSecrets": pull} if pull else {})}
    gateway_pod = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": _meta(f"{sandbox_id}-gateway", sandbox_id, "gateway", options, owner),
        "spec": {**pod_common,
                 "securityContext": {"runAsNonRoot": True, "runAsUser": GATEWAY_UID, "runAsGroup": GATEWAY_UID,
                                     "fsGroup": GATEWAY_UID, "seccompProfile": {"type": "RuntimeDefault"}},
                 "containers": [{
                     "name": "gateway", "image": options.image, "imagePullPolicy": options.image_pull_policy,
                     "command": [f"{SRC}/images/session/gateway.sh"],
                     "env": [{"name": "HOME", "value": "/home/gateway"},
                             {"name": "GATEWAY_POLICY_FILE", "value": f"{POLICY_DIR}/policy.json"},
                             {"name": "GATEWAY_PROXY_PORT", "value": str(PROXY_PORT)},
                             {"name": "GATEWAY_DECISION_LOG", "value": DECISION_LOG}],
                     "ports": [{"name": "proxy", "containerPort": PROXY_PORT, "protocol": "TCP"}],
                     "securityContext": _security(),
                     "resources": {"requests": {"cpu": options.gateway_cpu, "memory": options.gateway_memory},
                                   "limits": {"cpu": options.gateway_cpu_limit, "memory": options.gateway_memory}},
                     "volumeMounts": [{"name": "policy", "mountPath": POLICY_DIR, "readOnly": True},
                                      {"name": "tmp", "mountPath": "/tmp"},
                                      {"name": "run", "mountPath": "/run/desktop-sandbox"},
                                      {"name": "log", "mountPath": "/var/log/desktop-sandbox"},
                                      {"name": "home", "mountPath": "/home/gateway"}],
                 }],
                 "volumes": [{"name": "policy", "configMap": {"name": f"{sandbox_id}-policy", "defaultMode": 0o444}},
                             _empty_dir("tmp", 64), _empty_dir("run", 16), _empty_dir("log", 64),
                             _empty_dir("home", 64)]},
    }
    service = {"apiVersion": "v1", "kind": "Service",
               "metadata": _meta(f"{sandbox_id}-gateway", sandbox_id, "gateway", options, owner),
               "spec": {"type": "ClusterIP", "selector": {LABEL_SANDBOX: sandbox_id, LABEL_ROLE: "gateway"},
                        "ports": [{"name": "proxy", "port": PROXY_PORT, "targetPort": PROXY_PORT, "protocol": "TCP"}]}}
    proxy = f"http://{GATEWAY_HOSTNAME}:{PROXY_PORT}"
    apps = options.apps_file or f"{SRC}/images/apps.json"
    display_env = [{"name": "DISPLAY", "value": ":99"},
                   {"name": "SCREEN_WIDTH", "value": str(spec.screen_width)},
                   {"name": "SCREEN_HEIGHT", "value": str(spec.screen_height)},
                   {"name": "SCREEN_DEPTH", "value": "24"},
                   {"name": "AGENT_APPS_FILE", "value": apps}]
    desktop_cmd = (f"{PYTHON} {SRC}/images/session/xauth.py /home/sandbox/.Xauthority < {SECRETS_DIR}/xcookie && "
                   f"exec /usr/bin/supervisord --nodaemon --configuration {SESSION_DIR}/session.conf")
    agent_serve = [PYTHON, "-m", "guest", "serve", "--display", ":99", "--bind", f"0.0.0.0:{AGENT_PORT}",
                   "--token-file", f"{SECRETS_DIR}/token", "--apps", apps, *options.agent_args]
    agent_cmd = (f"{PYTHON} {SRC}/images/session/xauth.py {AGENT_DIR}/xauthority < {SECRETS_DIR}/xcookie && "
                 f"exec {PYTHON} {SRC}/images/session/await.py --display --file {SECRETS_DIR}/token -- "
                 + shlex.join(agent_serve))
    desktop_pod = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": _meta(f"{sandbox_id}-desktop", sandbox_id, "desktop", options, owner),
        "spec": {**pod_common,
                 "hostname": "desktop",
                 "hostAliases": [{"ip": gateway_ip, "hostnames": [GATEWAY_HOSTNAME]}],
                 "dnsPolicy": "None", "dnsConfig": {"nameservers": ["127.0.0.1"]},
                 "securityContext": {"runAsNonRoot": True, "fsGroup": DESKTOP_UID, "supplementalGroups": [DESKTOP_UID],
                                     "seccompProfile": {"type": "RuntimeDefault"}},
                 "containers": [
                     {"name": "desktop", "image": options.image, "imagePullPolicy": options.image_pull_policy,
                      "command": ["/bin/sh", "-c", desktop_cmd],
                      "env": [{"name": "HOME", "value": "/home/sandbox"}, {"name": "USER", "value": "sandbox"},
                              {"name": "XAUTHORITY", "value": "/home/sandbox/.Xauthority"},
                              *display_env,
                              *({"name": k, "value": v} for k, v in (
                                  ("HTTP_PROXY", proxy), ("HTTPS_PROXY", proxy), ("http_proxy", proxy),
                                  ("https_proxy", proxy), ("NO_PROXY", "127.0.0.1,localhost"),
                                  ("no_proxy", "127.0.0.1,localhost")))],
                      "securityContext": {**_security(), "runAsUser": DESKTOP_UID, "runAsGroup": DESKTOP_UID},
                      "resources": {"requests": {"cpu": options.desktop_cpu, "memory": options.desktop_memory},
                                    "limits": {"cpu": options.desktop_cpu_limit, "memory": options.desktop_memory}},
                      "volumeMounts": [
                          {"name": "home", "mountPath": "/home/sandbox"},
                          {"name": "tmp", "mountPath": "/tmp"},
                          {"name": "var-tmp", "mountPath": "/var/tmp"},
                          {"name": "shm", "mountPath": "/dev/shm"},
                          {"name": "x11", "mountPath": "/tmp/.X11-unix"},
                          {"name": "launch", "mountPath": LAUNCH_DIR},
                          {"name": "session", "mountPath": SESSION_DIR, "readOnly": True},
                          {"name": "cookie", "mountPath": SECRETS_DIR, "readOnly": True}]},
                     {"name": "agent", "image": options.image, "imagePullPolicy": options.image_pull_policy,
                      "command": ["/bin/sh", "-c", agent_cmd],
                      "env": [{"name": "HOME", "value": "/home/sandbox"}, {"name": "USER", "value": "agent"},
                              {"name": "XAUTHORITY", "value": f"{AGENT_DIR}/xauthority"},
                              {"name": "AGENT_LAUNCH_SOCKET", "value": f"{LAUNCH_DIR}/launch.sock"},
                              *display_env],
                      "ports": [{"name": "agent", "containerPort": AGENT_PORT, "protocol": "TCP"}],
                      "securityContext": {**_security(), "runAsUser": AGENT_UID, "runAsGroup": AGENT_UID},
                      "resources": {"requests": {"cpu": "100m", "memory": options.agent_memory},
                                    "limits": {"cpu": "1", "memory": options.agent_memory}},
                      "volumeMounts": [
                          {"name": "home", "mountPath": "/home/sandbox", "readOnly": True},
                          {"name": "agent-run", "mountPath": AGENT_DIR},
                          {"name": "agent-tmp", "mountPath": "/tmp"},
                          {"name": "x11", "mountPath": "/tmp/.X11-unix", "readOnly": True},
                          {"name": "launch", "mountPath": LAUNCH_DIR, "readOnly": True},
                          {"name": "agent-secrets", "mountPath": SECRETS_DIR, "readOnly": True}]},
                 ],
                 "volumes": [
                     _empty_dir("home", tmpfs["/home/sandbox"]), _empty_dir("tmp", tmpfs["/tmp"]),
                     _empty_dir("var-tmp", tmpfs["/var/tmp"]), _empty_dir("shm", 256),
                     _empty_dir("x11", 1), _empty_dir("launch", 1),
                     _empty_dir("agent-run", tmpfs["/run/desktop-sandbox"]), _empty_dir("agent-tmp", 16),
                     {"name": "session", "configMap": {"name": f"{sandbox_id}-session", "defaultMode": 0o444}},
                     {"name": "cookie", "secret": {"secretName": f"{sandbox_id}-agent", "defaultMode": 0o440,
                                                   "items": [{"key": "xcookie", "path": "xcookie"}]}},
                     {"name": "agent-secrets", "secret": {"secretName": f"{sandbox_id}-agent", "defaultMode": 0o440,
                                                          "items": [{"key": "token", "path": "token"},
                                                                    {"key": "xcookie", "path": "xcookie"}]}},
                 ]},
    }
    return [secret, policy_cm, session_cm, desktop_np, gateway_np, gateway_pod, service, desktop_pod]


def render_yaml(manifests: Sequence[Mapping[str, Any]], header: str = "") -> str:
    """The manifests as one YAML stream (``---`` between documents), ``header`` as comment lines first."""
    import yaml

    class _Dumper(yaml.SafeDumper):
        def ignore_aliases(self, data: Any) -> bool:  # an object used twice is written out twice: no &id001
            return True

    def _str(dumper: yaml.SafeDumper, value: str) -> Any:  # multi-line text (a ConfigMap's files) as a block
        style = "|" if "\n" in value and all(c.isprintable() or c == "\n" for c in value) else None
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)

    _Dumper.add_representer(str, _str)
    comments = "".join(f"# {line}\n" if line else "#\n" for line in header.splitlines())
    return comments + yaml.dump_all([dict(m) for m in manifests], Dumper=_Dumper, sort_keys=False,
                                    default_flow_style=False, allow_unicode=False)


RENDER_NOTE = """\
desktop-sandbox render --backend kubernetes: the objects of one sandbox, as `up` / `run-task --backend
kubernetes` creates them (in this order; every object labelled desktop-sandbox.sandbox=<id>).
Filled in at start, shown here as placeholders: the Secret's token and X cookie (random per sandbox),
the desktop Pod's hostAliases address (the gateway Service's cluster IP, 192.0.2.1 here), the owner
annotations. Apply only on a cluster whose network plugin enforces NetworkPolicy (README, operators)."""


def render_for_task(spec: SandboxSpec, options: KubernetesOptions, sandbox_id: str = f"{ID_PREFIX}00000000") -> str:
    """What ``desktop-sandbox render --backend kubernetes TASK`` prints: :func:`render_manifests` with
    placeholders for what a start generates (:data:`RENDER_NOTE`), as YAML."""
    manifests = render_manifests(sandbox_id, spec, options, token="GENERATED-AT-START", x_cookie="0" * 32,
                                 gateway_ip="192.0.2.1",
                                 owner={LABEL_OWNER: "HOST:PID", LABEL_OWNER_ID: "set at start"})
    return render_yaml(manifests, RENDER_NOTE)


# -- the cluster ---------------------------------------------------------------------------------------

@dataclass
class Apis:
    """The cluster as the backend uses it: ``core`` (``kubernetes.client.CoreV1Api``), ``networking``
    (``NetworkingV1Api``), ``exec(pod, container, argv, timeout) -> ExecResult`` and ``forward(pod, port)
    -> PortForwarder`` (both over the API server's websocket streams; replaced in tests)."""

    core: Any
    networking: Any
    exec: Callable[[str, str, Sequence[str], float | None], ExecResult]
    forward: Callable[[str, int], "PortForwarder"]


def _import_client() -> Any:
    try:
        import kubernetes  # noqa: F401
    except ImportError:
        raise BackendUnavailable("the kubernetes backend needs the official client: pip install "
                                 "'desktop-sandbox[kubernetes]'") from None
    return kubernetes


def resolve_namespace(options: KubernetesOptions) -> str:
    """``options.namespace``, else ``$DESKTOP_SANDBOX_K8S_NAMESPACE``, else the kubeconfig context's
    namespace. Raises BackendUnavailable when none names one (this backend never picks ``default``)."""
    if options.namespace:
        return options.namespace
    if os.environ.get(NAMESPACE_ENV):
        return os.environ[NAMESPACE_ENV]
    kubernetes = _import_client()
    try:
        _, current = kubernetes.config.list_kube_config_contexts()
    except Exception:  # noqa: BLE001 - no kubeconfig
        current = None
    if options.context:
        try:
            contexts, _ = kubernetes.config.list_kube_config_contexts()
            current = next((c for c in contexts if c.get("name") == options.context), current)
        except Exception:  # noqa: BLE001
            pass
    namespace = ((current or {}).get("context") or {}).get("namespace")
    if not namespace:
        raise BackendUnavailable(f"name the namespace for sandboxes: {NAMESPACE_ENV}=NAME (or a namespace in "
                                 "the kubeconfig context)")
    return namespace


def connect(options: KubernetesOptions) -> Apis:
    """Clients for the cluster the kubeconfig (``KUBECONFIG``, ``options.context``) or the in-cluster
    service account names. Raises BackendUnavailable when there is none or the client is missing."""
    kubernetes = _import_client()
    import kubernetes.stream
    from kubernetes import client, config

    try:
        if os.environ.get("KUBERNETES_SERVICE_HOST") and not os.environ.get("KUBECONFIG"):
            config.load_incluster_config()
        else:
            config.load_kube_config(context=options.context)
    except Exception as exc:  # noqa: BLE001 - ConfigException, missing files
        raise BackendUnavailable(f"no Kubernetes cluster configured: {clean(exc, 300)}") from None
    core = client.CoreV1Api()
    namespace = options.namespace

    def exec_(pod: str, container: str, argv: Sequence[str], timeout: float | None) -> ExecResult:
        return stream_exec(core, namespace, pod, container, argv, timeout)

    def forward(pod: str, port: int) -> PortForwarder:
        return PortForwarder(lambda: kubernetes.stream.portforward(
            core.connect_get_namespaced_pod_portforward, pod, namespace, ports=str(port)), port)

    return Apis(core=core, networking=client.NetworkingV1Api(), exec=exec_, forward=forward)


def stream_exec(core: Any, namespace: str, pod: str, container: str, argv: Sequence[str],
                timeout: float | None, max_bytes: int = EXEC_MAX_BYTES) -> ExecResult:
    """Run ``argv`` in a container through the API server's exec stream; at most ``max_bytes`` of output
    (SandboxError past it) and ``timeout`` seconds (the command is wrapped like ``timeout``: 124)."""
    from kubernetes.stream import stream

    try:
        resp = stream(core.connect_get_namespaced_pod_exec, pod, namespace, container=container,
                      command=with_timeout(list(argv), timeout), stdout=True, stderr=True, stdin=False, tty=False,
                      _preload_content=False)
    except Exception as exc:  # noqa: BLE001 - ApiException, websocket errors
        raise SandboxError(f"exec in {pod}/{container} failed: {clean(exc, 500)}") from None
    out, err, total = [], [], 0
    deadline = time.monotonic() + (timeout + 30 if timeout else 3600)
    while resp.is_open() and time.monotonic() < deadline:
        resp.update(timeout=1)
        for sink, chunk in ((out, resp.read_stdout() if resp.peek_stdout() else ""),
                            (err, resp.read_stderr() if resp.peek_stderr() else "")):
            if chunk:
                data = chunk.encode("utf-8", "surrogateescape") if isinstance(chunk, str) else chunk
                total += len(data)
                if total > max_bytes:
                    resp.close()
                    raise SandboxError(f"exec in {pod}/{container} printed more than {max_bytes} bytes")
                sink.append(data)
    resp.close()
    code = resp.returncode
    return ExecResult(int(code if code is not None else -1), b"".join(out), b"".join(err))


class PortForwarder:
    """A listener on 127.0.0.1 (a free port) whose every accepted connection is piped through a new
    port-forward stream to ``port`` of the Pod: what ``kubectl port-forward`` does, so the agent is
    reached at ``http://127.0.0.1:<local_port>``. ``open_stream()`` returns the client's ``PortForward``
    (``.socket(port)``, ``.close()``)."""

    def __init__(self, open_stream: Callable[[], Any], port: int) -> None:
        self._open = open_stream
        self.port = port
        self._server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._server.bind(("127.0.0.1", 0))
        self._server.listen(16)
        self.local_port = self._server.getsockname()[1]
        self._closed = threading.Event()
        threading.Thread(target=self._accept, name=f"port-forward-{self.local_port}", daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.local_port}"

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            threading.Thread(target=self._pipe, args=(conn,), daemon=True).start()

    def _pipe(self, conn: socket.socket) -> None:
        try:
            forward = self._open()
            remote = forward.socket(self.port)
        except Exception:  # noqa: BLE001 - the Pod is gone or the API refused: the client sees a reset
            conn.close()
            return
        try:
            pair = [conn, remote]
            while not self._closed.is_set():
                ready, _, _ = select.select(pair, [], [], 1.0)
                for sock in ready:
                    data = sock.recv(65536)
                    if not data:
                        return
                    (remote if sock is conn else conn).sendall(data)
        except OSError:
            return
        finally:
            conn.close()
            try:
                forward.close()
            except Exception:  # noqa: BLE001
                pass

    def close(self) -> None:
        """Stop listening; connections in flight end within a second."""
        self._closed.set()
        try:
            self._server.close()
        except OSError:
            pass


PROBE = """\
import socket, sys
host, port = sys.argv[1], int(sys.argv[2])
try:
    socket.create_connection((host, port), timeout=float(sys.argv[3])).close()
except OSError as exc:
    print(type(exc).__name__, exc)
    sys.exit(1)
print("connected")
"""
"""``python -c PROBE HOST PORT TIMEOUT``: exit 0 when a TCP connection opens, 1 when it does not."""


def probe_network_policy(run: Callable[[Sequence[str]], ExecResult], gateway_ip: str, *,
                         deadline_s: float = 30.0, connect_timeout_s: float = 3.0) -> None:
    """Prove from the desktop container that NetworkPolicy is enforced for this sandbox: the gateway's
    proxy port answers (the probe works), and the API server (``$KUBERNETES_SERVICE_HOST``) does not --
    retried until ``deadline_s`` (a plugin may program a new Pod's rules a moment after it starts).

    ``run(argv)`` runs a command in the desktop container. Raises SandboxError naming what was reached
    (enforcement unproven: the caller removes the sandbox)."""
    positive = run([PYTHON, "-c", PROBE, gateway_ip, str(PROXY_PORT), str(connect_timeout_s)])
    if positive.exit_code != 0:
        raise SandboxError(f"the desktop cannot reach its gateway's proxy {gateway_ip}:{PROXY_PORT}: "
                           f"{clean(positive.stdout.decode('utf-8', 'replace'), 300)}")
    check = ("import os, subprocess, sys; h = os.environ.get('KUBERNETES_SERVICE_HOST'); "
             "p = os.environ.get('KUBERNETES_SERVICE_PORT', '443'); "
             "sys.exit(3) if not h else "
             "sys.exit(subprocess.call([sys.executable, '-c', sys.argv[1], h, p, sys.argv[2]]))")
    end = time.monotonic() + deadline_s
    while True:
        result = run([PYTHON, "-c", check, PROBE, str(connect_timeout_s)])
        if result.exit_code == 1:
            return  # the API server is out of reach: the desktop's egress policy holds
        if result.exit_code == 3:
            raise SandboxError("the desktop Pod was not told the API server's address (KUBERNETES_SERVICE_HOST): "
                               "cannot prove NetworkPolicy enforcement")
        if time.monotonic() > end:
            raise SandboxError(
                "NetworkPolicy is not enforced: the desktop Pod reached the Kubernetes API server although its "
                "policy allows only the gateway's proxy port. This cluster's network plugin ignores "
                "NetworkPolicy; run sandboxes only where it is enforced (README, Kubernetes operators).")
        time.sleep(1.0)  # poll interval: waiting for the plugin to program the Pod's rules


def _owner() -> dict[str, str]:
    from controller.sandbox.owner import owner_id

    return {LABEL_OWNER: f"{socket.gethostname()}:{os.getpid()}", LABEL_OWNER_ID: owner_id()}


_KINDS = ("pod", "service", "network_policy", "secret", "config_map")
"""What a sandbox is made of, deleted in this order (Pods first: nothing runs once they are gone)."""


def _list(apis: Apis, kind: str, namespace: str, selector: str) -> list[Any]:
    api = apis.networking if kind == "network_policy" else apis.core
    return getattr(api, f"list_namespaced_{kind}")(namespace, label_selector=selector).items


def _delete(apis: Apis, kind: str, namespace: str, name: str) -> bool:
    """Delete one object; False when it was already gone (404)."""
    from kubernetes.client.exceptions import ApiException

    api = apis.networking if kind == "network_policy" else apis.core
    kwargs = {"grace_period_seconds": 0} if kind == "pod" else {}
    try:
        getattr(api, f"delete_namespaced_{kind}")(name, namespace, **kwargs)
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise
    return True


def list_sandboxes(apis: Apis, namespace: str) -> dict[str, dict[str, str]]:
    """Sandboxes in ``namespace``: ``{id: labels and annotations of one of its objects}``."""
    found: dict[str, dict[str, str]] = {}
    for kind in _KINDS:
        for item in _list(apis, kind, namespace, LABEL_SANDBOX):
            meta = item.metadata
            labels_ = dict(meta.labels or {})
            sid = labels_.get(LABEL_SANDBOX)
            if sid and labels_.get(LABEL_MANAGED) == MANAGED_BY:
                found.setdefault(sid, {**dict(meta.annotations or {}), **labels_})
    return found


def remove_sandbox(apis: Apis, namespace: str, sandbox_id: str) -> list[str]:
    """Delete every object labelled with ``sandbox_id`` in ``namespace``; returns ``kind/name`` of each
    deleted (objects already gone are skipped)."""
    removed = []
    selector = f"{LABEL_SANDBOX}={sandbox_id},{LABEL_MANAGED}={MANAGED_BY}"
    for kind in _KINDS:
        for item in _list(apis, kind, namespace, selector):
            if _delete(apis, kind, namespace, item.metadata.name):
                removed.append(f"{kind}/{item.metadata.name}")
    return removed


def _api_error(exc: Exception) -> str:
    body = getattr(exc, "body", None)
    try:
        message = json.loads(body).get("message") if body else None
    except (ValueError, AttributeError):
        message = None
    return clean(message or str(exc), 500)


class KubernetesSandbox(Sandbox):
    """A sandbox on a Kubernetes cluster (module docstring). Create with ``KubernetesSandbox.start``."""

    backend_name = "kubernetes"
    default_ready_timeout = 300.0  # includes the image pull on a fresh node

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
                "(README, Kubernetes operators: push it to a registry)")
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
                                     gateway_ip="192.0.2.1", owner=_owner())
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
        script = 'tail -n +"$1" "$2" 2>/dev/null | head -n "$3" | head -c "$4"'
        result = self.apis.exec(f"{self.id}-gateway", "gateway",
                                ["sh", "-c", script, "sh", str(start + 1), DECISION_LOG, str(max_lines),
                                 str(max_bytes)], 30)
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

