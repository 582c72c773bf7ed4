"""A task's sandbox as a warm pool of agent-sandbox objects (``render --pool N``), offline: every
SandboxTemplate / SandboxWarmPool / SandboxClaim passes the schema written from the upstream API
(controller.sandbox.agent_sandbox_schema), a mutated one is refused naming the field, the standard
objects and the template's Pod validate against the Kubernetes OpenAPI schemas as today's render does,
and the pool's Pod keeps the isolation of today's desktop Pod."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path

import pytest

from controller.sandbox import LABEL_ROLE, LABEL_SANDBOX, SandboxSpec

kv = pytest.importorskip("kubernetes_validate", reason="kubernetes-validate (test extra) holds the schemas")
yaml = pytest.importorskip("yaml", reason="PyYAML comes with the [kubernetes] extra")

from controller.model.errors import DesktopSandboxError  # noqa: E402
from controller.sandbox import agent_sandbox_schema as schema  # noqa: E402
from controller.sandbox import kubernetes_manifests as km  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
VERSIONS = ("1.30", "1.31", "1.32", "1.33", "1.34", "1.35")
DENY = {"mode": "deny-all", "allow": []}
POOL = "dk-pool-pickup"


def _render_cli(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in (km.NAMESPACE_ENV, km.IMAGE_ENV, km.PULL_SECRET_ENV)}
    return subprocess.run([sys.executable, "-m", "controller.cli", "render", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


def _options() -> km.KubernetesOptions:
    return km.KubernetesOptions(namespace="sandboxes", image="registry.example/desktop-sandbox:1")


def _spec(policy=None) -> SandboxSpec:
    return SandboxSpec(screen_width=1280, screen_height=800, policy=policy or DENY)


def _kind(manifests: list[dict], kind: str) -> dict:
    (found,) = [m for m in manifests if m["kind"] == kind]
    return found


@pytest.fixture(scope="module")
def rendered() -> tuple[str, list[dict]]:
    """What ``desktop-sandbox render --backend kubernetes --pool 3 tasks/pickup.toml`` prints: the text and
    its documents."""
    result = _render_cli("--backend", "kubernetes", "--namespace", "sandboxes", "--pool", "3", "tasks/pickup.toml")
    assert result.returncode == 0, result.stderr
    return result.stdout, list(yaml.safe_load_all(result.stdout))


def test_pool_render_passes_the_schemas(rendered):
    text, docs = rendered
    assert text.startswith("# desktop-sandbox render --backend kubernetes --pool 3")
    assert "&id" not in text and "*id" not in text  # no YAML anchors: plain to read and diff
    assert [m["kind"] for m in docs] == ["ConfigMap", "ConfigMap", "NetworkPolicy", "SandboxTemplate",
                                        "SandboxWarmPool", "SandboxClaim"]
    assert schema.embedded_checker() == "kubernetes client models"  # the official client's models check PodSpec
    for m in docs:
        if m["kind"] in schema.SPECS:
            assert m["apiVersion"] == "extensions.agents.x-k8s.io/v1beta1"
            assert schema.check(m) == [], m["kind"]
            schema.validate(m)
    pod = _kind(docs, "SandboxTemplate")["spec"]["podTemplate"]
    as_pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x", **pod["metadata"]}, "spec": pod["spec"]}
    for version in VERSIONS:  # the checks today's Pod render passes, on the template's Pod and the plain objects
        kv.validate(as_pod, version, strict=True)
        for m in docs:
            if m["kind"] not in schema.SPECS:
                kv.validate(m, version, strict=True)


def test_the_pool_holds_n_sandboxes_of_the_template_and_the_claim_takes_from_it(rendered):
    text, docs = rendered
    template, pool, claim = (_kind(docs, k) for k in ("SandboxTemplate", "SandboxWarmPool", "SandboxClaim"))
    assert pool["spec"]["replicas"] == 3
    assert template["metadata"]["name"] == pool["metadata"]["name"] == POOL
    # the claim names the pool (v1beta1: warmPoolRef), the pool names the template
    assert claim["spec"] == {"warmPoolRef": {"name": POOL}}
    assert pool["spec"]["sandboxTemplateRef"] == {"name": POOL}
    assert {m["metadata"]["namespace"] for m in docs} == {"sandboxes"}
    volumes = {v["name"]: v for v in template["spec"]["podTemplate"]["spec"]["volumes"]}
    # the Secret the header says to create
    assert volumes["agent-secrets"]["secret"]["secretName"] == f"{POOL}-agent"
    assert f"create secret generic {POOL}-agent" in text
    assert volumes["policy"]["configMap"]["name"] == docs[0]["metadata"]["name"] == f"{POOL}-policy"
    for n in (0, 7):
        made = km.render_pool(POOL, _spec(), _options(), replicas=n)
        made_pool = _kind(made, "SandboxWarmPool")
        assert made_pool["spec"]["replicas"] == n and schema.check(made_pool) == []


def test_the_pool_pod_keeps_the_sandbox_pod_isolation(rendered):
    _, docs = rendered
    template = _kind(docs, "SandboxTemplate")
    pod_meta, pod = template["spec"]["podTemplate"]["metadata"], template["spec"]["podTemplate"]["spec"]
    # our NetworkPolicy selects every Pod of the pool: nothing in, nothing out over the Pod network
    policy = _kind(docs, "NetworkPolicy")["spec"]
    assert policy["podSelector"]["matchLabels"].items() <= pod_meta["labels"].items()
    assert policy["policyTypes"] == ["Ingress", "Egress"] and policy["ingress"] == [] and policy["egress"] == []
    # and the template carries the same, managed (left out, the controller's default opens the internet)
    assert template["spec"]["networkPolicyManagement"] == "Managed"
    assert template["spec"]["networkPolicy"] == {"ingress": [], "egress": []}
    # claims may neither change the environment (the proxy settings) nor add volumes; no Service
    assert template["spec"]["envVarsInjectionPolicy"] == "Disallowed"
    assert template["spec"]["volumeClaimTemplatesPolicy"] == "Disallowed" and template["spec"]["service"] is False
    # the only way out is the gateway: the Pod's own loopback, no DNS, the proxy settings of today's Pod
    assert pod["hostAliases"] == [{"ip": "127.0.0.1", "hostnames": ["gateway"]}]
    assert pod["dnsPolicy"] == "None" and pod["dnsConfig"] == {"nameservers": ["127.0.0.1"]}
    today = km.render_manifests("dk-0123abcd", _spec(), km.KubernetesOptions(namespace="sandboxes"), token="t",
                                x_cookie="0" * 32, gateway_ip="10.96.0.10")
    today_desktop = next(m for m in today if m["kind"] == "Pod" and m["metadata"]["labels"][LABEL_ROLE] == "desktop")
    today_gateway = next(m for m in today if m["kind"] == "Pod" and m["metadata"]["labels"][LABEL_ROLE] == "gateway")
    desktop, agent, gateway = pod["containers"]
    assert [desktop, agent] == today_desktop["spec"]["containers"]  # the same containers, field for field
    assert pod["securityContext"] == today_desktop["spec"]["securityContext"]
    env = {e["name"]: e["value"] for e in desktop["env"]}
    assert env["HTTPS_PROXY"] == env["HTTP_PROXY"] == "http://gateway:3128" and env["SCREEN_WIDTH"] == "1280"
    # the gateway: today's gateway container, as its own user, refusing the agent's port
    was = today_gateway["spec"]["containers"][0]
    assert gateway["command"] == was["command"] and gateway["ports"] == was["ports"]
    assert gateway["env"] == [*was["env"], {"name": "RELAY_PORT", "value": str(km.AGENT_PORT)}]
    assert gateway["securityContext"] == {**was["securityContext"], "runAsUser": 1001, "runAsGroup": 1001}
    for c in pod["containers"]:
        ctx = c["securityContext"]
        assert ctx["runAsNonRoot"] is True and ctx["readOnlyRootFilesystem"] is True and ctx["privileged"] is False
        assert ctx["allowPrivilegeEscalation"] is False and ctx["capabilities"] == {"drop": ["ALL"]}
        assert c["resources"]["requests"]["memory"] == c["resources"]["limits"]["memory"]
    assert pod["automountServiceAccountToken"] is False and pod["enableServiceLinks"] is False
    assert not pod.get("hostNetwork") and not pod.get("hostPID") and not pod.get("shareProcessNamespace")
    mounts = {c["name"]: {m["name"] for m in c["volumeMounts"]} for c in pod["containers"]}
    assert [n for n, ms in mounts.items() if "policy" in ms] == ["gateway"]  # the policy: the gateway only
    assert [n for n, ms in mounts.items() if "agent-secrets" in ms] == ["agent"]  # the token: the agent only
    assert not mounts["gateway"] & (mounts["desktop"] | mounts["agent"])  # nothing shared with the gateway
    # a pool is not a sandbox of the backend: down --all and orphan reaping pass its objects by
    for m in docs:
        assert LABEL_SANDBOX not in m["metadata"]["labels"] and m["metadata"]["labels"][km.LABEL_K8S_POOL] == POOL
    assert LABEL_SANDBOX not in pod_meta["labels"]


def _set(path: str, value):
    def mutate(obj: dict) -> None:
        *parents, last = path.split(".")
        for key in parents:
            obj = obj[int(key)] if isinstance(obj, list) else obj[key]
        if value is _DELETE:
            del obj[last]
        else:
            obj[last] = value
    return mutate


def _renamed(path: str, name: str, to: str):
    """The field ``name`` of the object at ``path`` spelt ``to`` (a snake_case spelling the client's
    models read, which the API does not)."""
    def mutate(obj: dict) -> None:
        for key in path.split("."):
            obj = obj[int(key)] if isinstance(obj, list) else obj[key]
        obj[to] = obj.pop(name)
    return mutate


_DELETE = object()
_CONTAINER = "spec.podTemplate.spec.containers"
_POOL, _TEMPLATE, _CLAIM = "SandboxWarmPool", "SandboxTemplate", "SandboxClaim"
MUTATIONS = [
    # (kind, mutation, what one problem must say: "<kind> <field>: <message>")
    (_POOL, _set("spec.sandboxTemplateRef", _DELETE), "spec.sandboxTemplateRef: required field missing"),
    (_POOL, _set("spec.replicas", "3"), "spec.replicas: expected an integer"),
    (_POOL, _set("spec.replicas", True), "spec.replicas: expected an integer"),
    (_POOL, _set("spec.replicas", -1), "spec.replicas: must be at least 0"),
    (_POOL, _set("spec.replicas", 2**31), "spec.replicas: 2147483648 is outside int32"),
    (_POOL, _set("spec.replica", 3), "spec.replica: unknown field"),
    (_POOL, _set("spec.updateStrategy.type", "Rolling"), "spec.updateStrategy.type: Rolling is not one of"),
    (_POOL, _set("apiVersion", "extensions.agents.x-k8s.io/v1alpha1"),
     "apiVersion: expected extensions.agents.x-k8s.io/v1beta1, got extensions.agents.x-k8s.io/v1alpha1"),
    (_POOL, _set("metadata.name", _DELETE), "metadata.name: required field missing"),
    (_POOL, _set("specs", {}), "specs: unknown field"),
    (_TEMPLATE, _set("apiVersion", "agents.x-k8s.io/v1beta1"), "apiVersion: expected"),
    (_TEMPLATE, _set("spec.podTemplate", _DELETE), "spec.podTemplate: required field missing"),
    (_TEMPLATE, _set("spec.podTemplate.spec", _DELETE), "spec.podTemplate.spec: required field missing"),
    (_TEMPLATE, _set("spec.networkPolicyManagement", "managed"), "spec.networkPolicyManagement: managed is not one of"),
    (_TEMPLATE, _set("spec.service", "false"), "spec.service: expected a boolean"),
    (_TEMPLATE, _set("spec.networkPolicy.podSelector", {}), "spec.networkPolicy.podSelector: unknown field"),
    (_TEMPLATE, _set("spec.networkPolicy.egress", [{"to": [{"ipBlock": {"cidr": 5}}]}]),
     "spec.networkPolicy.egress[0].to[0].ipBlock.cidr:"),
    (_TEMPLATE, _set(f"{_CONTAINER}.0.securityContext.runAsNonRooot", True),
     f"{_CONTAINER}[0].securityContext.runAsNonRooot:"),
    (_TEMPLATE, _set(f"{_CONTAINER}.1.securityContext.runAsUser", "1002"), f"{_CONTAINER}[1].securityContext.runAsUser:"),
    (_TEMPLATE, _renamed(f"{_CONTAINER}.2.securityContext", "runAsUser", "run_as_user"),
     f"{_CONTAINER}[2].securityContext.run_as_user: not in the API's form"),
    (_TEMPLATE, _set(f"{_CONTAINER}.2.name", _DELETE), f"{_CONTAINER}[2].name: Field required"),
    (_TEMPLATE, _set(_CONTAINER, []), f"{_CONTAINER}: a pod needs at least one container"),
    (_TEMPLATE, _set("spec.podTemplate.metadata.labels", {"desktop-sandbox.role": "bad value!"}),
     "spec.podTemplate.metadata.labels: label value bad value! is not valid"),
    (_CLAIM, _set("spec.warmPoolRef", _DELETE), "spec.warmPoolRef: required field missing"),
    (_CLAIM, _set("spec.warmPoolRef.name", 7), "spec.warmPoolRef.name: expected a string, got integer"),
    (_CLAIM, _set("spec.warmPoolRef.name", "Not_A_Name"), "spec.warmPoolRef.name: Not_A_Name is not a DNS-1123"),
    (_CLAIM, _set("spec.sandboxTemplateRef", {"name": "x"}), "spec.sandboxTemplateRef: unknown field"),
    (_CLAIM, _set("spec.lifecycle", {"shutdownTime": "tomorrow"}), "spec.lifecycle.shutdownTime: tomorrow is not an RFC 3339"),
    (_CLAIM, _set("spec.lifecycle", {"shutdownPolicy": "Forever"}),
     "spec.lifecycle.shutdownPolicy: Forever is not one of Delete, DeleteForeground, Retain"),
    (_CLAIM, _set("spec.env", [{"name": "A"}]), "spec.env[0].value: required field missing"),
    (_CLAIM, _set("kind", "SandboxPool"), "kind: not an agent-sandbox kind"),
]


@pytest.mark.parametrize("kind,mutate,named", MUTATIONS, ids=[f"{m[0]} {m[2][:50]}" for m in MUTATIONS])
def test_a_mutated_object_is_refused_naming_the_field(rendered, kind, mutate, named):
    obj = copy.deepcopy(_kind(rendered[1], kind))
    assert schema.check(obj) == []
    mutate(obj)
    problems = schema.check(obj)
    shown_kind = obj["kind"] if isinstance(obj.get("kind"), str) else kind
    assert any(p.startswith(f"{shown_kind} {named}") for p in problems), problems
    with pytest.raises(schema.AgentSandboxSchemaError, match="not a valid agent-sandbox object") as caught:
        schema.validate(obj)
    assert isinstance(caught.value, DesktopSandboxError) and caught.value.problems == problems


def test_the_schema_takes_what_the_upstream_api_allows(rendered):
    """The optional fields the render leaves out pass too, and a Sandbox made from the template as the
    pool's controller makes one (generateName, the template's workload fields) is a valid Sandbox."""
    template = _kind(rendered[1], "SandboxTemplate")
    workload = {k: v for k, v in template["spec"].items() if k in ("podTemplate", "volumeClaimTemplates", "service")}
    sandbox = {"apiVersion": "agents.x-k8s.io/v1beta1", "kind": "Sandbox",
               "metadata": {"generateName": f"{POOL}-", "namespace": "sandboxes"},
               "spec": {**copy.deepcopy(workload), "operatingMode": "Running", "shutdownPolicy": "Delete",
                        "shutdownTime": "2030-01-31T12:00:00Z"}}
    assert schema.check(sandbox) == []
    pvc = {"metadata": {"name": "data"}, "spec": {"accessModes": ["ReadWriteOnce"],
                                                  "resources": {"requests": {"storage": "1Gi"}}}}
    claim = {"apiVersion": "extensions.agents.x-k8s.io/v1beta1", "kind": "SandboxClaim",
             "metadata": {"name": "c", "labels": {"a.example/b": "c"}},
             "spec": {"warmPoolRef": {"name": POOL},
                      "lifecycle": {"shutdownTime": "2030-01-31T12:00:00+02:00", "ttlSecondsAfterFinished": 60,
                                    "shutdownPolicy": "DeleteForeground"},
                      "additionalPodMetadata": {"labels": {"team": "a"}, "annotations": {"note": "x y"}},
                      "env": [{"name": "A", "value": "1", "containerName": "desktop"}],
                      "volumeClaimTemplates": [pvc]},
             "status": {"sandbox": {"name": "s"}}}
    assert schema.check(claim) == []
    bad_pvc = copy.deepcopy(claim)
    bad_pvc["spec"]["volumeClaimTemplates"][0]["spec"]["accessMode"] = ["ReadWriteOnce"]
    assert any("spec.volumeClaimTemplates[0].spec.accessMode" in p for p in schema.check(bad_pvc))
    pool = {"apiVersion": "extensions.agents.x-k8s.io/v1beta1", "kind": "SandboxWarmPool",
            "metadata": {"name": "p"}, "spec": {"sandboxTemplateRef": {"name": "t"}}}  # replicas defaults upstream
    assert schema.check(pool) == []


@pytest.mark.parametrize("checker", ["kubernetes-validate", "shape only"])
def test_the_embedded_pod_without_the_client_models(rendered, monkeypatch, checker):
    """An older client (its models do not validate): kubernetes-validate checks the embedded types, strictly;
    without it only their shape is checked."""
    monkeypatch.setattr(schema, "_EMBEDDED", schema._Embedded())
    if checker == "kubernetes-validate":
        monkeypatch.setattr(schema._EMBEDDED, "_kind", f"kubernetes-validate {kv.latest_version()}")
        monkeypatch.setattr(schema._EMBEDDED, "_kv_version", kv.latest_version())
    else:
        monkeypatch.setattr(schema._EMBEDDED, "_kind", "shape only")
    template = copy.deepcopy(_kind(rendered[1], "SandboxTemplate"))
    assert schema.check(template) == []
    misspelt = copy.deepcopy(template)
    misspelt["spec"]["podTemplate"]["spec"]["containers"][0]["securityContext"]["runAsNonRooot"] = True
    nameless = copy.deepcopy(template)
    del nameless["spec"]["podTemplate"]["spec"]["containers"][1]["name"]
    assert any(p.startswith(f"SandboxTemplate {_CONTAINER}[1]") and "name" in p for p in schema.check(nameless))
    if checker == "kubernetes-validate":
        assert any("spec.podTemplate.spec" in p and "runAsNonRooot" in p for p in schema.check(misspelt))
    else:
        assert schema.check(misspelt) == []  # what shape only cannot see


def test_a_pool_only_for_deny_all_tasks(tmp_path):
    allow = _render_cli("--backend", "kubernetes", "--pool", "2", "tasks/sign-in-demo.toml")
    assert allow.returncode == 2 and 'mode "allowlist" is not available for a warm pool' in allow.stderr
    assert not allow.stdout
    negative = _render_cli("--backend", "kubernetes", "--pool", "-1", "tasks/pickup.toml")
    assert negative.returncode == 2 and not negative.stdout
    with pytest.raises(ValueError, match='mode "ask" is not available for a warm pool'):
        km.render_pool(POOL, _spec({"mode": "ask", "allow": []}), _options(), replicas=1)
    with pytest.raises(ValueError, match="whole number"):
        km.render_pool(POOL, _spec(), _options(), replicas=-1)
    assert km.pool_name("Sign In_Demo") == "dk-pool-sign-in-demo" and len(km.pool_name("x" * 100)) == km.POOL_NAME_MAX
