"""Machine snapshots of the VM backend: the whole guest (RAM and device state) saved through QEMU's
migration to a file, and new VMs started from it (``VMSandbox.save_snapshot`` / ``restore_snapshot``).

A snapshot directory holds (written by ``VMSandbox.save_snapshot``, read by :func:`read_facts`):

* ``machine.mig`` (:data:`MIGRATION_FILE`): QEMU's migration stream of the stopped guest (RAM, CPUs,
  devices). The guest's root disk is read-only and all it writes is tmpfs, so this is its whole state.
* ``vm.json`` (:data:`FACTS_FILE`): what a restore must match, at most :data:`FACTS_MAX_BYTES`::

      {"format": 1, "kind": "machine", "backend": "vm", "source": "dv-...", "saved_at": ISO-8601 UTC,
       "arch": "amd64", "accel": "tcg", "memory_mib": 2048, "cpus": 2,
       "qemu_version": "QEMU emulator version ...",
       "image": {"path": DIR, "key": manifest key, "rootfs_size": bytes, "rootfs_sample_sha256": hex},
       "screen": {"width": px, "height": px}, "guest_env": the fw_cfg env file's text,
       "argv": QEMU's command line with the per-sandbox parts as {dir} {image} {id} {agent_port}
               {gateway_port} {python} {forwarder}: machine, CPU, memory, devices, kernel command line,
       "migration": {"file": "machine.mig", "bytes": int}}

* ``agent-token`` (:data:`TOKEN_FILE`, 0600): the agent's bearer token inside the saved RAM. It drives
  nothing that runs: the source VM was moved to this token just before it stopped and to a fresh one
  just after; every restored VM is moved to its own fresh token before it is returned.

A restore refuses (SandboxError, before starting anything) a snapshot whose QEMU version, image (build
key, disk size, :func:`rootfs_facts`' sample hash) or command line differ from what this host would run:
the guest's page cache and devices must find what they left.
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any, Callable

from controller.sandbox.errors import SandboxError
from controller.sandbox.vm_qga import GuestAgentChannel
from controller.sandbox.vm_qmp import QMPChannel, QMPCommandError
from controller.text import clean

SNAPSHOT_FORMAT = 1
"""Version of the snapshot directory's layout and ``vm.json``."""
MIGRATION_FILE = "machine.mig"
FACTS_FILE = "vm.json"
TOKEN_FILE = "agent-token"
PAYLOAD_FILES = (MIGRATION_FILE, FACTS_FILE, TOKEN_FILE)
"""Every file a machine snapshot holds (a restore needs all of them)."""
FACTS_MAX_BYTES = 256 * 1024
"""Largest ``vm.json`` read."""
TOKEN_MAX_BYTES = 256
"""Largest ``agent-token`` read (the agent takes 32 to 256 characters)."""
MAX_FORKS = 16
"""Most VMs one restore starts."""
MIGRATE_TIMEOUT_S = 300.0
"""Longest a save waits for QEMU to write the migration file (seconds)."""
MIGRATE_MAX_BANDWIDTH = 1 << 40
"""QEMU's migration bandwidth cap during a save (bytes/s): none in effect (its default cap, 128 MiB/s,
would throttle the copy of a stopped guest's several hundred MiB to seconds of pause)."""
CLOCK_TOLERANCE_S = 2.0
"""Largest difference between guest and host clock accepted after setting the guest's (seconds)."""

_HASHES: dict[tuple[str, int, int, int], str] = {}
_VERSIONS: dict[str, str] = {}


def qemu_version(qemu: str) -> str:
    """The first line of ``qemu --version`` (cached per binary). Raises SandboxError when it does not run."""
    if qemu not in _VERSIONS:
        try:
            out = subprocess.run([qemu, "--version"], capture_output=True, timeout=20, check=False,
                                 stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise SandboxError(f"{qemu} --version failed: {clean(exc, 200)}") from exc
        lines = out.stdout[:4096].decode("utf-8", "replace").splitlines()
        if out.returncode != 0 or not lines:
            raise SandboxError(f"{qemu} --version failed (exit {out.returncode})")
        _VERSIONS[qemu] = lines[0].strip()
    return _VERSIONS[qemu]


SAMPLE_HEAD_BYTES = 1024 * 1024
"""Bytes at the start of ``rootfs.raw`` in its sample hash (the ext4 superblock, with the UUID each
build makes anew, and the group descriptors)."""
SAMPLE_BLOCKS = 62
SAMPLE_BLOCK_BYTES = 64 * 1024
"""The sample hash also covers :data:`SAMPLE_BLOCKS` blocks of this size spread evenly over the disk."""


def rootfs_facts(image: Path) -> dict[str, Any]:
    """``{"rootfs_size": bytes, "rootfs_sample_sha256": hex}`` of ``image/rootfs.raw``: sha256 of its size,
    its first :data:`SAMPLE_HEAD_BYTES` and :data:`SAMPLE_BLOCKS` blocks spread over it (about 5 MiB read,
    where hashing the whole 2.3 GiB disk takes seconds; the build key says what went into the disk, this
    tells two builds of it apart). Cached per path, size, modification time and inode for this process.
    Raises SandboxError when unreadable."""
    path = image / "rootfs.raw"
    try:
        st = path.stat()
        key = (str(path), st.st_size, st.st_mtime_ns, st.st_ino)
        if key not in _HASHES:
            digest = hashlib.sha256(str(st.st_size).encode() + b"\n")
            with open(path, "rb") as fh:
                digest.update(fh.read(SAMPLE_HEAD_BYTES))
                step = max(st.st_size // SAMPLE_BLOCKS, SAMPLE_BLOCK_BYTES)
                for i in range(SAMPLE_BLOCKS):
                    fh.seek(min(i * step, max(st.st_size - SAMPLE_BLOCK_BYTES, 0)))
                    digest.update(fh.read(SAMPLE_BLOCK_BYTES))
            _HASHES[key] = digest.hexdigest()
    except OSError as exc:
        raise SandboxError(f"cannot read the VM image's disk {path}: {clean(exc, 200)}") from exc
    return {"rootfs_size": st.st_size, "rootfs_sample_sha256": _HASHES[key]}


def argv_shape(argv: list[str], replacements: list[tuple[str, str]]) -> list[str]:
    """``argv`` with each ``(value, placeholder)`` of ``replacements`` replaced in every item (longest
    value first) and any ``-incoming`` pair left out: the command line's facts without this sandbox's
    own paths and ports, compared between a snapshot and its restore."""
    out: list[str] = []
    skip = False
    ordered = sorted((r for r in replacements if r[0]), key=lambda r: -len(r[0]))
    for item in argv:
        if skip:
            skip = False
            continue
        if item == "-incoming":
            skip = True
            continue
        for value, placeholder in ordered:
            item = item.replace(value, placeholder)
        out.append(item)
    return out


def check_path(path: Path, what: str) -> None:
    """Raise SandboxError when ``path`` cannot go into a QEMU option unquoted (a comma would start
    another option; spaces and control characters are refused too)."""
    text = str(path)
    if "," in text or any(c.isspace() or not c.isprintable() for c in text):
        raise SandboxError(f"{what} must not contain commas, spaces or control characters: {clean(text, 200)}")


def _check(cond: bool, what: str) -> None:
    if not cond:
        raise SandboxError(f"not a VM machine snapshot: {what}")


def read_facts(source: Path) -> dict[str, Any]:
    """``vm.json`` of snapshot directory ``source``, its shape checked (see the module docstring).

    Raises SandboxError naming what is missing or malformed (a file, a field), also when the migration
    file is missing or its size differs from the one recorded.
    """
    source = Path(source)
    path = source / FACTS_FILE
    try:
        with open(path, "rb") as fh:
            raw = fh.read(FACTS_MAX_BYTES + 1)
    except OSError as exc:
        raise SandboxError(f"not a VM machine snapshot: cannot read {path} ({clean(exc, 200)})") from exc
    _check(len(raw) <= FACTS_MAX_BYTES, f"{FACTS_FILE} over {FACTS_MAX_BYTES} bytes")
    try:
        facts = json.loads(raw)
    except ValueError as exc:
        raise SandboxError(f"not a VM machine snapshot: {FACTS_FILE} is not JSON ({clean(exc, 120)})") from exc
    _check(isinstance(facts, dict), f"{FACTS_FILE} is not an object")
    _check(facts.get("format") == SNAPSHOT_FORMAT, f"format {clean(facts.get('format'), 20)}, "
                                                   f"not {SNAPSHOT_FORMAT}")
    _check(facts.get("kind") == "machine" and facts.get("backend") == "vm", "kind or backend not machine/vm")
    for name, kind in (("arch", str), ("accel", str), ("memory_mib", int), ("cpus", int), ("qemu_version", str),
                       ("guest_env", str), ("image", dict), ("screen", dict), ("argv", list), ("migration", dict)):
        _check(isinstance(facts.get(name), kind), f"field {name!r} missing or not {kind.__name__}")
    _check(all(isinstance(a, str) for a in facts["argv"]), "field 'argv' holds a non-string")
    image = facts["image"]
    for name, kind in (("path", str), ("key", str), ("rootfs_size", int), ("rootfs_sample_sha256", str)):
        _check(isinstance(image.get(name), kind), f"field 'image.{name}' missing or not {kind.__name__}")
    for name in ("width", "height"):
        _check(isinstance(facts["screen"].get(name), int), f"field 'screen.{name}' missing or not int")
    _check(facts["migration"].get("file") == MIGRATION_FILE and isinstance(facts["migration"].get("bytes"), int),
           "field 'migration' malformed")
    try:
        size = (source / MIGRATION_FILE).stat().st_size
    except OSError as exc:
        raise SandboxError(f"not a VM machine snapshot: {MIGRATION_FILE} missing ({clean(exc, 200)})") from exc
    if size != facts["migration"]["bytes"]:
        raise SandboxError(f"VM snapshot {source}: {MIGRATION_FILE} has {size} bytes, "
                           f"{FACTS_FILE} says {facts['migration']['bytes']}")
    return facts


def read_token(source: Path) -> str:
    """The agent token inside the snapshot's RAM (``agent-token``). Raises SandboxError when missing or
    not 32 to 256 visible ASCII characters."""
    try:
        with open(Path(source) / TOKEN_FILE, "rb") as fh:
            raw = fh.read(TOKEN_MAX_BYTES + 1)
    except OSError as exc:
        raise SandboxError(f"not a VM machine snapshot: cannot read {TOKEN_FILE} ({clean(exc, 200)})") from exc
    token = raw.decode("ascii", "replace").strip()
    if not 32 <= len(token) <= TOKEN_MAX_BYTES or not all(33 <= ord(c) < 127 for c in token):
        raise SandboxError(f"not a VM machine snapshot: {TOKEN_FILE} is not a token")
    return token


def check_image(facts: dict[str, Any], image: Path, manifest: dict[str, Any]) -> None:
    """Raise SandboxError unless ``image`` (its ``manifest.json`` already read into ``manifest``) is the
    image the snapshot's guest booted from: same build key, disk size and sample hash (:func:`rootfs_facts`)."""
    want = facts["image"]
    if manifest.get("key") != want["key"]:
        raise SandboxError(f"VM image {image} is build {clean(manifest.get('key'), 40)}; the snapshot's guest "
                           f"booted from build {clean(want['key'], 40)}")
    have = rootfs_facts(image)
    if have["rootfs_size"] != want["rootfs_size"]:
        raise SandboxError(f"VM image {image}: rootfs.raw has {have['rootfs_size']} bytes, the snapshot's "
                           f"{want['rootfs_size']}")
    if have["rootfs_sample_sha256"] != want["rootfs_sample_sha256"]:
        raise SandboxError(f"VM image {image}: rootfs.raw is another build of the disk the snapshot's guest "
                           f"booted from (sample sha256 differs)")


def check_argv(facts: dict[str, Any], shape: list[str]) -> None:
    """Raise SandboxError naming the first differences when the command line a restore would run
    (``shape``, see :func:`argv_shape`) is not the snapshot's."""
    saved = facts["argv"]
    if shape == saved:
        return
    diffs = [f"{clean(a, 120)} -> {clean(b, 120)}" for a, b in zip(saved, shape) if a != b][:3]
    if len(saved) != len(shape):
        diffs.append(f"{len(saved)} arguments -> {len(shape)}")
    raise SandboxError("the VM's QEMU command line differs from the snapshot's (machine, CPU, memory or devices): "
                       + "; ".join(diffs))


def migrate_to_file(qmp: QMPChannel, path: Path, *, timeout: float = MIGRATE_TIMEOUT_S,
                    poll: Callable[[], None] = lambda: None) -> dict[str, Any]:
    """Have QEMU (its guest stopped) write its migration stream to ``path`` and wait until done.

    Returns ``{"seconds": float, "ram_bytes": transferred RAM bytes}``. ``poll()`` runs between status
    queries (raises to give up). Raises SandboxError when the migration fails (QEMU's reason, escaped)
    or takes over ``timeout`` seconds (then it is cancelled).
    """
    check_path(path, "snapshot path")
    t0 = time.monotonic()
    qmp.command("migrate-set-parameters", {"max-bandwidth": MIGRATE_MAX_BANDWIDTH})
    qmp.command("migrate", {"uri": f"file:{path}"})
    deadline = t0 + timeout
    delay = 0.01
    while True:
        info = qmp.command("query-migrate")
        status = info.get("status") if isinstance(info, dict) else None
        if status == "completed":
            ram = info.get("ram", {}) if isinstance(info.get("ram"), dict) else {}
            return {"seconds": time.monotonic() - t0, "ram_bytes": int(ram.get("transferred", 0) or 0)}
        if status in ("failed", "cancelled"):
            raise SandboxError(f"QEMU could not save the machine: {clean(info.get('error-desc', status), 300)}")
        if time.monotonic() > deadline:
            try:
                qmp.command("migrate_cancel")
            except SandboxError:
                pass
            raise SandboxError(f"QEMU did not save the machine within {timeout:.0f}s (status {clean(status, 40)})")
        poll()
        time.sleep(delay)  # poll interval of a condition wait (migration done), bounded by the deadline
        delay = min(delay * 1.5, 0.2)


def wait_running(qmp: QMPChannel, *, timeout: float, check_alive: Callable[[], None]) -> None:
    """Wait until QEMU has loaded an incoming migration (``-incoming``), then run the guest: a snapshot's
    stream carries the stopped state the source was saved in, so the loaded guest waits ``paused``
    until ``cont``. ``check_alive()`` runs between polls and raises when QEMU exited. Raises
    SandboxError on another state (QEMU's words, escaped) or after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    delay = 0.02
    while True:
        try:
            status = qmp.command("query-status", timeout=max(min(5.0, deadline - time.monotonic()), 0.1))
        except QMPCommandError:
            raise
        except SandboxError:
            check_alive()  # QEMU exited: its own output says why
            raise
        state = status.get("status") if isinstance(status, dict) else None
        if state == "running":
            return
        if state == "paused":
            info = qmp.command("query-migrate")
            migration = info.get("status") if isinstance(info, dict) else None
            if migration == "completed":
                qmp.command("cont")
                continue
            if migration in ("failed", "cancelled"):
                check_alive()
                raise SandboxError(f"QEMU could not load the machine: "
                                   f"{clean(info.get('error-desc', migration), 300)}")
        elif state not in ("inmigrate", "prelaunch"):
            check_alive()
            raise SandboxError(f"restored VM is {clean(state, 40)}, not running")
        check_alive()
        if time.monotonic() > deadline:
            raise SandboxError(f"restored VM not running after {timeout:.0f}s (state {clean(state, 40)})")
        time.sleep(delay)  # poll interval of a condition wait (migration loaded), bounded by the deadline
        delay = min(delay * 1.5, 0.2)


def guest_clock_offset(qga: GuestAgentChannel, *, deadline: float, samples: int = 3) -> float:
    """The guest's clock minus the host's (seconds), from qemu-guest-agent's ``guest-get-time`` (read
    in its own process, so no command start is in it): of ``samples`` round trips the shortest, its
    answer taken as of its middle. Raises SandboxError when the agent does not answer by ``deadline``
    (``time.monotonic()``)."""
    best: tuple[int, int] | None = None  # (round trip, offset) in ns
    for _ in range(samples):
        before = time.time_ns()
        guest = qga.command("guest-get-time", timeout=max(deadline - time.monotonic(), 1.0))
        after = time.time_ns()
        if not isinstance(guest, int):
            raise SandboxError("guest agent guest-get-time: not a number")
        sample = (after - before, guest - (before + after) // 2)
        best = sample if best is None or sample[0] < best[0] else best
    assert best is not None
    return best[1] / 1e9


def set_guest_clock(qga: GuestAgentChannel, *, timeout: float = 30.0) -> float:
    """Set the guest's clock to the host's and return the guest's offset afterwards (seconds, guest minus
    host, :func:`guest_clock_offset`). The offset is measured first, then taken back inside the guest as a
    step relative to the guest's own clock (``date -u -s "<-offset> seconds"`` as root through
    ``guest-exec``), so however long the guest takes to start ``date`` (seconds, with several guests
    emulated at once) does not count. (qemu-ga's ``guest-set-time`` sets an absolute time, which goes
    stale by that start-up time, and then runs ``hwclock -w``, which waits for the emulated RTC's next
    second and fails in this guest.) Raises SandboxError when the guest agent does not answer within
    ``timeout`` seconds, ``date`` fails, or the offset afterwards is over :data:`CLOCK_TOLERANCE_S`."""
    deadline = time.monotonic() + timeout
    qga.wait_ready(timeout)
    step = -guest_clock_offset(qga, deadline=deadline)
    pid = qga.command("guest-exec", {"path": "/bin/date", "arg": ["-u", "-s", f"{step:+.9f} seconds"],
                                     "capture-output": True}, timeout=max(deadline - time.monotonic(), 1.0))["pid"]
    delay = 0.01
    while True:
        status = qga.command("guest-exec-status", {"pid": pid}, timeout=max(deadline - time.monotonic(), 1.0))
        if status.get("exited"):
            break
        if time.monotonic() > deadline:
            raise SandboxError(f"setting the guest's clock took over {timeout:.0f}s")
        time.sleep(delay)  # poll interval of a condition wait (date exited), bounded by the deadline
        delay = min(delay * 1.5, 0.2)
    if status.get("exitcode") != 0:
        err = base64.b64decode(status.get("err-data", ""))[:500].decode("utf-8", "replace")
        raise SandboxError(f"setting the guest's clock failed (exit {clean(status.get('exitcode'), 10)}): "
                           f"{clean(err, 300)}")
    offset = guest_clock_offset(qga, deadline=deadline, samples=1)
    if abs(offset) > CLOCK_TOLERANCE_S:
        raise SandboxError(f"guest clock not set (off by {offset:.1f}s)")
    return offset


def write_private(path: Path, data: bytes) -> None:
    """Create ``path`` (mode 0600, not already there) holding ``data``."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)


def utc_now() -> str:
    """Now as ISO-8601 UTC (seconds)."""
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
