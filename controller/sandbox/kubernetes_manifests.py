"""The Kubernetes backend's objects (:mod:`controller.sandbox.kubernetes`) as manifests: the names and
paths they share, the backend's options, the desktop container's session files, and
:func:`render_manifests`, which writes every object of one sandbox (JSON-ready dicts) in the order the
backend creates them; :func:`render_for_task` is ``desktop-sandbox render --backend kubernetes``.
:func:`render_pool` writes the same sandbox as a warm pool of agent-sandbox objects (kubernetes-sigs/
agent-sandbox: SandboxTemplate, SandboxWarmPool, SandboxClaim), :func:`render_pool_for_task` is
``render --pool N``.

Pure: no cluster is contacted (PyYAML only for :func:`render_yaml`; the official client's models only
to check a pool's objects, :mod:`controller.sandbox.agent_sandbox_schema`). The backend's isolation
promises (module docstring of :mod:`controller.sandbox.kubernetes`) are read here, in one place: about
550 lines, because the manifests of one sandbox, and the pool made from them, refer to each other
(names, labels, selectors, volumes, ports) and split apart they could no longer be checked side by side.
"""

from __future__ import annotations

import ipaddress
import json
import shlex
import urllib.parse
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from controller.sandbox import LABEL_OWNER, LABEL_OWNER_ID, LABEL_ROLE, LABEL_SANDBOX, SandboxSpec
from controller.sandbox.backend_setup import sandbox_labels
from controller.sandbox.docker_hardening import DESKTOP_TMPFS_MIB
from controller.sandbox.guest import (  # noqa: F401 - re-exported: the backend's guest facts
    AGENT_PORT,
    AGENT_UID,
    DECISION_LOG,
    DESKTOP_UID,
    DESKTOP_USER,
    GATEWAY_HOME,
    GATEWAY_HOSTNAME,
    GATEWAY_LOG_DIR,
    GATEWAY_UID,
    GUEST_DISPLAY,
    GUEST_HOME,
    GUEST_NO_PROXY,
    RUN_DIR,
)
from controller.sandbox.guest import GATEWAY_PROXY_PORT as PROXY_PORT
from controller.sandbox.guest import GUEST_PYTHON as PYTHON
from controller.text import clean

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

SRC = "/opt/desktop-sandbox/src"
SECRETS_DIR = "/run/desktop-sandbox-secrets"
SESSION_DIR = "/etc/desktop-sandbox/session"
POLICY_DIR = "/etc/desktop-sandbox/policy"
LAUNCH_DIR = "/run/desktop-sandbox-launch"
AGENT_DIR = RUN_DIR
"""The agent container's run directory: its X cookie (``xauthority``)."""

PRIVATE_RANGES = ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "169.254.0.0/16", "100.64.0.0/10",
                  "127.0.0.0/8", "0.0.0.0/8", "192.0.0.0/24", "198.18.0.0/15", "224.0.0.0/4", "240.0.0.0/4")
"""IPv4 ranges the gateway's egress NetworkPolicy excludes from ``0.0.0.0/0`` (the gateway refuses them
too; this keeps the Pod network from reaching them should the proxy be wrong)."""


def _program(name: str, command: str, *settings: str) -> str:
    """A supervisord ``[program:NAME]`` section: ``command``, the ``settings`` lines, and its output to
    the container's stdout (what ``kubectl logs`` shows)."""
    return "\n".join([f"[program:{name}]", f"command={command}", *settings, "stdout_logfile=/dev/fd/1",
                      "stdout_logfile_maxbytes=0", "redirect_stderr=true"]) + "\n"


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

""" + "\n".join([
    _program("xvfb", f"{PYTHON} {SRC}/images/session/xserver.py",
             f'environment=XSERVER_AUTH="{GUEST_HOME}/.Xauthority"', "priority=10", "autorestart=true", "startsecs=1"),
    _program("openbox", f"{PYTHON} {SRC}/images/session/await.py --display -- openbox",
             "priority=20", "autorestart=true", "startsecs=0"),
    _program("launcher", f"{PYTHON} {SESSION_DIR}/broker.py --socket {LAUNCH_DIR}/launch.sock --client agent "
                         f"--user {DESKTOP_USER} --apps %(ENV_AGENT_APPS_FILE)s",
             "priority=25", "autorestart=true", "startsecs=0"),
    _program("pickup", f"{PYTHON} {SRC}/images/session/pickup.py",
             "priority=40", "autorestart=unexpected", "exitcodes=0", "startsecs=0"),
])
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
    docs/kubernetes.md, "Setting it up"). ``namespace``: required (``$DESKTOP_SANDBOX_K8S_NAMESPACE`` or the kubeconfig
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


def labels(sandbox_id: str, role: str, options: KubernetesOptions) -> dict[str, str]:
    """The labels of one object: sandbox id, role, the app's name and manager, extras, ``detached``."""
    return sandbox_labels(sandbox_id, role, options, {LABEL_NAME: "desktop-sandbox", LABEL_MANAGED: MANAGED_BY})


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


def _gateway_container(options: KubernetesOptions, *, volume_prefix: str = "",
                       extra_env: Sequence[Mapping[str, str]] = ()) -> dict[str, Any]:
    """The gateway container (uid :data:`GATEWAY_UID`: the egress proxy on :data:`PROXY_PORT`), its
    volumes named ``policy`` and ``<volume_prefix>tmp`` / ``run`` / ``log`` / ``home``."""
    return {
        "name": "gateway", "image": options.image, "imagePullPolicy": options.image_pull_policy,
        "command": [f"{SRC}/images/session/gateway.sh"],
        "env": [{"name": "HOME", "value": GATEWAY_HOME},
                {"name": "GATEWAY_POLICY_FILE", "value": f"{POLICY_DIR}/policy.json"},
                {"name": "GATEWAY_PROXY_PORT", "value": str(PROXY_PORT)},
                {"name": "GATEWAY_DECISION_LOG", "value": DECISION_LOG}, *extra_env],
        "ports": [{"name": "proxy", "containerPort": PROXY_PORT, "protocol": "TCP"}],
        "securityContext": _security(),
        "resources": {"requests": {"cpu": options.gateway_cpu, "memory": options.gateway_memory},
                      "limits": {"cpu": options.gateway_cpu_limit, "memory": options.gateway_memory}},
        "volumeMounts": [{"name": "policy", "mountPath": POLICY_DIR, "readOnly": True},
                         {"name": f"{volume_prefix}tmp", "mountPath": "/tmp"},
                         {"name": f"{volume_prefix}run", "mountPath": RUN_DIR},
                         {"name": f"{volume_prefix}log", "mountPath": GATEWAY_LOG_DIR},
                         {"name": f"{volume_prefix}home", "mountPath": GATEWAY_HOME}],
    }


def _gateway_volumes(policy_config_map: str, volume_prefix: str = "") -> list[dict[str, Any]]:
    """The volumes :func:`_gateway_container` mounts: the policy ConfigMap and four memory-backed dirs."""
    return [{"name": "policy", "configMap": {"name": policy_config_map, "defaultMode": 0o444}},
            _empty_dir(f"{volume_prefix}tmp", 64), _empty_dir(f"{volume_prefix}run", 16),
            _empty_dir(f"{volume_prefix}log", 64), _empty_dir(f"{volume_prefix}home", 64)]


def _desktop_pod_spec(base: str, spec: SandboxSpec, options: KubernetesOptions, pod_common: Mapping[str, Any],
                      gateway_ip: str) -> dict[str, Any]:
    """The desktop Pod's spec: containers ``desktop`` and ``agent``, their volumes (ConfigMap
    ``<base>-session``, Secret ``<base>-agent``), ``gateway`` mapped to ``gateway_ip``, no DNS."""
    proxy = f"http://{GATEWAY_HOSTNAME}:{PROXY_PORT}"
    apps = options.apps_file or f"{SRC}/images/apps.json"
    tmpfs = DESKTOP_TMPFS_MIB
    display_env = [{"name": "DISPLAY", "value": GUEST_DISPLAY},
                   {"name": "SCREEN_WIDTH", "value": str(spec.screen_width)},
                   {"name": "SCREEN_HEIGHT", "value": str(spec.screen_height)},
                   {"name": "SCREEN_DEPTH", "value": "24"},
                   {"name": "AGENT_APPS_FILE", "value": apps}]
    desktop_cmd = (f"{PYTHON} {SRC}/images/session/xauth.py {GUEST_HOME}/.Xauthority < {SECRETS_DIR}/xcookie && "
                   f"exec /usr/bin/supervisord --nodaemon --configuration {SESSION_DIR}/session.conf")
    agent_serve = [PYTHON, "-m", "guest", "serve", "--display", GUEST_DISPLAY, "--bind", f"0.0.0.0:{AGENT_PORT}",
                   "--token-file", f"{SECRETS_DIR}/token", "--apps", apps, *options.agent_args]
    agent_cmd = (f"{PYTHON} {SRC}/images/session/xauth.py {AGENT_DIR}/xauthority < {SECRETS_DIR}/xcookie && "
                 f"exec {PYTHON} {SRC}/images/session/await.py --display --file {SECRETS_DIR}/token -- "
                 + shlex.join(agent_serve))
    return {**pod_common,
            "hostname": "desktop",
            "hostAliases": [{"ip": gateway_ip, "hostnames": [GATEWAY_HOSTNAME]}],
            "dnsPolicy": "None", "dnsConfig": {"nameservers": ["127.0.0.1"]},
            "securityContext": {"runAsNonRoot": True, "fsGroup": DESKTOP_UID, "supplementalGroups": [DESKTOP_UID],
                                "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [
                {"name": "desktop", "image": options.image, "imagePullPolicy": options.image_pull_policy,
                 "command": ["/bin/sh", "-c", desktop_cmd],
                 "env": [{"name": "HOME", "value": GUEST_HOME}, {"name": "USER", "value": DESKTOP_USER},
                         {"name": "XAUTHORITY", "value": f"{GUEST_HOME}/.Xauthority"},
                         *display_env,
                         *({"name": k, "value": v} for k, v in (
                             ("HTTP_PROXY", proxy), ("HTTPS_PROXY", proxy), ("http_proxy", proxy),
                             ("https_proxy", proxy), ("NO_PROXY", GUEST_NO_PROXY),
                             ("no_proxy", GUEST_NO_PROXY)))],
                 "securityContext": {**_security(), "runAsUser": DESKTOP_UID, "runAsGroup": DESKTOP_UID},
                 "resources": {"requests": {"cpu": options.desktop_cpu, "memory": options.desktop_memory},
                               "limits": {"cpu": options.desktop_cpu_limit, "memory": options.desktop_memory}},
                 "volumeMounts": [
                     {"name": "home", "mountPath": GUEST_HOME},
                     {"name": "tmp", "mountPath": "/tmp"},
                     {"name": "var-tmp", "mountPath": "/var/tmp"},
                     {"name": "shm", "mountPath": "/dev/shm"},
                     {"name": "x11", "mountPath": "/tmp/.X11-unix"},
                     {"name": "launch", "mountPath": LAUNCH_DIR},
                     {"name": "session", "mountPath": SESSION_DIR, "readOnly": True},
                     {"name": "cookie", "mountPath": SECRETS_DIR, "readOnly": True}]},
                {"name": "agent", "image": options.image, "imagePullPolicy": options.image_pull_policy,
                 "command": ["/bin/sh", "-c", agent_cmd],
                 "env": [{"name": "HOME", "value": GUEST_HOME}, {"name": "USER", "value": "agent"},
                         {"name": "XAUTHORITY", "value": f"{AGENT_DIR}/xauthority"},
                         {"name": "AGENT_LAUNCH_SOCKET", "value": f"{LAUNCH_DIR}/launch.sock"},
                         *display_env],
                 "ports": [{"name": "agent", "containerPort": AGENT_PORT, "protocol": "TCP"}],
                 "securityContext": {**_security(), "runAsUser": AGENT_UID, "runAsGroup": AGENT_UID},
                 "resources": {"requests": {"cpu": "100m", "memory": options.agent_memory},
                               "limits": {"cpu": "1", "memory": options.agent_memory}},
                 "volumeMounts": [
                     {"name": "home", "mountPath": GUEST_HOME, "readOnly": True},
                     {"name": "agent-run", "mountPath": AGENT_DIR},
                     {"name": "agent-tmp", "mountPath": "/tmp"},
                     {"name": "x11", "mountPath": "/tmp/.X11-unix", "readOnly": True},
                     {"name": "launch", "mountPath": LAUNCH_DIR, "readOnly": True},
                     {"name": "agent-secrets", "mountPath": SECRETS_DIR, "readOnly": True}]},
            ],
            "volumes": [
                _empty_dir("home", tmpfs[GUEST_HOME]), _empty_dir("tmp", tmpfs["/tmp"]),
                _empty_dir("var-tmp", tmpfs["/var/tmp"]), _empty_dir("shm", 256),
                _empty_dir("x11", 1), _empty_dir("launch", 1),
                _empty_dir("agent-run", tmpfs[AGENT_DIR]), _empty_dir("agent-tmp", 16),
                {"name": "session", "configMap": {"name": f"{base}-session", "defaultMode": 0o444}},
                {"name": "cookie", "secret": {"secretName": f"{base}-agent", "defaultMode": 0o440,
                                              "items": [{"key": "xcookie", "path": "xcookie"}]}},
                {"name": "agent-secrets", "secret": {"secretName": f"{base}-agent", "defaultMode": 0o440,
                                                     "items": [{"key": "token", "path": "token"},
                                                               {"key": "xcookie", "path": "xcookie"}]}},
            ]}


def _config_maps(base: str, spec: SandboxSpec, meta: Callable[[str, str], dict]) -> list[dict[str, Any]]:
    """ConfigMaps ``<base>-policy`` (the task's ``[network]`` table) and ``<base>-session``;
    ``meta(name, role)`` writes their metadata."""
    return [{"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta(f"{base}-policy", "policy"),
             "data": {"policy.json": spec.policy_json()}},
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta(f"{base}-session", "session"),
             "data": {"session.conf": SESSION_CONF, "broker.py": BROKER_PY}}]


def _pod_common(options: KubernetesOptions) -> dict[str, Any]:
    pull = [{"name": options.pull_secret}] if options.pull_secret else []
    return {"automountServiceAccountToken": False, "enableServiceLinks": False, "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 5, **({"imagePullSecrets": pull} if pull else {})}


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

    def meta(name: str, role: str) -> dict:
        return _meta(name, sandbox_id, role, options, owner)

    secret = {"apiVersion": "v1", "kind": "Secret", "type": "Opaque", "metadata": meta(f"{sandbox_id}-agent", "secret"),
              "stringData": {"token": token, "xcookie": x_cookie}}
    policy_cm, session_cm = _config_maps(sandbox_id, spec, meta)
    desktop_np = {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
                  "metadata": meta(f"{sandbox_id}-desktop", "desktop"),
                  "spec": {"podSelector": _select(sandbox_id, "desktop"), "policyTypes": ["Ingress", "Egress"],
                           "ingress": [],
                           "egress": [{"to": [{"podSelector": _select(sandbox_id, "gateway")}],
                                       "ports": [{"protocol": "TCP", "port": PROXY_PORT}]}]}}
    gateway_np = {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
                  "metadata": meta(f"{sandbox_id}-gateway", "gateway"),
                  "spec": {"podSelector": _select(sandbox_id, "gateway"), "policyTypes": ["Ingress", "Egress"],
                           "ingress": [{"from": [{"podSelector": _select(sandbox_id, "desktop")}],
                                        "ports": [{"protocol": "TCP", "port": PROXY_PORT}]}],
                           "egress": gateway_egress(policy)}}
    pod_common = _pod_common(options)
    gateway_pod = {
        "apiVersion": "v1", "kind": "Pod", "metadata": meta(f"{sandbox_id}-gateway", "gateway"),
        "spec": {**pod_common,
                 "securityContext": {"runAsNonRoot": True, "runAsUser": GATEWAY_UID, "runAsGroup": GATEWAY_UID,
                                     "fsGroup": GATEWAY_UID, "seccompProfile": {"type": "RuntimeDefault"}},
                 "containers": [_gateway_container(options)],
                 "volumes": _gateway_volumes(f"{sandbox_id}-policy")},
    }
    service = {"apiVersion": "v1", "kind": "Service", "metadata": meta(f"{sandbox_id}-gateway", "gateway"),
               "spec": {"type": "ClusterIP", "selector": {LABEL_SANDBOX: sandbox_id, LABEL_ROLE: "gateway"},
                        "ports": [{"name": "proxy", "port": PROXY_PORT, "targetPort": PROXY_PORT, "protocol": "TCP"}]}}
    desktop_pod = {"apiVersion": "v1", "kind": "Pod", "metadata": meta(f"{sandbox_id}-desktop", "desktop"),
                   "spec": _desktop_pod_spec(sandbox_id, spec, options, pod_common, gateway_ip)}
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
annotations. Apply only on a cluster whose network plugin enforces NetworkPolicy (docs/kubernetes.md)."""


def render_for_task(spec: SandboxSpec, options: KubernetesOptions, sandbox_id: str = f"{ID_PREFIX}00000000") -> str:
    """What ``desktop-sandbox render --backend kubernetes TASK`` prints: :func:`render_manifests` with
    placeholders for what a start generates (:data:`RENDER_NOTE`), as YAML."""
    manifests = render_manifests(sandbox_id, spec, options, token="GENERATED-AT-START", x_cookie="0" * 32,
                                 gateway_ip="192.0.2.1",
                                 owner={LABEL_OWNER: "HOST:PID", LABEL_OWNER_ID: "set at start"})
    return render_yaml(manifests, RENDER_NOTE)


# -- a warm pool of sandboxes as agent-sandbox objects (kubernetes-sigs/agent-sandbox) -----------------------

LABEL_K8S_POOL = "desktop-sandbox.k8s-pool"
"""Label naming the warm pool an object belongs to (never ``desktop-sandbox.sandbox``: a pool's objects
are not one sandbox of this backend, so ``down --all`` and orphan reaping leave them alone)."""
POOL_PREFIX = f"{ID_PREFIX}pool-"
POOL_NAME_MAX = 40
"""Longest pool name: the pool names its sandboxes (and their Pods) ``<pool>-<5 characters>``."""

POOL_MODE_REFUSED = (
    "[network] mode \"{mode}\" is not available for a warm pool, only \"deny-all\": a pool sandbox's gateway "
    "is a container of the sandbox's own Pod (the pool's Pods are copies of one template), so a NetworkPolicy "
    "letting the gateway out would let the desktop out past the proxy; render mode allowlist without --pool "
    "(one sandbox, its gateway in a Pod of its own)")
"""Why a task in a mode other than ``deny-all`` has no warm pool (``{mode}``: the task's mode)."""


def pool_name(task_file_stem: str) -> str:
    """The pool's name for a task file (its stem, e.g. ``pickup``): ``dk-pool-<stem>``, lower-cased,
    every character other than a-z, 0-9 and ``-`` made ``-``, cut to :data:`POOL_NAME_MAX` characters,
    ending in a letter or digit."""
    stem = "".join(c if c.isascii() and (c.isalnum() or c == "-") else "-" for c in task_file_stem.lower())
    return (POOL_PREFIX + stem)[:POOL_NAME_MAX].rstrip("-") or POOL_PREFIX.rstrip("-")


def pool_labels(name: str, role: str, options: KubernetesOptions, *, managed: bool = True) -> dict[str, str]:
    """The labels of one object of pool ``name``: :data:`LABEL_K8S_POOL`, the role, the app's name, its
    manager (``managed``: an object applied from the render; the pool's Pods are the agent-sandbox
    controller's) and ``options.extra_labels``."""
    return {LABEL_K8S_POOL: name, LABEL_ROLE: role, LABEL_NAME: "desktop-sandbox",
            **({LABEL_MANAGED: MANAGED_BY} if managed else {}), **options.extra_labels}


def pool_pod_spec(name: str, spec: SandboxSpec, options: KubernetesOptions) -> dict[str, Any]:
    """The Pod of every sandbox of pool ``name``: the desktop Pod's spec (:func:`render_manifests`) with
    the gateway as a third container (uid :data:`GATEWAY_UID`, its own volumes ``gateway-*`` and the
    policy ConfigMap ``<name>-policy``, refusing to connect to the agent's port), ``gateway`` mapped to
    127.0.0.1 (the Pod's own loopback: no Service, no DNS), the Secret ``<name>-agent``."""
    pod = _desktop_pod_spec(name, spec, options, _pod_common(options), "127.0.0.1")
    gateway = _gateway_container(options, volume_prefix="gateway-",
                                 extra_env=[{"name": "RELAY_PORT", "value": str(AGENT_PORT)}])
    gateway["securityContext"] = {**gateway["securityContext"], "runAsUser": GATEWAY_UID, "runAsGroup": GATEWAY_UID}
    pod["containers"].append(gateway)
    pod["volumes"].extend(_gateway_volumes(f"{name}-policy", "gateway-"))
    return pod


def render_pool(name: str, spec: SandboxSpec, options: KubernetesOptions, *, replicas: int) -> list[dict[str, Any]]:
    """A warm pool of ``replicas`` sandboxes (``>= 0``) named ``name`` as manifests (JSON-ready dicts), in
    the order to apply them: ConfigMaps ``<name>-policy`` and ``<name>-session``, NetworkPolicy
    ``<name>-sandbox`` (selects the pool's Pods: no connection in, none out), SandboxTemplate ``<name>``
    (:func:`pool_pod_spec`, the same default-deny NetworkPolicy carried as the template's own, claims
    may not change environment or volumes, no Service), SandboxWarmPool ``<name>`` (``replicas``, that
    template, stale unclaimed sandboxes recreated), and one SandboxClaim ``<name>-claim`` of that pool.
    The Secret ``<name>-agent`` (token, X cookie) is not among them: it is made by whoever applies them.
    Raises ValueError for a policy other than ``deny-all`` (:data:`POOL_MODE_REFUSED`) or a ``replicas``
    outside 0 to 2**31 - 1."""
    from controller.sandbox.agent_sandbox_schema import EXTENSIONS_API_VERSION

    mode = json.loads(spec.policy_json()).get("mode", "deny-all")
    if mode != "deny-all":
        raise ValueError(POOL_MODE_REFUSED.format(mode=clean(mode, 40)))
    if isinstance(replicas, bool) or not isinstance(replicas, int) or not 0 <= replicas <= 2**31 - 1:
        raise ValueError(f"a pool's size must be a whole number from 0, not {replicas!r}")

    def meta(object_name: str, role: str) -> dict:
        return {"name": object_name, "namespace": options.namespace, "labels": pool_labels(name, role, options)}

    pod_labels = pool_labels(name, "desktop", options, managed=False)
    selector = {"matchLabels": {LABEL_K8S_POOL: name, LABEL_ROLE: "desktop"}}
    # Nothing in, nothing out over the Pod network: the gateway is a container of the same Pod, reached
    # on its loopback, which no NetworkPolicy governs; deny-all gives the gateway no way out either.
    isolation = {"ingress": [], "egress": []}
    network_policy = {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
                      "metadata": meta(f"{name}-sandbox", "desktop"),
                      "spec": {"podSelector": selector, "policyTypes": ["Ingress", "Egress"], **isolation}}
    template = {"apiVersion": EXTENSIONS_API_VERSION, "kind": "SandboxTemplate", "metadata": meta(name, "template"),
                "spec": {"podTemplate": {"metadata": {"labels": pod_labels},
                                         "spec": pool_pod_spec(name, spec, options)},
                         "service": False,
                         "networkPolicyManagement": "Managed",
                         "networkPolicy": {"ingress": [], "egress": []},
                         "envVarsInjectionPolicy": "Disallowed",
                         "volumeClaimTemplatesPolicy": "Disallowed"}}
    pool = {"apiVersion": EXTENSIONS_API_VERSION, "kind": "SandboxWarmPool", "metadata": meta(name, "pool"),
            "spec": {"replicas": replicas, "sandboxTemplateRef": {"name": name},
                     "updateStrategy": {"type": "Recreate"}}}
    claim = {"apiVersion": EXTENSIONS_API_VERSION, "kind": "SandboxClaim", "metadata": meta(f"{name}-claim", "claim"),
             "spec": {"warmPoolRef": {"name": name}}}
    policy_cm, session_cm = _config_maps(name, spec, meta)
    return [policy_cm, session_cm, network_policy, template, pool, claim]


POOL_NOTE = """\
desktop-sandbox render --backend kubernetes --pool {replicas}: this task's sandbox as a warm pool (replicas:
{replicas}) of agent-sandbox objects (kubernetes-sigs/agent-sandbox, extensions.agents.x-k8s.io/v1beta1: its
CRDs and controller must be installed), in the order to apply them; the last, the SandboxClaim, takes
one sandbox from the pool (apply it again under another name for another). First create the Secret
the Pods mount (not printed here, so no token is written out):
  kubectl -n {namespace} create secret generic {name}-agent --from-literal=token="$(openssl rand -hex 32)" \\
    --from-literal=xcookie="$(openssl rand -hex 16)"
Apply only on a cluster whose network plugin enforces NetworkPolicy (docs/kubernetes.md, "Warm pools
(agent-sandbox)")."""


def render_pool_for_task(spec: SandboxSpec, options: KubernetesOptions, name: str, replicas: int) -> str:
    """What ``desktop-sandbox render --backend kubernetes --pool N TASK`` prints: :func:`render_pool`,
    each agent-sandbox object first checked against the upstream API's schema
    (:func:`controller.sandbox.agent_sandbox_schema.validate`), as YAML under :data:`POOL_NOTE`. Raises
    ValueError as :func:`render_pool` does."""
    from controller.sandbox import agent_sandbox_schema

    manifests = render_pool(name, spec, options, replicas=replicas)
    for manifest in manifests:
        if manifest["kind"] in agent_sandbox_schema.SPECS:
            agent_sandbox_schema.validate(manifest)
    return render_yaml(manifests, POOL_NOTE.format(replicas=replicas, namespace=options.namespace, name=name))
