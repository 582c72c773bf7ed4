"""A video of a run: the screen grabbed while the run goes on, the actions drawn on it, encoded to WebM.

``run-task --video`` (also ``run-suite``, ``replay``; a task's ``[record] video = true``; the Python
API's ``Sandbox.start(video=True)``) makes :class:`controller.run.runner.Run` start a
:class:`VideoRecorder` once the sandbox is up and finish it before the record ends: the file is
``runs/<id>/run.webm`` (:data:`controller.run.shots.VIDEO_NAME`), and the record's ``video`` entry, the
last before ``run_finished``, says what it holds (or why there is none).

**Frames.** Every frame is grabbed through the agent client's
:meth:`controller.agent_client.AgentClient.screenshot` -- as a JPEG (:data:`GRAB_SOURCE`, the cheaper of
:data:`GRAB_SOURCES` for the run) scaled by the guest to the video's size -- the same path as the console's
live screen (:meth:`controller.run.live.LiveRun.frame`); no pixel comes any other way, and a frame is held
only in memory on its way to the encoder. Grabs are taken at :attr:`VideoSettings.fps` on a thread of
their own (:class:`VideoRecorder`), at least ``1/fps`` apart (a late grab is not made up for). A grab whose
image is the same as the last one's (the same bytes) while the marks drawn on it are the same too is
not encoded (``unchanged``): the frame before stays on screen, so the video has a variable frame rate
with each frame at the time it was grabbed (milliseconds since the first grab).

**Marks.** The actions the run sends (the bus's :class:`controller.run.bus.ActionSent`, screen px, typed
text as its length only) and the elements browser calls acted on (``browser_call`` entries) are drawn
on every frame grabbed within :data:`MARK_HOLD_S` seconds after they were sent, numbered in the order
the run sent them, as the HTML report draws them (:mod:`controller.model.marks`, drawn by
:mod:`controller.run.video_marks`).

**Bounds.** :class:`VideoSettings`: ``fps`` (default 2, at most :data:`MAX_FPS`), ``max_edge`` (the
frame's longest side, default 1280 px: the screen is scaled down to it, never up), ``max_duration_s``
(default 30 min: no frame is grabbed after it, ``limit`` ``duration``), ``max_bytes`` (default and at
most :data:`controller.run.shots.MAX_VIDEO_BYTES`: no frame is added once the file could pass it,
``limit`` ``bytes``); frame times passed over after a limit are counted (``cut``). The encoder never
holds up the run: it runs on a thread of its own behind a queue of :data:`QUEUE_FRAMES` frames
(:class:`FrameQueue`); a frame grabbed while the queue is full is dropped and counted (``dropped``).
Every byte from the guest is capped and has a deadline (the agent client's); an image that is not a JPEG
of at most the asked size is refused before it is decoded (``grab_errors``).

**Finish.** :meth:`VideoRecorder.stop_grabbing` (before the sandbox goes: the run's settle) stops the
grabs; :meth:`VideoRecorder.finish` (the run's finish phase) lets the encoder take what is queued and
close the file, for at most ``timeout`` seconds, then gives up on the rest and closes it all the same:
a cancelled run gets a playable file too. It returns the ``video`` entry.
"""

from __future__ import annotations

import collections
import contextlib
import datetime as _dt
import fractions
import hashlib
import io
import os
import queue
import statistics
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Literal, get_args

from PIL import Image, ImageDraw
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from controller.agent_client import MAX_SCREEN_PX
from controller.model.errors import DesktopSandboxError
from controller.redaction import FILL, image_boxes
from controller.model.marks import overlay
from controller.run.bus import ActionSent, EntryWritten, Published, RunBus
from controller.run.entries import Video
from controller.run.live import browser_box, shown_action
from controller.run.shots import MAX_VIDEO_BYTES, VIDEO_NAME
from controller.run.video_marks import draw_overlay, scaled_action
from controller.text import clean

VIDEO_FILE = VIDEO_NAME.pattern.replace("\\", "")
"""The video's file name in the run directory (``run.webm``)."""

MAX_FPS = 10.0
"""Most frames a second a video may ask for."""


@dataclass(frozen=True)
class GrabSource:
    """How frames are grabbed: the agent's screenshot ``format`` at ``quality`` (None: the agent's
    default), the bytes its images start with (``magic``) and its name to Pillow (``pillow``)."""

    format: str
    quality: int | None
    magic: bytes
    pillow: str


GRAB_SOURCES = {
    "jpeg": GrabSource("jpeg", 80, b"\xff\xd8\xff", "JPEG"),
    "png": GrabSource("png", None, b"\x89PNG\r\n\x1a\n", "PNG"),
}
"""The grabs a video may take (``controller.bench_video`` measures each): ``jpeg`` -- the console's live
screen's path, at quality 80 so that text stays legible after the video's own compression -- or
``png`` (lossless: on flat colour and text about as cheap, on a photograph twice the time and 16 times
the bytes)."""

GRAB_SOURCE = "jpeg"
"""The grab a run's video takes: the one that costs the run less, at worst (docs/benchmarks.md, "A run's
video")."""

QUEUE_FRAMES = 4
"""Frames waiting for the encoder at most; a frame grabbed while they wait is dropped."""

MARK_HOLD_S = 1.5
"""Seconds an action's mark stays on the frames grabbed after it was sent."""

MAX_MARKED = 60
"""Most recent actions drawn on one frame (the overlay draws at most its own limit anyway)."""

CODEC = "libvpx-vp9"
"""The encoder (VP9, in PyAV's wheel): WebM that Debian's chromium plays."""

CODEC_OPTIONS = {"deadline": "realtime", "cpu-used": "8", "crf": "36", "lag-in-frames": "0", "row-mt": "0",
                 "tune-content": "screen"}
"""libvpx's options: the realtime speed (a frame in a few ms), constant quality, no frame held back (a
stopped video ends at once), tuned for screen content."""

KEYFRAME_S = 10.0
"""Seconds between key frames at the asked rate (where a player can seek to)."""

BYTES_RESERVE = 4096
"""Bytes kept free under ``max_bytes`` besides what is counted: a frame is added only when the file,
counted as :data:`HEAD_BYTES` and every frame's bytes as encoded with :data:`FRAME_OVERHEAD` each, stays
this far within the cap. Counted, not read off the file: the muxer holds a cluster (up to 5 MiB) before it
writes it, so the file's size on disk runs behind."""

HEAD_BYTES = 1024
"""Bytes counted for the file's head and end (EBML header, segment info, tracks, seek head; about 500 for
VP9 in WebM, measured) before any frame."""

FRAME_OVERHEAD = 32
"""Bytes counted for each frame besides its data: its block's header and its share of its cluster's
header and of the cues (about 10 a frame, measured)."""

FINISH_S = 20.0
"""Default seconds :meth:`VideoRecorder.finish` waits for the encoder."""

CANCELLED_FINISH_S = 3.0
"""Seconds :meth:`VideoRecorder.finish` still waits for the encoder once the run is cancelled (a signal
ends every wait within seconds); the file is closed after the frame it is on, and plays."""

GRAB_JOIN_S = 5.0
"""Seconds :meth:`VideoRecorder.stop_grabbing` waits for a grab under way (its call has the agent
client's deadline; a stopping run cuts it sooner)."""


class VideoSettingsError(DesktopSandboxError, ValueError):
    """Video settings out of their bounds; ``code`` ``invalid_video_settings``, the message names the field."""

    code = "invalid_video_settings"


class VideoSettings(BaseModel):
    """How a run's video is made (module docstring). ``fps``: frames a second grabbed (> 0, at most
    :data:`MAX_FPS`); ``max_edge``: the frame's longest side in px (64 to the largest screen; the
    screen is scaled down to it, never up); ``max_duration_s``: seconds after the first frame past which
    nothing is grabbed; ``max_bytes``: the file's cap (256 KiB to :data:`MAX_VIDEO_BYTES`); ``grab``: how
    frames are grabbed (:data:`GRAB_SOURCES`; default :data:`GRAB_SOURCE`)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    fps: float = Field(2.0, gt=0, le=MAX_FPS)
    max_edge: int = Field(1280, ge=64, le=MAX_SCREEN_PX)
    max_duration_s: float = Field(1800.0, gt=0, le=24 * 3600)
    max_bytes: int = Field(MAX_VIDEO_BYTES, ge=256 * 1024, le=MAX_VIDEO_BYTES)
    grab: Literal["jpeg", "png"] = GRAB_SOURCE

    def __init__(self, **fields: Any) -> None:
        """Raises :class:`VideoSettingsError` naming the first field out of its bounds (or unknown)."""
        try:
            super().__init__(**fields)
        except ValidationError as exc:
            first = exc.errors(include_url=False)[0]
            where = ".".join(str(p) for p in first["loc"]) or "video"
            raise VideoSettingsError(f"video {where}: {first['msg']}") from None


assert set(GRAB_SOURCES) == set(get_args(VideoSettings.model_fields["grab"].annotation)), \
    "every grab a video may be asked for is in GRAB_SOURCES, and no other"


def frame_size(screen: tuple[int, int], max_edge: int) -> tuple[int, int]:
    """The video's frame size (w, h) for a screen of ``screen`` px: scaled so that its longest side is
    at most ``max_edge`` (never up), each side even (the encoder's 4:2:0 needs it) and at least 2."""
    width, height = screen
    scale = min(1.0, max_edge / max(width, height))
    return max(2, round(width * scale) // 2 * 2), max(2, round(height * scale) // 2 * 2)


class FrameQueue:
    """The frames between the grabs and the encoder: at most ``capacity``; :meth:`offer` never waits
    (a frame that does not fit is dropped and counted in :attr:`dropped`)."""

    def __init__(self, capacity: int = QUEUE_FRAMES) -> None:
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=capacity)
        self.dropped = 0

    def offer(self, item: Any) -> bool:
        """Queue ``item`` at once, or drop it (False) when the queue is full."""
        try:
            self._queue.put_nowait(item)
            return True
        except queue.Full:
            self.dropped += 1
            return False

    def take(self, timeout: float) -> Any:
        """The oldest frame, waiting at most ``timeout`` seconds; None when none came."""
        try:
            return self._queue.get(timeout=timeout)
        except queue.Empty:
            return None


class _Sink:
    """The file the muxer writes, counting how far it reached (``extent``, bytes)."""

    def __init__(self, fh: Any) -> None:
        self.fh, self.extent = fh, 0

    def write(self, data: Any) -> int:
        written = self.fh.write(data)
        self.extent = max(self.extent, self.fh.tell())
        return written

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        return self.fh.seek(offset, whence)

    def tell(self) -> int:
        return self.fh.tell()

    def flush(self) -> None:
        self.fh.flush()


class VideoRecorder:
    """Grabs, marks and encodes one run's video (module docstring).

    ``agent``: the run's ``AgentClient`` (thread-safe: its calls may overlap the run's); ``screen``: the
    screen's size (w, h), screen px; ``directory``: the run's record directory (the file is
    :data:`VIDEO_FILE` in it, created there, never opened through a link); ``bus``: the run's bus (its
    actions and browser calls are drawn); ``clock``: seconds, monotonic. :meth:`start`, then
    :meth:`stop_grabbing` and :meth:`finish` (each also safe when the other was not called)."""

    def __init__(self, agent: Any, screen: tuple[int, int], directory: Path, bus: RunBus,
                 settings: VideoSettings | None = None, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.agent, self.screen, self.directory, self.bus = agent, tuple(screen), Path(directory), bus
        self.settings = settings or VideoSettings()
        self.source = GRAB_SOURCES[self.settings.grab]
        self.clock = clock
        self.size = frame_size(self.screen, self.settings.max_edge)
        self.queue = FrameQueue()
        self.frames = self.unchanged = self.cut = self.grab_errors = 0
        self.limit: str | None = None
        self.error: str | None = None
        self.bytes = 0
        self.last_pts_ms: int | None = None
        self._grab_ms: collections.deque[float] = collections.deque(maxlen=2000)
        self._stop = threading.Event()
        self._last_frame = threading.Event()  # one grab more once stopped (stop_grabbing)
        self._last_digest: bytes | None = None  # the last frame queued: its image and marks
        self._last_key: Any = None
        self._full = threading.Event()  # the encoder reached the byte cap
        self._end = threading.Event()  # the encoder takes what is queued, then closes
        self._abort = threading.Event()  # the encoder closes now
        self._marks_lock = threading.Lock()
        self._marks: collections.deque[tuple[float, int, dict[str, Any]]] = collections.deque(maxlen=MAX_MARKED)
        self._boxes: collections.deque[tuple[float, int, dict[str, Any]]] = collections.deque(maxlen=MAX_MARKED)
        self._sent = 0
        self._t0: float | None = None
        self.started_at: str | None = None  # UTC time of the first grab kept: the video's time 0
        self._last_grab_ms: int | None = None  # the time of the last grab kept (ms since the first)
        self._count_lock = threading.Lock()
        self._subscription: Any = None
        self._grab_error: str | None = None
        self._grabber = threading.Thread(target=self._grab_loop, name="video-grab", daemon=True)
        self._encoder = threading.Thread(target=self._encode_loop, name="video-encode", daemon=True)

    # -- the run's side --------------------------------------------------------------------------------
    def start(self) -> "VideoRecorder":
        """Follow the run's actions and start grabbing and encoding; returns itself."""
        self._subscription = self.bus.subscribe(self._on_event, name="video", inline=True,
                                                accepts=lambda e: isinstance(e, (ActionSent, EntryWritten)))
        self._encoder.start()
        self._grabber.start()
        return self

    def stop_grabbing(self, timeout: float = GRAB_JOIN_S, *, last_frame: bool = True) -> None:
        """No more grabs but, with ``last_frame``, one more at once: the screen as the run left it (its
        last step may have come after the last frame's time). A grab under way is waited for at most
        ``timeout`` seconds; whatever it brings after that is let go. Safe to call again."""
        if last_frame and not self._stop.is_set():
            self._last_frame.set()
        self._stop.set()
        if self._subscription is not None:
            self._subscription.close()
        if self._grabber.is_alive() and self._grabber is not threading.current_thread():
            self._grabber.join(timeout)

    def finish(self, timeout: float = FINISH_S, cancelled: Callable[[], bool] | None = None) -> Video:
        """Stop grabbing (if not yet), let the encoder take what is queued and close the file, for at
        most ``timeout`` seconds all together (then it closes the file after the frame it is on); once
        ``cancelled()`` (the run's flag, also when it turns true during the wait) for at most
        :data:`CANCELLED_FINISH_S` more. Returns the record's ``video`` entry. Never raises."""
        started = time.monotonic()
        deadline = started + timeout
        self.stop_grabbing(min(GRAB_JOIN_S, timeout))
        self._end.set()
        while self._encoder.is_alive():
            now = time.monotonic()
            if cancelled is not None and cancelled():
                deadline = min(deadline, now + CANCELLED_FINISH_S)
                cancelled = None  # the budget is counted once, from when the flag was seen
            if now >= deadline:
                break
            self._encoder.join(min(deadline - now, 0.1))
        if self._encoder.is_alive():
            self._abort.set()
            self._encoder.join(GRAB_JOIN_S)
            waited = time.monotonic() - started
            self.error = self.error or (f"the encoder did not finish within {waited:.3g} s: frames still queued "
                                        "were let go")
        return self.entry()

    def entry(self) -> Video:
        """The ``video`` entry for what was made so far (the file is kept when it holds a frame)."""
        kept = self.frames > 0
        error = self.error
        if not kept and error is None:
            error = (f"no frame was kept: {self.grab_errors} grabs failed or were refused (the last: "
                     f"{self._grab_error})" if self._grab_error else "no frame was grabbed")
        duration = round((self.last_pts_ms or 0) / 1000 + 1 / self.settings.fps, 3) if kept else 0.0
        grab_ms = round(statistics.median(self._grab_ms), 1) if self._grab_ms else None
        return Video(file=VIDEO_FILE if kept else None, frames=self.frames, unchanged=self.unchanged,
                     dropped=self.queue.dropped, cut=self.cut, limit=self.limit, fps=self.settings.fps,
                     duration_s=duration, size=self.size, bytes=self.bytes if kept else 0, grab_ms=grab_ms,
                     grab_errors=self.grab_errors, error=clean(error, 300) if error else None,
                     started_at=self.started_at if kept else None)

    # -- what is drawn ---------------------------------------------------------------------------------
    def _on_event(self, published: Published) -> None:
        """The bus's actions and browser calls, noted with the time they were sent (inline: no wait)."""
        event, now = published.event, self.clock()
        if isinstance(event, ActionSent):
            action = event.action
            if action.get("type") in ("wait", "screenshot", "browser_call"):
                return
            with self._marks_lock:
                self._sent += 1
                self._marks.append((now, self._sent, shown_action(action)))
        elif isinstance(event, EntryWritten) and getattr(event.entry, "type", None) == "browser_call":
            box = browser_box(event.entry.target, event.entry.viewport)
            if box is None:
                return
            with self._marks_lock:
                self._sent += 1
                self._boxes.append((now, self._sent, {**box, "member": clean(str(event.entry.member), 40)}))

    def _overlay_at(self, when: float) -> tuple[Any, dict[str, Any] | None]:
        """``(key, overlay)`` of the marks shown at ``when``: the actions sent within :data:`MARK_HOLD_S`
        before it, in frame px; ``key`` tells two sets of marks apart (None and None: nothing to draw)."""
        with self._marks_lock:
            marks = [m for m in self._marks if when - MARK_HOLD_S <= m[0] <= when]
            boxes = [b for b in self._boxes if when - MARK_HOLD_S <= b[0] <= when]
        if not marks and not boxes:
            return None, None
        sx, sy = self.size[0] / self.screen[0], self.size[1] / self.screen[1]
        drawn = overlay([(n, scaled_action(a, sx, sy)) for _t, n, a in marks], self.size)
        drawn["boxes"] = [{"n": str(n), "x": f"{b['x'] * sx:.1f}", "y": f"{b['y'] * sy:.1f}",
                           "w": f"{b['width'] * sx:.1f}", "h": f"{b['height'] * sy:.1f}", "label": f"{n} {b['member']}"}
                          for _t, n, b in boxes]
        return (tuple(n for _t, n, _a in marks), tuple(n for _t, n, _b in boxes)), drawn

    # -- the grabs ---------------------------------------------------------------------------------------
    def _grab_loop(self) -> None:
        period = 1.0 / self.settings.fps
        due = self.clock()
        while True:
            if self._stop.wait(max(0.0, due - self.clock())):  # the frame's time, or the run stops
                if self._last_frame.is_set():
                    self._grab_once(final=True)  # the screen as the run left it
                return
            due = self.clock() + period  # frames at least a period apart: a late grab is not made up for
            self._grab_once()

    def _grab_once(self, final: bool = False) -> None:
        """One grab, queued for the encoder unless it is refused, unchanged, or past a limit. ``final``:
        the last grab, taken after the stop."""
        now = self.clock()
        if self._t0 is not None and (now - self._t0 > self.settings.max_duration_s or self._full.is_set()):
            self._cut("bytes" if self._full.is_set() else "duration")
            return
        began = self.clock()
        try:
            shot = self.agent.screenshot(format=self.source.format, quality=self.source.quality,
                                         max_width=self.size[0], max_height=self.size[1])
        except Exception as exc:  # noqa: BLE001 - an agent error, a deadline: counted, the run goes on
            self._refused(clean(exc, 200))
            return
        self._grab_ms.append((self.clock() - began) * 1000)
        if self._stop.is_set() and not final:
            return
        if self._t0 is None:
            self._t0 = began
            self.started_at = (_dt.datetime.now(_dt.timezone.utc)
                               - _dt.timedelta(seconds=self.clock() - began)).isoformat()
        pts = int(round((began - self._t0) * 1000))
        if self._last_grab_ms is not None and pts <= self._last_grab_ms:
            return
        if not shot.data.startswith(self.source.magic):
            self._refused(f"the guest's image is not a {self.source.pillow}")
            return
        digest = hashlib.blake2b(shot.data, digest_size=16).digest()
        key, drawn = self._overlay_at(began)
        self._last_grab_ms = pts
        if digest == self._last_digest and key == self._last_key:
            self.unchanged += 1
            return
        filled = image_boxes(list(getattr(shot, "redacted", ())), shot.frame, shot.image_size)
        if self.queue.offer((pts, shot.data, drawn, filled)):
            self._last_digest, self._last_key = digest, key

    def _cut(self, limit: str) -> None:
        """A frame time past ``limit`` (``duration`` or ``bytes``): counted, the first limit kept."""
        with self._count_lock:
            self.limit = self.limit or limit
            self.cut += 1

    def _refused(self, why: str) -> None:
        """A grab that failed, or whose image was refused: counted, the last reason kept."""
        with self._count_lock:  # the grabs' thread and the encoder's both refuse
            self.grab_errors += 1
            self._grab_error = why

    # -- the encoder -------------------------------------------------------------------------------------
    def _encode_loop(self) -> None:
        """Take frames until told to end (then what is queued) or to abort; close the file either way."""
        out: _Output | None = None
        last: tuple[int, Image.Image] | None = None
        try:
            while not self._abort.is_set():
                item = self.queue.take(0.1)  # poll interval: the end and abort flags are plain events
                if item is None:
                    if self._end.is_set() and self._stop.is_set():
                        break
                    continue
                pts, data, drawn, filled = item
                image = self._decode(data)
                if image is None:
                    continue
                if drawn is not None:
                    image = draw_overlay(image, drawn)
                    if filled:  # nothing is drawn over a region kept out of pictures (controller.redaction)
                        painter = ImageDraw.Draw(image)
                        for x, y, w, h in filled:
                            painter.rectangle((x, y, x + w - 1, y + h - 1), fill=FILL)
                if out is None:
                    out = _Output.create(self.directory / VIDEO_FILE, self.size, self.settings.fps)
                if not out.add(image, pts, self.settings.max_bytes):
                    if self.frames == 0:
                        self.error = self.error or (f"the first frame alone would take the file past its "
                                                    f"{self.settings.max_bytes} byte cap")
                    self._full.set()
                    self._cut("bytes")
                    continue
                self.frames += 1
                self.last_pts_ms = pts
                self.bytes = out.sink.extent
                last = (pts, image)
            # the last frame again at the last grab's time: the video lasts as long as the grabs did
            final = self._last_grab_ms
            if out is not None and last is not None and final is not None and final > last[0] \
                    and not self._abort.is_set() and out.add(last[1], final, self.settings.max_bytes):
                self.frames += 1
                self.last_pts_ms = final
        except Exception as exc:  # noqa: BLE001 - the video fails, never the run
            self.error = f"encoding failed: {type(exc).__name__}: {exc}"
        finally:
            if out is not None:
                try:
                    out.close()
                    self.bytes = out.sink.extent
                except Exception as exc:  # noqa: BLE001
                    self.error = self.error or f"closing the video failed: {type(exc).__name__}: {exc}"
                if self.frames == 0:
                    with contextlib.suppress(OSError):
                        os.unlink(self.directory / VIDEO_FILE)
                    self.bytes = 0

    def _decode(self, data: bytes) -> Image.Image | None:
        """A grab's image as an RGB image of the frame's size; None (a grab error) when its header says it
        is not an image of the source's format at most the asked size (checked before any pixel is
        decoded) or it does not decode."""
        try:
            with Image.open(io.BytesIO(data), formats=[self.source.pillow]) as img:
                if img.width > self.size[0] + 1 or img.height > self.size[1] + 1:
                    self._refused(f"the guest's image is {img.width}x{img.height} px, larger than the "
                                  f"{self.size[0]}x{self.size[1]} asked")
                    return None
                image = img.convert("RGB")
        except (OSError, ValueError, Image.DecompressionBombError, SyntaxError) as exc:
            self._refused(f"the guest's image does not decode: {clean(exc, 100)}")
            return None
        return image if image.size == self.size else image.resize(self.size)


class _Output:
    """The WebM file being written: one VP9 stream, times in milliseconds."""

    def __init__(self, container: Any, stream: Any, sink: _Sink, fh: Any) -> None:
        self.container, self.stream, self.sink, self.fh = container, stream, sink, fh
        self.counted = HEAD_BYTES  # bytes the file holds once the muxer wrote all it was given (at most)
        self.refused = False  # a frame was encoded but not added: nothing may follow it

    @classmethod
    def create(cls, path: Path, size: tuple[int, int], fps: float) -> "_Output":
        """A new file at ``path`` (created: it must not exist, and a link there is not followed)."""
        import av

        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
        fd = os.open(path, flags, 0o666)
        fh = os.fdopen(fd, "w+b")
        sink = _Sink(fh)
        try:
            container = av.open(sink, mode="w", format="webm")
            stream = container.add_stream(CODEC, rate=fractions.Fraction(fps).limit_denominator(1000))
            stream.width, stream.height = size
            stream.pix_fmt = "yuv420p"
            stream.time_base = fractions.Fraction(1, 1000)
            stream.codec_context.time_base = fractions.Fraction(1, 1000)
            stream.codec_context.gop_size = max(1, int(fps * KEYFRAME_S))
            stream.codec_context.bit_rate = 0
            stream.codec_context.thread_count = 1
            stream.options = dict(CODEC_OPTIONS)
        except Exception:
            fh.close()
            raise
        return cls(container, stream, sink, fh)

    def add(self, image: Image.Image, pts_ms: int, max_bytes: int) -> bool:
        """Encode ``image`` at ``pts_ms`` and add it unless the file could then pass ``max_bytes`` (its
        bytes as encoded, counted before the muxer gets them, with :data:`BYTES_RESERVE`): False, nothing
        added, and no frame after it is (the encoder's next frames would refer to the one left out)."""
        import av

        if self.refused:
            return False
        frame = av.VideoFrame.from_image(image)
        frame.pts = pts_ms
        frame.time_base = fractions.Fraction(1, 1000)
        packets = list(self.stream.encode(frame))
        size = sum(packet.size + FRAME_OVERHEAD for packet in packets)
        if max(self.counted, self.sink.extent) + size + BYTES_RESERVE > max_bytes:
            self.refused = True
            return False
        for packet in packets:
            self.container.mux(packet)
        self.counted += size
        return True

    def close(self) -> None:
        try:
            for packet in self.stream.encode():
                if not self.refused:  # a frame held back refers to the one left out
                    self.container.mux(packet)
            self.container.close()
        finally:
            self.fh.close()
