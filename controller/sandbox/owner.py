"""Who started a sandbox, recorded so that a later start can tell a killed run's leftovers from someone
else's sandbox.

A sandbox's owner is recorded as one string (:func:`owner_id`, the ``desktop-sandbox.owner-id`` label of
Docker sandboxes and the ``owner_id`` of a VM sandbox's ``owner.json``)::

    <machine id>:<boot id>:<pid namespace>:<pid>:<start time>

* machine id: ``/etc/machine-id``, else ``/var/lib/dbus/machine-id``, else a random id created once and
  kept in ``$XDG_STATE_HOME/desktop-sandbox/machine-id`` (default ``~/.local/state/...``). 32 hex
  digits in each case.
* boot id: ``/proc/sys/kernel/random/boot_id`` (random per kernel boot); ``-`` where there is none.
* pid namespace: the inode of ``/proc/self/ns/pid`` (two containers on one kernel differ); ``-`` where
  there is none.
* pid and start time: the process's id and its start time in clock ticks after boot (field 22 of
  ``/proc/PID/stat``), so a pid reused by a later process is never taken for the owner.

:func:`owner_state` judges a recorded owner against this process's view: ``dead`` only when every part
but the pid and start time is this host's own and the pid names no process (or a zombie that started
then); ``alive`` when the pid still names the process that started then; ``unproven`` otherwise (another
machine or container, a reused pid, no ``/proc``, an unreadable or older label). Only ``dead`` may be
reaped; an ``unproven`` owner is reported and its sandbox left for ``desktop-sandbox down``.
"""

from __future__ import annotations

import os
import re
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

MACHINE_ID_FILES = (Path("/etc/machine-id"), Path("/var/lib/dbus/machine-id"))
"""Where the machine id is read from, in order."""
BOOT_ID_FILE = Path("/proc/sys/kernel/random/boot_id")
_HEX32 = re.compile(r"[0-9a-f]{32}")
_FIELD = re.compile(r"[0-9A-Za-z-]{1,64}")
STAT_CAP = 4096
"""Most bytes read from one ``/proc/PID/stat`` (a process name is at most 16 bytes)."""


def _state_dir() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "desktop-sandbox"


def machine_id() -> str:
    """This machine's id: 32 lowercase hex digits (see the module docstring for where it comes from).

    The fallback file is created (0600, directory 0700) on first use. Raises OSError only when none of
    the files is readable and the fallback cannot be written.
    """
    for path in MACHINE_ID_FILES:
        try:
            text = path.read_text(encoding="ascii", errors="replace")[:256].strip().lower()
        except OSError:
            continue
        if _HEX32.fullmatch(text):
            return text
    fallback = _state_dir() / "machine-id"
    try:
        text = fallback.read_text(encoding="ascii", errors="replace")[:256].strip().lower()
        if _HEX32.fullmatch(text):
            return text
    except OSError:
        pass
    fallback.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    new = secrets.token_hex(16)
    tmp = fallback.with_name(f"machine-id.{os.getpid()}.partial")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(new + "\n")
    try:
        os.link(tmp, fallback)  # the first writer wins; a concurrent one reads its id
    except FileExistsError:
        pass
    finally:
        tmp.unlink(missing_ok=True)
    return fallback.read_text(encoding="ascii").strip().lower()


def boot_id() -> str:
    """This kernel boot's id (hex, dashes removed), or ``-`` where the system has none."""
    try:
        text = BOOT_ID_FILE.read_text(encoding="ascii", errors="replace")[:256].strip().lower()
    except OSError:
        return "-"
    text = text.replace("-", "")
    return text if _HEX32.fullmatch(text) else "-"


def pid_namespace() -> str:
    """The inode number of this process's pid namespace (decimal), or ``-`` where there is none."""
    try:
        link = os.readlink("/proc/self/ns/pid")
    except OSError:
        return "-"
    match = re.fullmatch(r"pid:\[(\d+)\]", link)
    return match.group(1) if match else "-"


@dataclass(frozen=True)
class ProcStat:
    """What ``/proc/PID/stat`` says of a process: ``state`` (one letter, ``Z`` zombie) and ``start``
    (start time in clock ticks after boot)."""

    state: str
    start: int


def proc_stat(pid: int) -> ProcStat | None:
    """State and start time of process ``pid`` from ``/proc/PID/stat``; None when there is no such
    process. Raises OSError when ``/proc`` cannot be read otherwise (permission, no ``/proc``) and
    ValueError when the file does not parse."""
    try:
        with open(f"/proc/{int(pid)}/stat", "rb") as fh:
            raw = fh.read(STAT_CAP)
    except (FileNotFoundError, ProcessLookupError):
        return None
    text = raw.decode("ascii", "replace")
    rest = text[text.rindex(")") + 2:].split()  # after "pid (comm) ": state, ppid, ...; starttime is 22nd
    return ProcStat(state=rest[0], start=int(rest[19]))


def process_start(pid: int) -> str:
    """Start time (clock ticks after boot, decimal) of process ``pid``, or ``-`` when unreadable."""
    try:
        stat = proc_stat(pid)
    except (OSError, ValueError, IndexError):
        return "-"
    return str(stat.start) if stat is not None else "-"


_SELF: str | None = None


def owner_id(pid: int | None = None) -> str:
    """The owner string of process ``pid`` (default: this one), as recorded on the sandboxes it starts.

    Shape: ``<machine id>:<boot id>:<pid namespace>:<pid>:<start time>`` (see the module docstring).
    """
    global _SELF
    if pid is None or pid == os.getpid():
        if _SELF is None or _SELF.split(":")[3] != str(os.getpid()):  # recomputed in a forked child
            _SELF = f"{machine_id()}:{boot_id()}:{pid_namespace()}:{os.getpid()}:{process_start(os.getpid())}"
        return _SELF
    return f"{machine_id()}:{boot_id()}:{pid_namespace()}:{pid}:{process_start(pid)}"


OwnerState = Literal["dead", "alive", "unproven"]


def owner_state(recorded: str | None) -> tuple[OwnerState, str]:
    """Judge a recorded owner string (:func:`owner_id`) from this process: ``(state, reason)``.

    ``dead``: same machine, boot and pid namespace, and the pid names no process or a zombie started at
    the recorded time (reason says which). ``alive``: the pid names the very process. ``unproven``: any
    other case; the reason names the first part that differs or cannot be read. Never raises.
    """
    if not recorded:
        return "unproven", "no owner id recorded"
    parts = recorded.split(":")
    if len(parts) != 5 or not all(_FIELD.fullmatch(p) for p in parts) or not parts[3].isdigit():
        return "unproven", f"owner id {recorded[:120]!r} does not parse"
    machine, boot, pidns, pid_text, start = parts
    try:
        here = machine_id()
    except OSError as exc:
        return "unproven", f"this machine's id is unreadable ({exc})"
    if machine != here:
        return "unproven", f"started on another machine ({machine})"
    if boot == "-" or boot != boot_id():
        return "unproven", "started in another boot of this machine, or one without a boot id"
    if pidns == "-" or pidns != pid_namespace():
        return "unproven", f"started in another pid namespace ({pidns}: another container on this machine)"
    if start == "-":
        return "unproven", "no start time recorded"
    pid = int(pid_text)
    try:
        stat = proc_stat(pid)
    except (OSError, ValueError, IndexError) as exc:
        return "unproven", f"process {pid} cannot be inspected ({type(exc).__name__})"
    if stat is None:
        return "dead", f"process {pid} has exited"
    if str(stat.start) != start:
        return "unproven", f"pid {pid} is now another process (started at {stat.start}, not {start})"
    if stat.state in ("Z", "X"):
        return "dead", f"process {pid} has exited (zombie)"
    return "alive", f"process {pid} is running"


# -- ownership handed over (a warm pool's claim) ------------------------------------------------------

CLAIM_FILE_CAP = 4096
"""Most bytes read from one claim file."""


def claims_dir() -> Path:
    """Where handed-over ownership is recorded: ``$XDG_STATE_HOME/desktop-sandbox/claims`` (0700)."""
    return _state_dir() / "claims"


def record_claim(sandbox_id: str, new_owner_id: str, new_owner: str) -> None:
    """Record that sandbox ``sandbox_id`` now belongs to ``new_owner_id`` (an :func:`owner_id` string;
    ``new_owner``: ``<host>:<pid>`` for people), whatever its labels say: a warm pool's keeper started it
    and a claimer in another process took it (:mod:`controller.sandbox.pool`). Orphan reaping judges the
    recorded owner (:func:`claimed_owner`). Written atomically (0600). Raises OSError."""
    folder = claims_dir()
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    partial = folder / f".{sandbox_id}.{secrets.token_hex(4)}"
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="ascii") as out:
        out.write(f"{new_owner_id}\n{new_owner}\n")
    os.replace(partial, folder / sandbox_id)


def claimed_owner(sandbox_id: str) -> tuple[str, str] | None:
    """``(owner id, owner)`` recorded by :func:`record_claim` for ``sandbox_id``, or None."""
    try:
        with open(claims_dir() / sandbox_id, encoding="ascii", errors="replace") as src:
            lines = src.read(CLAIM_FILE_CAP).splitlines()
    except OSError:
        return None
    return (lines[0], lines[1] if len(lines) > 1 else "") if lines and lines[0] else None


def forget_claim(sandbox_id: str) -> None:
    """Remove the claim record of ``sandbox_id`` (the sandbox is gone); nothing when there is none."""
    try:
        (claims_dir() / sandbox_id).unlink()
    except OSError:
        pass
