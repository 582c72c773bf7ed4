"""Regions of the screen kept out of every picture: the one rule for redaction.

While a secret may be on the guest's screen, the region it may be in is *held* here, and every picture
taken of the screen in that time -- the model's screenshots and so the record's files and the report, the
web console's live view, the run's video -- has the region filled with :data:`FILL` before the picture
leaves :class:`controller.agent_client.AgentClient` (the one place every grab comes through,
:meth:`Redactor.apply`). Two things hold a region (:data:`REASONS`):

* ``sign_in``: the agent filling a sign-in form (contract 8) -- the whole screen, from just before the first
  value is sent to the agent until the fill's answer is back (the values are then gone: submitted and the
  document left, or cleared); a fill call cut off before its answer keeps it until the agent answers again
  (its chromium takes one call at a time) or the run ends. Not the field boxes only: the page's own script
  shares the field and may show its value anywhere it draws, and its layout is the page's to change while
  the fill runs;
* ``typing``: a person typing during a takeover (the console's ``type`` and ``keypress`` actions, and a
  replay's performing them again) -- the box of the top-level window that held the X input focus when the
  key went (``GET /v1/focus``; the whole screen when the agent cannot say), from before the key reaches the
  desktop until control goes back to the model (Resume) or the run ends. What the person leaves on the
  screen then is the model's to see, as a takeover's result always is: a value that must stay private is
  typed where the app masks it (a password field, a prompt that does not echo) or cleared before Resume.

Timing: a picture's grab is a span of time, not a moment. A picture is filled with every region held at
any time from the moment its request was sent (:meth:`Redactor.mark`) to the moment its answer was read,
so a grab that was under way when a region was held, or released, is filled too.

Units: boxes are screen px ``(x, y, width, height)``; a picture covers the screen px ``frame`` and has
``image_size`` image px, and a box is mapped into it outward (the fill never falls short of the box by a
rounding), then widened to 16 image px so that a JPEG's blocks hold the fill colour alone.
"""

from __future__ import annotations

import io
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Literal

from PIL import Image, ImageDraw

Box = tuple[int, int, int, int]
"""``(x, y, width, height)`` in screen px."""

Reason = Literal["sign_in", "typing"]
REASONS: dict[str, str] = {
    "sign_in": "the agent was filling a sign-in form (the whole screen while the fill ran)",
    "typing": "a person typed during a takeover (the window the keys went to, until control went back)",
}
"""Why a region is held: the one vocabulary (record ``redaction.why``, the report, the docs)."""

FILL = (0, 0, 0)
"""The colour a held region is filled with (RGB)."""

MAX_REGIONS = 256
"""Most regions held at once (a person's typing into many windows): past it, the whole screen is held."""

RELEASED_KEEP_S = 120.0
"""Seconds a released region is still applied to grabs that began before its release (longer than any grab's
deadline)."""

JPEG_BLOCK = 16
"""Image px a filled box is widened to (a JPEG's chroma block), so no block mixes the fill and the screen."""


@dataclass
class _Region:
    box: Box | None  # None: the whole screen
    why: str
    since: float
    until: float | None = None


@dataclass
class Redactor:
    """The regions a sandbox's screen keeps out of pictures (module docstring). Thread-safe.

    ``on_hold(why, box)``: called (outside the lock) each time a region starts to be held (``box`` None:
    the whole screen), e.g. to write the record's ``redaction`` line."""

    clock: Callable[[], float] = time.monotonic
    on_hold: Callable[[str, Box | None], None] | None = None
    _regions: list[_Region] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def mark(self) -> float:
        """The time a grab starts (pass it to :meth:`apply`)."""
        return self.clock()

    def hold(self, why: str, box: Box | None = None) -> _Region:
        """Hold ``box`` (screen px; None: the whole screen) out of every picture from now on, until
        :meth:`release`. Raises ValueError for a ``why`` outside :data:`REASONS` or a malformed box."""
        if why not in REASONS:
            raise ValueError(f"unknown redaction reason {why!r}")
        if box is not None:
            if len(box) != 4 or any(isinstance(v, bool) or not isinstance(v, int) for v in box) or box[2] <= 0 or box[3] <= 0:
                raise ValueError(f"a redaction box is (x, y, width, height) with a positive size, not {box!r}")
        with self._lock:
            now = self.clock()
            self._prune(now)
            for region in self._regions:
                if region.until is None and region.why == why and region.box == box:
                    return region  # already held: nothing new to say
            if len(self._regions) >= MAX_REGIONS:
                box = None
            region = _Region(box, why, now)
            self._regions.append(region)
        if self.on_hold is not None:
            self.on_hold(why, box)
        return region

    def release(self, region: _Region) -> None:
        """Stop holding ``region``: pictures whose grab begins from now on are no longer filled there."""
        with self._lock:
            if region.until is None:
                region.until = self.clock()

    def release_all(self, why: str) -> None:
        """Stop holding every region held for ``why`` (a takeover ended: its ``typing`` regions)."""
        with self._lock:
            now = self.clock()
            for region in self._regions:
                if region.why == why and region.until is None:
                    region.until = now

    def held(self) -> list[tuple[str, Box | None]]:
        """``(why, box)`` of every region held now."""
        with self._lock:
            return [(r.why, r.box) for r in self._regions if r.until is None]

    def spans(self) -> list[tuple[str, Box | None, float, float | None]]:
        """``(why, box, since, until)`` of every region kept (held now: ``until`` None; released ones for
        :data:`RELEASED_KEEP_S`), times on :attr:`clock`: which of a view's grabs a region covered."""
        with self._lock:
            return [(r.why, r.box, r.since, r.until) for r in self._regions]

    def boxes(self, since: float, screen: tuple[int, int]) -> list[Box]:
        """Every region held at any time from ``since`` (a :meth:`mark`) to now, as screen px boxes
        (the whole screen ``screen`` (W, H) for a whole-screen region)."""
        with self._lock:
            regions = [r for r in self._regions if r.until is None or r.until >= since]
        return [r.box if r.box is not None else (0, 0, screen[0], screen[1]) for r in regions]

    def _prune(self, now: float) -> None:
        self._regions = [r for r in self._regions if r.until is None or now - r.until < RELEASED_KEEP_S]


def image_boxes(boxes: list[Box], frame: Box, image_size: tuple[int, int], block: int = JPEG_BLOCK) -> list[Box]:
    """``boxes`` (screen px) mapped into a picture of screen px ``frame`` and ``image_size`` image px:
    each widened outward to whole image px, then to multiples of ``block``, cut to the image; boxes
    outside the frame are left out."""
    fx, fy, fw, fh = frame
    iw, ih = image_size
    if fw <= 0 or fh <= 0 or iw <= 0 or ih <= 0:
        return []
    sx, sy = iw / fw, ih / fh
    out: list[Box] = []
    for x, y, w, h in boxes:
        left, top = (x - fx) * sx, (y - fy) * sy
        right, bottom = (x + w - fx) * sx, (y + h - fy) * sy
        left_i = max(0, int(left // block) * block)
        top_i = max(0, int(top // block) * block)
        right_i = min(iw, -int(-right // block) * block)
        bottom_i = min(ih, -int(-bottom // block) * block)
        if right_i > left_i and bottom_i > top_i:
            out.append((left_i, top_i, right_i - left_i, bottom_i - top_i))
    return out


_FORMATS = {"image/png": "PNG", "image/jpeg": "JPEG"}


def paint(data: bytes, mime: str, boxes: list[Box], *, size: tuple[int, int]) -> bytes:
    """The picture ``data`` (PNG or JPEG, ``mime``) with ``boxes`` (image px) filled with :data:`FILL`,
    encoded again in the same format (a JPEG at quality 90 without chroma subsampling, so the fill stays
    the fill colour). ``data`` unchanged when ``boxes`` is empty. ``size``: the picture's (w, h) in image
    px as its sender declared it (bounded by the caller): the picture's own header must say the same,
    read before any pixel is decoded, so a few KiB of guest bytes never decode to gigabytes. Raises
    ValueError for another ``mime``, bytes that are no such image, or another size."""
    if not boxes:
        return data
    if mime not in _FORMATS:
        raise ValueError(f"cannot redact a {mime!r} picture")
    try:
        with Image.open(io.BytesIO(data), formats=[_FORMATS[mime]]) as opened:
            if opened.size != tuple(size):
                raise ValueError(f"the picture is {opened.width}x{opened.height} px, not the {size[0]}x{size[1]} "
                                 "declared")
            image = opened.convert("RGB")
    except (OSError, Image.DecompressionBombError) as exc:
        raise ValueError(f"the picture could not be decoded for redaction: {exc}") from None
    draw = ImageDraw.Draw(image)
    for x, y, w, h in boxes:
        draw.rectangle((x, y, x + w - 1, y + h - 1), fill=FILL)
    out = io.BytesIO()
    if mime == "image/png":
        image.save(out, format="PNG", compress_level=1)
    else:
        image.save(out, format="JPEG", quality=90, subsampling=0)
    return out.getvalue()


TYPING_ACTIONS = frozenset({"type", "keypress"})
"""A person's actions (agent form, ``wire.actions``) that count as typing: held before they are sent."""


def hold_for_typing(agent: object, action: dict[str, object]) -> None:
    """Before a person's ``action`` (agent form) reaches the desktop: when it types (:data:`TYPING_ACTIONS`),
    hold the box of the window holding the input focus as ``typing`` on ``agent``'s redactor (the whole
    screen when the agent cannot say where the keys go: no window has the focus, an agent without
    ``GET /v1/focus``, an error), until :func:`typing_done`. Does nothing for other actions or an agent
    without a redactor."""
    redactor = getattr(agent, "redactor", None)
    if action.get("type") not in TYPING_ACTIONS or not isinstance(redactor, Redactor):
        return
    try:
        box = agent.focus_box()  # type: ignore[attr-defined]
    except Exception:  # noqa: BLE001 - not knowing where the keys go means the whole screen
        box = None
    redactor.hold("typing", box)


def typing_done(agent: object) -> None:
    """A takeover ended (control went back to the model, or the run ended): release its ``typing``
    regions on ``agent``'s redactor (none: nothing)."""
    redactor = getattr(agent, "redactor", None)
    if isinstance(redactor, Redactor):
        redactor.release_all("typing")
