"""The state proof's two measurements agree: a directory measured in place (as in a guest) and the same
directory measured from its tar archive (as a files snapshot is) give the same records, caps included;
the comparison names each differing path escaped; a manifest that is not one is refused."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from controller.sandbox import snapshot as snapshots
from controller.sandbox import snapshot_probe


def _home(tmp_path: Path) -> Path:
    home = tmp_path / "home"
    (home / "docs").mkdir(parents=True)
    (home / "docs" / "a.txt").write_text("hello\n")
    (home / "big.bin").write_bytes(b"x" * 5000)
    (home / ".Xauthority").write_bytes(b"cookie")
    (home / "profile").mkdir()
    os.symlink("desktop-123", home / "profile" / "SingletonLock")
    os.symlink("docs/a.txt", home / "link")
    conn = sqlite3.connect(home / "app.db")
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT, b BLOB)")
    conn.executemany("INSERT INTO t (v, b) VALUES (?, ?)", [("one", b"\x00"), ("two", None)])
    conn.commit()
    conn.close()
    return home


def _archive(home: Path, tmp_path: Path) -> Path:
    work = tmp_path / "snap"
    work.mkdir()
    subprocess.run(["tar", "-c", "-f", str(work / "home.tar"), "-C", str(home), "."], check=True)
    return work


def _in_place(home: Path, files: list[str], databases: list[str]) -> dict:
    """The guest-side program, run as in a guest: source with -c, request as one JSON argument."""
    request = {"roots": [str(home)], "files": files, "sqlite": databases, "max_files": snapshots.PROOF_MAX_FILES,
               "max_bytes": 4096, "file_max": snapshots.PROOF_FILE_MAX_BYTES, "sqlite_seconds": 10}
    out = subprocess.run([sys.executable, "-c", Path(snapshot_probe.__file__).read_text(), json.dumps(request)],
                         capture_output=True, check=True, timeout=60)
    return json.loads(out.stdout)


def test_a_directory_and_its_archive_measure_the_same(tmp_path, monkeypatch):
    home = _home(tmp_path)
    work = _archive(home, tmp_path)
    files = [f"{home}/docs/a.txt", f"{home}/missing.txt", f"{home}/app.db"]
    databases = [f"{home}/app.db"]
    monkeypatch.setattr(snapshots, "PROOF_MAX_BYTES", 4096)
    in_place = _in_place(home, files, databases)
    archived = snapshots.measure_archives(work, {"home.tar": str(home)}, files, databases)
    assert archived == in_place
    tree = archived["roots"][str(home)]["files"]
    assert tree["link"] == {"link": "docs/a.txt"}
    assert tree["big.bin"] == {"size": 5000, "sha256": None}  # past the byte cap: listed by size only
    assert ".Xauthority" not in tree and "profile/SingletonLock" not in tree
    assert archived["files"][f"{home}/missing.txt"] is None
    assert archived["sqlite"][f"{home}/app.db"]["tables"]["t"]["rows"] == 2
    assert snapshots.compare(in_place, archived) == []


def test_the_file_cap_truncates_both_sides_alike(tmp_path, monkeypatch):
    home = _home(tmp_path)
    entries = snapshot_probe._walk(str(home))
    listed = snapshot_probe.listing(entries, 2, 1 << 20, 1 << 20)
    assert listed["truncated"] and list(listed["files"]) == sorted(listed["files"]) and len(listed["files"]) == 2


def test_differences_name_each_path_escaped(tmp_path):
    want = {"roots": {"/home/sandbox": {"files": {"a": {"size": 1, "sha256": "aa" * 32},
                                                  "evil\x1b[2J": {"size": 1, "sha256": "bb" * 32}},
                                        "truncated": False}},
            "files": {"/home/sandbox/a": {"size": 1, "sha256": "aa" * 32}},
            "sqlite": {"/home/sandbox/db": {"tables": {"t": {"rows": 1, "sha256": "cc" * 32}}}}}
    got = {"roots": {"/home/sandbox": {"files": {"a": {"size": 2, "sha256": "dd" * 32}}, "truncated": False}},
           "files": {"/home/sandbox/a": {"size": 2, "sha256": "dd" * 32}},
           "sqlite": {"/home/sandbox/db": {"tables": {"t": {"rows": 2, "sha256": "ee" * 32}}}}}
    diffs = snapshots.compare(want, got)
    assert "/home/sandbox/a: in the snapshot 1 bytes, sha256 aaaaaaaaa..., restored 2 bytes, sha256 ddddddddd..." in diffs
    assert "/home/sandbox/evil\\x1b[2J: in the snapshot 1 bytes, sha256 bbbbbbbbb..., restored absent" in diffs
    assert any(d.startswith("/home/sandbox/db table t: in the snapshot 1 rows") for d in diffs)
    err = snapshots.SnapshotMismatch("snap-00000000", "restored sandbox ds-00000000", diffs)
    assert "\x1b" not in str(err) and len(err.differences) == len(diffs) == 4


@pytest.mark.parametrize("manifest, needle", [
    ("[1]", "not a snapshot manifest"),
    ('{"format": "desktop-sandbox-snapshot", "version": 2}', "manifest version 2"),
    ('{"format": "desktop-sandbox-snapshot", "version": 1, "id": "snap-00000000", "backend": "docker", '
     '"kind": "files", "payload": {"../x": {"size": 1, "sha256": "a"}}}', "payload entry ../x is malformed"),
    ("x" * 10, "is not JSON"),
])
def test_a_manifest_that_is_not_one_is_refused(tmp_path, manifest, needle):
    (tmp_path / "manifest.json").write_text(manifest)
    with pytest.raises(snapshots.SnapshotError, match=needle.replace(".", r"\.").replace("[", r"\[")):
        snapshots.load(tmp_path)


def test_no_snapshot_by_id_is_refused(tmp_path):
    with pytest.raises(snapshots.SnapshotError, match="no snapshot at"):
        snapshots.load("snap-00000000", root=tmp_path)
