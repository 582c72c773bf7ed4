"""Files snapshots of the Docker backend: a sandbox with files and an app record in its home is saved, then
restored (the command line's ``up --from``) and forked; each restore holds exactly the saved files and
records, forks do not share what they write, and every restored agent answers only its fresh token. A
changed archive (a file, an app record) or a changed manifest is refused naming the guest path, and
nothing it started is left. A backend without snapshots is refused at once."""

from __future__ import annotations

import io
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tarfile
from pathlib import Path

import httpx
import pytest

from controller.commands.common import token_path
from controller.sandbox import SandboxSpec
from controller.sandbox.capabilities import CapabilityMissing
from controller.sandbox.docker import AGENT_TOKEN_FILE, AGENT_UID, DockerOptions, DockerSandbox, list_sandboxes
from controller.sandbox import docker_snapshot
from controller.sandbox import snapshot as snapshots

ROOT = Path(__file__).resolve().parents[2]
TASK = ROOT / "tasks" / "pickup.toml"
NOTE = "/home/sandbox/Documents/pickup.txt"
DB = "/home/sandbox/.local/share/pickup/pickup.db"
CONFIRMATION = "PU-424242"

_BOOK = (
    "import os, sqlite3, sys\n"
    "os.makedirs(os.path.expanduser('~/Documents'), exist_ok=True)\n"
    "open(os.path.expanduser('~/Documents/pickup.txt'), 'w').write(sys.argv[1] + '\\n')\n"
    "conn = sqlite3.connect(os.path.expanduser('~/.local/share/pickup/pickup.db'))\n"
    "conn.execute(\"INSERT INTO pickups (confirmation, name, date, time_window, items) VALUES \"\n"
    "             \"(?, 'Ada Lovelace', '2030-05-17', '12:00-15:00', '2 boxes of books')\", (sys.argv[1],))\n"
    "conn.commit()\n"
    "conn.close()\n"
)


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "controller.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=180, stdin=subprocess.DEVNULL,
                          env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})


def _read(sandbox, path: str):
    result = sandbox.exec_in_guest(["cat", path], timeout=10)
    return result.stdout if result.exit_code == 0 else None


RESTORED: list[str] = []
"""Every sandbox id this module restored (the last test checks that none is left)."""


def _labelled(docker_client, test_labels) -> set[str]:
    """This session's sandboxes on the engine (what a restore given ``test_labels`` would start)."""
    return {sid for sid, labels in list_sandboxes(docker_client).items()
            if all(labels.get(k) == v for k, v in test_labels.items())}


@pytest.fixture(scope="module")
def source(docker_client, desktop_image, test_labels):
    """The sandbox that is snapshotted: a note and a booking record (the pickup task's) in its home."""
    sb = DockerSandbox.start(SandboxSpec(), DockerOptions(image=desktop_image, extra_labels=test_labels),
                             client=docker_client)
    with sb:
        done = sb.exec_in_guest(["/opt/desktop-sandbox/bin/python", "-c", _BOOK, CONFIRMATION], timeout=30)
        assert done.exit_code == 0, done.stderr.decode()
        yield sb


@pytest.fixture(scope="module")
def snap(source, tmp_path_factory):
    from controller.run.tasks import load_task

    root = tmp_path_factory.mktemp("snapshots")
    done = _cli("snapshot", source.id, "--task", str(TASK), "--dir", str(root))
    assert done.returncode == 0, done.stderr
    snap_id = done.stdout.strip()
    assert snapshots.SNAPSHOT_ID.fullmatch(snap_id), done.stdout
    taken = snapshots.load(snap_id, root=root)
    # the CLI's snapshot is the one the API takes for the same task
    assert set(taken.manifest["proof"]["files"]) == set(snapshots.check_targets(load_task(TASK), "/home/sandbox")[0])
    return taken


def _copy(snap, tmp_path: Path) -> Path:
    dest = tmp_path / snap.id
    shutil.copytree(snap.path, dest)
    return dest


def _rewrite(archive: Path, member: str, change) -> None:  # noqa: ANN001
    """Replace the content of ``member`` in the tar ``archive`` by ``change(old bytes)``."""
    out = io.BytesIO()
    with tarfile.open(archive) as tin, tarfile.open(fileobj=out, mode="w", format=tarfile.GNU_FORMAT) as tout:
        for info in tin.getmembers():
            data = tin.extractfile(info).read() if info.isfile() else None
            if info.name == member:
                data = change(data)
                info.size = len(data)
            tout.addfile(info, io.BytesIO(data) if data is not None else None)
    archive.write_bytes(out.getvalue())


def _rename_booking(old: bytes, tmp_path: Path) -> bytes:
    db = tmp_path / "pickup.db"
    db.write_bytes(old)
    conn = sqlite3.connect(db)
    conn.execute("UPDATE pickups SET name = 'Mallory' WHERE confirmation = ?", (CONFIRMATION,))
    conn.commit()
    conn.close()
    return db.read_bytes()


def test_manifest_records_template_payload_and_proof(snap, source):
    m = snap.manifest
    assert (m["format"], m["version"], m["backend"], m["kind"]) == ("desktop-sandbox-snapshot", 1, "docker", "files")
    assert m["template"]["image_id"] == source.image_id
    assert m["template"]["screen"] == {"width": 1280, "height": 800}
    assert m["template"]["policy"]["mode"] == "deny-all"
    assert set(m["payload"]) == {"home.tar", "browser-home.tar", "docker.json"}
    proof = m["proof"]
    assert proof["caps"] == {"max_files": snapshots.PROOF_MAX_FILES, "max_bytes": snapshots.PROOF_MAX_BYTES,
                             "file_max": snapshots.PROOF_FILE_MAX_BYTES}
    assert proof["files"][NOTE]["size"] == len(CONFIRMATION) + 1
    assert proof["sqlite"][DB]["tables"]["pickups"]["rows"] == 1
    home = proof["roots"]["/home/sandbox"]["files"]
    assert "Documents/pickup.txt" in home and ".Xauthority" not in home


def test_up_from_restores_a_proven_sandbox_that_passes_the_task_checks(snap, source, docker_client):
    from controller.run.tasks import load_task
    from controller.run.verify import run_checks

    done = _cli("up", "--from", str(snap.path), "--detach")
    assert done.returncode == 0, done.stderr
    restored_id = done.stdout.strip().splitlines()[-1]
    RESTORED.append(restored_id)
    try:
        token = token_path(restored_id).read_text().strip()  # the fresh one: `up` wrote it
        restored = DockerSandbox.attach(restored_id, client=docker_client, agent_token=token)
        assert restored_id != source.id
        assert _read(restored, NOTE) == f"{CONFIRMATION}\n".encode()
        results = run_checks(load_task(TASK).checks, restored.agent)
        assert all(r["passed"] for r in results), [{k: r.get(k) for k in ("target", "observed", "detail")} for r in results]
        # the demo app runs again after the restore
        status = restored._exec(restored.desktop, ["supervisorctl", "-c", docker_snapshot.SUPERVISOR_CONF, "status",
                                                   "pickup"], user="0:0", timeout=20)
        assert b"RUNNING" in status.stdout, status.stdout
    finally:
        DockerSandbox.remove(restored_id)
        token_path(restored_id).unlink(missing_ok=True)


def test_forks_are_independent_and_answer_only_fresh_tokens(snap, source, test_labels):
    forks = snapshots.restore(snap.id, root=snap.path.parent, count=2, extra_labels=test_labels)
    RESTORED.extend(fork.id for fork in forks)
    try:
        a, b = forks
        assert len({a.id, b.id, source.id}) == 3
        for fork in forks:
            assert _read(fork, NOTE) == f"{CONFIRMATION}\n".encode()
            measured = snapshots.measure_guest(fork, [], [NOTE], [DB])
            assert measured["files"][NOTE] == snap.manifest["proof"]["files"][NOTE]
            assert measured["sqlite"][DB] == snap.manifest["proof"]["sqlite"][DB]
        assert a.exec_in_guest(["sh", "-c", "echo mine > ~/Documents/only-a.txt"], timeout=10).exit_code == 0
        assert _read(a, "/home/sandbox/Documents/only-a.txt") == b"mine\n"
        assert _read(b, "/home/sandbox/Documents/only-a.txt") is None
        assert _read(source, "/home/sandbox/Documents/only-a.txt") is None
        # the source's token is refused; the fresh one works, and the agent's token file holds it (an agent
        # restarted reads the token in force, not the one the fork started with)
        in_file = a._exec(a.desktop, ["cat", AGENT_TOKEN_FILE], user=f"{AGENT_UID}:{AGENT_UID}", timeout=10)
        assert in_file.stdout.decode().strip() == a.agent_token
        with httpx.Client(base_url=a.agent_url, trust_env=False, timeout=10) as http:
            assert http.get("/v1/display", headers={"Authorization": f"Bearer {source.agent_token}"}).status_code == 401
            assert http.get("/v1/display", headers={"Authorization": f"Bearer {a.agent_token}"}).status_code == 200
        assert a.agent_token != b.agent_token
    finally:
        for fork in forks:
            fork.close()


def test_a_changed_archive_is_refused_before_anything_starts(snap, tmp_path, docker_client, test_labels):
    copy = _copy(snap, tmp_path)
    _rewrite(copy / "home.tar", "./Documents/pickup.txt", lambda old: b"PU-000000\n")
    _rewrite(copy / "home.tar", "./.local/share/pickup/pickup.db", lambda old: _rename_booking(old, tmp_path))
    before = _labelled(docker_client, test_labels)
    with pytest.raises(snapshots.SnapshotMismatch) as err:
        snapshots.restore(copy, extra_labels=test_labels)
    text = str(err.value)
    assert "payload home.tar: the manifest says" in text
    assert f"{NOTE}: in the snapshot {len(CONFIRMATION) + 1} bytes" in text and "in the archive 10 bytes" in text
    assert f"{DB} table pickups: in the snapshot 1 rows" in text
    assert _labelled(docker_client, test_labels) == before


def test_a_restored_state_that_differs_from_the_manifest_is_removed_and_each_path_named(snap, tmp_path, docker_client,
                                                                                        test_labels):
    # the archive changed and its hash in the manifest with it, and the manifest's proof lists a file the
    # archive lacks (its name hostile): only the proof in the restored guest sees these
    copy = _copy(snap, tmp_path)
    _rewrite(copy / "home.tar", "./Documents/pickup.txt", lambda old: b"PU-000000\n")
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["payload"]["home.tar"] = {"size": (copy / "home.tar").stat().st_size,
                                       "sha256": snapshots._sha256_file(copy / "home.tar")}
    manifest["proof"]["roots"]["/home/sandbox"]["files"]["Documents/\x1b[31mgone.txt"] = {"size": 1, "sha256": "0" * 64}
    (copy / "manifest.json").write_text(json.dumps(manifest))
    before = _labelled(docker_client, test_labels)
    with pytest.raises(snapshots.SnapshotMismatch) as err:
        snapshots.restore(copy, extra_labels=test_labels)
    text = str(err.value)
    assert "restored sandbox ds-" in text and "\x1b" not in text
    # named twice: as a file the task's checks read and in the home's listing
    assert text.count(f"{NOTE}: in the snapshot {len(CONFIRMATION) + 1} bytes") == 2
    assert "/home/sandbox/Documents/\\x1b[31mgone.txt: in the snapshot 1 bytes" in text and "restored absent" in text
    assert _labelled(docker_client, test_labels) == before


def test_a_backend_without_snapshots_is_refused_at_once(snap, tmp_path):
    from controller.sandbox.kubernetes import KubernetesSandbox

    with pytest.raises(CapabilityMissing, match="kubernetes backend cannot"):
        snapshots.take_snapshot(object.__new__(KubernetesSandbox), root=tmp_path)
    assert list(tmp_path.iterdir()) == []
    copy = _copy(snap, tmp_path)
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["backend"] = "kubernetes"
    (copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(CapabilityMissing, match="kubernetes backend cannot"):
        snapshots.restore(copy)
    done = _cli("snapshot", "dk-12345678")
    assert done.returncode == 2 and "kubernetes backend cannot" in done.stderr


def test_nothing_restored_is_left(docker_client, test_labels, source):
    """Runs last: of what this module started only the source sandbox is there."""
    assert len(RESTORED) == 3
    assert not set(RESTORED) & set(list_sandboxes(docker_client))
    assert _labelled(docker_client, test_labels) & ({source.id} | set(RESTORED)) == {source.id}
