"""Writing a guest file for :meth:`desktop_sandbox.Sandbox.write_file`: as the desktop user, only under the
roots the sandbox was started with (``writable``), through the backend's ``exec_in_guest``.

The bytes go in base64 chunks of :data:`CHUNK_BYTES` (an argument stays far under the kernel's 128 KiB
limit per argument) into a temporary file beside the target, which is then renamed over it; each step
resolves the path in the guest (symbolic links followed) and refuses one outside the allowed roots, so a
link planted by the desktop cannot turn a write elsewhere. Every step is bounded in time; what the guest
says back is capped and escaped.
"""

from __future__ import annotations

import base64
import posixpath
from typing import Any, Sequence

from controller.model.errors import DesktopSandboxError
from controller.sandbox.guest import GUEST_HOME, GUEST_PYTHON
from controller.text import clean

MAX_WRITE_BYTES = 8 * 1024 * 1024
"""Largest file :meth:`Sandbox.write_file` writes (bytes)."""
CHUNK_BYTES = 48 * 1024
"""Bytes of the file a guest command carries (base64: 64 KiB of argument)."""
STEP_TIMEOUT_S = 30.0
"""Longest one guest command of a write may take (seconds)."""

# argv: step, roots (":"-joined, real paths), target, [tmp], [base64 data]
_SCRIPT = r"""
import base64, os, sys
step, target = sys.argv[1], sys.argv[3]
roots = [os.path.realpath(r) for r in sys.argv[2].split(":")]
def inside(p):
    return any(p == r or p.startswith(r.rstrip("/") + "/") for r in roots)
parent = os.path.realpath(os.path.dirname(target))
final = os.path.join(parent, os.path.basename(target))
if not inside(final) or (os.path.lexists(final) and not inside(os.path.realpath(final))):
    print("outside the writable roots: " + final, file=sys.stderr); sys.exit(45)
if step == "begin":
    os.makedirs(parent, exist_ok=True)
    if os.path.isdir(final):
        print("a directory: " + final, file=sys.stderr); sys.exit(48)
    import tempfile
    fd, tmp = tempfile.mkstemp(prefix=".write-", dir=parent)
    os.close(fd)
    print(tmp)
elif step == "append":
    tmp = sys.argv[4]
    if os.path.dirname(os.path.realpath(tmp)) != parent or not os.path.basename(tmp).startswith(".write-"):
        sys.exit(46)
    with open(tmp, "ab") as f:
        f.write(base64.b64decode(sys.argv[5]))
elif step == "commit":
    tmp = sys.argv[4]
    if os.path.dirname(os.path.realpath(tmp)) != parent or not os.path.basename(tmp).startswith(".write-"):
        sys.exit(46)
    os.chmod(tmp, 0o644)
    os.replace(tmp, final)
"""


class GuestWriteError(DesktopSandboxError, PermissionError):
    """A write the guest refused: outside the writable roots, a directory, or the command failed."""


def guest_path(path: str, home: str = GUEST_HOME) -> str:
    """``path`` as an absolute guest path (``~`` is the desktop user's home), normalised lexically."""
    if not isinstance(path, str) or not path or "\x00" in path:
        raise ValueError("a guest path must be a non-empty string without NUL")
    if path == "~" or path.startswith("~/"):
        path = home + path[1:]
    if not path.startswith("/"):
        path = posixpath.join(home, path)
    return posixpath.normpath(path)


def write_guest_file(sandbox: Any, roots: Sequence[str], path: str, data: bytes, *, home: str = GUEST_HOME) -> str:
    """Write ``data`` to the guest file ``path`` under one of ``roots`` (guest paths); returns the path
    written. Raises :class:`GuestWriteError` (no roots, outside them, a directory, a failed step) and
    ``ValueError`` (too large, a bad path)."""
    if not roots:
        raise GuestWriteError("this sandbox was started with no writable roots (Sandbox.start(writable=[...]))")
    if len(data) > MAX_WRITE_BYTES:
        raise ValueError(f"at most {MAX_WRITE_BYTES} bytes a file, got {len(data)}")
    target = guest_path(path, home)
    joined = ":".join(guest_path(r, home) for r in roots)

    def step(*args: str) -> str:
        result = sandbox.exec_in_guest([GUEST_PYTHON, "-I", "-c", _SCRIPT, args[0], joined, target, *args[1:]],
                                       timeout=STEP_TIMEOUT_S)
        if result.exit_code != 0:
            said = clean(result.stderr.decode("utf-8", "replace")[-300:], 300) if result.stderr else ""
            raise GuestWriteError(f"writing {clean(target, 300)}: {said or f'exit status {result.exit_code}'}")
        return result.stdout.decode("utf-8", "replace")[:4096].strip()

    tmp = step("begin")
    if not tmp.startswith("/"):
        raise GuestWriteError(f"writing {clean(target, 300)}: the guest gave no temporary file")
    for start in range(0, len(data), CHUNK_BYTES):
        step("append", tmp, base64.b64encode(data[start:start + CHUNK_BYTES]).decode("ascii"))
    step("commit", tmp)
    return target
