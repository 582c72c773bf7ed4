"""Read-only access to files under allowed roots (``GET /v1/files``).

A path is accepted when it is absolute (or starts with ``~``, the agent user's home) and, after
resolving ``..`` and every symbolic link, lies inside one of the roots (themselves resolved). The file
is then opened along that resolved path one component at a time, each directory relative to the one
before it and none of them through a symbolic link (``openat`` with ``O_NOFOLLOW`` on every component,
from ``/``): a directory swapped for a link between the check and the open (a process in the guest
racing the agent) makes the read fail (400 ``bad_path``) instead of leaving the roots.
Errors: 400 ``bad_path`` (empty, relative, NUL byte, not a regular file), 403 ``forbidden``
(outside every root; checked before existence, so nothing outside leaks), 404 ``not_found``,
413 ``too_large`` (over ``max_bytes``).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

DEFAULT_MAX_BYTES = 16 * 1024 * 1024


class FileError(Exception):
    """A refused read: HTTP ``status``, error ``code`` and message."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


class FileReader:
    """Reads whole files under ``roots`` (resolved at construction), at most ``max_bytes`` each."""

    def __init__(self, roots: list[str], max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.roots = [Path(os.path.realpath(os.path.expanduser(r))) for r in roots]
        self.max_bytes = max_bytes

    def resolve(self, path: str) -> Path:
        """The real path of ``path`` if it lies under a root. Raises FileError (400, 403)."""
        if not path or "\x00" in path:
            raise FileError(400, "bad_path", "path must be a non-empty string without NUL bytes")
        if path.startswith("~"):
            path = os.path.expanduser(path)
        if not os.path.isabs(path):
            raise FileError(400, "bad_path", f"path must be absolute or start with ~: {path!r}")
        try:
            real = Path(os.path.realpath(path))
        except OSError as exc:  # a link swapped for a directory while being resolved (EINVAL, ...)
            raise FileError(400, "bad_path", f"{path!r} changed while it was resolved: {exc.strerror}") from None
        for root in self.roots:
            if real == root or root in real.parents:
                return real
        raise FileError(403, "forbidden", f"{path!r} is outside the allowed roots")

    def read(self, path: str) -> bytes:
        """Contents of the file. Raises FileError (400, 403, 404, 413)."""
        real = self.resolve(path)
        try:
            fd = _open_no_links(real)
        except FileNotFoundError:
            raise FileError(404, "not_found", f"{path!r} does not exist") from None
        except IsADirectoryError:
            raise FileError(400, "bad_path", f"{path!r} is not a regular file") from None
        except PermissionError:
            raise FileError(403, "forbidden", f"{path!r} is not readable") from None
        except OSError as exc:  # ELOOP / ENOTDIR: a component turned into a link after resolving
            raise FileError(400, "bad_path", f"{path!r} cannot be opened: {exc.strerror}") from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise FileError(400, "bad_path", f"{path!r} is not a regular file")
            if st.st_size > self.max_bytes:
                raise FileError(413, "too_large", f"{path!r} is {st.st_size} bytes; the limit is {self.max_bytes}")
            chunks: list[bytes] = []
            total = 0
            while True:
                chunk = os.read(fd, 1 << 20)
                if not chunk:
                    break
                total += len(chunk)
                if total > self.max_bytes:
                    raise FileError(413, "too_large", f"{path!r} is larger than {self.max_bytes} bytes")
                chunks.append(chunk)
            return b"".join(chunks)
        finally:
            os.close(fd)


def _open_no_links(real: Path) -> int:
    """A read-only descriptor of the regular file or directory at ``real`` (absolute, already resolved),
    reached from ``/`` one component at a time without following any symbolic link: each directory is
    opened ``O_DIRECTORY | O_NOFOLLOW`` relative to its parent's descriptor, the last component
    ``O_NOFOLLOW | O_NONBLOCK``. Raises OSError: ``ELOOP`` or ``ENOTDIR`` when a component is (now) a
    link, ``ENOENT`` when one is gone, ``EISDIR`` never (directories open; the caller checks the type)."""
    parts = real.parts[1:]
    dir_flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open("/", dir_flags)
    try:
        for name in parts[:-1]:
            next_fd = os.open(name, dir_flags, dir_fd=fd)
            os.close(fd)
            fd = next_fd
        if not parts:
            return os.dup(fd)
        return os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=fd)
    finally:
        os.close(fd)
