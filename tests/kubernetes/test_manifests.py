"""The Kubernetes backend's manifests, offline: every object ``render --backend kubernetes`` prints validates
against the Kubernetes OpenAPI schemas of 1.30 to 1.35 (kubernetes-validate, strict: no unknown field; its
schemas ship in the wheel, nothing is fetched), and the security fields and NetworkPolicy selectors are
what the backend promises (module docstring of controller.sandbox.kubernetes)."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path

import pytest

from controller.sandbox import LABEL_OWNER, LABEL_OWNER_ID, LABEL_ROLE, LABEL_SANDBOX, SandboxSpec
from controller.sandbox.docker_hardening import DESKTOP_TMPFS_MIB

kv = pytest.importorskip("kubernetes_validate", reason="kubernetes-validate (test extra) holds the schemas")
yaml = pytest.importorskip("yaml", reason="PyYAML comes with the [kubernetes] extra")

from controller.sandbox import kubernetes as k8s  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
VERSIONS = ("1.30", "1.31", "1.32", "1.33", "1.34", "1.35")
SID = "dk-0123abcd"
ALLOW = {"mode": "allowlist", "allow": ["https://example.com:443", "http://example.org:8080"],
         "allow_addresses": ["10.1.2.3"]}


def _manifests(policy=None, **options) -> list[dict]:
    spec = SandboxSpec(screen_width=1280, screen_height=800, policy=policy or {"mode": "deny-all", "allow": []})
    opts = k8s.KubernetesOptions(namespace="sandboxes", image="registry.example/desktop-sandbox:1", **options)
    return k8s.render_manifests(SID, spec, opts, token="t0ken", x_cookie="ab" * 16, gateway_ip="10.96.0.10",
                                owner={LABEL_OWNER: "host:1", LABEL_OWNER_ID: "m:b:ns:1:2"})


def _by(manifests: list[dict], kind: str, role: str) -> dict:
    return next(m for m in manifests if m["kind"] == kind and m["metadata"]["labels"][LABEL_ROLE] == role)


def _render_cli(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != k8s.NAMESPACE_ENV}
    return subprocess.run([sys.executable, "-m", "controller.cli", "render", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def rendered() -> list[dict]:
    """What ``desktop-sandbox render --backend kubernetes tasks/pickup.toml`` prints, parsed."""
    result = _render_cli("--backend", "kubernetes", "--namespace", "sandboxes", "tasks/pickup.toml")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("# desktop-sandbox render --backend kubernetes")
    assert "&id" not in result.stdout and "*id" not in result.stdout  # no YAML anchors: plain to read and diff
    return list(yaml.safe_load_all(result.stdout))


@pytest.mark.parametrize("version", VERSIONS)
def test_render_output_validates_strictly(rendered, version):
    kinds = [m["kind"] for m in rendered]
    assert kinds == ["Secret", "ConfigMap", "ConfigMap", "NetworkPolicy", "NetworkPolicy", "Pod", "Service", "Pod"]
    for manifest in rendered:
        kv.validate(manifest, version, strict=True)
    for manifest in _manifests(ALLOW):  # the allowlist's egress rules and ipBlocks too
        kv.validate(manifest, version, strict=True)


def test_validation_can_fail(rendered):
    pod = copy.deepcopy(rendered[-1])
    pod["spec"]["containers"][0]["securityContext"]["runAsNonRooot"] = True  # a misspelt field
    with pytest.raises(kv.ValidationError):
        kv.validate(pod, "1.33", strict=True)
    policy = copy.deepcopy(rendered[3])
    policy["spec"]["egress"][0]["ports"][0]["port"] = {"not": "a port"}
    with pytest.raises(kv.ValidationError):
        kv.validate(policy, "1.33", strict=True)


def test_render_refusals():
    assert _render_cli("--backend", "docker", "tasks/pickup.toml").returncode == 2
    missing = _render_cli("--backend", "kubernetes", "tasks/no-such-task.toml")
    assert missing.returncode == 2 and "cannot load task" in missing.stderr


def test_every_object_labelled_and_owned():
    for m in _manifests():
        meta = m["metadata"]
        assert meta["namespace"] == "sandboxes" and meta["name"].startswith(SID)
        assert meta["labels"][LABEL_SANDBOX] == SID and meta["labels"]["app.kubernetes.io/managed-by"] == "desktop-sandbox"
        # the owner's values are not valid label values: they go in annotations
        assert meta["annotations"] == {LABEL_OWNER: "host:1", LABEL_OWNER_ID: "m:b:ns:1:2"}
        assert LABEL_OWNER not in meta["labels"]


def test_every_container_is_locked_down():
    pods = [m for m in _manifests() if m["kind"] == "Pod"]
    assert len(pods) == 2
    for pod in pods:
        spec = pod["spec"]
        assert spec["automountServiceAccountToken"] is False and spec["enableServiceLinks"] is False
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        assert not spec.get("hostNetwork") and not spec.get("hostPID") and not spec.get("hostIPC")
        for c in spec["containers"]:
            ctx = c["securityContext"]
            assert ctx["runAsNonRoot"] is True and ctx["readOnlyRootFilesystem"] is True
            assert ctx["allowPrivilegeEscalation"] is False and ctx["privileged"] is False
            assert ctx["capabilities"] == {"drop": ["ALL"]} and "add" not in ctx["capabilities"]
            assert ctx["seccompProfile"] == {"type": "RuntimeDefault"}
            res = c["resources"]
            assert set(res["requests"]) == set(res["limits"]) == {"cpu", "memory"}
            assert res["requests"]["memory"] == res["limits"]["memory"]  # no overcommit of memory, as Docker's limit
        for v in spec["volumes"]:
            if "emptyDir" in v:
                assert v["emptyDir"]["medium"] == "Memory" and v["emptyDir"]["sizeLimit"].endswith("Mi")


def test_desktop_pod_users_volumes_and_dns():
    pod = _by(_manifests(), "Pod", "desktop")
    spec = pod["spec"]
    desktop, agent = spec["containers"]
    assert (desktop["name"], desktop["securityContext"]["runAsUser"]) == ("desktop", 1000)
    assert (agent["name"], agent["securityContext"]["runAsUser"]) == ("agent", 1002)
    sizes = {v["name"]: v["emptyDir"]["sizeLimit"] for v in spec["volumes"] if "emptyDir" in v}
    # sized like the Docker backend's tmpfs budget
    assert sizes["home"] == f"{DESKTOP_TMPFS_MIB['/home/sandbox']}Mi" and sizes["tmp"] == f"{DESKTOP_TMPFS_MIB['/tmp']}Mi"
    assert sizes["var-tmp"] == f"{DESKTOP_TMPFS_MIB['/var/tmp']}Mi" and sizes["shm"] == "256Mi"
    mounts = {c["name"]: {m["name"]: m for m in c["volumeMounts"]} for c in (desktop, agent)}
    # the token only where it is needed: the agent container; the desktop container gets the X cookie alone
    assert "agent-secrets" in mounts["agent"] and "agent-secrets" not in mounts["desktop"]
    cookie = next(v for v in spec["volumes"] if v["name"] == "cookie")["secret"]
    assert cookie["items"] == [{"key": "xcookie", "path": "xcookie"}]
    assert mounts["agent"]["home"]["readOnly"] is True and mounts["desktop"]["home"].get("readOnly") is not True
    assert "session" not in mounts["agent"] and "policy" not in mounts["desktop"]
    assert spec["dnsPolicy"] == "None" and spec["dnsConfig"] == {"nameservers": ["127.0.0.1"]}
    assert spec["hostAliases"] == [{"ip": "10.96.0.10", "hostnames": ["gateway"]}]
    env = {e["name"]: e["value"] for e in desktop["env"]}
    assert env["HTTPS_PROXY"] == "http://gateway:3128" and env["SCREEN_WIDTH"] == "1280"
    assert "t0ken" not in str(pod)  # the token is in the Secret, never in a Pod's spec
    gateway = _by(_manifests(), "Pod", "gateway")
    assert [v["name"] for v in gateway["spec"]["volumes"] if "configMap" in v] == ["policy"]
    assert "secret" not in str(gateway["spec"]["volumes"])


def test_network_policies_select_their_pods_and_ports():
    ms = _manifests()
    desktop_np, gateway_np = _by(ms, "NetworkPolicy", "desktop"), _by(ms, "NetworkPolicy", "gateway")
    desktop_sel = {LABEL_SANDBOX: SID, LABEL_ROLE: "desktop"}
    gateway_sel = {LABEL_SANDBOX: SID, LABEL_ROLE: "gateway"}
    # the selectors match the Pods' labels
    assert desktop_sel.items() <= _by(ms, "Pod", "desktop")["metadata"]["labels"].items()
    assert gateway_sel.items() <= _by(ms, "Pod", "gateway")["metadata"]["labels"].items()
    assert _by(ms, "Service", "gateway")["spec"]["selector"] == gateway_sel
    d = desktop_np["spec"]
    assert d["podSelector"] == {"matchLabels": desktop_sel} and d["policyTypes"] == ["Ingress", "Egress"]
    assert d["ingress"] == []  # nothing reaches the desktop over the Pod network: the agent only by port-forward
    assert d["egress"] == [{"to": [{"podSelector": {"matchLabels": gateway_sel}}],
                            "ports": [{"protocol": "TCP", "port": 3128}]}]  # no DNS, nothing else
    g = gateway_np["spec"]
    assert g["podSelector"] == {"matchLabels": gateway_sel} and g["policyTypes"] == ["Ingress", "Egress"]
    assert g["ingress"] == [{"from": [{"podSelector": {"matchLabels": desktop_sel}}],
                             "ports": [{"protocol": "TCP", "port": 3128}]}]
    assert g["egress"] == []  # deny-all: the gateway has no way out


def test_gateway_egress_follows_the_policy():
    rules = k8s.gateway_egress(ALLOW)
    dns, public, named = rules
    assert dns["ports"] == [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]
    assert dns["to"][0]["podSelector"] == {"matchLabels": {"k8s-app": "kube-dns"}}
    assert public["ports"] == [{"protocol": "TCP", "port": 443}, {"protocol": "TCP", "port": 8080}]
    block = public["to"][0]["ipBlock"]
    assert block["cidr"] == "0.0.0.0/0" and {"10.0.0.0/8", "169.254.0.0/16", "127.0.0.0/8"} <= set(block["except"])
    assert named == {"to": [{"ipBlock": {"cidr": "10.1.2.3/32"}}], "ports": public["ports"]}
    assert k8s.gateway_egress({"mode": "deny-all", "allow": []}) == []
    with pytest.raises(ValueError, match="not available on the kubernetes backend"):
        k8s.gateway_egress({"mode": "ask", "allow": []})


def test_secret_holds_the_token_and_cookie_only():
    secret = _by(_manifests(), "Secret", "secret")
    assert secret["stringData"] == {"token": "t0ken", "xcookie": "ab" * 16}
    policy = _by(_manifests(ALLOW), "ConfigMap", "policy")
    assert '"mode": "allowlist"' in policy["data"]["policy.json"]


def test_a_task_in_mode_ask_is_refused_before_anything(tmp_path):
    """Mode ask needs the gateway's control API, which this backend's gateway Pod does not run: render
    refuses the task (exit 2, one line), and so does a start, before any cluster is contacted."""
    task = tmp_path / "ask.toml"
    task.write_text((ROOT / "tasks" / "pickup.toml").read_text().replace('mode = "deny-all"', 'mode = "ask"'))
    assert 'mode = "ask"' in task.read_text()
    out = _render_cli("--backend", "kubernetes", str(task))
    assert out.returncode == 2 and "not available on the kubernetes backend" in out.stderr and not out.stdout
    from controller.sandbox import SandboxError, SandboxSpec

    spec = SandboxSpec(policy={"mode": "ask", "allow": []})
    with pytest.raises(SandboxError, match="not available on the kubernetes backend"):
        k8s.KubernetesSandbox.start(spec, apis=None)
