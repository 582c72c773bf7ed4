"""The one rule for reading a run record's screenshot files, for every reader: ``report``, the web
console, the Agents API and ``replay``.

A record may be hostile: anyone who can write the run directory may have edited ``record.jsonl`` or
put something else where a screenshot was. So a screenshot named by a record entry's ``file`` is read
only when:

* the name is a plain :data:`SHOT_NAME` (``shot-0001.png``, what :class:`controller.run.record.RunRecord`
  writes): no directory, no ``..``, no absolute path, no control character;
* the run directory, then the file in it, are each opened without following a symlink
  (``O_NOFOLLOW``) and without blocking (``O_NONBLOCK``: a FIFO answers at once, never hangs a reader);
* it is a regular file of at most :data:`MAX_SHOT_BYTES` bytes whose bytes start as its extension says
  (PNG or JPEG);
* its header, read before any pixel is decoded, says it is a PNG or JPEG as named of at most
  :data:`MAX_SHOT_SIDE` px a side (the largest screen a guest is ever given), so no reader decodes (or
  hands a browser) a decompression bomb.

Anything else is refused with the reason, a short phrase (the name itself is never part of it: show it
with :func:`controller.text.clean` where it is shown at all).
"""

from __future__ import annotations

import io
import os
import re
import stat
import warnings
from pathlib import Path
from typing import Any

from PIL import Image

from controller.agent_client import MAX_SCREEN_PX

SHOT_NAME = re.compile(r"shot-[0-9]{4}\.(png|jpg)")
"""The only screenshot file names a reader opens (what :class:`controller.run.record.RunRecord` writes)."""

SHOT_TYPES = {"png": "image/png", "jpg": "image/jpeg"}
"""Content type of a screenshot by its name's extension."""

MAGIC = {"png": b"\x89PNG\r\n\x1a\n", "jpg": b"\xff\xd8\xff"}
"""How a screenshot's bytes start, by its name's extension."""

FORMATS = {"png": "PNG", "jpg": "JPEG"}
"""The image format (Pillow's name) its header must declare, by its name's extension."""

MAX_SHOT_BYTES = 32 * 1024 * 1024
"""Largest screenshot file read (bytes; a run's are at most a few MiB)."""

MAX_SHOT_SIDE = MAX_SCREEN_PX
"""Largest width or height of a screenshot read (px): the largest screen the controller gives a guest."""


def shot_name(file: Any) -> str | None:
    """``file`` when it is a screenshot name a reader may open (:data:`SHOT_NAME`), else None."""
    return file if isinstance(file, str) and SHOT_NAME.fullmatch(file) else None


def shot_type(file: Any) -> str | None:
    """The content type of screenshot name ``file`` (``image/png`` / ``image/jpeg``), None for a name
    a reader does not open."""
    name = shot_name(file)
    return SHOT_TYPES[name.rsplit(".", 1)[1]] if name else None


_FLAGS = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)


def read_shot(directory: str | Path, file: Any, budget: int = MAX_SHOT_BYTES) -> tuple[bytes | None, str | None]:
    """The bytes of screenshot ``file`` in the run directory ``directory``: ``(data, None)``, or
    ``(None, why)`` when the rule (module doc) refuses it or it cannot be read. ``budget``: most bytes
    it may have (besides :data:`MAX_SHOT_BYTES`). Never raises for a bad file, never blocks."""
    name = shot_name(file)
    if name is None:
        return None, "not a screenshot file name"
    # the run directory, then the file in it, each opened without following a link: a writer that swaps
    # either for a link between a check and the read cannot point the read outside the run
    try:
        dir_fd = os.open(directory, _FLAGS | os.O_DIRECTORY)
    except OSError as exc:
        return None, f"cannot open the run directory: {exc.strerror or exc}"
    try:
        fd = os.open(name, _FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        return None, f"cannot open: {exc.strerror or exc}"
    finally:
        os.close(dir_fd)
    with os.fdopen(fd, "rb") as fh:
        info = os.fstat(fh.fileno())
        if not stat.S_ISREG(info.st_mode):
            return None, "not a regular file"
        cap = min(MAX_SHOT_BYTES, budget)
        if info.st_size > cap:
            return None, f"larger than {cap} bytes"
        try:
            data = fh.read(cap + 1)
        except OSError as exc:
            return None, f"cannot read: {exc.strerror or exc}"
    if len(data) > cap:
        return None, f"larger than {cap} bytes"
    ext = name.rsplit(".", 1)[1]
    if not data.startswith(MAGIC[ext]):
        return None, "not a PNG or JPEG as its name says"
    why = _header_problem(data, FORMATS[ext])
    return (None, why) if why else (data, None)


def _header_problem(data: bytes, fmt: str) -> str | None:
    """Why the image ``data`` may not be decoded, read from its header alone (None: it may)."""
    try:
        with warnings.catch_warnings():  # a header past Pillow's own pixel limit is refused below
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data), formats=[fmt]) as img:
                width, height = img.size
    except (OSError, ValueError, Image.DecompressionBombError, SyntaxError) as exc:
        return f"not a readable {fmt}: {' '.join(str(exc).split())[:100]}"
    if width > MAX_SHOT_SIDE or height > MAX_SHOT_SIDE:
        return f"{width}x{height} px, larger than {MAX_SHOT_SIDE}x{MAX_SHOT_SIDE} (the largest screen)"
    return None


def check_shot(directory: str | Path, file: Any) -> str | None:
    """Why screenshot ``file`` would not be read (None: it would by all that is known without reading
    it: its name, a regular file, not a link, its size). A reader that serves it still reads it
    with :func:`read_shot`."""
    name = shot_name(file)
    if name is None:
        return "not a screenshot file name"
    try:
        info = os.lstat(Path(directory) / name)
    except OSError as exc:
        return f"cannot open: {exc.strerror or exc}"
    if not stat.S_ISREG(info.st_mode):
        return "not a regular file"
    return f"larger than {MAX_SHOT_BYTES} bytes" if info.st_size > MAX_SHOT_BYTES else None


def decode_shot(data: bytes) -> tuple[Image.Image | None, str | None]:
    """The RGB image of screenshot bytes that :func:`read_shot` returned (their header was checked):
    ``(image, None)``, or ``(None, why)`` when the pixels do not decode."""
    try:
        with Image.open(io.BytesIO(data), formats=list(FORMATS.values())) as img:
            if img.width > MAX_SHOT_SIDE or img.height > MAX_SHOT_SIDE:  # bytes not from read_shot
                return None, f"{img.width}x{img.height} px, larger than the largest screen"
            return img.convert("RGB"), None
    except (OSError, ValueError, Image.DecompressionBombError, SyntaxError) as exc:
        return None, f"does not decode: {' '.join(str(exc).split())[:100]}"


def load_shot(directory: str | Path, file: Any) -> tuple[Image.Image | None, str | None]:
    """:func:`read_shot` then :func:`decode_shot`: the RGB image of screenshot ``file`` in
    ``directory``, or None and why not."""
    data, why = read_shot(directory, file)
    if data is None:
        return None, why
    return decode_shot(data)
