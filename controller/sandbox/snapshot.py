"""Snapshots you can trust: a sandbox's state saved in a directory with a manifest, restored into one or
more new sandboxes only after the state they hold is proven to be the state that was saved.

A snapshot is a directory ``<root>/snap-<8 hex>/`` (``root``: ``$DESKTOP_SANDBOX_SNAPSHOTS``, else
``snapshots/`` under the current directory) holding ``manifest.json`` (format: docs/ARCHITECTURE.md,
"Snapshots") and the backend's payload: the Docker backend's tar archives of the guest's homes (kind
``files``: processes do not survive, apps start again), the VM backend's machine state (kind
``machine``: RAM and disk, processes survive). What a backend can do is its ``capabilities.snapshot``;
asking one without it raises :class:`~controller.sandbox.capabilities.CapabilityMissing` at once.

* :func:`take_snapshot` saves a running sandbox (``save_snapshot(dest)`` of its backend) and writes the
  manifest: the template it came from (image id, screen, browser channel, policy, backend options), the
  sha256 of every payload file, and the **state proof** (:mod:`controller.sandbox.snapshot_probe`):
  the hash of every file a task's checks read (file checks, sqlite checks' databases with ``-wal`` and
  ``-shm`` and their ``bind_files``) and of the app records of each sqlite check's database, the guest's
  home listed with sizes and hashes (at most :data:`PROOF_MAX_FILES` files, :data:`PROOF_MAX_BYTES`
  bytes hashed, files over :data:`PROOF_FILE_MAX_BYTES` listed by size only), and for kind ``machine``
  the sha256 of the screen's pixels. For kind ``files`` the proof is measured on the archives
  themselves, so it says exactly what a restore writes.
* :func:`restore` checks the payload hashes first (a changed archive is refused before anything starts,
  naming each guest path it changes), restores ``count`` sandboxes (``restore_snapshot`` of the
  backend class), gives each a fresh agent token, then measures each restored guest the same way and
  compares with the manifest; any difference removes every sandbox it restored and raises
  :class:`SnapshotMismatch` naming each differing path (escaped) and what differs.

Every read from the guest is capped (bytes) and deadlined (seconds): :data:`PROBE_OUTPUT_MAX_BYTES`,
:data:`PROBE_TIMEOUT_S`; the manifest is read with :data:`MANIFEST_MAX_BYTES`.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import secrets
import shutil
import tarfile
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path, PurePosixPath
from typing import Any, Callable, Sequence

from controller.model.checks import check_guest_path
from controller.sandbox import snapshot_probe
from controller.sandbox.errors import SandboxError
from controller.sandbox.guest import GUEST_HOME
from controller.text import clean

FORMAT = "desktop-sandbox-snapshot"
"""The manifest's ``format`` value."""
VERSION = 1
"""The manifest format's version; a manifest of another version is refused."""
MANIFEST = "manifest.json"
ROOT_ENV = "DESKTOP_SANDBOX_SNAPSHOTS"
"""Environment variable naming the snapshots' root directory (default ``snapshots/`` here)."""
SNAPSHOT_ID = re.compile(r"snap-[0-9a-f]{8}")
"""A snapshot's id: ``snap-<8 hex>`` (also its directory's name)."""

PROOF_MAX_FILES = 5000
"""Most files (and symlinks) of a guest home the state proof lists; the rest are left out (``truncated``)."""
PROOF_MAX_BYTES = 256 * 1024 * 1024
"""Most bytes the state proof hashes per home; files past it are listed by size only."""
PROOF_FILE_MAX_BYTES = 64 * 1024 * 1024
"""Largest single file the proof hashes (bytes): a bigger one is listed by size; a checked file (or a
checked database) bigger than this is recorded as an error on both sides."""
PROBE_TIMEOUT_S = 120.0
"""Seconds one measurement of a guest may take (the program is killed after it)."""
PROBE_OUTPUT_MAX_BYTES = 16 * 1024 * 1024
"""Largest answer of one measurement of a guest (bytes)."""
SQLITE_SECONDS = 10.0
"""Seconds reading one database's app records may take."""
MANIFEST_MAX_BYTES = 32 * 1024 * 1024
"""Largest manifest read (bytes)."""
SHOWN_DIFFERENCES = 50
"""Most differences a :class:`SnapshotMismatch` message lists (all are in ``differences``)."""

_PAYLOAD_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}(/[A-Za-z0-9][A-Za-z0-9._-]{0,127}){0,7}")


class SnapshotError(SandboxError):
    """A snapshot cannot be taken, found, read or restored; the message says which and why."""


class SnapshotMismatch(SnapshotError):
    """What a restore holds (or a snapshot's payload) differs from the manifest. ``differences``: one
    line each, ``PATH: what differs`` (paths escaped); everything restored was removed first."""

    def __init__(self, snapshot_id: str, where: str, differences: Sequence[str]) -> None:
        self.snapshot_id, self.where, self.differences = snapshot_id, where, list(differences)
        shown = self.differences[:SHOWN_DIFFERENCES]
        more = len(self.differences) - len(shown)
        super().__init__(f"{where} differs from snapshot {clean(snapshot_id, 40)} in {len(self.differences)} "
                         f"place(s); refused:\n  " + "\n  ".join(shown) + (f"\n  ... and {more} more" if more else ""))


@dataclass(frozen=True)
class Snapshot:
    """A snapshot on disk: ``id`` (``snap-<8 hex>``), ``path`` (its directory), ``manifest`` (parsed)."""

    id: str
    path: Path
    manifest: dict[str, Any]

    @property
    def backend(self) -> str:
        """The registry name of the backend that took it."""
        return str(self.manifest["backend"])

    @property
    def kind(self) -> str:
        """``files`` or ``machine`` (:data:`controller.sandbox.capabilities.SnapshotKind`)."""
        return str(self.manifest["kind"])


# -- where snapshots live ------------------------------------------------------------------------------


def snapshots_root(root: str | os.PathLike[str] | None = None) -> Path:
    """The snapshots' root directory: ``root``, else ``$DESKTOP_SANDBOX_SNAPSHOTS``, else ``./snapshots``."""
    return Path(root or os.environ.get(ROOT_ENV) or "snapshots")


def load(ref: str | os.PathLike[str], *, root: str | os.PathLike[str] | None = None) -> Snapshot:
    """The snapshot ``ref`` names: an id (``snap-<8 hex>``, looked up under :func:`snapshots_root`) or a
    snapshot directory. Raises SnapshotError when there is none or its manifest is unreadable, too big
    (:data:`MANIFEST_MAX_BYTES`), of another format or version, or malformed."""
    text = os.fspath(ref)
    path = snapshots_root(root) / text if SNAPSHOT_ID.fullmatch(text) else Path(text)
    manifest_path = path / MANIFEST
    try:
        with open(manifest_path, "rb") as fh:
            raw = fh.read(MANIFEST_MAX_BYTES + 1)
    except OSError as exc:
        raise SnapshotError(f"no snapshot at {clean(str(path), 300)}: {clean(exc.strerror or exc, 200)}") from None
    if len(raw) > MANIFEST_MAX_BYTES:
        raise SnapshotError(f"{clean(str(manifest_path), 300)} is over {MANIFEST_MAX_BYTES} bytes")
    try:
        manifest = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise SnapshotError(f"{clean(str(manifest_path), 300)} is not JSON: {clean(exc, 200)}") from None
    _check_manifest(manifest, manifest_path)
    return Snapshot(str(manifest["id"]), path, manifest)


def _check_manifest(manifest: Any, where: Path) -> None:
    """Raise SnapshotError naming the first field of ``manifest`` that is missing or malformed."""
    def bad(why: str) -> SnapshotError:
        return SnapshotError(f"{clean(str(where), 300)}: {why}")

    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise bad(f"not a snapshot manifest (format is not {FORMAT!r})")
    if manifest.get("version") != VERSION:
        raise bad(f"manifest version {clean(manifest.get('version'), 20)}; this program reads version {VERSION}")
    if not isinstance(manifest.get("id"), str) or not SNAPSHOT_ID.fullmatch(manifest["id"]):
        raise bad("id is not snap-<8 hex>")
    if not isinstance(manifest.get("backend"), str) or manifest.get("kind") not in ("files", "machine"):
        raise bad("backend or kind missing (kind: files | machine)")
    payload = manifest.get("payload")
    if not isinstance(payload, dict) or not payload:
        raise bad("payload lists no file")
    for name, entry in payload.items():
        if not isinstance(name, str) or not _PAYLOAD_NAME.fullmatch(name) or name == MANIFEST \
                or not isinstance(entry, dict) or not isinstance(entry.get("size"), int) \
                or not isinstance(entry.get("sha256"), str):
            raise bad(f"payload entry {clean(name, 200)} is malformed (a plain relative name, size, sha256)")
    proof = manifest.get("proof")
    if not isinstance(proof, dict) or not isinstance(proof.get("roots"), dict) \
            or not isinstance(proof.get("files"), dict) or not isinstance(proof.get("sqlite"), dict):
        raise bad("proof missing or malformed (roots, files, sqlite)")
    template = manifest.get("template")
    if not isinstance(template, dict) or not isinstance(template.get("screen"), dict):
        raise bad("template missing or malformed")


# -- taking ---------------------------------------------------------------------------------------------


def check_targets(task: Any, home: str) -> tuple[list[str], list[str]]:
    """What ``task``'s checks read in the guest, as absolute paths (``~/`` under ``home``):
    ``(files, databases)``. Files: every file check's path, every sqlite check's database with its
    ``-wal`` and ``-shm``, and its ``bind_files``; databases: every sqlite check's. Page checks read a
    page, not a guest file: none. ``task`` None: ``([], [])``. Raises SnapshotError for a path the task
    rules refuse."""
    files: list[str] = []
    databases: list[str] = []
    for check in getattr(task, "checks", None) or []:
        kind = getattr(check, "kind", None)
        if kind == "file":
            files.append(_guest_path(check.path, home))
        elif kind == "sqlite":
            db = _guest_path(check.path, home)
            databases.append(db)
            files += [db, db + "-wal", db + "-shm", *(_guest_path(p, home) for p in check.bind_files)]
    return list(dict.fromkeys(files)), list(dict.fromkeys(databases))


def _guest_path(path: str, home: str) -> str:
    try:
        check_guest_path(path)
    except ValueError as exc:
        raise SnapshotError(f"check path: {clean(exc, 300)}") from None
    return home.rstrip("/") + path[1:] if path.startswith("~/") else path


def take_snapshot(sandbox: Any, *, task: Any = None, root: str | os.PathLike[str] | None = None) -> Snapshot:
    """Save the running ``sandbox`` as a new snapshot under :func:`snapshots_root` (``root``) and return it.

    ``task`` (a loaded task, optional): its checks' paths go into the state proof (see the module doc).
    The backend's ``save_snapshot(dest)`` writes the payload into a private directory, which becomes
    ``<root>/snap-<8 hex>/`` with its manifest once complete; nothing is left on a failure. For kind
    ``machine`` the guest is measured (files, records, screen) just before the backend saves it.

    Raises CapabilityMissing at once when the backend has no snapshot, SnapshotError (a file kind
    snapshot cannot hold a checked path outside the archived homes; the payload or the guest cannot be
    read), SandboxError from the backend.
    """
    backend = getattr(sandbox, "backend_name", type(sandbox).__name__)
    sandbox.capabilities.require(backend, "snapshot")
    kind = sandbox.capabilities.snapshot
    home = getattr(sandbox, "guest_home", "") or GUEST_HOME
    files, databases = check_targets(task, home)
    base = snapshots_root(root)
    base.mkdir(parents=True, exist_ok=True)
    snap_id = f"snap-{secrets.token_hex(4)}"
    while (base / snap_id).exists():
        snap_id = f"snap-{secrets.token_hex(4)}"
    work = Path(tempfile.mkdtemp(prefix=f".{snap_id}-", dir=base))
    try:
        live = None
        if kind == "machine":
            live = measure_guest(sandbox, [home], files, databases)
            live["screen_sha256"] = screen_sha256(sandbox)
        info = sandbox.save_snapshot(work) or {}
        if not isinstance(info, dict):
            raise SnapshotError(f"the {backend} backend's save_snapshot answered {type(info).__name__}, not a dict")
        if info.get("kind", kind) != kind:
            raise SnapshotError(f"the {backend} backend saved kind {clean(info.get('kind'), 20)}; it declares {kind}")
        template = _template(sandbox, info.get("template") or {})
        payload = _hash_payload(work)
        if not payload:
            raise SnapshotError(f"the {backend} backend's save_snapshot wrote no payload")
        if kind == "files":
            proof = measure_archives(work, info.get("archives") or {}, files, databases)
        else:
            assert live is not None
            proof = live
        proof["caps"] = _caps()
        manifest = {
            "format": FORMAT, "version": VERSION, "id": snap_id, "backend": backend, "kind": kind,
            "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "source_sandbox": getattr(sandbox, "id", ""),
            "task": {"name": getattr(task, "name", None),
                     "source": str(getattr(task, "source", "") or "") or None} if task is not None else None,
            "template": template,
            "payload": payload,
            "backend_data": {k: v for k, v in info.items() if k not in ("kind", "template")},
            "proof": proof,
        }
        with open(os.open(work / MANIFEST, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as fh:
            fh.write(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
        dest = base / snap_id
        work.rename(dest)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return Snapshot(snap_id, dest, manifest)


def _caps() -> dict[str, int]:
    return {"max_files": PROOF_MAX_FILES, "max_bytes": PROOF_MAX_BYTES, "file_max": PROOF_FILE_MAX_BYTES}


def _template(sandbox: Any, saved: dict[str, Any]) -> dict[str, Any]:
    """What a restore starts from: image id, screen, policy (the gateway's ``GET /v1/policy``; None when
    it has no control API), browser channel, and what the backend's ``save_snapshot`` adds (``saved``:
    its options; a screen it knows, else the agent's display is asked)."""
    screen = saved.get("screen")
    if not isinstance(screen, dict):
        display = sandbox.agent.display()
        screen = {"width": int(display["width"]), "height": int(display["height"])}
    return {
        "image_id": getattr(sandbox, "image_id", ""),
        "policy": read_policy(sandbox),
        "browser_channel": False,
        "arch": getattr(sandbox, "arch", "") or "",
        **saved,
        "screen": {"width": int(screen["width"]), "height": int(screen["height"])},
    }


def read_policy(sandbox: Any, timeout: float = 10.0) -> dict[str, Any] | None:
    """The policy the sandbox's gateway enforces now (:func:`controller.sandbox.policy_swap.get_policy`);
    None when it has no control API. Raises SnapshotError when the gateway does not answer."""
    from controller.sandbox.policy_swap import get_policy

    url, token = sandbox.gateway_control_url, sandbox.gateway_control_token
    if not url or not token:
        return None
    try:
        return get_policy(url, token, timeout=timeout)
    except SandboxError as exc:
        raise SnapshotError(f"cannot read the gateway's policy: {exc}") from None


def _hash_payload(work: Path) -> dict[str, dict[str, Any]]:
    """``{relative name: {"size", "sha256"}}`` of every regular file under ``work`` (not the manifest).
    Raises SnapshotError for anything else there (a symlink, a device) or a name outside the rules."""
    out: dict[str, dict[str, Any]] = {}
    for path in sorted(work.rglob("*")):
        rel = path.relative_to(work).as_posix()
        if path.is_dir() and not path.is_symlink():
            continue
        if rel == MANIFEST:
            continue
        if path.is_symlink() or not path.is_file() or not _PAYLOAD_NAME.fullmatch(rel):
            raise SnapshotError(f"payload {clean(rel, 200)}: only regular files with plain names belong in a snapshot")
        out[rel] = {"size": path.stat().st_size, "sha256": _sha256_file(path)}
    return out


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


# -- measuring --------------------------------------------------------------------------------------------


def measure_guest(sandbox: Any, roots: Sequence[str], files: Sequence[str], databases: Sequence[str]) -> dict[str, Any]:
    """Measure the running guest (:mod:`controller.sandbox.snapshot_probe`, run there as the desktop
    user, killed after :data:`PROBE_TIMEOUT_S`, its answer at most :data:`PROBE_OUTPUT_MAX_BYTES`):
    ``{"roots": {dir: tree}, "files": {path: record}, "sqlite": {path: records}}``. Raises SnapshotError."""
    from controller.sandbox.guest import GUEST_PYTHON

    request = {"roots": list(roots), "files": list(files), "sqlite": list(databases), **_caps(),
               "sqlite_seconds": SQLITE_SECONDS}
    source = Path(snapshot_probe.__file__).read_text()
    result = sandbox.exec_in_guest([GUEST_PYTHON, "-c", source, json.dumps(request)], timeout=PROBE_TIMEOUT_S)
    if result.exit_code != 0:
        raise SnapshotError(f"measuring the guest of {clean(getattr(sandbox, 'id', '?'), 40)} failed (exit "
                            f"{result.exit_code}): {clean(result.stderr.decode('utf-8', 'replace'), 1000)}")
    if len(result.stdout) > PROBE_OUTPUT_MAX_BYTES:
        raise SnapshotError(f"the guest's measurement is over {PROBE_OUTPUT_MAX_BYTES} bytes")
    try:
        data = json.loads(result.stdout)
    except (ValueError, RecursionError) as exc:
        raise SnapshotError(f"the guest's measurement is not JSON: {clean(exc, 200)}") from None
    if not isinstance(data, dict) or not all(isinstance(data.get(k), dict) for k in ("roots", "files", "sqlite")):
        raise SnapshotError("the guest's measurement is malformed")
    return data


def measure_archives(work: Path, archives: dict[str, str], files: Sequence[str],
                     databases: Sequence[str]) -> dict[str, Any]:
    """Measure a files snapshot on the host, from its tar archives (``archives``: payload name -> the guest
    directory it holds), as :func:`measure_guest` measures a guest: the same records, caps and order.
    Raises SnapshotError for a checked path outside every archived directory, or an archive that is not
    a readable tar."""
    roots: dict[str, Any] = {}
    members: dict[str, tuple[tarfile.TarFile, tarfile.TarInfo]] = {}
    opened: list[tarfile.TarFile] = []
    try:
        for name, directory in sorted(archives.items()):
            try:
                tar = tarfile.open(work / name, mode="r:")
            except (OSError, tarfile.TarError) as exc:
                raise SnapshotError(f"payload {clean(name, 100)} is not a readable tar: {clean(exc, 200)}") from None
            opened.append(tar)
            entries = []
            for info in tar.getmembers():
                rel = _member_path(info.name)
                if rel is None:
                    continue
                if info.issym():
                    entries.append((rel, "link", 0, info.linkname))
                elif info.isfile() or info.islnk():
                    entries.append((rel, "file", info.size, lambda t=tar, i=info: t.extractfile(i)))
                else:
                    continue
                members[f"{directory.rstrip('/')}/{rel}"] = (tar, info)
            roots[directory] = snapshot_probe.listing(entries, PROOF_MAX_FILES, PROOF_MAX_BYTES, PROOF_FILE_MAX_BYTES)
        outside = [p for p in [*files, *databases] if not any(p.startswith(d.rstrip("/") + "/") for d in archives.values())]
        if outside:
            raise SnapshotError(f"a files snapshot holds {', '.join(sorted(archives.values()))} only; the task's "
                                f"checks read {', '.join(clean(p, 200) for p in outside)}")

        def read(path: str) -> bytes | None:
            found = members.get(path)
            if found is None or not (found[1].isfile() or found[1].islnk()):
                return None
            stream = found[0].extractfile(found[1])
            return None if stream is None else stream.read(PROOF_FILE_MAX_BYTES + 1)

        file_records: dict[str, Any] = {}
        for path in files:
            found = members.get(path)
            if found is None:
                file_records[path] = None
            elif found[1].issym():
                file_records[path] = {"error": "not a regular file"}
            else:
                stream = found[0].extractfile(found[1])
                assert stream is not None
                size, digest = snapshot_probe._hash_stream(stream.read, PROOF_FILE_MAX_BYTES)
                file_records[path] = ({"size": size, "sha256": digest} if digest is not None
                                      else {"error": f"larger than {PROOF_FILE_MAX_BYTES} bytes"})
        records: dict[str, Any] = {}
        for path in databases:
            with tempfile.TemporaryDirectory(prefix="snapshot-proof-") as tmp:
                try:
                    copy = snapshot_probe.copy_database(read, path, tmp, PROOF_FILE_MAX_BYTES)
                    records[path] = None if copy is None else snapshot_probe.sqlite_records(copy, SQLITE_SECONDS)
                except ValueError as exc:
                    records[path] = {"error": str(exc)}
        return {"roots": roots, "files": file_records, "sqlite": records}
    except tarfile.TarError as exc:
        raise SnapshotError(f"a payload archive cannot be read: {clean(exc, 200)}") from None
    finally:
        for tar in opened:
            tar.close()


def _member_path(name: str) -> str | None:
    """A tar member's path relative to the archived directory (``./a/b`` -> ``a/b``); None for the
    directory itself and for names that leave it (absolute, ``..``)."""
    parts = [p for p in PurePosixPath(name).parts if p not in (".", "")]
    if not parts or name.startswith("/") or ".." in parts:
        return None
    return "/".join(parts)


def screen_sha256(sandbox: Any) -> dict[str, Any]:
    """``{"width", "height", "sha256"}`` of the guest screen's pixels (RGB, row by row), from a PNG
    screenshot of the agent (its client caps the answer and has a deadline)."""
    from PIL import Image

    shot = sandbox.agent.screenshot()
    with Image.open(io.BytesIO(shot.data), formats=["PNG"]) as img:
        rgb = img.convert("RGB")
        return {"width": rgb.width, "height": rgb.height, "sha256": hashlib.sha256(rgb.tobytes()).hexdigest()}


# -- comparing ------------------------------------------------------------------------------------------------


def _short(digest: Any) -> str:
    return clean(digest, 12) if isinstance(digest, str) else "none"


def _describe(record: Any) -> str:
    if record is None:
        return "absent"
    if not isinstance(record, dict):
        return clean(record, 60)
    if "link" in record:
        return f"a symlink to {clean(record['link'], 200)}"
    if "error" in record:
        return f"unreadable ({clean(record['error'], 120)})"
    return f"{record.get('size')} bytes, sha256 {_short(record.get('sha256'))}"


def compare(expected: dict[str, Any], observed: dict[str, Any], label: str = "restored") -> list[str]:
    """The differences between two measurements (the manifest's proof and a restored guest's, or an
    archive's: ``label`` names it), one line each: ``PATH: in the snapshot X, restored Y`` (paths and
    values escaped)."""
    out: list[str] = []

    def differ(what: str, want: Any, have: Any) -> None:
        if want != have:
            out.append(f"{clean(what, 300)}: in the snapshot {_describe(want)}, {label} {_describe(have)}")

    roots_want, roots_got = expected.get("roots") or {}, observed.get("roots") or {}
    for root in sorted(roots_want):
        want, have = roots_want[root], roots_got.get(root)
        if not isinstance(want, dict) or not isinstance(have, dict):
            if want != have:
                out.append(f"{clean(root, 300)}: in the snapshot {'a directory' if want else 'absent'}, "
                           f"{label} {'a directory' if have else 'absent'}")
            continue
        wf, gf = want.get("files") or {}, have.get("files") or {}
        for rel in sorted(set(wf) | set(gf)):
            differ(f"{root.rstrip('/')}/{rel}", wf.get(rel), gf.get(rel))
        if bool(want.get("truncated")) != bool(have.get("truncated")):
            out.append(f"{clean(root, 300)}: listing truncated at {PROOF_MAX_FILES} files in one and not the other")
    files_want, files_got = expected.get("files") or {}, observed.get("files") or {}
    for path in sorted(files_want):
        differ(path, files_want[path], files_got.get(path))
    db_want, db_got = expected.get("sqlite") or {}, observed.get("sqlite") or {}
    for path in sorted(db_want):
        want, have = db_want[path], db_got.get(path)
        if want == have:
            continue
        if not (isinstance(want, dict) and isinstance(have, dict) and "tables" in want and "tables" in have):
            out.append(f"{clean(path, 300)} (app records): in the snapshot {_records(want)}, {label} {_records(have)}")
            continue
        tw, tg = want["tables"], have["tables"]
        for table in sorted(set(tw) | set(tg)):
            if tw.get(table) != tg.get(table):
                out.append(f"{clean(path, 300)} table {clean(table, 100)}: in the snapshot {_rows(tw.get(table))}, "
                           f"{label} {_rows(tg.get(table))}")
    if "screen_sha256" in expected and expected.get("screen_sha256") != observed.get("screen_sha256"):
        want, have = expected.get("screen_sha256") or {}, observed.get("screen_sha256") or {}
        out.append(f"screen pixels: in the snapshot {clean(want.get('width'), 8)}x{clean(want.get('height'), 8)} "
                   f"sha256 {_short(want.get('sha256'))}, {label} {clean(have.get('width'), 8)}x"
                   f"{clean(have.get('height'), 8)} sha256 {_short(have.get('sha256'))}")
    return out


def _records(value: Any) -> str:
    if value is None:
        return "no database"
    if isinstance(value, dict) and "error" in value:
        return f"unreadable ({clean(value['error'], 120)})"
    return f"{len(value.get('tables', {}))} tables" if isinstance(value, dict) else clean(value, 60)


def _rows(value: Any) -> str:
    if not isinstance(value, dict):
        return "no such table"
    return f"{clean(value.get('rows'), 12)} rows (sha256 {_short(value.get('sha256'))})"


# -- restoring ------------------------------------------------------------------------------------------------


def verify_payload(snapshot: Snapshot) -> None:
    """Check every payload file against the manifest (size, sha256) and that the directory holds nothing
    else. Raises SnapshotMismatch naming each differing payload file and, for a files snapshot, each guest
    path the changed archive would write differently (measured on the archive, as at the take)."""
    listed = snapshot.manifest["payload"]
    try:
        present = _hash_payload(snapshot.path)
    except SnapshotError as exc:
        raise SnapshotMismatch(snapshot.id, f"the payload in {clean(str(snapshot.path), 200)}", [str(exc)]) from None
    differences = []
    for name in sorted(set(listed) | set(present)):
        want, got = listed.get(name), present.get(name)
        if want is None:
            differences.append(f"payload {clean(name, 200)}: not in the manifest")
        elif got is None:
            differences.append(f"payload {clean(name, 200)}: missing")
        elif (want.get("size"), want.get("sha256")) != (got["size"], got["sha256"]):
            differences.append(f"payload {clean(name, 200)}: the manifest says {want.get('size')} bytes sha256 "
                               f"{_short(want.get('sha256'))}, the file is {got['size']} bytes sha256 {_short(got['sha256'])}")
    if not differences:
        return
    archives = (snapshot.manifest.get("backend_data") or {}).get("archives") or {}
    if snapshot.kind == "files" and isinstance(archives, dict):
        expected = snapshot.manifest["proof"]
        readable = {n: d for n, d in archives.items() if isinstance(n, str) and isinstance(d, str)
                    and n in present and n in listed}
        try:
            files, databases = list(expected.get("files") or {}), list(expected.get("sqlite") or {})
            measured = measure_archives(snapshot.path, readable, files, databases)
            differences += compare({**expected, "roots": {d: expected["roots"].get(d) for d in readable.values()}},
                                   measured, label="in the archive")
        except SnapshotError as exc:
            differences.append(str(exc))
    raise SnapshotMismatch(snapshot.id, f"the payload in {clean(str(snapshot.path), 200)}", differences)


def template_spec(snapshot: Snapshot, ready_timeout: float | None = None) -> Any:
    """The :class:`~controller.sandbox.SandboxSpec` of the snapshot's template (screen, policy, browser
    channel); ``ready_timeout`` seconds when given."""
    from controller.sandbox import DEFAULT_POLICY, SandboxSpec

    template = snapshot.manifest["template"]
    screen = template["screen"]
    extra = {} if ready_timeout is None else {"ready_timeout": ready_timeout}
    return SandboxSpec(screen_width=int(screen["width"]), screen_height=int(screen["height"]),
                       policy=template.get("policy") or dict(DEFAULT_POLICY),
                       browser_channel=bool(template.get("browser_channel")), **extra)


def prove(sandbox: Any, snapshot: Snapshot) -> list[str]:
    """Measure the restored ``sandbox`` as the snapshot was measured and return the differences (:func:`compare`),
    the image first when it is another one."""
    proof = snapshot.manifest["proof"]
    out = []
    want_image = snapshot.manifest["template"].get("image_id")
    if want_image and getattr(sandbox, "image_id", want_image) != want_image:
        out.append(f"image: in the snapshot {clean(want_image, 80)}, restored {clean(sandbox.image_id, 80)}")
    observed = measure_guest(sandbox, list(proof["roots"]), list(proof["files"]), list(proof["sqlite"]))
    if "screen_sha256" in proof:
        observed["screen_sha256"] = screen_sha256(sandbox)
    return out + compare(proof, observed)


def restore(ref: str | os.PathLike[str], *, count: int = 1, spec: Any = None, options: Any = None,
            root: str | os.PathLike[str] | None = None,
            on_restored: Callable[[Any], None] | None = None, **option_overrides: Any) -> list[Any]:
    """Restore ``count`` new sandboxes from the snapshot ``ref`` (an id under :func:`snapshots_root`
    ``root``, or a directory) and return them, each proven to hold the snapshot's state.

    ``spec``: the :class:`~controller.sandbox.SandboxSpec` (default: the snapshot's template, with its
    backend's ready timeout); ``options``: the backend's options (default: the template's, where the
    backend can make them, ``snapshot_options``); ``option_overrides``: backend option fields set on
    those (``detached=True``, ``extra_labels={...}``, ``image="tag"``). In order: the
    payload hashes are checked (:func:`verify_payload`); the backend class's ``restore_snapshot(path,
    count, spec, options)`` restores; each sandbox gets a fresh agent token (``rotate_agent_token``:
    the old one is refused, 401); each is measured and compared with the manifest (:func:`prove`); then
    apps held by the restore start again (``resume_after_restore``, where the backend has it).
    ``on_restored(sandbox)`` is called for each proven one.

    Raises CapabilityMissing at once (a backend without snapshots, or without fork for ``count`` > 1),
    SnapshotError (no such snapshot, a malformed manifest), SnapshotMismatch (the payload, or a
    restored guest, differs: every sandbox restored is removed first), SandboxError from the backend;
    on any failure, also a signal, nothing restored is left.
    """
    from controller.sandbox import registry

    if count < 1:
        raise SnapshotError(f"count must be at least 1, not {count}")
    snapshot = load(ref, root=root)
    try:
        backend_cls = registry.get_backend(snapshot.backend)
    except KeyError:
        raise SnapshotError(f"snapshot {snapshot.id} was taken by backend {clean(snapshot.backend, 40)}, "
                            "which this program does not have") from None
    backend_cls.capabilities.require(snapshot.backend, "snapshot")
    if count > 1:
        backend_cls.capabilities.require(snapshot.backend, "fork")
    if backend_cls.capabilities.snapshot != snapshot.kind:
        raise SnapshotError(f"snapshot {snapshot.id} is of kind {snapshot.kind}; the {snapshot.backend} backend "
                            f"restores {backend_cls.capabilities.snapshot}")
    verify_payload(snapshot)
    spec = spec or template_spec(snapshot, backend_cls.default_ready_timeout)
    if option_overrides:
        import dataclasses

        make = getattr(backend_cls, "snapshot_options", None)
        try:
            if options is not None:
                options = dataclasses.replace(options, **option_overrides)
            elif make is not None:
                options = make(snapshot.manifest["template"], **option_overrides)
            else:
                options = dataclasses.replace(backend_cls.make_options(), **option_overrides)
        except TypeError as exc:
            raise SnapshotError(f"backend options for the {snapshot.backend} backend: {clean(exc, 300)}") from None
    restored: list[Any] = []
    try:
        restored = list(backend_cls.restore_snapshot(snapshot.path, count=count, spec=spec, options=options))
        for sandbox in restored:
            sandbox.rotate_agent_token()
            differences = prove(sandbox, snapshot)
            if differences:
                raise SnapshotMismatch(snapshot.id, f"restored sandbox {sandbox.id}", differences)
            resume = getattr(sandbox, "resume_after_restore", None)
            if resume is not None:
                resume()
            if on_restored is not None:
                on_restored(sandbox)
    except BaseException:
        for sandbox in restored:
            sandbox.close()
        raise
    return restored


__all__ = [
    "FORMAT", "VERSION", "MANIFEST", "ROOT_ENV", "SNAPSHOT_ID", "PROOF_MAX_FILES", "PROOF_MAX_BYTES",
    "PROOF_FILE_MAX_BYTES", "PROBE_TIMEOUT_S", "PROBE_OUTPUT_MAX_BYTES", "Snapshot", "SnapshotError",
    "SnapshotMismatch", "snapshots_root", "load", "check_targets", "take_snapshot", "measure_guest",
    "measure_archives", "screen_sha256", "compare", "verify_payload", "template_spec", "prove", "restore",
]
