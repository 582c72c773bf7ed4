"""The launch broker (guest.launch.serve_broker) and the agent's client side of it, over a real Unix socket,
and the allowlist and pipe spawning it is built on (guest.launch.load_apps, spawn_with_pipes).

The broker tests need root (CAP_SETUID/CAP_SETGID: the broker switches to the target user); skipped otherwise.
"""

from __future__ import annotations

import json
import os
import pwd
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from guest.launch import Launcher, LaunchError, load_allowlist, load_apps, serve_broker, spawn_with_pipes

root = pytest.mark.skipif(os.geteuid() != 0, reason="the broker needs root to switch users")

SLEEP = ["/bin/sleep"]


def _uid(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Uid:"):
            return int(line.split()[1])
    raise AssertionError(pid)


def _broker(tmp_path: Path, client: str) -> str:
    apps = tmp_path / "apps.json"
    apps.write_text(json.dumps({"sleep": SLEEP}))
    path = str(tmp_path / "launch.sock")
    threading.Thread(target=serve_broker, args=(path, client, "nobody", str(apps)), daemon=True).start()
    deadline = time.monotonic() + 10
    while not Path(path).is_socket():
        assert time.monotonic() < deadline, "broker did not listen"
        time.sleep(0.01)  # poll interval until the broker binds, bounded by the deadline
    return path


@root
def test_broker_path_appears_only_once_it_accepts_connections(tmp_path, monkeypatch):
    """Held between bind and listen, the broker has not yet put a socket at the path clients use: a
    client that finds the path can connect and, the mode being set before, is not refused by it."""
    import socketserver

    bound, looked = threading.Event(), threading.Event()
    listen = socketserver.UnixStreamServer.server_activate

    def held_listen(server):
        bound.set()
        assert looked.wait(10)
        listen(server)

    monkeypatch.setattr(socketserver.UnixStreamServer, "server_activate", held_listen)
    apps = tmp_path / "apps.json"
    apps.write_text(json.dumps({"sleep": SLEEP}))
    path = tmp_path / "launch.sock"
    path.write_text("left by an earlier broker")
    (tmp_path / "launch.sock.binding").write_text("left by a broker killed before it listened")
    threading.Thread(target=serve_broker, args=(str(path), "root", "nobody", str(apps)), daemon=True).start()
    assert bound.wait(10), "broker did not bind"
    try:
        assert not path.is_socket(), "the path is a socket before it listens"
        assert (tmp_path / "launch.sock.binding").stat().st_mode & 0o777 == 0o666, "mode set after the path appears"
    finally:
        looked.set()
    deadline = time.monotonic() + 10
    while not path.is_socket():
        assert time.monotonic() < deadline, "broker did not listen"
        time.sleep(0.01)  # poll interval until the broker listens, bounded by the deadline
    assert path.stat().st_mode & 0o777 == 0o666
    assert not (tmp_path / "launch.sock.binding").exists()
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(10)
        s.connect(str(path))


@root
def test_broker_that_cannot_take_the_path_leaves_nothing(tmp_path):
    apps = tmp_path / "apps.json"
    apps.write_text(json.dumps({"sleep": SLEEP}))
    (tmp_path / "launch.sock").mkdir()  # os.replace cannot put a socket over a directory
    with pytest.raises(OSError):
        serve_broker(str(tmp_path / "launch.sock"), "root", "nobody", str(apps))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["apps.json", "launch.sock"]


@root
def test_launch_through_broker_runs_as_the_target_user(tmp_path):
    path = _broker(tmp_path, "root")
    pid = Launcher({"sleep": SLEEP}, ":99", broker=path).launch("sleep", ["30"])
    try:
        assert _uid(pid) == pwd.getpwnam("nobody").pw_uid
        # started as ``env -C HOME /bin/sleep 30``: env enters the directory as the user, then execs
        deadline = time.monotonic() + 10
        while Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[:1] != [b"/bin/sleep"]:
            assert time.monotonic() < deadline, Path(f"/proc/{pid}/cmdline").read_bytes()
            time.sleep(0.01)  # poll interval while env execs the program
        assert Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[:2] == [b"/bin/sleep", b"30"]
    finally:
        os.kill(pid, 9)


@root
def test_broker_refuses_other_users_and_unlisted_programs(tmp_path):
    path = _broker(tmp_path, "nobody")
    with pytest.raises(LaunchError) as err:
        Launcher({"sleep": SLEEP}, ":99", broker=path).launch("sleep", ["30"])
    assert "uid 0 may not launch" in err.value.message
    (tmp_path / "own").mkdir()
    own = _broker(tmp_path / "own", "root")
    with pytest.raises(LaunchError) as err:
        Launcher({"sh": ["/bin/sh"]}, ":99", broker=own).launch("sh", ["-c", "id"])
    assert "allowlisted" in err.value.message
    for bad in ({"argv": SLEEP, "display": "host:0"}, {"argv": [], "display": ":99"}, ["x"]):
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(10)
            s.connect(own)
            s.sendall(json.dumps(bad).encode() + b"\n")
            assert "error" in json.loads(s.recv(4096)), bad


@root
def test_broker_unreachable_is_a_launch_error(tmp_path):
    with pytest.raises(LaunchError) as err:
        Launcher({"sleep": SLEEP}, ":99", broker=str(tmp_path / "absent.sock")).launch("sleep", ["1"])
    assert err.value.status == 400 and err.value.code == "launch_failed"


@root
def test_broker_never_targets_root(tmp_path):
    (tmp_path / "apps.json").write_text("{}")
    with pytest.raises(ValueError):
        serve_broker(str(tmp_path / "s"), "root", "root", str(tmp_path / "apps.json"))


# -- the allowlist: plain and channel apps ------------------------------------------------------------
CHANNEL_ARGV = ["chromium", "--remote-debugging-pipe"]


def test_load_apps_splits_plain_and_channel_apps(tmp_path):
    apps = tmp_path / "apps.json"
    apps.write_text(json.dumps({"terminal": ["xterm"], "browser": ["firefox-esr", "--new-instance"],
                                "chromium": {"argv": CHANNEL_ARGV, "channel": "devtools-pipe"}}))
    plain, channel = load_apps(str(apps))
    assert plain == {"terminal": ["xterm"], "browser": ["firefox-esr", "--new-instance"]}
    assert channel == {"chromium": CHANNEL_ARGV}
    assert load_allowlist(str(apps)) == plain  # the plain apps only
    assert load_apps(None) == ({}, {})


def test_the_image_allowlists_load():
    root_dir = Path(__file__).resolve().parents[2] / "images"
    for name in ("apps.json", "apps.conformance.json"):
        plain, channel = load_apps(str(root_dir / name))
        assert plain and not set(plain) & set(channel)


@pytest.mark.parametrize("entry", [
    {"argv": CHANNEL_ARGV, "channel": "devtools"},           # a channel kind not in CHANNELS
    {"argv": CHANNEL_ARGV, "channel": "DEVTOOLS-PIPE"},
    {"argv": CHANNEL_ARGV, "channel": ""},
    {"argv": CHANNEL_ARGV, "channel": None},
    {"argv": CHANNEL_ARGV, "channel": True},
    {"argv": CHANNEL_ARGV, "channel": ["devtools-pipe"]},
    {"argv": CHANNEL_ARGV},                                    # no channel: not an object entry
    {"channel": "devtools-pipe"},
    {"argv": CHANNEL_ARGV, "channel": "devtools-pipe", "user": "root"},  # an extra key
    {"argv": [], "channel": "devtools-pipe"},
    {"argv": "chromium", "channel": "devtools-pipe"},
    {"argv": ["chromium", 1], "channel": "devtools-pipe"},
    [],
    "xterm",
    ["xterm", None],
])
def test_load_apps_refuses_bad_entries(tmp_path, entry):
    apps = tmp_path / "apps.json"
    apps.write_text(json.dumps({"terminal": ["xterm"], "chromium": entry}))
    with pytest.raises(ValueError) as refused:
        load_apps(str(apps))
    assert "devtools-pipe" in str(refused.value) and str(apps) in str(refused.value)


@pytest.mark.parametrize("text", ["[]", '["xterm"]', '"xterm"', "null"])
def test_load_apps_refuses_a_file_that_is_not_an_object(tmp_path, text):
    apps = tmp_path / "apps.json"
    apps.write_text(text)
    with pytest.raises(ValueError):
        load_apps(str(apps))


# -- spawn_with_pipes -------------------------------------------------------------------------------
ECHO = ("import os, sys\n"
        "line = b''\n"
        "while not line.endswith(b'\\n'):\n"
        "    chunk = os.read(3, 4096)\n"
        "    if not chunk: break\n"
        "    line += chunk\n"
        "os.write(4, b'%d %d %d:' % (os.getuid(), os.getsid(0) == os.getpid(), os.isatty(0)) + line)\n")


def _talk(fds: list[int], line: bytes) -> bytes:
    write_fd, read_fd = fds
    with os.fdopen(write_fd, "wb", buffering=0) as to_child, os.fdopen(read_fd, "rb") as from_child:
        to_child.write(line)
        return from_child.read()  # until the child exits and its fd 4 closes


def _wait(pid: int) -> int:
    deadline = time.monotonic() + 10
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        assert time.monotonic() < deadline, "child did not exit"
        time.sleep(0.01)  # poll interval until the child exits, bounded by the deadline


def test_spawn_with_pipes_gives_the_child_fds_3_and_4(tmp_path):
    pid, fds = spawn_with_pipes(["python3", "-c", ECHO], dict(os.environ))
    try:
        assert len(fds) == 2 and all(not os.get_inheritable(fd) for fd in fds)
        assert _talk(fds, b"hello over fd 3\n") == b"%d 1 0:hello over fd 3\n" % os.getuid()
    finally:
        assert _wait(pid) == 0


def test_spawn_with_pipes_when_fds_3_and_4_are_taken(tmp_path):
    """The pipes land wherever the kernel puts them (here above other open files), and still reach 3 and 4."""
    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(4)]
    try:
        pid, fds = spawn_with_pipes(["python3", "-c", ECHO], dict(os.environ))
        assert _talk(fds, b"ping\n").endswith(b":ping\n")
        assert _wait(pid) == 0
    finally:
        for fd in held:
            os.close(fd)


def test_spawn_with_pipes_with_a_prefix_and_a_missing_program(tmp_path):
    pid, fds = spawn_with_pipes(["-c", ECHO], dict(os.environ), prefix=["python3"])
    assert _talk(fds, b"prefixed\n").endswith(b":prefixed\n")
    assert _wait(pid) == 0
    # counted in a process of its own: other tests' threads open and close descriptors in this one
    check = (
        "import os, sys\n"
        "from guest.launch import spawn_with_pipes\n"
        "before = set(os.listdir('/proc/self/fd'))\n"
        "try:\n"
        "    spawn_with_pipes([sys.argv[1]], dict(os.environ))\n"
        "except OSError:\n"
        "    pass\n"
        "else:\n"
        "    sys.exit('no OSError')\n"
        "print(sorted(set(os.listdir('/proc/self/fd')) ^ before))\n"
    )
    done = subprocess.run([sys.executable, "-c", check, str(tmp_path / "no-such-program")], capture_output=True,
                          text=True, timeout=60, cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"  # the four pipe ends were closed


# -- channel requests through the broker ------------------------------------------------------------
PYTHON = "/usr/bin/python3"
CHANNEL_APP = [PYTHON, "-c", ECHO]


def _channel_broker(tmp_path: Path, channel_user: str | None = "nobody") -> str:
    apps = tmp_path / "apps.json"
    apps.write_text(json.dumps({"sleep": SLEEP, "pipe": {"argv": CHANNEL_APP, "channel": "devtools-pipe"}}))
    path = str(tmp_path / "launch.sock")
    threading.Thread(target=serve_broker, args=(path, "root", "daemon", str(apps), channel_user), daemon=True).start()
    deadline = time.monotonic() + 10
    while not Path(path).is_socket():
        assert time.monotonic() < deadline, "broker did not listen"
        time.sleep(0.01)  # poll interval until the broker binds, bounded by the deadline
    return path


needs_channel = pytest.mark.skipif(not (os.path.exists(PYTHON) and os.path.exists("/usr/bin/setpriv")),
                                   reason="needs /usr/bin/python3 and setpriv")


@root
@needs_channel
def test_channel_request_hands_over_two_fds_reaching_a_child_of_the_channel_user(tmp_path):
    path = _channel_broker(tmp_path)
    got: list[tuple[str, int, int, int]] = []
    launcher = Launcher({"sleep": SLEEP}, ":99", broker=path, channel_apps={"pipe": CHANNEL_APP},
                        on_channel=lambda app, pid, w, r: got.append((app, pid, w, r)))
    pid = launcher.launch("pipe", [])
    [(app, channel_pid, write_fd, read_fd)] = got
    assert (app, channel_pid) == ("pipe", pid)
    assert pid not in (os.getpid(),) and write_fd != read_fd
    assert os.fstat(write_fd).st_mode & 0o170000 == os.fstat(read_fd).st_mode & 0o170000 == 0o010000  # FIFOs
    reply = _talk([write_fd, read_fd], b"through the broker\n")
    assert reply == b"%d 1 0:through the broker\n" % pwd.getpwnam("nobody").pw_uid
    # the plain app still starts as the desktop user, not the channel user
    plain = launcher.launch("sleep", ["30"])
    try:
        assert _uid(plain) == pwd.getpwnam("daemon").pw_uid
    finally:
        os.kill(plain, 9)


@root
@needs_channel
def test_broker_keeps_plain_and_channel_apps_apart(tmp_path):
    path = _channel_broker(tmp_path)
    got: list = []
    # a plain request for the channel app's argv
    with pytest.raises(LaunchError) as refused:
        Launcher({"pipe": CHANNEL_APP}, ":99", broker=path).launch("pipe", [])
    assert "allowlisted program" in refused.value.message
    # a channel request for a plain app
    with pytest.raises(LaunchError) as refused:
        Launcher({}, ":99", broker=path, channel_apps={"sleep": SLEEP},
                 on_channel=lambda *a: got.append(a)).launch("sleep", ["30"])
    assert "allowlisted channel app" in refused.value.message and got == []
    # the raw protocol: a channel request for a plain argv gets an error line and no fds
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(10)
        s.connect(path)
        s.sendall(json.dumps({"argv": SLEEP + ["30"], "display": ":99", "channel": True}).encode() + b"\n")
        data, fds, _flags, _addr = socket.recv_fds(s, 4096, 2)
        assert fds == [] and "error" in json.loads(data)


@root
@needs_channel
def test_broker_without_a_channel_user_starts_no_channel_app(tmp_path):
    path = _channel_broker(tmp_path, channel_user=None)
    got: list = []
    with pytest.raises(LaunchError) as refused:
        Launcher({}, ":99", broker=path, channel_apps={"pipe": CHANNEL_APP},
                 on_channel=lambda *a: got.append(a)).launch("pipe", [])
    assert "no --channel-user" in refused.value.message and got == []


@root
def test_the_channel_user_is_a_user_of_its_own(tmp_path):
    (tmp_path / "apps.json").write_text("{}")
    for user, client, channel in (("nobody", "root", "nobody"), ("daemon", "nobody", "nobody"),
                                  ("nobody", "root", "root")):
        with pytest.raises(ValueError):
            serve_broker(str(tmp_path / "s"), client, user, str(tmp_path / "apps.json"), channel)
    assert not (tmp_path / "s").exists()


def test_a_channel_app_takes_urls_but_no_options():
    """Nothing after a channel app's fixed argv may be an option: a request cannot add a debugging port,
    --no-sandbox or another profile (the broker refuses the same; its own test above)."""
    from guest.launch import LaunchError, Launcher

    started: list[int] = []
    launcher = Launcher({}, ":0", broker="", channel_apps={"chromium": [sys.executable, "-c", "pass"]},
                        on_channel=lambda app, pid, w, r: started.append(pid))
    for option in ("--remote-debugging-port=9222", "--no-sandbox", "-x"):
        with pytest.raises(LaunchError) as refused:
            launcher.launch("chromium", ["http://example.test/", option])
        assert refused.value.code == "invalid_request"
    assert started == []
