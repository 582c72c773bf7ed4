"""One-line descriptions of why a file (task, policy) was refused.

The CLI prints these instead of pydantic's multi-line reports: ``FILE: FIELD: WHAT (got VALUE)``, one
line, naming the field in the file's own terms (``checks[1].value``, ``network.allow[0]``) and, for an
unknown key, the known key it most resembles.
"""

from __future__ import annotations

import difflib
import os
import stat
from typing import Any, Iterable, Mapping, Sequence

from pydantic import ValidationError

MAX_ERRORS = 3
MAX_VALUE_CHARS = 80


def field_path(loc: Sequence[Any], tags: Mapping[str, Iterable[str]] | None = None) -> str:
    """``('checks', 0, 'file', 'value')`` -> ``checks[0].value``.

    ``tags``: for a list field whose items are a tagged union, the tag values pydantic inserts after
    the item's index (``{"checks": ("file", "sqlite")}``); they are dropped from the path.
    """
    tags = tags or {}
    out = ""
    for i, part in enumerate(loc):
        if isinstance(part, int):
            out += f"[{part}]"
            continue
        if i >= 2 and isinstance(loc[i - 1], int) and part in tags.get(str(loc[i - 2]), ()):
            continue
        out += f".{part}" if out else str(part)
    return out


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= MAX_VALUE_CHARS else text[: MAX_VALUE_CHARS - 3] + "..."


def describe_validation_error(exc: ValidationError, *, known_keys: Iterable[str] = (),
                              tags: Mapping[str, Iterable[str]] | None = None) -> str:
    """The errors of ``exc`` on one line: ``field: message (got value)``, joined by ``; ``.

    ``known_keys``: valid key names, used to suggest the intended key for an unknown one;
    ``tags``: see :func:`field_path`. Errors of the whole document have no field prefix; the value is
    shown only when the message does not already quote it.
    """
    known = sorted(set(known_keys))
    parts = []
    # Unknown keys first: a misspelt key usually explains the "missing" error that comes with it.
    errors = sorted(exc.errors(include_url=False), key=lambda e: e.get("type") != "extra_forbidden")
    for error in errors[:MAX_ERRORS]:
        loc = error.get("loc", ())
        where = field_path(loc, tags)
        kind = error.get("type", "")
        if kind == "extra_forbidden":
            key = str(loc[-1]) if loc else where
            hint = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
            text = f"{where}: unknown key" + (f" (did you mean {hint[0]!r}?)" if hint else "")
        elif kind == "missing":
            text = f"{where}: required but missing"
        else:
            message = str(error.get("msg", "invalid"))
            for prefix in ("Value error, ", "Assertion failed, "):
                if message.startswith(prefix):
                    message = message[len(prefix):]
            text = f"{where}: {message}" if where else message
            value = error.get("input")
            if "input" in error and not isinstance(value, (dict, list, tuple)) and repr(value) not in message:
                text += f" (got {_shown(value)})"
        parts.append(" ".join(text.split()))
    if len(errors) > MAX_ERRORS:
        parts.append(f"and {len(errors) - MAX_ERRORS} more")
    return "; ".join(parts)


def read_input_file(path: "str | os.PathLike[str]", max_bytes: int) -> str:
    """The text of an input file a user names (a task, a script, a run record): a regular file only
    (a FIFO, a device or a directory is refused before it is opened for reading, so nothing blocks),
    at most ``max_bytes`` bytes, UTF-8 without lone surrogates.

    Raises OSError (missing, unreadable, not a regular file, too large; the message names the file)
    or UnicodeDecodeError (not UTF-8).
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(f"{os.fspath(path)}: not a regular file")
        if st.st_size > max_bytes:
            raise OSError(f"{os.fspath(path)}: larger than {max_bytes} bytes")
        chunks, total = [], 0
        while chunk := os.read(fd, 1 << 20):
            total += len(chunk)
            if total > max_bytes:
                raise OSError(f"{os.fspath(path)}: larger than {max_bytes} bytes")
            chunks.append(chunk)
    finally:
        os.close(fd)
    return b"".join(chunks).decode("utf-8")


def lone_surrogate(value: Any) -> bool:
    """True when a parsed JSON value holds a string (or key) with a lone UTF-16 surrogate (``"\\ud800"``):
    JSON can spell one, UTF-8 cannot carry it, and the guest agent refuses it."""
    if isinstance(value, str):
        return any("\ud800" <= c <= "\udfff" for c in value)
    if isinstance(value, dict):
        return any(lone_surrogate(k) or lone_surrogate(v) for k, v in value.items())
    if isinstance(value, list):
        return any(lone_surrogate(v) for v in value)
    return False


def read_input_or_raise(path: "str | os.PathLike[str]", max_bytes: int, error: type[Exception]) -> str:
    """:func:`read_input_file`, its failures raised as ``error`` with one line naming the file: ``PATH:
    not UTF-8 text (byte N)`` or ``PATH: cannot read: REASON`` (a task's or a script's refusal)."""
    try:
        return read_input_file(path, max_bytes)
    except UnicodeDecodeError as exc:
        raise error(f"{path}: not UTF-8 text (byte {exc.start})") from None
    except OSError as exc:
        raise error(f"{path}: cannot read: {exc.strerror or exc}") from None
