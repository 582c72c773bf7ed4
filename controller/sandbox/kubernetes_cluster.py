"""The cluster as the Kubernetes backend (:mod:`controller.sandbox.kubernetes`) uses it: the official
client's APIs (:class:`Apis`, :func:`connect`, :func:`resolve_namespace`), commands run in a Pod over
the API server's exec stream (:func:`stream_exec`), the local listener that port-forwards to the agent
(:class:`PortForwarder`), the NetworkPolicy enforcement probe (:func:`probe_network_policy`), and the
listing and deletion of a sandbox's objects by label (:func:`list_sandboxes`, :func:`remove_sandbox`).

The official ``kubernetes`` client (extra ``[kubernetes]``) is imported only when a function needs it.
"""

from __future__ import annotations

import json
import os
import select
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from controller.sandbox import LABEL_SANDBOX, BackendUnavailable, ExecResult, SandboxError, with_timeout
from controller.sandbox.kubernetes_manifests import (
    LABEL_MANAGED, MANAGED_BY, NAMESPACE_ENV, PROXY_PORT, PYTHON, KubernetesOptions,
)
from controller.text import clean

EXEC_MAX_BYTES = 16 * 1024 * 1024
"""Most output (bytes, stdout and stderr together) collected from one command run in a Pod."""


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
                "NetworkPolicy; run sandboxes only where it is enforced (docs/kubernetes.md).")
        time.sleep(1.0)  # poll interval: waiting for the plugin to program the Pod's rules


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
