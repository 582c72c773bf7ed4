"""A finished run as one self-contained HTML page: ``desktop-sandbox report runs/<id> --html``.

:func:`render_report` reads ``runs/<id>/record.jsonl`` with :func:`controller.run.record.read_entries`
(validated entry models; its OSError / ValueError propagate), groups the entries into steps
(:func:`controller.report.steps.build_view`) and renders ``templates/report.html`` with Jinja2,
autoescaping on. :func:`write_report` writes the page to ``runs/<id>/report.html``.

The page loads nothing but the run's video, when the run recorded one (a ``<video controls>`` of
``run.webm`` beside the page, or of the serving console's URL): CSS is inline, there is no script, and a
Content-Security-Policy meta (:data:`CSP`) forbids every other source. Screenshots are embedded as ``data:`` URLs
(``embed_images=True``), or each ``<img src>`` is ``image_url(name)`` for a server that serves the
same page from its own routes (the web console). Each step's actions are drawn over its screenshot
as inline SVG in **model px** (pixels of the image the model was sent; the viewBox is the screenshot
entry's ``image_size``), never screen px.

The record may be hostile (a model, a page or the guest wrote its strings; anyone may have edited
the file). So: every string is escaped (:func:`controller.text.clean`, then HTML autoescaping);
typed text is never shown (the record holds its length only); and a screenshot file is read only
by the rule of :mod:`controller.run.shots` (a plain ``shot-NNNN.png|jpg`` name in the run directory,
no link followed, a regular file, size and pixel caps), and while the page's images stay under
:data:`MAX_EMBEDDED_BYTES`. Any other screenshot is shown as missing, with the reason.
"""

from __future__ import annotations

import base64
import contextlib
import io
import os
import stat
import tempfile
from pathlib import Path
from typing import Any, Callable

import jinja2

from controller.model.marks import COLORS, NOTE_COLOR
from controller.report.steps import build_view
from controller.run.record import read_entries
from controller.run.shots import MAX_SHOT_BYTES, SHOT_TYPES, check_shot, check_video, decode_shot, read_shot

CSP = "default-src 'none'; img-src data: 'self'; media-src 'self'; style-src 'unsafe-inline'"
"""The page's Content-Security-Policy: images from ``data:`` URLs or the serving origin, the run's video
from the serving origin (or, for a page opened as a file, the file beside it), inline CSS, nothing else
(no script, no font, no frame, no connection)."""

MAX_EMBEDDED_BYTES = 512 * 1024 * 1024
"""Most image bytes one page embeds; screenshots past it are shown as missing."""

REPORT_NAME = "report.html"

_ENV = jinja2.Environment(
    loader=jinja2.PackageLoader("controller.report", "templates"),
    autoescape=True, undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True,
)


def _directory(run_dir: Path) -> Path:
    """The run directory of ``run_dir`` (a run directory, or its ``record.jsonl``)."""
    run_dir = Path(run_dir)
    return run_dir.parent if run_dir.name == "record.jsonl" and not run_dir.is_dir() else run_dir


def _resolve_images(view: dict[str, Any], directory: Path, embed_images: bool,
                    image_url: Callable[[str], str] | None) -> None:
    """Fill each screenshot's ``src`` (a ``data:`` URL or ``image_url(name)``) or ``missing`` (why
    not), and drop the raw file name from the view."""
    refs = [s["shot"] for s in view["steps"] if s["shot"] is not None] + view["unshown"]
    budget = MAX_EMBEDDED_BYTES
    done: set[int] = set()
    for ref in refs:
        if id(ref) in done:
            continue
        done.add(id(ref))
        raw = ref.pop("raw_file")
        if embed_images:
            data, why = read_shot(directory, raw, budget)
            if data is None and why and why.startswith("larger than") and budget < MAX_SHOT_BYTES:
                why = "not embedded: the page's images reached their size limit"
            if data is not None:
                budget -= len(data)
                mime = SHOT_TYPES[raw.rsplit(".", 1)[1]]
                ref["src"] = f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}"
            ref["missing"] = why
        else:
            why = check_shot(directory, raw)
            ref["missing"] = why
            if why is None:
                assert image_url is not None
                ref["src"] = str(image_url(raw))


def _resolve_video(view: dict[str, Any], directory: Path, video_url: Callable[[str], str] | None) -> None:
    """Fill the video's ``src`` (``video_url(name)``, or the name itself: a URL relative to a page in the
    run directory) when the file passes the reading rule (:func:`controller.run.shots.check_video`), else
    ``missing`` (why not); drop the raw file name from the view."""
    video = view.get("video")
    if video is None:
        return
    raw = video.pop("raw_file")
    video["src"], video["missing"] = None, None
    if raw is None:
        return
    _size, why = check_video(directory, raw)
    if why is None:
        video["src"] = str(video_url(raw)) if video_url is not None else raw
    video["missing"] = why


def _resolve_crops(view: dict[str, Any], directory: Path) -> None:
    """Cut the replayed region of each diverged replay step (``crops`` of an unmet ``matches``
    expectation) from the screenshot it was judged on, inlined as a PNG ``data:`` URL; the raw file name
    is dropped from the view. A screenshot that cannot be read leaves ``replayed`` None (the page says so)."""
    for step in view["steps"]:
        for exp in step["expectations"]:
            for unmet in exp["unmet"]:
                crops = unmet.get("crops")
                if not crops:
                    continue
                data, _why = read_shot(directory, crops.pop("shot_file"))
                if data is None:
                    continue
                x, y, w, h = crops["region"]
                img, _why = decode_shot(data)
                if img is None or x + w > img.width or y + h > img.height:
                    continue
                out = io.BytesIO()
                img.crop((x, y, x + w, y + h)).save(out, format="PNG")
                crops["replayed"] = f"data:image/png;base64,{base64.b64encode(out.getvalue()).decode('ascii')}"


def render_report(run_dir: Path, *, embed_images: bool = True,
                  image_url: Callable[[str], str] | None = None, home_url: str | None = None,
                  video_url: Callable[[str], str] | None = None) -> str:
    """The review page of the run in ``run_dir`` (``runs/<id>``, or its ``record.jsonl``) as HTML text.

    ``embed_images=True``: screenshots inlined as base64 ``data:`` URLs (the page stands alone);
    ``False``: each screenshot's ``src`` is ``image_url(file_name)`` (``file_name`` always matches
    :data:`SHOT_NAME` and names a regular file in the run directory), for a server that serves them.
    Raises OSError / ValueError when the record cannot be read (:func:`read_entries`), ValueError
    when ``embed_images`` is False without ``image_url``. ``home_url``: a link back to where the page
    is listed (the console's runs list), shown above the header; None for a page that stands alone.
    ``video_url``: the URL of the run's video (``video_url("run.webm")``) for a server that serves it; None:
    the file's name, for a page beside it (:func:`write_report`). The video is played only when its file
    passes the reading rule of :mod:`controller.run.shots`; otherwise the page says why not."""
    if not embed_images and image_url is None:
        raise ValueError("render_report: give image_url when embed_images is False")
    directory = _directory(Path(run_dir))
    entries = read_entries(run_dir)
    view = build_view(entries, directory.resolve().name)
    _resolve_images(view, directory, embed_images, image_url)
    _resolve_crops(view, directory)
    _resolve_video(view, directory, video_url)
    return _ENV.get_template("report.html").render(csp=CSP, home_url=home_url, mark_colors=COLORS,
                                                   note_color=NOTE_COLOR, **view)


def write_report(run_dir: Path) -> Path:
    """Write :func:`render_report` (images embedded) to ``run_dir/report.html`` and return that path.

    Written to a temporary file in the directory first and then renamed over ``report.html``, so a
    reader never sees half a page and an existing ``report.html`` symlink is replaced, not followed.
    The page gets the record's permission bits (it shows the same screenshots)."""
    directory = _directory(Path(run_dir))
    page = render_report(directory)
    mode = stat.S_IMODE(os.stat(directory / "record.jsonl").st_mode) & 0o666
    target = directory / REPORT_NAME
    fd, tmp = tempfile.mkstemp(prefix=".report-", suffix=".html", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(page)
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return target
