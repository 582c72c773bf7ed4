"""Screenshots: grab (mss, one reused X connection), crop, downscale, encode.

Units: ``crop`` and the returned ``frame`` are screen pixels ``(x, y, w, h)``; ``max_width`` /
``max_height`` bound the *image* size. The image is the frame scaled by
``min(1, max_width / w, max_height / h)`` (aspect ratio kept, never upscaled, at least 1 px).
PNG is written by :mod:`guest.png` (no row filter, zlib level 1 run-length: fast and lossless, so
colours are exact at depth 24); JPEG uses ``quality`` (default 80).

One mss instance (one X connection, MIT-SHM when available) serves every screenshot and the frame
comparison of ``wait``; a lock serialises it, so concurrent requests are safe. If the grab fails
because the X server went away, the instance is closed, :class:`DisplayUnavailable` is raised, and
the next grab opens a new one.

Memory: a full-screen shot allocates a few large buffers (the grabbed BGRX pixels, 4 MB at 1280x800,
and the packed rows, 3 MB) and frees them again. glibc's malloc hands such freed buffers back to the
kernel, so every shot got them back as fresh pages: about 1,500 page faults, which cost more than the
grab and the encode together. :func:`retain_frame_buffers` (called once by ``python -m guest serve``)
asks malloc to keep them for the next shot instead.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import io
import threading
from dataclasses import dataclass

import mss
from PIL import Image

from . import png
from .display import DisplayUnavailable, close_quietly, describe, went_away

DEFAULT_JPEG_QUALITY = 80
#: mallopt(3) parameters (glibc ``<malloc.h>``) and the values :func:`retain_frame_buffers` sets: no
#: buffer below 32 MiB (glibc's largest allowed value) is mmap'ed on its own, and the heap gives memory
#: back to the kernel only when 64 MiB are free at its top.
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
MMAP_THRESHOLD_BYTES = 32 * 1024 * 1024
TRIM_THRESHOLD_BYTES = 64 * 1024 * 1024


def retain_frame_buffers() -> bool:
    """Make this process's malloc keep freed screenshot-sized buffers for reuse (module doc).

    Process-wide and permanent. Returns False where it cannot be done (a C library without glibc's
    ``mallopt``); screenshots are then only slower.
    """
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES))


class BadCapture(ValueError):
    """Invalid screenshot parameters (HTTP 400 ``invalid_request``)."""


@dataclass(frozen=True)
class Shot:
    """An encoded screenshot.

    ``data`` image bytes, ``mime`` their type, ``screen`` (W, H) screen px, ``frame`` (x, y, w, h)
    the captured region in screen px, ``size`` (w, h) of the encoded image in image px.
    """

    data: bytes
    mime: str
    screen: tuple[int, int]
    frame: tuple[int, int, int, int]
    size: tuple[int, int]


def to_image(raw: bytearray | bytes, frame: tuple[int, int, int, int], size: tuple[int, int]) -> Image.Image:
    """Grabbed BGRX pixels of ``frame`` (screen px) as an RGB image of ``size`` (image px), downscaled as
    every screenshot is (bilinear, ``reducing_gap`` 2): the one scaling rule, so an image compared with
    a screenshot (:mod:`wire.screen_match`) is made the same way."""
    w, h = frame[2], frame[3]
    image = Image.frombuffer("RGB", (w, h), raw, "raw", "BGRX", 0, 1)
    if tuple(size) != (w, h):
        image = image.resize(tuple(size), Image.Resampling.BILINEAR, reducing_gap=2.0)
    return image


def scaled_size(w: int, h: int, max_width: int | None, max_height: int | None) -> tuple[int, int]:
    """Image size for a ``w`` x ``h`` frame under the optional bounds (rule in the module doc)."""
    scale = 1.0
    if max_width is not None:
        scale = min(scale, max_width / w)
    if max_height is not None:
        scale = min(scale, max_height / h)
    if scale >= 1.0:
        return w, h
    return max(1, round(w * scale)), max(1, round(h * scale))


class Capture:
    """Grabs the screen of one display through a single reused mss instance."""

    def __init__(self, display_name: str) -> None:
        self.display_name = display_name
        self._mss: mss.MSS | None = None
        self._lock = threading.Lock()

    def _instance(self) -> mss.MSS:
        if self._mss is None:
            try:
                self._mss = mss.MSS(display=self.display_name)
            except Exception as exc:  # noqa: BLE001 - mss raises several types on connect failure
                raise DisplayUnavailable(f"cannot capture X display {self.display_name} ({describe(exc)}); "
                                         "is its X server running?") from exc
        return self._mss

    def _drop(self) -> None:
        inst, self._mss = self._mss, None
        close_quietly(inst)

    def close(self) -> None:
        """Close the X connection (a later grab reopens it)."""
        with self._lock:
            self._drop()

    def screen_size(self) -> tuple[int, int]:
        """(W, H) of the screen in screen px. Raises DisplayUnavailable."""
        with self._lock:
            try:
                mon = self._instance().monitors[0]
            except DisplayUnavailable:
                raise
            except Exception as exc:  # noqa: BLE001
                self._drop()
                raise went_away(self.display_name, exc) from exc
            return mon["width"], mon["height"]

    def grab(self, frame: tuple[int, int, int, int] | None = None) -> tuple[bytearray, tuple[int, int, int, int], tuple[int, int]]:
        """Raw BGRX pixels of ``frame`` (whole screen when None).

        Returns ``(pixels, frame, screen)``. Raises BadCapture for a frame outside the screen,
        DisplayUnavailable when the X server cannot be reached.
        """
        with self._lock:
            try:
                inst = self._instance()
                mon = inst.monitors[0]
                screen = (mon["width"], mon["height"])
                if frame is None:
                    frame = (0, 0, screen[0], screen[1])
                x, y, w, h = frame
                if w <= 0 or h <= 0 or x < 0 or y < 0 or x + w > screen[0] or y + h > screen[1]:
                    raise BadCapture(f"crop {x},{y},{w},{h} is not inside the {screen[0]}x{screen[1]} screen")
                shot = inst.grab({"left": x, "top": y, "width": w, "height": h})
                return shot.raw, frame, screen
            except (BadCapture, DisplayUnavailable):
                raise
            except Exception as exc:  # noqa: BLE001 - any grab failure means the connection is gone
                self._drop()
                raise went_away(self.display_name, exc) from exc

    def check(self, *, fmt: str = "png", quality: int | None = None, max_width: int | None = None,
              max_height: int | None = None, crop: tuple[int, int, int, int] | None = None) -> None:
        """Raise BadCapture for parameters :meth:`screenshot` would refuse, grabbing nothing: a format
        other than png/jpeg, a quality outside 1-100, a bound under 1, a ``crop`` (screen px) not inside
        the screen (this one asks the X server for the screen size: DisplayUnavailable when it is gone)."""
        if fmt not in ("png", "jpeg"):
            raise BadCapture(f"format must be png or jpeg, not {fmt!r}")
        if quality is not None and not 1 <= quality <= 100:
            raise BadCapture("quality must be between 1 and 100")
        for name, bound in (("max_width", max_width), ("max_height", max_height)):
            if bound is not None and bound < 1:
                raise BadCapture(f"{name} must be at least 1")
        if crop is not None:
            x, y, w, h = crop
            screen = self.screen_size()
            if w <= 0 or h <= 0 or x < 0 or y < 0 or x + w > screen[0] or y + h > screen[1]:
                raise BadCapture(f"crop {x},{y},{w},{h} is not inside the {screen[0]}x{screen[1]} screen")

    def screenshot(
        self,
        *,
        fmt: str = "png",
        quality: int | None = None,
        max_width: int | None = None,
        max_height: int | None = None,
        crop: tuple[int, int, int, int] | None = None,
    ) -> Shot:
        """Grab, crop, downscale and encode (see module doc). Raises BadCapture, DisplayUnavailable."""
        self.check(fmt=fmt, quality=quality, max_width=max_width, max_height=max_height)
        raw, frame, screen = self.grab(crop)
        w, h = frame[2], frame[3]
        size = scaled_size(w, h, max_width, max_height)
        if fmt == "png" and size == (w, h):
            # Hot path: straight from the grabbed BGRX pixels, one packing pass (guest.png).
            return Shot(png.encode_bgrx(raw, w, h), "image/png", screen, frame, size)
        image = to_image(raw, frame, size)
        if fmt == "png":
            return Shot(png.encode_image(image), "image/png", screen, frame, size)
        buf = io.BytesIO()
        image.save(buf, "JPEG", quality=quality or DEFAULT_JPEG_QUALITY)
        return Shot(buf.getvalue(), "image/jpeg", screen, frame, size)
