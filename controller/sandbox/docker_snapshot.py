"""Files snapshots of the Docker backend (kind ``files``): the guest's homes written to and read from tar
archives by ``tar`` run in the desktop container, for ``DockerSandbox.save_snapshot`` and
``restore_snapshot`` (:mod:`controller.sandbox.snapshot` checks the payload and proves the state).

The engine's archive API (``get_archive``, ``put_archive``) cannot serve: the homes are tmpfs mounts,
which it does not see (it reads the empty directory under the mount) and may not write (the desktop's
root file system is read-only: "container rootfs is marked read-only"). So ``tar`` runs in the container
as each directory's owner, its archive streamed over the exec's output (saving) or standard input
(restoring), every stream capped in bytes and bounded in time.

Files only: processes are not saved. A restore starts a fresh sandbox, stops the session programs that
write the home (:data:`HELD_PROGRAMS`: the demo app and its database), empties each directory (but the
new session's X cookie), unpacks the archive, and the caller starts the held programs again once the
state is proven; apps start again.
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path
from typing import Any

from controller.sandbox.errors import SandboxError
from controller.sandbox.guest import BROWSER_UID, DESKTOP_UID, GUEST_HOME
from controller.sandbox.readiness import with_timeout
from controller.sandbox.snapshot_probe import VOLATILE_NAMES
from controller.text import clean, clean_lines

ARCHIVES = (("home.tar", GUEST_HOME, DESKTOP_UID), ("browser-home.tar", "/home/browser", BROWSER_UID))
"""What a files snapshot holds: ``(payload name, guest directory, owner uid)``: the desktop user's home and
the agent's chromium's profile (contract 8: its cookies are what a page check sees)."""
FACTS = "docker.json"
"""The backend's own file in the snapshot: ``{"format": 1, "image_id", "archives": {name: guest
directory}, "screen": {"width", "height"}, "browser_channel", "options": the start options}``."""
FACTS_MAX_BYTES = 64 * 1024
TAR_MAX_BYTES = 1024 * 1024 * 1024
"""Largest tar archive of one guest directory read (bytes; the home's tmpfs is 512 MiB)."""
IO_TIMEOUT_S = 300.0
"""Seconds writing or reading one archive in the container may take."""
OUTPUT_MAX_BYTES = 64 * 1024
"""Most of a command's messages (stderr) kept for an error message (bytes)."""
HELD_PROGRAMS = ("pickup",)
"""Session programs that write the home (the demo app: its database): stopped by a restore before it
writes the home, started again by ``DockerSandbox.resume_after_restore``."""
SUPERVISOR_CONF = "/opt/desktop-sandbox/src/images/supervisor/desktop.conf"


def _excludes() -> list[str]:
    return [f"--exclude={name}" for name in VOLATILE_NAMES]


def write_facts(dest: Path, facts: dict[str, Any]) -> None:
    """Write :data:`FACTS` (0600) into the snapshot directory ``dest``."""
    with open(os.open(Path(dest) / FACTS, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as fh:
        fh.write(json.dumps(facts, indent=1, sort_keys=True) + "\n")


def read_facts(source: Path) -> dict[str, Any]:
    """:data:`FACTS` of the snapshot directory ``source``, checked: its archives are :data:`ARCHIVES`'
    and present. Raises SandboxError."""
    path = Path(source) / FACTS
    try:
        with open(path, "rb") as fh:
            facts = json.loads(fh.read(FACTS_MAX_BYTES + 1)[:FACTS_MAX_BYTES])
    except (OSError, ValueError, RecursionError) as exc:
        raise SandboxError(f"{clean(str(path), 300)}: not a Docker snapshot: {clean(exc, 200)}") from None
    known = {name: directory for name, directory, _ in ARCHIVES}
    archives = facts.get("archives") if isinstance(facts, dict) else None
    if not isinstance(archives, dict) or facts.get("format") != 1 \
            or any(known.get(n) != d or not (Path(source) / n).is_file() for n, d in archives.items()):
        raise SandboxError(f"{clean(str(path), 300)}: its archives are not the Docker backend's ({', '.join(known)})")
    return facts


def supervise(sandbox: Any, verb: str) -> None:
    """``supervisorctl VERB`` each of :data:`HELD_PROGRAMS` in ``sandbox``'s desktop (as root: the
    control socket is root's). A program that is not running counts as stopped. Raises SandboxError."""
    for program in HELD_PROGRAMS:
        result = sandbox._exec(sandbox.desktop, ["supervisorctl", "-c", SUPERVISOR_CONF, verb, program],
                               user="0:0", timeout=60, max_bytes=OUTPUT_MAX_BYTES)
        said = (result.stdout + result.stderr).decode("utf-8", "replace")
        if result.exit_code != 0 and not (verb == "stop" and "not running" in said):
            raise SandboxError(f"cannot {verb} {program} in {sandbox.id} (exit {result.exit_code}): "
                               f"{clean_lines(said.strip(), 1000)}")


def _exit_code(api: Any, exec_id: str, deadline: float) -> int:
    """The exit status of exec ``exec_id`` once it has ended (asked until ``deadline``)."""
    delay = 0.01
    while True:
        state = api.exec_inspect(exec_id)
        if not state.get("Running") and state.get("ExitCode") is not None:
            return int(state["ExitCode"])
        if time.monotonic() > deadline:
            raise SandboxError("a command in the desktop container did not end in time")
        time.sleep(delay)  # poll interval of a condition wait (the exec ended), bounded by the deadline
        delay = min(delay * 2, 0.2)


def has_directory(sandbox: Any, directory: str, uid: int) -> bool:
    """Whether ``directory`` exists in ``sandbox``'s desktop, as ``uid`` sees it."""
    return sandbox._exec(sandbox.desktop, ["test", "-d", directory], user=f"{uid}:{uid}", timeout=10).exit_code == 0


def tar_out(sandbox: Any, directory: str, uid: int, path: Path) -> None:
    """Write ``directory`` of ``sandbox``'s desktop as a tar archive to the new host file ``path`` (0600):
    ``tar`` run there as ``uid``, without :data:`VOLATILE_NAMES`, at most :data:`TAR_MAX_BYTES` within
    :data:`IO_TIMEOUT_S`; its exit status 1 (a file changed while it was read) is accepted. Raises
    SandboxError."""
    import docker.errors

    argv = with_timeout(["tar", "-c", "-f", "-", "-C", directory, *_excludes(), "."], IO_TIMEOUT_S)
    deadline = time.monotonic() + IO_TIMEOUT_S + 10
    api = sandbox.client.api
    errors = bytearray()
    total = 0
    what = f"reading {directory} of {sandbox.id}"
    try:
        exec_id = api.exec_create(sandbox.desktop.id, argv, user=f"{uid}:{uid}")["Id"]
        chunks = api.exec_start(exec_id, stream=True, demux=True)
        with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as out:
            try:
                for stdout, stderr in chunks:
                    total += len(stdout or b"")
                    if total > TAR_MAX_BYTES:
                        raise SandboxError(f"{directory} of {sandbox.id} is over {TAR_MAX_BYTES} bytes as a tar archive")
                    if time.monotonic() > deadline:
                        raise SandboxError(f"{what} took over {IO_TIMEOUT_S:g} s")
                    if stdout:
                        out.write(stdout)
                    if stderr and len(errors) < OUTPUT_MAX_BYTES:
                        errors += stderr[:OUTPUT_MAX_BYTES - len(errors)]
            finally:
                chunks.close()
        code = _exit_code(api, exec_id, deadline)
    except (OSError, docker.errors.APIError) as exc:  # requests' errors are OSErrors
        raise SandboxError(f"{what} failed: {clean(exc, 500)}") from None
    if code not in (0, 1):
        raise SandboxError(f"{what} failed (tar exit {code}): {clean_lines(errors.decode('utf-8', 'replace').strip(), 2000)}")


def tar_in(sandbox: Any, path: Path, directory: str, uid: int) -> None:
    """Empty ``directory`` of ``sandbox``'s desktop (but :data:`VOLATILE_NAMES`) and unpack the host's tar
    archive ``path`` into it, both as ``uid``: the archive streamed to ``tar``'s standard input, within
    :data:`IO_TIMEOUT_S`, its messages read up to :data:`OUTPUT_MAX_BYTES`. Raises SandboxError."""
    import docker.errors

    keep = [arg for name in VOLATILE_NAMES for arg in ("!", "-name", name)]
    wiped = sandbox._exec(sandbox.desktop, ["find", directory, "-mindepth", "1", "-maxdepth", "1", *keep, "-exec",
                                            "rm", "-rf", "--", "{}", "+"],
                          user=f"{uid}:{uid}", timeout=60, max_bytes=OUTPUT_MAX_BYTES)
    if wiped.exit_code != 0:
        raise SandboxError(f"cannot empty {directory} of {sandbox.id}: "
                           f"{clean_lines(wiped.stderr.decode('utf-8', 'replace').strip(), 1000)}")
    argv = with_timeout(["tar", "-x", "-f", "-", "-C", directory, "--no-same-owner", *_excludes()], IO_TIMEOUT_S)
    deadline = time.monotonic() + IO_TIMEOUT_S + 10
    api = sandbox.client.api
    answer = bytearray()
    what = f"writing {directory} of {sandbox.id}"
    try:
        exec_id = api.exec_create(sandbox.desktop.id, argv, user=f"{uid}:{uid}", stdin=True)["Id"]
        sock = api.exec_start(exec_id, socket=True)
        raw = getattr(sock, "_sock", sock)
        try:
            raw.settimeout(30.0)
            with open(path, "rb") as fh:
                for chunk in iter(lambda: fh.read(1 << 20), b""):
                    raw.sendall(chunk)
                    if time.monotonic() > deadline:
                        raise SandboxError(f"{what} took over {IO_TIMEOUT_S:g} s")
            raw.shutdown(socket.SHUT_WR)
            while True:
                data = raw.recv(65536)
                if not data:
                    break
                if len(answer) < OUTPUT_MAX_BYTES:
                    answer += data[:OUTPUT_MAX_BYTES - len(answer)]
                if time.monotonic() > deadline:
                    raise SandboxError(f"{what} took over {IO_TIMEOUT_S:g} s")
        finally:
            sock.close()
        code = _exit_code(api, exec_id, deadline)
    except (OSError, docker.errors.APIError) as exc:
        raise SandboxError(f"{what} failed: {clean(exc, 500)}") from None
    if code != 0:
        raise SandboxError(f"{what} failed (tar exit {code}): "
                           f"{clean_lines(_unframe(bytes(answer)).decode('utf-8', 'replace').strip(), 2000)}")


def _unframe(data: bytes) -> bytes:
    """The payload of an attached exec's multiplexed output (its 8-byte frame headers dropped)."""
    out = bytearray()
    while len(data) >= 8:
        size = int.from_bytes(data[4:8], "big")
        out += data[8:8 + size]
        data = data[8 + size:]
    return bytes(out)
