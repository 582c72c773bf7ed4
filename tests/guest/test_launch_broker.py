"""The launch broker (guest.launch.serve_broker) and the agent's client side of it, over a real Unix socket.

Needs root (CAP_SETUID/CAP_SETGID: the broker switches to the target user); skipped otherwise.
"""

from __future__ import annotations

import json
import os
import pwd
import socket
import threading
import time
from pathlib import Path

import pytest

from guest.launch import Launcher, LaunchError, serve_broker

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the broker needs root to switch users")

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


def test_broker_that_cannot_take_the_path_leaves_nothing(tmp_path):
    apps = tmp_path / "apps.json"
    apps.write_text(json.dumps({"sleep": SLEEP}))
    (tmp_path / "launch.sock").mkdir()  # os.replace cannot put a socket over a directory
    with pytest.raises(OSError):
        serve_broker(str(tmp_path / "launch.sock"), "root", "nobody", str(apps))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["apps.json", "launch.sock"]


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


def test_broker_unreachable_is_a_launch_error(tmp_path):
    with pytest.raises(LaunchError) as err:
        Launcher({"sleep": SLEEP}, ":99", broker=str(tmp_path / "absent.sock")).launch("sleep", ["1"])
    assert err.value.status == 400 and err.value.code == "launch_failed"


def test_broker_never_targets_root(tmp_path):
    (tmp_path / "apps.json").write_text("{}")
    with pytest.raises(ValueError):
        serve_broker(str(tmp_path / "s"), "root", "root", str(tmp_path / "apps.json"))
