"""Orphan reaping takes only what this host provably owns (controller.sandbox.owner, ``reap``): a sandbox
labelled with another machine's id, with this machine's id and a live pid that started at another time
(a reused pid), or with an owner label of the old ``host:pid`` form is reported and left; one whose
owner is provably dead and ours is removed. The same for VM leftovers (a private directory with a
process naming it, standing in for QEMU), and ``down --all --backend vm`` removes those; no Docker, no
QEMU. The backend registry imports no backend module until one is looked up."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from controller.sandbox import LABEL_DETACHED, LABEL_OWNER, LABEL_OWNER_ID, LABEL_SANDBOX, reap
from controller.sandbox.owner import boot_id, machine_id, owner_id, owner_state, pid_namespace, process_start
from tests.helpers import exited_process

ROOT = Path(__file__).resolve().parents[2]


def _ours(pid: int, start: str) -> str:
    return f"{machine_id()}:{boot_id()}:{pid_namespace()}:{pid}:{start}"


def _reap(found: dict[str, dict[str, str]]) -> list[str]:
    removed: list[str] = []
    reap(found, lambda sid: removed.append(sid) or [sid])
    return removed


def test_owner_id_names_this_process():
    state, reason = owner_state(owner_id())
    assert state == "alive", reason
    assert owner_id().split(":")[3] == str(os.getpid())


def test_only_provably_dead_owners_of_this_host_are_reaped(caplog):
    pid, start = exited_process()
    other_machine = "0" * 32 if machine_id() != "0" * 32 else "1" * 32
    me = os.getpid()
    found = {
        "ds-dead": {LABEL_OWNER_ID: _ours(pid, start)},
        "ds-other-machine": {LABEL_OWNER_ID: f"{other_machine}:{boot_id()}:{pid_namespace()}:{pid}:{start}"},
        "ds-reused-pid": {LABEL_OWNER_ID: _ours(me, str(int(process_start(me)) + 1))},
        "ds-other-container": {LABEL_OWNER_ID: f"{machine_id()}:{boot_id()}:1:{pid}:{start}"},
        "ds-old-label": {LABEL_OWNER: f"{os.uname().nodename}:{pid}"},
        "ds-alive": {LABEL_OWNER_ID: owner_id()},
        "ds-detached": {LABEL_OWNER_ID: _ours(pid, start), LABEL_DETACHED: "1"},
    }
    with caplog.at_level(logging.WARNING, logger="controller.sandbox"):
        assert _reap(found) == ["ds-dead"]
    warned = {r.args[0] for r in caplog.records}
    assert warned == {"ds-other-machine", "ds-reused-pid", "ds-other-container", "ds-old-label"}
    assert "another machine" in caplog.text and "now another process" in caplog.text


def test_unparseable_owner_ids_are_unproven():
    for value in ("", "x", "a:b:c:d", "a:b:c:notapid:e", "a:b:c:1:e:f", "../../:x:y:1:2"):
        assert owner_state(value)[0] == "unproven", value


# -- VM leftovers ----------------------------------------------------------------------------------------

MARK = {"desktop-sandbox.test": f"reaping-{os.getpid()}"}
"""Label of every VM leftover made here, so ``down --all --label`` touches no one else's sandbox."""


def _vm_leftover(owner: str | None) -> tuple[Path, subprocess.Popen]:
    """A VM sandbox directory as a killed run leaves it: owner.json and a process (in its own session,
    like QEMU) whose command line names the directory."""
    sandbox_id = f"dv-t{os.urandom(3).hex()}"
    path = Path(tempfile.mkdtemp(prefix=f"desktop-sandbox-vm-{sandbox_id}-"))
    proc = subprocess.Popen([sys.executable, "-c", "import sys, time; time.sleep(600)", f"{path}/console.log"],
                            start_new_session=True)
    labels = {LABEL_SANDBOX: sandbox_id, **MARK, **({LABEL_OWNER_ID: owner} if owner else {})}
    (path / "owner.json").write_text(json.dumps({"id": sandbox_id, "labels": labels, "qemu_pid": proc.pid}))
    return path, proc


def _wait_gone(proc: subprocess.Popen) -> None:
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        pytest.fail(f"process {proc.pid} still running")


@pytest.fixture
def leftovers():
    made: list[tuple[Path, subprocess.Popen]] = []

    def make(owner: str | None) -> tuple[Path, subprocess.Popen]:
        made.append(_vm_leftover(owner))
        return made[-1]

    yield make
    for path, proc in made:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        import shutil

        shutil.rmtree(path, ignore_errors=True)


def test_vm_reaping_removes_only_provably_dead_and_ours(leftovers, caplog):
    from controller.sandbox.vm import VMSandbox
    from controller.sandbox.vm_process import _sandbox_id

    pid, start = exited_process()
    dead_dir, dead_qemu = leftovers(_ours(pid, start))
    foreign_dir, foreign_qemu = leftovers(f"{'f' * 32}:{boot_id()}:{pid_namespace()}:{pid}:{start}")
    reused_dir, reused_qemu = leftovers(_ours(os.getpid(), str(int(process_start(os.getpid())) + 1)))
    with caplog.at_level(logging.WARNING, logger="controller.sandbox"):
        reaped = VMSandbox.reap_orphans()
    assert _sandbox_id(dead_dir) in reaped
    _wait_gone(dead_qemu)
    assert not dead_dir.exists()
    for path, proc in ((foreign_dir, foreign_qemu), (reused_dir, reused_qemu)):
        assert path.exists() and proc.poll() is None, f"{path.name} was taken for dead and ours"
    assert "another machine" in caplog.text and "now another process" in caplog.text


def test_down_all_removes_vm_leftovers_whoever_started_them(leftovers, tmp_path):
    """``down --all`` (narrowed by ``--label`` to this test's leftovers, so other sessions' VMs on this
    host survive) stops the processes and deletes the directories, also of owners it cannot judge."""
    foreign_dir, foreign_qemu = leftovers(f"{'f' * 32}:-:-:1:1")
    unlabelled_dir, unlabelled_qemu = leftovers(None)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "XDG_RUNTIME_DIR": str(tmp_path)}
    (key, value), = MARK.items()
    out = subprocess.run([sys.executable, "-m", "controller.cli", "down", "--all", "--backend", "vm",
                          "--label", f"{key}={value}"], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    for path, proc in ((foreign_dir, foreign_qemu), (unlabelled_dir, unlabelled_qemu)):
        _wait_gone(proc)
        assert not path.exists()
    assert "removed " in out.stderr and "-qemu" in out.stderr and "-dir" in out.stderr, out.stderr


def test_the_registry_imports_no_backend_until_asked():
    code = ("import sys; from controller.sandbox.registry import BACKENDS, backend_names; "
            "assert backend_names() == ['docker', 'vm', 'kubernetes']; "
            "assert not [m for m in sys.modules if m in ('docker', 'kubernetes') or m.startswith('controller.sandbox.')"
            " and m.split('.')[-1] in ('docker', 'vm', 'vm_image', 'vm_process', 'kubernetes')], sorted(sys.modules); "
            "assert BACKENDS['vm'].backend_name == 'vm' and 'docker' not in sys.modules "
            "and 'kubernetes' not in sys.modules")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr


def test_an_abandoned_sandbox_that_cannot_be_removed_does_not_stop_the_reaping(caplog):
    pid, begun = exited_process()
    found = {f"ds-{n}": {LABEL_OWNER_ID: _ours(pid, begun)} for n in ("a", "b", "c")}
    tried: list[str] = []

    def remove(sandbox_id: str) -> list[str]:
        tried.append(sandbox_id)
        if sandbox_id == "ds-b":
            raise RuntimeError("has active endpoints \x1b[2J")
        return [sandbox_id]

    with caplog.at_level(logging.WARNING, logger="controller.sandbox"):
        assert reap(found, remove) == ["ds-a", "ds-c"]
    assert tried == ["ds-a", "ds-b", "ds-c"]
    assert "ds-b could not be removed (has active endpoints \\x1b[2J)" in caplog.text
