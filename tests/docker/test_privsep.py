"""The agent is not the desktop user's (images/supervisor/desktop.conf, controller/sandbox/docker_hardening.py).

Each test acts as the desktop user `sandbox` inside the guest (``exec_in_guest``, uid 1000), the way a
terminal the model opens would, and shows that it cannot reach the agent's token, its supervisor, its
process, its port or its launch broker, while the agent keeps answering and still starts apps as the
desktop user.
"""

from __future__ import annotations

import json

from controller.sandbox.docker import AGENT_PORT, AGENT_TOKEN_FILE
from controller.sandbox.docker_hardening import AGENT_UID, CONTROL_DIR, DESKTOP_UID

SUPERVISOR_CONF = "/opt/desktop-sandbox/src/images/supervisor/desktop.conf"

#: Prints the agent's pids: processes whose argv holds "guest" "serve".
_AGENT_PIDS = (
    "import os\n"
    "for p in os.listdir('/proc'):\n"
    "    if p.isdigit():\n"
    "        try:\n"
    "            argv = open(f'/proc/{p}/cmdline', 'rb').read().split(b'\\0')\n"
    "        except OSError:\n"
    "            continue\n"
    "        if b'guest' in argv and b'serve' in argv and b'-m' in argv:\n"
    "            print(p)\n"
)


def _as_desktop_user(sandbox, argv: list[str], timeout: float = 30):
    return sandbox.exec_in_guest(argv, timeout=timeout)


def _agent_pid(sandbox) -> int:
    out = _as_desktop_user(sandbox, ["python3", "-c", _AGENT_PIDS]).stdout.decode().split()
    assert len(out) == 1, out
    return int(out[0])


def _uid_of(sandbox, pid: int) -> int:
    status = _as_desktop_user(sandbox, ["cat", f"/proc/{pid}/status"]).stdout.decode()
    line = next(line for line in status.splitlines() if line.startswith("Uid:"))
    return int(line.split()[1])


def _assert_agent_untouched(sandbox, pid: int) -> None:
    assert _agent_pid(sandbox) == pid
    state = _as_desktop_user(sandbox, ["sh", "-c", f"grep '^State:' /proc/{pid}/status"]).stdout.decode()
    assert "(stopped)" not in state and "(tracing stop)" not in state, state
    assert sandbox.agent.livez()
    assert sandbox.agent.screenshot().screen_size == (1280, 800)


def test_agent_runs_as_its_own_user_and_launches_as_the_desktop_user(sandbox):
    pid = _agent_pid(sandbox)
    assert _uid_of(sandbox, pid) == AGENT_UID
    probe = sandbox.agent.launch("probe", ["--log", "/home/sandbox/privsep-probe.jsonl"])
    try:
        assert _uid_of(sandbox, probe) == DESKTOP_UID
    finally:
        _as_desktop_user(sandbox, ["kill", str(probe)])


def test_desktop_user_cannot_read_the_token(sandbox):
    for argv in (["cat", AGENT_TOKEN_FILE], ["ls", "-a", "/run/desktop-sandbox"]):
        result = _as_desktop_user(sandbox, argv)
        assert result.exit_code != 0, (argv, result)
        assert b"Permission denied" in result.stderr, result
        assert sandbox.agent_token.encode() not in result.stdout + result.stderr


def test_desktop_user_cannot_stop_the_agent_through_supervisor(sandbox):
    pid = _agent_pid(sandbox)
    result = _as_desktop_user(sandbox, ["supervisorctl", "-c", SUPERVISOR_CONF, "stop", "agent"])
    assert result.exit_code != 0, result
    _assert_agent_untouched(sandbox, pid)


def test_desktop_user_cannot_signal_the_agent(sandbox):
    pid = _agent_pid(sandbox)
    for signal in ("STOP", "TERM", "KILL"):
        result = _as_desktop_user(sandbox, ["kill", f"-{signal}", str(pid)])
        assert result.exit_code != 0 and b"not permitted" in result.stderr, (signal, result)
    _assert_agent_untouched(sandbox, pid)


_TRACE = (
    "import ctypes, errno, json, os, sys\n"
    "pid = int(sys.argv[1])\n"
    "out = {}\n"
    "libc = ctypes.CDLL(None, use_errno=True)\n"
    "libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]\n"
    "rc = libc.ptrace(16, pid, None, None)\n"  # PTRACE_ATTACH
    "out['ptrace_attach'] = 'ok' if rc == 0 else errno.errorcode[ctypes.get_errno()]\n"
    "if rc == 0:\n"
    "    os.waitpid(pid, 0); libc.ptrace(17, pid, None, None)\n"  # PTRACE_DETACH
    "for name in ('mem', 'environ', 'maps'):\n"
    "    try:\n"
    "        open(f'/proc/{pid}/{name}', 'rb').read(1); out[name] = 'ok'\n"
    "    except OSError as exc:\n"
    "        out[name] = errno.errorcode[exc.errno]\n"
    "try:\n"
    "    os.listdir(f'/proc/{pid}/fd'); out['fd'] = 'ok'\n"
    "except OSError as exc:\n"
    "    out['fd'] = errno.errorcode[exc.errno]\n"
    "print(json.dumps(out))\n"
)


def test_desktop_user_cannot_trace_the_agent(sandbox):
    pid = _agent_pid(sandbox)
    result = _as_desktop_user(sandbox, ["python3", "-c", _TRACE, str(pid)])
    assert result.exit_code == 0, result
    out = json.loads(result.stdout)
    assert out == {"ptrace_attach": "EPERM", "mem": "EACCES", "environ": "EACCES", "maps": "EACCES",
                   "fd": "EACCES"}, out
    _assert_agent_untouched(sandbox, pid)


#: Kill the agent if allowed, then bind its port until that works or the agent is provably alive
#: while the port is refused. Prints TAKEN or REFUSED <errno>; exits 1 after the deadline.
_TAKE_PORT = (
    "import errno, os, socket, sys, time\n"
    "pid, port = int(sys.argv[1]), int(sys.argv[2])\n"
    "try:\n"
    "    os.kill(pid, 9); killed = True\n"
    "except PermissionError:\n"
    "    killed = False\n"
    "deadline = time.monotonic() + 10\n"
    "while time.monotonic() < deadline:\n"
    "    for host in ('0.0.0.0', '127.0.0.1', socket.gethostbyname(socket.gethostname())):\n"
    "        s = socket.socket()\n"
    "        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
    "        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)\n"
    "        try:\n"
    "            s.bind((host, port)); s.listen(1)\n"
    "            print('TAKEN', host); sys.exit(0)\n"
    "        except OSError as exc:\n"
    "            err = errno.errorcode[exc.errno]\n"
    "        finally:\n"
    "            s.close()\n"
    "    if not killed:\n"
    "        try:\n"
    "            os.kill(pid, 0)\n"
    "        except PermissionError:\n"
    "            print('REFUSED', err); sys.exit(0)\n"
    "    time.sleep(0.01)  # poll interval of the take-over attempts, bounded by the deadline\n"
    "sys.exit(1)\n"
)


def test_desktop_user_cannot_take_the_agent_port(sandbox):
    pid = _agent_pid(sandbox)
    result = _as_desktop_user(sandbox, ["python3", "-c", _TAKE_PORT, str(pid), str(AGENT_PORT)])
    assert result.stdout.decode().split() == ["REFUSED", "EADDRINUSE"], result
    _assert_agent_untouched(sandbox, pid)


_CONNECT_UNIX = (
    "import errno, socket, sys\n"
    "s = socket.socket(socket.AF_UNIX)\n"
    "try:\n"
    "    s.connect(sys.argv[1]); print('connected')\n"
    "except OSError as exc:\n"
    "    print(errno.errorcode[exc.errno])\n"
)


def test_desktop_user_cannot_reach_the_launch_broker_or_control_socket(sandbox):
    for name in ("launch.sock", "supervisor.sock"):
        result = _as_desktop_user(sandbox, ["python3", "-c", _CONNECT_UNIX, f"{CONTROL_DIR}/{name}"])
        assert result.stdout.decode().strip() == "EACCES", (name, result)
    # The broker starts nothing for a connection that is not the agent's user either (here: root).
    request = json.dumps({"argv": ["xterm"], "display": ":99"})
    script = (
        "import socket, sys\n"
        "s = socket.socket(socket.AF_UNIX); s.settimeout(10); s.connect(sys.argv[1])\n"
        "try:\n"
        "    s.sendall(sys.argv[2].encode() + b'\\n')\n"
        "except (BrokenPipeError, ConnectionResetError):\n"
        "    pass  # the broker may answer and close before it reads the request\n"
        "print(s.recv(4096).decode().strip())\n"
    )
    result = sandbox._exec(sandbox.desktop, ["python3", "-c", script, f"{CONTROL_DIR}/launch.sock", request],
                           user="0:0", timeout=30)
    assert result.exit_code == 0 and result.stdout.strip(), result
    assert json.loads(result.stdout) == {"error": "uid 0 may not launch"}, result


def test_display_admits_only_cookie_holders(sandbox):
    """The agent reaches the display with its own cookie; a process without one is refused (no xhost +)."""
    assert sandbox.agent.display()["width"] == 1280
    result = sandbox._exec(sandbox.desktop, ["env", "XAUTHORITY=/nonexistent", "xdpyinfo", "-display", ":99"],
                           user="65534:65534", timeout=30)
    assert result.exit_code != 0, result
    ok = _as_desktop_user(sandbox, ["xdpyinfo", "-display", ":99"])
    assert ok.exit_code == 0, ok

