"""The Kubernetes backend's start and teardown against the official client over a recorded-API test double
(tests/kubernetes/fake_cluster.py: a double because no cluster can run here). The exec and port-forward
streams are stand-ins: port-forward reaches a stub agent on 127.0.0.1 through the backend's real
:class:`PortForwarder`; exec answers the NetworkPolicy enforcement probe as an enforcing (or not) cluster."""

from __future__ import annotations

import socket
from typing import Any, Iterator, Sequence

import pytest

pytest.importorskip("kubernetes", reason="the [kubernetes] extra holds the official client")

from typer.testing import CliRunner  # noqa: E402

from controller.sandbox import LABEL_OWNER, LABEL_OWNER_ID, ExecResult, SandboxError, SandboxSpec  # noqa: E402
from controller.sandbox import kubernetes as k8s  # noqa: E402

from tests.helpers import QuietHandler, reply_json, serve_http  # noqa: E402

from .fake_cluster import FakeCluster, official_apis  # noqa: E402

NS = "sandboxes"
TOKEN: dict[str, str] = {}


class _Agent(QuietHandler):
    """Answers ``/livez`` and, with the sandbox's token, ``/v1/display``: what readiness asks."""

    def do_GET(self) -> None:  # noqa: N802
        if self.path == "/livez":
            body, code = {"status": "ok"}, 200
        elif self.headers.get("Authorization") in {f"Bearer {t}" for t in TOKEN.values()}:
            body, code = {"width": 1280, "height": 800, "depth": 24}, 200
        else:
            body, code = {"error": {"code": "unauthorized", "message": "no"}}, 401
        reply_json(self, code, body)


@pytest.fixture(autouse=True)
def _quick_pod_polls(monkeypatch):
    monkeypatch.setattr(k8s, "POD_POLL_S", 0.05)  # the double's Pods run from their second read


@pytest.fixture(scope="module")
def stub_agent() -> Iterator[int]:
    server = serve_http(_Agent)
    yield server.server_address[1]
    server.shutdown()


class _Stream:
    """What ``kubernetes.stream.portforward`` returns, as far as PortForwarder uses it."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port))

    def socket(self, _port: int) -> socket.socket:
        return self.sock

    def close(self) -> None:
        self.sock.close()


def _apis(cluster: FakeCluster, agent_port: int, *, enforced: bool = True) -> tuple[k8s.Apis, list]:
    core, networking = official_apis(cluster)
    execs: list[tuple[str, str, list[str]]] = []

    def exec_(pod: str, container: str, argv: Sequence[str], timeout: float | None) -> ExecResult:
        execs.append((pod, container, list(argv)))
        if k8s.PROBE in argv and "KUBERNETES_SERVICE_HOST" in " ".join(argv):  # the API server probe
            return ExecResult(0 if not enforced else 1, b"", b"")
        if k8s.PROBE in argv:  # the gateway's proxy: reachable
            return ExecResult(0, b"connected\n", b"")
        return ExecResult(0, b"", b"")

    def forward(pod: str, port: int) -> k8s.PortForwarder:
        assert port == k8s.AGENT_PORT and pod.endswith("-desktop")
        return k8s.PortForwarder(lambda: _Stream(agent_port), port)

    return k8s.Apis(core=core, networking=networking, exec=exec_, forward=forward), execs


def _options(**kw: Any) -> k8s.KubernetesOptions:
    return k8s.KubernetesOptions(namespace=NS, image="registry.example/desktop-sandbox:1", netpol_probe_s=1.0, **kw)


def _start(cluster: FakeCluster, stub_agent: int, **kw: Any) -> tuple[k8s.KubernetesSandbox, list]:
    apis, execs = _apis(cluster, stub_agent, **kw)
    original = k8s.secrets.token_urlsafe

    def token(n: int) -> str:  # the stub agent learns the token the backend makes
        value = original(n)
        TOKEN["current"] = value
        return value

    k8s.secrets.token_urlsafe = token
    try:
        return k8s.KubernetesSandbox.start(SandboxSpec(ready_timeout=20), _options(), apis=apis), execs
    finally:
        k8s.secrets.token_urlsafe = original


def test_start_creates_policies_first_and_teardown_deletes_everything(stub_agent):
    cluster = FakeCluster()
    sandbox, execs = _start(cluster, stub_agent)
    sid = sandbox.id
    assert sid.startswith("dk-")
    created = cluster.kinds_created()
    assert created == [f"Secret/{sid}-agent", f"ConfigMap/{sid}-policy", f"ConfigMap/{sid}-session",
                       f"NetworkPolicy/{sid}-desktop", f"NetworkPolicy/{sid}-gateway", f"Pod/{sid}-gateway",
                       f"Service/{sid}-gateway", f"Pod/{sid}-desktop"]
    service_ip = cluster.objects[("Service", NS, f"{sid}-gateway")]["spec"]["clusterIP"]
    desktop = cluster.objects[("Pod", NS, f"{sid}-desktop")]
    assert desktop["spec"]["hostAliases"] == [{"ip": service_ip, "hostnames": ["gateway"]}]
    assert all(c.path.startswith(f"/api/v1/namespaces/{NS}/") or c.path.startswith(
        f"/apis/networking.k8s.io/v1/namespaces/{NS}/") for c in cluster.calls)
    # the agent answers through the port-forward, with the sandbox's token
    assert sandbox.agent_url.startswith("http://127.0.0.1:")
    assert sandbox.timings["display_ready"] > 0 and sandbox.image_id.endswith("@sha256:" + "ab" * 32)
    # the enforcement probe ran in the desktop container: the proxy reached, then the API server refused
    probes = [e for e in execs if k8s.PROBE in e[2]]
    assert [(p, c) for p, c, _ in probes] == [(f"{sid}-desktop", "desktop")] * 2
    assert service_ip in probes[0][2]
    owner = cluster.objects[("Secret", NS, f"{sid}-agent")]["metadata"]["annotations"]
    assert set(owner) == {LABEL_OWNER, LABEL_OWNER_ID}
    topo = sandbox.topology()
    assert (topo.backend, topo.proxy_host, topo.proxy_port) == ("kubernetes", service_ip, 3128)
    sandbox.close()
    assert cluster.objects == {}
    assert sorted(cluster.deleted()) == sorted([f"pods/{sid}-gateway", f"pods/{sid}-desktop",
                                                f"services/{sid}-gateway", f"networkpolicies/{sid}-desktop",
                                                f"networkpolicies/{sid}-gateway", f"secrets/{sid}-agent",
                                                f"configmaps/{sid}-policy", f"configmaps/{sid}-session"])
    calls = len(cluster.calls)
    sandbox.close()  # idempotent
    assert len(cluster.calls) == calls


def test_unenforced_network_policy_refuses_and_removes_everything(stub_agent):
    cluster = FakeCluster()
    with pytest.raises(SandboxError, match="NetworkPolicy is not enforced"):
        _start(cluster, stub_agent, enforced=False)
    assert len(cluster.kinds_created()) == 8 and cluster.objects == {}


def test_a_refused_create_removes_what_was_made(stub_agent):
    cluster = FakeCluster(fail_create={"NetworkPolicy": 403})
    with pytest.raises(SandboxError, match="cannot create NetworkPolicy .*refused by the double"):
        _start(cluster, stub_agent)
    assert [c.split("/")[0] for c in cluster.kinds_created()] == ["Secret", "ConfigMap", "ConfigMap", "NetworkPolicy"]
    assert cluster.objects == {}  # no Pod was ever created, and what was is gone


def test_image_pull_failure_is_reported(stub_agent):
    cluster = FakeCluster(pod_phases=("Pending",), waiting_reason="ErrImagePull")
    with pytest.raises(SandboxError, match="will not start: container gateway: ErrImagePull"):
        _start(cluster, stub_agent)
    assert cluster.objects == {}


def test_orphans_reaped_and_down_all_backend_kubernetes(stub_agent, monkeypatch):
    from controller.cli import app
    from controller.sandbox.owner import owner_id

    cluster = FakeCluster()
    first, _ = _start(cluster, stub_agent)
    second, _ = _start(cluster, stub_agent)
    # an object of the namespace that is not the backend's stays whatever happens
    core, _net = official_apis(cluster)
    core.create_namespaced_config_map(NS, {"apiVersion": "v1", "kind": "ConfigMap",
                                           "metadata": {"name": "someone-elses", "labels": {"desktop-sandbox.sandbox": "x"}}})
    apis, _ = _apis(cluster, stub_agent)
    monkeypatch.setattr(k8s.KubernetesSandbox, "_configured", classmethod(lambda cls: (apis, NS)))
    assert set(k8s.KubernetesSandbox.list_all()) == {first.id, second.id}
    assert k8s.KubernetesSandbox.list_all()[first.id][LABEL_OWNER_ID] == owner_id()
    # a sandbox whose starter is provably dead is reaped by the next start; a live one's stays
    dead = owner_id(1).rsplit(":", 2)[0] + ":999999:0"
    cluster.objects[("Secret", NS, f"{second.id}-agent")]["metadata"]["annotations"][LABEL_OWNER_ID] = dead
    for kind in ("Pod", "Service", "NetworkPolicy", "ConfigMap"):
        for key, obj in list(cluster.objects.items()):
            if key[0] == kind and key[2].startswith(second.id):
                obj["metadata"]["annotations"][LABEL_OWNER_ID] = dead
    third, _ = _start(cluster, stub_agent)
    assert set(k8s.KubernetesSandbox.list_all()) == {first.id, third.id}
    result = CliRunner().invoke(app, ["down", "--all", "--backend", "kubernetes"])
    assert result.exit_code == 0, result.output
    assert "removed 16" in result.output
    assert list(cluster.objects) == [("ConfigMap", NS, "someone-elses")]
    first._closed = third._closed = True  # already removed by `down`
    second._closed = True


def test_unconfigured_backend_has_no_sandboxes(monkeypatch, tmp_path):
    monkeypatch.delenv(k8s.NAMESPACE_ENV, raising=False)
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "none"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    assert k8s.KubernetesSandbox.list_all() == {} and k8s.KubernetesSandbox.remove("dk-00000000") == []
    with pytest.raises(k8s.BackendUnavailable, match=k8s.NAMESPACE_ENV):
        k8s.resolve_namespace(k8s.KubernetesOptions())
