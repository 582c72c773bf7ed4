"""The isolation model (ARCHITECTURE.md, "Isolation model (Docker)") as `docker inspect` and the guest see it."""

from __future__ import annotations

import json
import socket

import pytest

from controller.sandbox import LABEL_ROLE, LABEL_SANDBOX
from controller.sandbox.docker import AGENT_PORT, AGENT_TOKEN_FILE, GATEWAY_CONTROL_PORT, GATEWAY_PROXY_PORT
from controller.sandbox.docker_hardening import (AGENT_UID, BROWSER_ROUTES_DIR, CONTROL_DIR, DESKTOP_CAP_ADD,
                                                 DESKTOP_TMPFS_MIB)


def _inspect(sandbox, role: str) -> dict:
    container = sandbox.desktop if role == "desktop" else sandbox.gateway
    return sandbox.client.api.inspect_container(container.id)


def _networks(sandbox) -> dict[str, dict]:
    nets = sandbox.client.networks.list(filters={"label": f"{LABEL_SANDBOX}={sandbox.id}"})
    return {n.attrs["Labels"][LABEL_ROLE]: sandbox.client.api.inspect_network(n.id) for n in nets}


@pytest.mark.parametrize("role,user,caps", [("desktop", "0:0", sorted(DESKTOP_CAP_ADD)), ("gateway", "1001:1001", [])])
def test_container_hardening(sandbox, role, user, caps):
    info = _inspect(sandbox, role)
    host = info["HostConfig"]
    assert info["Config"]["User"] == user
    assert host["CapDrop"] == ["ALL"]
    assert sorted(c.removeprefix("CAP_") for c in host["CapAdd"] or []) == caps
    assert "no-new-privileges:true" in host["SecurityOpt"]
    assert not any(o.startswith("seccomp") for o in host["SecurityOpt"]), "default seccomp profile expected"
    assert not any("apparmor=unconfined" in o for o in host["SecurityOpt"])
    assert host["Privileged"] is False
    assert host["ReadonlyRootfs"] is True
    assert "/tmp" in host["Tmpfs"]
    assert host["PidsLimit"] and host["PidsLimit"] > 0
    assert host["Memory"] > 0 and host["MemorySwap"] == host["Memory"]
    assert host["NetworkMode"] not in ("host", "bridge", "default")
    assert not host["Binds"]
    assert all(m["Type"] == "tmpfs" for m in info["Mounts"]), info["Mounts"]
    assert not any("docker.sock" in json.dumps(m) for m in info["Mounts"])
    assert host["Devices"] in (None, [])
    assert host["PidMode"] == "" and host["IpcMode"] == "private" and host["UTSMode"] == ""
    assert info["Config"]["Labels"][LABEL_SANDBOX] == sandbox.id
    assert info["Config"]["Labels"][LABEL_ROLE] == role


def test_desktop_tmpfs_and_limits(sandbox):
    host = _inspect(sandbox, "desktop")["HostConfig"]
    assert set(host["Tmpfs"]) == set(DESKTOP_TMPFS_MIB)
    assert "uid=1000" in host["Tmpfs"]["/home/sandbox"]
    assert f"uid={AGENT_UID}" in host["Tmpfs"]["/run/desktop-sandbox"]
    assert "uid=0" in host["Tmpfs"][CONTROL_DIR] and f"gid={AGENT_UID}" in host["Tmpfs"][CONTROL_DIR]
    assert f"uid={AGENT_UID}" in host["Tmpfs"][BROWSER_ROUTES_DIR] and "mode=0755" in host["Tmpfs"][BROWSER_ROUTES_DIR]
    # chromium's proxy routes: the agent's alone to write (the desktop user cannot add or replace them)
    for argv in (["touch", f"{BROWSER_ROUTES_DIR}/proxy.json"], ["mv", BROWSER_ROUTES_DIR, "/tmp/routes"]):
        assert sandbox.exec_in_guest(argv, timeout=10).exit_code != 0, argv
    assert host["ShmSize"] >= 256 * 1024 * 1024
    tmpfs_bytes = sum(DESKTOP_TMPFS_MIB.values()) * 1024 * 1024
    assert host["Memory"] - host["ShmSize"] - tmpfs_bytes >= 768 * 1024 * 1024


def test_no_secrets_in_environment(sandbox):
    for role in ("desktop", "gateway"):
        env = _inspect(sandbox, role)["Config"]["Env"]
        text = "\n".join(env)
        assert sandbox.agent_token not in text
        assert not any(e.split("=", 1)[0] in ("OPENAI_API_KEY", "AGENT_TOKEN") for e in env)
        assert "OPENAI" not in text


def test_networks(sandbox):
    nets = _networks(sandbox)
    assert set(nets) == {"internal", "egress"}
    assert nets["internal"]["Internal"] is True
    assert nets["egress"]["Internal"] is False
    assert not nets["internal"]["EnableIPv6"] and not nets["egress"]["EnableIPv6"]
    desktop = _inspect(sandbox, "desktop")
    gateway = _inspect(sandbox, "gateway")
    assert set(desktop["NetworkSettings"]["Networks"]) == {nets["internal"]["Name"]}
    assert set(gateway["NetworkSettings"]["Networks"]) == {nets["internal"]["Name"], nets["egress"]["Name"]}
    # No published ports on the desktop; the gateway publishes only the relay and its control API, on
    # 127.0.0.1.
    assert not desktop["HostConfig"]["PortBindings"]
    assert not any(desktop["NetworkSettings"]["Ports"].values())
    bindings = gateway["HostConfig"]["PortBindings"]
    assert sorted(bindings) == sorted([f"{AGENT_PORT}/tcp", f"{GATEWAY_CONTROL_PORT}/tcp"])
    for port in (AGENT_PORT, GATEWAY_CONTROL_PORT):
        assert all(b["HostIp"] == "127.0.0.1" for b in bindings[f"{port}/tcp"])
        published = gateway["NetworkSettings"]["Ports"][f"{port}/tcp"]
        assert published and all(b["HostIp"] == "127.0.0.1" for b in published)


def _guest(sandbox, *argv: str) -> str:
    result = sandbox.exec_in_guest(list(argv), timeout=20)
    assert result.exit_code == 0, (argv, result)
    return result.stdout.decode()


def test_guest_process_view(sandbox):
    """What a process in the guest actually gets: uid, no caps (the bounding set holds at most supervisord's
    three, which no_new_privs keeps it from gaining), no_new_privs, seccomp filter."""
    assert _guest(sandbox, "id", "-u").strip() == "1000"
    status = dict(
        line.split(":", 1) for line in _guest(sandbox, "cat", "/proc/self/status").splitlines() if ":" in line
    )
    assert int(status["CapEff"].strip(), 16) == 0
    assert int(status["CapPrm"].strip(), 16) == 0
    assert int(status["CapInh"].strip(), 16) == 0
    assert int(status["CapAmb"].strip(), 16) == 0
    kill_setgid_setuid = (1 << 5) | (1 << 6) | (1 << 7)
    assert int(status["CapBnd"].strip(), 16) & ~kill_setgid_setuid == 0
    assert status["NoNewPrivs"].strip() == "1"
    assert status["Seccomp"].strip() == "2"


def test_guest_cannot_write_root_or_escalate(sandbox):
    result = sandbox.exec_in_guest(["touch", "/etc/desktop-sandbox-probe"], timeout=10)
    assert result.exit_code != 0 and b"Read-only file system" in result.stderr
    for tool in ("sudo", "su -c id root"):
        result = sandbox.exec_in_guest(tool.split(), timeout=10)
        assert result.exit_code != 0
    result = sandbox.exec_in_guest(["sh", "-c", "command -v sudo"], timeout=10)
    assert result.exit_code != 0, "sudo must not be installed"


def test_token_file(sandbox):
    as_agent = sandbox._exec(sandbox.desktop, ["stat", "-c", "%a %u %g", AGENT_TOKEN_FILE, "/run/desktop-sandbox"],
                             user=f"{AGENT_UID}:{AGENT_UID}", timeout=10)
    assert as_agent.stdout.decode().split() == ["400", "1002", "1002", "700", "1002", "1002"], as_agent
    # Not readable by the desktop user (tests/docker/test_privsep.py) nor by the gateway.
    assert sandbox.exec_in_guest(["cat", AGENT_TOKEN_FILE], timeout=10).exit_code != 0
    # Not readable by the gateway, not in the image's filesystem layers.
    assert sandbox.exec_in_gateway(["cat", AGENT_TOKEN_FILE], timeout=10).exit_code != 0


def test_guest_network_view(sandbox):
    """No IPv6, the gateway found by name through /etc/hosts (no DNS needed)."""
    assert _guest(sandbox, "cat", "/proc/sys/net/ipv6/conf/all/disable_ipv6").strip() == "1"
    hosts = _guest(sandbox, "cat", "/etc/hosts")
    assert any(line.split()[1:2] == ["gateway"] for line in hosts.splitlines() if line.strip())


def test_internal_network_has_no_host_address(sandbox):
    nets = _networks(sandbox)
    assert nets["internal"]["Options"].get("com.docker.network.bridge.inhibit_ipv4") == "true"


def test_docker_host_not_reachable_from_guest(sandbox):
    """A listener on the host's 0.0.0.0 is reached neither via the internal network's gateway address
    nor via the host's other addresses (egress bridge, docker0); the listener proves nothing arrived."""
    nets = _networks(sandbox)
    candidates = {c["Gateway"] for n in nets.values() for c in n["IPAM"]["Config"] if c.get("Gateway")}
    candidates.add("172.17.0.1")
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("0.0.0.0", 0))
    listener.listen(8)
    listener.setblocking(False)
    port = listener.getsockname()[1]
    try:
        for address in sorted(candidates):
            out = _guest(sandbox, "python3", "-c", _CONNECT, address, str(port))
            assert out.startswith("closed"), (address, out)
        with pytest.raises(BlockingIOError):
            listener.accept()
    finally:
        listener.close()


_CONNECT = (
    "import socket,sys\n"
    "s=socket.socket(); s.settimeout(3)\n"
    "try:\n"
    "    s.connect((sys.argv[1], int(sys.argv[2]))); print('open')\n"
    "except OSError as e:\n"
    "    print('closed', type(e).__name__)\n"
)


def test_relay_port_not_reachable_from_guest(sandbox):
    """The relay listens on the gateway's egress side only: the guest cannot open it."""
    out = _guest(sandbox, "python3", "-c", _CONNECT, "gateway", str(AGENT_PORT))
    assert out.startswith("closed"), out


def test_proxy_port_reachable_from_guest(sandbox):
    out = _guest(sandbox, "python3", "-c", _CONNECT, "gateway", str(GATEWAY_PROXY_PORT))
    assert out.startswith("open"), out


_FILL = (
    "import errno, json, os, sys\n"
    "out = {}\n"
    "block = b'\\xa5' * (1 << 20)\n"
    "for d in sys.argv[1:]:\n"
    "    fd = os.open(os.path.join(d, 'ds-fill'), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)\n"
    "    written = 0\n"
    "    try:\n"
    "        while True:\n"
    "            written += os.write(fd, block)\n"
    "    except OSError as exc:\n"
    "        out[d] = [errno.errorcode[exc.errno], written >> 20]\n"
    "    finally:\n"
    "        os.close(fd)\n"
    "print(json.dumps(out))\n"
)
FILLED = ("/home/sandbox", "/tmp", "/var/tmp", "/dev/shm")


def test_filling_temporary_space_leaves_the_session_alive(sandbox):
    """The desktop user fills every writable tmpfs and /dev/shm to ENOSPC: the writer fails, the
    container is not OOM-killed, the agent still takes screenshots."""
    try:
        result = sandbox.exec_in_guest(["python3", "-c", _FILL, *FILLED], timeout=60)
        assert result.exit_code == 0, result
        filled = json.loads(result.stdout)
        assert {d: e for d, (e, _) in filled.items()} == {d: "ENOSPC" for d in FILLED}, filled
        assert filled["/home/sandbox"][1] >= 400 and filled["/dev/shm"][1] >= 200, filled
        shot = sandbox.agent.screenshot()
        assert shot.screen_size == (1280, 800) and shot.data[:8] == b"\x89PNG\r\n\x1a\n"
        state = _inspect(sandbox, "desktop")["State"]
        assert state["Running"] is True and state["OOMKilled"] is False, state
        assert sandbox.agent.livez()
    finally:
        sandbox.exec_in_guest(["rm", "-f", *(f"{d}/ds-fill" for d in FILLED)], timeout=30)
