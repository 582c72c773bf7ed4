"""Machine snapshots of the VM backend: one booted VM saved (RAM and devices through QEMU's migration to
a file) while it goes on running; one VM restored from it, then three at once (a fork). Each restored VM
answers only its own fresh token, shows the saved screen pixel for pixel, holds the saved files, has the
host's time, and keeps what it writes to itself; a restore that fails, or is interrupted, and closing
them all leave no process and no directory."""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]
MARKER = "Documents/saved-marker.txt"


def _pixels(sandbox) -> bytes:
    """The screen's RGB pixels (PNG screenshot decoded)."""
    from PIL import Image

    shot = sandbox.agent.screenshot()
    return Image.open(io.BytesIO(shot.data)).convert("RGB").tobytes()


def _sandbox_dirs(owner_pid: int | None = None) -> set[Path]:
    """VM sandbox directories on this host; with ``owner_pid``, those that process started."""
    import socket

    from controller.sandbox import LABEL_OWNER
    from controller.sandbox.vm_process import read_owner

    found = set(Path(tempfile.gettempdir()).glob("desktop-sandbox-vm-dv-*"))
    if owner_pid is None:
        return found
    owner = f"{socket.gethostname()}:{owner_pid}"
    return {d for d in found if read_owner(d).get("labels", {}).get(LABEL_OWNER) == owner}


def _cmdlines() -> dict[int, bytes]:
    out = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                out[int(entry.name)] = (entry / "cmdline").read_bytes()
            except OSError:
                continue
    return out


def _processes_naming(path: Path, also: bytes = b"") -> list[int]:
    """Pids whose command line names ``path`` as a directory (and holds ``also``)."""
    marker = f"{path}/".encode()
    return [pid for pid, cmd in _cmdlines().items() if marker in cmd and also in cmd]


def _assert_removed(workdirs: list[Path]) -> None:
    for workdir in workdirs:
        assert not workdir.exists(), f"{workdir} left"
        assert _processes_naming(workdir) == [], f"a process of {workdir.name} left"


def _status(sandbox, token: str) -> int:
    with httpx.Client(base_url=sandbox.agent_url, timeout=30, trust_env=False) as http:
        return http.get("/v1/display", headers={"Authorization": f"Bearer {token}"}).status_code


def _guest_clock_offset(sandbox) -> float:
    """Guest time minus host time (seconds), read through a guest command."""
    before = time.time()
    result = sandbox.exec_in_guest(["date", "+%s.%N"], timeout=30)
    after = time.time()
    assert result.exit_code == 0, result.stderr
    return float(result.stdout) - (before + after) / 2


def _record(what: str, timings: dict) -> None:
    from tests.vm import conftest

    conftest._timings.append((what, {k: round(v, 2) if isinstance(v, float) else v for k, v in timings.items()}))


@pytest.fixture(scope="module")
def saved(vm_image, tmp_path_factory):
    """One booted VM (the source), a file written in its home, its screen, then its machine snapshot."""
    from controller.sandbox import SandboxSpec
    from controller.sandbox.vm import VMOptions, VMSandbox
    from controller.sandbox.vm_snapshot import TOKEN_FILE

    with VMSandbox.start(SandboxSpec(ready_timeout=600), VMOptions(image=vm_image)) as source:
        wrote = source.exec_in_guest(["sh", "-c", f"echo saved-state > ~/{MARKER}"], timeout=60)
        assert wrote.exit_code == 0, wrote.stderr
        token_before = source.agent_token
        screen = _pixels(source)
        dest = tmp_path_factory.mktemp("vm-snapshot") / "snap"
        facts = source.save_snapshot(dest)
        _record("snapshot save", {k: facts[k] for k in ("seconds", "pause_seconds", "migrate_seconds", "bytes")})
        yield SimpleNamespace(source=source, dest=dest, facts=facts, screen=screen, token_before=token_before,
                              snapshot_token=(dest / TOKEN_FILE).read_text())


def test_save_keeps_the_source_running_with_a_fresh_token(saved):
    source, facts = saved.source, saved.facts
    assert sorted(p.name for p in saved.dest.iterdir()) == ["agent-token", "machine.mig", "vm.json"]
    assert facts["files"]["machine.mig"] == (saved.dest / "machine.mig").stat().st_size > 100 * 2**20
    assert (saved.dest / "agent-token").stat().st_mode & 0o777 == 0o600
    meta = json.loads((saved.dest / "vm.json").read_text())
    assert meta["memory_mib"] == 2048 and meta["screen"] == {"width": 1280, "height": 800}
    assert facts["pause_seconds"] < 30 and facts["kind"] == "machine"
    # the source runs on: a new token, neither the one before nor the snapshot's drives it
    assert source.agent_token not in (saved.token_before, saved.snapshot_token)
    assert _status(source, source.agent_token) == 200
    assert _status(source, saved.token_before) == 401 and _status(source, saved.snapshot_token) == 401
    assert abs(_guest_clock_offset(source)) < 3


def test_restored_vm_is_the_saved_machine_with_its_own_token(saved):
    from controller.sandbox.vm import VMSandbox

    before = _sandbox_dirs(os.getpid())
    t0 = time.monotonic()
    [restored] = VMSandbox.restore_snapshot(saved.dest)
    with restored:
        screen = _pixels(restored)
        first_screenshot = time.monotonic() - t0
        _record(f"restore {restored.id}", {**restored.timings, "first_screenshot": first_screenshot})
        workdirs = list(_sandbox_dirs(os.getpid()) - before)
        assert [d.name.startswith(f"desktop-sandbox-vm-{restored.id}-") for d in workdirs] == [True]
        assert screen == saved.screen  # pixel for pixel
        token = restored.agent_token
        assert token not in (saved.token_before, saved.snapshot_token, saved.source.agent_token)
        assert _status(restored, token) == 200
        for old in (saved.token_before, saved.snapshot_token, saved.source.agent_token):
            assert _status(restored, old) == 401
        read = restored.exec_in_guest(["cat", f"/home/sandbox/{MARKER}"], timeout=30)
        assert read.stdout == b"saved-state\n"
        assert abs(_guest_clock_offset(restored)) < 3
        assert restored.agent_host_port != saved.source.agent_host_port
        assert restored.gateway_host_port != saved.source.gateway_host_port
        assert restored.decision_log() == []
    _assert_removed(workdirs)


def test_forks_are_isolated_from_each_other(saved):
    from controller.sandbox.vm import VMSandbox

    before = _sandbox_dirs(os.getpid())
    t0 = time.monotonic()
    forks = VMSandbox.restore_snapshot(saved.dest, count=3)
    try:
        screens = [_pixels(fork) for fork in forks]
        _record("fork of 3", {"returned": max(f.timings["token_rotated"] for f in forks),
                              "last_first_screenshot": time.monotonic() - t0})
        workdirs = list(_sandbox_dirs(os.getpid()) - before)
        assert len(workdirs) == 3 and len({f.id for f in forks}) == 3
        assert all(screen == saved.screen for screen in screens)
        tokens = {f.agent_token for f in forks}
        assert len(tokens) == 3 and not tokens & {saved.token_before, saved.snapshot_token, saved.source.agent_token}
        for fork in forks:
            others = tokens - {fork.agent_token}
            assert _status(fork, fork.agent_token) == 200 and {_status(fork, t) for t in others} == {401}
            wrote = fork.exec_in_guest(["sh", "-c", f"echo {fork.id} > ~/Documents/{fork.id}.txt"], timeout=60)
            assert wrote.exit_code == 0, wrote.stderr
        for fork in forks + [saved.source]:
            listing = fork.exec_in_guest(["ls", "/home/sandbox/Documents"], timeout=60).stdout.decode().split()
            mine = [f"{fork.id}.txt"] if fork in forks else []
            assert sorted(n for n in listing if n.startswith("dv-")) == mine, (fork.id, listing)
            assert "saved-marker.txt" in listing
    finally:
        for fork in forks:
            fork.close()
    _assert_removed(workdirs)


def test_a_restore_that_fails_leaves_nothing(saved, tmp_path):
    """A snapshot whose migration stream is cut short: QEMU starts, fails to load it and exits; the
    error says so and nothing of the VM stays. A changed command line is refused before anything starts."""
    from controller.sandbox import SandboxError
    from controller.sandbox.vm import VMSandbox

    broken = tmp_path / "cut"
    broken.mkdir()
    shutil.copy(saved.dest / "agent-token", broken / "agent-token")
    with open(saved.dest / "machine.mig", "rb") as src, open(broken / "machine.mig", "wb") as dst:
        dst.write(src.read(8 * 2**20))
    meta = json.loads((saved.dest / "vm.json").read_text())
    meta["migration"]["bytes"] = 8 * 2**20
    (broken / "vm.json").write_text(json.dumps(meta))
    mine = _sandbox_dirs(os.getpid())
    with pytest.raises(SandboxError, match="load"):
        VMSandbox.restore_snapshot(broken, count=2)
    assert _sandbox_dirs(os.getpid()) == mine
    assert _processes_naming(broken) == []

    meta["argv"] = [a.replace("2048", "4096") for a in meta["argv"]]
    (broken / "vm.json").write_text(json.dumps(meta))
    with pytest.raises(SandboxError, match="command line differs"):
        VMSandbox.restore_snapshot(broken)
    assert _sandbox_dirs(os.getpid()) == mine


_CHILD = """
import sys
from controller.sandbox.vm import VMSandbox
print("restoring", flush=True)
try:
    VMSandbox.restore_snapshot(sys.argv[1], count=2)
except KeyboardInterrupt:
    print("interrupted", flush=True)
    sys.exit(130)
print("restored", flush=True)
"""


def test_ctrl_c_during_a_restore_leaves_nothing(saved):
    child = subprocess.Popen([sys.executable, "-c", _CHILD, str(saved.dest)], cwd=ROOT, stdout=subprocess.PIPE,
                             text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        deadline = time.monotonic() + 60
        running: list[Path] = []
        while len(running) < 2:  # until both of its QEMUs load the snapshot
            running = [d for d in _sandbox_dirs(child.pid) if _processes_naming(d, b"-incoming")]
            assert time.monotonic() < deadline and child.poll() is None, "the child's QEMUs never ran"
            time.sleep(0.05)  # poll interval while the child starts them, bounded by the deadline
        child.send_signal(signal.SIGINT)
        out, _ = child.communicate(timeout=90)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == 130 and "interrupted" in out, out
    _assert_removed(running)
    assert _sandbox_dirs(child.pid) == set()


def test_qmp_reads_are_capped_and_deadlined(tmp_path):
    """The QMP client against a fake QEMU: an answer over the line cap, and no answer at all, each end in
    a SandboxError within the command's timeout; events before a reply are kept, and the reply is the
    one with the command's id."""
    import socket
    import threading

    from controller.sandbox import SandboxError
    from controller.sandbox.vm_qmp import LINE_MAX_BYTES, QMPChannel

    path = tmp_path / "qmp.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(4)

    def serve(conn: socket.socket, behaviour: str) -> None:
        with conn:
            conn.sendall(b'{"QMP": {"version": {}, "capabilities": []}}\n')
            reader = conn.makefile("rb")
            for line in reader:
                msg = json.loads(line)
                if msg["execute"] == "qmp_capabilities":
                    conn.sendall(json.dumps({"return": {}, "id": msg["id"]}).encode() + b"\n")
                elif behaviour == "huge":
                    conn.sendall(b'{"return": "' + b"x" * (LINE_MAX_BYTES + 10))
                elif behaviour == "events":
                    conn.sendall(b'{"event": "STOP"}\n{"return": "stale", "id": "other"}\n'
                                 + json.dumps({"return": {"status": "running"}, "id": msg["id"]}).encode() + b"\n")
                # "silent": never answers

    def accept_loop() -> None:
        for behaviour in ("events", "huge", "silent"):
            conn, _ = server.accept()
            threading.Thread(target=serve, args=(conn, behaviour), daemon=True).start()

    threading.Thread(target=accept_loop, daemon=True).start()
    try:
        good = QMPChannel(path)
        assert good.command("query-status") == {"status": "running"}
        assert [e["event"] for e in good.events] == ["STOP"]
        for match in ("over", "did not answer"):
            channel = QMPChannel(path)
            t0 = time.monotonic()
            with pytest.raises(SandboxError, match=match):
                channel.command("query-status", timeout=2.0)
            assert time.monotonic() - t0 < 5.0
            channel.close()
        good.close()
    finally:
        server.close()
