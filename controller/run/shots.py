"""The one rule for reading a run record's screenshot files, for every reader: ``report``, the web
console, the Agents API and ``replay``; and the same rule for the run's video (:func:`open_video`).

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

The run's video (``run.webm``, :mod:`controller.run.video`) is read by the same rule: the one name
:data:`VIDEO_NAME`, the directory and the file opened without following a link and without blocking, a
regular file of at most :data:`MAX_VIDEO_BYTES` whose bytes start as a WebM file does
(:data:`VIDEO_MAGIC`, then the ``webm`` document type in its header). A reader hands it on as it is
(a browser decodes it); no reader here decodes it.

Anything else is refused with the reason, a short phrase (the name itself is never part of it: show it
with :func:`controller.text.clean` where it is shown at all).
"""

from __future__ import annotations

import errno
import io
import os
import re
import stat
import warnings
from pathlib import Path
from typing import IO, Any

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

VIDEO_NAME = re.compile(r"run\.webm")
"""The only video file name a reader opens (what :class:`controller.run.video.VideoRecorder` writes)."""

VIDEO_TYPE = "video/webm"
"""Content type of the run's video."""

VIDEO_MAGIC = b"\x1a\x45\xdf\xa3"
"""How a WebM (Matroska, EBML) file starts."""

VIDEO_DOCTYPE = b"\x42\x82\x84webm"
"""The EBML header's DocType element saying ``webm``, within :data:`VIDEO_HEAD_BYTES` of the start."""

VIDEO_HEAD_BYTES = 64
"""Bytes of a video read to check its magic and document type."""

MAX_VIDEO_BYTES = 512 * 1024 * 1024
"""Largest video file read (bytes), and the recorder's own cap on what it writes."""


def _open_failed(exc: OSError) -> str:
    """Why a file of the run could not be opened, in words (a link is named as such: never followed)."""
    if exc.errno == errno.ELOOP:
        return "is a symbolic link (not followed)"
    return f"cannot open: {exc.strerror or exc}"


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
        return None, _open_failed(exc)
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


def video_name(file: Any) -> str | None:
    """``file`` when it is the video name a reader may open (:data:`VIDEO_NAME`), else None."""
    return file if isinstance(file, str) and VIDEO_NAME.fullmatch(file) else None


def open_video(directory: str | Path, file: Any) -> tuple[IO[bytes] | None, int, str | None]:
    """The run's video ``file`` in the run directory ``directory``, opened by the rule (module doc):
    ``(binary file at offset 0, its size in bytes, None)``, or ``(None, 0, why)``. The caller reads what
    it sends from the file returned (never the path again) and closes it. Never raises for a bad file,
    never blocks."""
    name = video_name(file)
    if name is None:
        return None, 0, "not the video's file name"
    try:
        dir_fd = os.open(directory, _FLAGS | os.O_DIRECTORY)
    except OSError as exc:
        return None, 0, f"cannot open the run directory: {exc.strerror or exc}"
    try:
        fd = os.open(name, _FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        return None, 0, _open_failed(exc)
    finally:
        os.close(dir_fd)
    try:
        info = os.fstat(fd)
    except OSError as exc:
        os.close(fd)
        return None, 0, f"cannot read: {exc.strerror or exc}"
    if not stat.S_ISREG(info.st_mode):  # a folder or a FIFO: never read (fdopen refuses a folder)
        os.close(fd)
        return None, 0, "not a regular file"
    fh = os.fdopen(fd, "rb")
    try:
        if info.st_size > MAX_VIDEO_BYTES:
            why = f"larger than {MAX_VIDEO_BYTES} bytes"
        else:
            head = fh.read(VIDEO_HEAD_BYTES)
            why = None if head.startswith(VIDEO_MAGIC) and VIDEO_DOCTYPE in head else "not a WebM file"
        if why is None:
            fh.seek(0)
            return fh, info.st_size, None
    except OSError as exc:
        why = f"cannot read: {exc.strerror or exc}"
    fh.close()
    return None, 0, why


def check_video(directory: str | Path, file: Any) -> tuple[int | None, str | None]:
    """Whether the run's video ``file`` would be read (:func:`open_video`): ``(its size in bytes, None)``
    or ``(None, why)``."""
    fh, size, why = open_video(directory, file)
    if fh is None:
        return None, why
    fh.close()
    return size, None
