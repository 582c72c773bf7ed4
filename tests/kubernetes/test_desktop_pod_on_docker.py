"""The desktop Pod's two containers, exactly as :func:`controller.sandbox.kubernetes.render_manifests`
renders them (command, environment, user, groups, mounts, read-only root, no capabilities), run on the
local Docker engine from the project's image: no cluster can run here, so this is where the Kubernetes
session layout -- no user switching, the agent in a container of its own, sharing only the X socket,
the broker's socket and (read-only) the home -- is shown to work. Docker stands in for what a Pod gives:
one network namespace for both containers (``network_mode=container:``), emptyDir volumes (tmpfs
volumes), Secret and ConfigMap volumes (files 0440/0444, group ``fsGroup``), ``fsGroup`` and
``supplementalGroups`` (``group_add``). Network policy is not part of it (the gateway is not started).
"""

from __future__ import annotations

import os
import secrets
import socket
import time
from pathlib import Path

import httpx
import pytest

from controller.sandbox import LABEL_OWNER, LABEL_OWNER_ID, LABEL_ROLE, LABEL_SANDBOX, SandboxSpec
from controller.sandbox.kubernetes import AGENT_PORT, KubernetesOptions, render_manifests
from controller.sandbox.owner import owner_id

pytestmark = [pytest.mark.docker, pytest.mark.slow]

TERMINAL_ARGS = ["-T", "Terminal", "-e", "bash", "-c", "mkdir -p ~/.cache && touch ~/.cache/terminal-ready && exec bash"]


def _pod(image: str) -> tuple[dict, dict, dict]:
    spec = SandboxSpec(screen_width=1024, screen_height=768)
    manifests = render_manifests("dk-0000beef", spec, KubernetesOptions(namespace="ns", image=image),
                                 token=secrets.token_urlsafe(32), x_cookie=secrets.token_hex(16), gateway_ip="192.0.2.1")
    by_kind = {(m["kind"], m["metadata"]["labels"][LABEL_ROLE]): m for m in manifests}
    return by_kind[("Pod", "desktop")], by_kind[("Secret", "secret")], by_kind[("ConfigMap", "session")]


def _volume_source(pod: dict, name: str) -> dict:
    return next(v for v in pod["spec"]["volumes"] if v["name"] == name)


@pytest.fixture
def pod_on_docker(docker_client, desktop_image, tmp_path):
    """Both containers of the rendered desktop Pod started on Docker; yields ``(agent_url, token)``."""
    pod, secret, session = _pod(desktop_image)
    fs_group = pod["spec"]["securityContext"]["fsGroup"]
    groups = [str(g) for g in {fs_group, *pod["spec"]["securityContext"].get("supplementalGroups", [])}]
    sid = f"ds-{secrets.token_hex(4)}"  # a Docker-backend id: `down` and orphan reaping know it
    labels = {LABEL_SANDBOX: sid, LABEL_ROLE: "k8s-rehearsal", LABEL_OWNER: f"{socket.gethostname()}:{os.getpid()}",
              LABEL_OWNER_ID: owner_id()}
    created = []

    def files(volume: dict) -> str:
        """A host folder standing for a Secret or ConfigMap volume: each item a file, mode and group as
        the kubelet makes them (owner root, group fsGroup)."""
        src = volume.get("secret") or volume.get("configMap")
        data = secret["stringData"] if "secret" in volume else session["data"]
        folder = tmp_path / volume["name"]
        folder.mkdir()
        for item in src.get("items") or [{"key": k, "path": k} for k in data]:
            path = folder / item["path"]
            path.write_text(data[item["key"]], encoding="utf-8")
            os.chown(path, 0, fs_group)
            path.chmod(src["defaultMode"])
        folder.chmod(0o755)
        return str(folder)

    volumes = {}
    for v in pod["spec"]["volumes"]:
        if "emptyDir" in v:
            vol = docker_client.volumes.create(
                f"{sid}-{v['name']}", driver="local", labels=labels,
                driver_opts={"type": "tmpfs", "device": "tmpfs",
                             "o": f"size={v['emptyDir']['sizeLimit'].replace('Mi', 'm')},mode=2777,gid={fs_group}"})
            created.append(vol)
            volumes[v["name"]] = vol.name
        else:
            volumes[v["name"]] = files(v)

    def kwargs(container: dict) -> dict:
        ctx = container["securityContext"]
        assert ctx["capabilities"] == {"drop": ["ALL"]} and ctx["readOnlyRootFilesystem"] and ctx["runAsNonRoot"]
        mounts = {}
        for m in container["volumeMounts"]:
            mounts[volumes[m["name"]]] = {"bind": m["mountPath"], "mode": "ro" if m.get("readOnly") else "rw"}
        return dict(entrypoint=container["command"], environment={e["name"]: e["value"] for e in container["env"]},
                    user=f"{ctx['runAsUser']}:{ctx['runAsGroup']}", group_add=groups, read_only=True,
                    cap_drop=["ALL"], security_opt=["no-new-privileges:true"], volumes=mounts, labels=labels,
                    mem_limit=container["resources"]["limits"]["memory"].replace("Gi", "g").replace("Mi", "m"),
                    hostname=pod["spec"]["hostname"])

    desktop_c, agent_c = pod["spec"]["containers"]
    try:
        desktop = docker_client.containers.create(desktop_image, name=f"{sid}-desktop", detach=True,
                                                  ports={f"{AGENT_PORT}/tcp": ("127.0.0.1", None)}, **kwargs(desktop_c))
        created.insert(0, desktop)
        desktop.start()
        agent_kw = kwargs(agent_c)
        agent_kw.pop("hostname")  # shares the desktop's, as containers of a Pod do
        agent = docker_client.containers.create(desktop_image, name=f"{sid}-agent", detach=True,
                                                network_mode=f"container:{desktop.id}", **agent_kw)
        created.insert(0, agent)
        agent.start()
        desktop.reload()
        port = desktop.attrs["NetworkSettings"]["Ports"][f"{AGENT_PORT}/tcp"][0]["HostPort"]
        yield f"http://127.0.0.1:{port}", secret["stringData"]["token"], (desktop, agent)
    finally:
        for thing in created:
            try:
                thing.remove(force=True)
            except Exception:  # noqa: BLE001 - already gone
                pass


def _until(what: str, fn, timeout: float = 90.0, containers=()):
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = fn()
            if value:
                return value
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            logs = "\n".join(c.logs(tail=30).decode("utf-8", "replace") for c in containers)
            pytest.fail(f"no {what} within {timeout:g}s\n{logs}")
        time.sleep(0.2)  # poll interval: the session starts in the containers


def test_rendered_desktop_pod_runs_without_any_capability(pod_on_docker):
    url, token, containers = pod_on_docker
    auth = {"Authorization": f"Bearer {token}"}
    with httpx.Client(base_url=url, timeout=10) as http:
        _until("agent answering", lambda: http.get("/v1/display", headers=auth).status_code == 200,
               containers=containers)
        assert http.get("/v1/display", headers=auth).json() == {"width": 1024, "height": 768, "depth": 24}
        assert http.get("/v1/display", headers={"Authorization": "Bearer wrong"}).status_code == 401
        # an app through the desktop container's broker, as the desktop user: its file appears in the home
        launched = http.post("/v1/launch", headers=auth, json={"app": "terminal", "args": TERMINAL_ARGS})
        assert launched.status_code == 200, launched.text
        _until("the terminal's file", lambda: http.get("/v1/files", params={"path": "~/.cache/terminal-ready"},
                                                       headers=auth).status_code == 200, containers=containers)
        shot = http.get("/v1/screenshot", headers=auth)
        assert shot.status_code == 200 and shot.content.startswith(b"\x89PNG")
    desktop, agent = containers
    # the desktop user cannot read the agent's token: it is not in its container at all
    out = desktop.exec_run(["sh", "-c", "cat /run/desktop-sandbox-secrets/token; ls /run/desktop-sandbox-secrets"],
                           user="1000:1000")
    assert token.encode() not in out.output and b"xcookie" in out.output
    # nor see the agent's processes (a container's own PID namespace)
    ps = desktop.exec_run(["sh", "-c", "cat /proc/[0-9]*/cmdline | tr '\\0' ' '"], user="1000:1000").output
    assert b"guest serve" not in ps and b"supervisord" in ps
    # the terminal runs as the desktop user, in the desktop container, with no capability
    status = desktop.exec_run(["sh", "-c", "grep -l Terminal /proc/[0-9]*/cmdline | head -1 | xargs dirname | "
                               "xargs -I{} grep -E '^(Uid|CapEff|CapPrm)' {}/status"], user="1000:1000").output.decode()
    assert "Uid:\t1000" in status and "CapEff:\t0000000000000000" in status, status
    # and the agent's home mount is read-only
    write = agent.exec_run(["sh", "-c", "touch /home/sandbox/x"], user="1002:1002")
    assert write.exit_code != 0 and b"Read-only" in write.output
