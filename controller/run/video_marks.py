"""The marks of :mod:`controller.model.marks` drawn into the pixels of a video frame.

:func:`controller.model.marks.overlay` says where each mark goes, how big it is and what its label says
(the geometry, in the px of the image drawn on); the HTML report draws that as SVG, and
:func:`draw_overlay` here draws the same thing with Pillow into a frame of the run's video, in the same
colours (:data:`controller.model.marks.COLORS`). Units: frame px throughout (the overlay is made for the
frame's size, :func:`scaled_action` brings an action from screen px into it).

Labels come from the overlay, already escaped (:func:`controller.text.clean`) and without typed text (a
``type`` action is drawn from its ``text_length``); nothing here reads a record or the guest.
"""

from __future__ import annotations

import functools
from typing import Any

from PIL import Image, ImageDraw, ImageFont

from controller.model.marks import COLORS, HALO, NOTE_COLOR

NOTE_BACKDROP = (36, 41, 47, 215)
"""The strip behind the labels of actions without a point (RGBA): the report's strip colour, nearly opaque."""

RING_FILL = (255, 255, 255, 31)
"""The faint fill inside a click's ring (RGBA), as the report's."""

MAX_FONT_PX = 200
"""Largest label size drawn (px): an overlay's ``font`` is bounded by the frame's size anyway."""


@functools.lru_cache(maxsize=16)
def _font(size: int) -> Any:
    """Pillow's bundled font at ``size`` px (no font file of the system is read)."""
    return ImageFont.load_default(size=max(6, min(size, MAX_FONT_PX)))


def _rgb(color: str, alpha: int = 255) -> tuple[int, int, int, int]:
    value = int(color.lstrip("#"), 16)
    return (value >> 16) & 255, (value >> 8) & 255, value & 255, alpha


def _points(text: str) -> list[tuple[float, float]]:
    """``"x,y x,y ..."`` (an overlay's polygon or polyline) as points."""
    out = []
    for pair in text.split():
        x, _, y = pair.partition(",")
        out.append((float(x), float(y)))
    return out


def scaled_action(action: dict[str, Any], sx: float, sy: float) -> dict[str, Any]:
    """``action`` (an agent action, screen px) with its point(s) in frame px: ``x``/``y`` times
    ``sx``/``sy``, and each point of a drag's ``path``; scroll amounts and everything else unchanged.
    Coordinates that are not numbers are left as they are (the overlay lists such an action as a note)."""
    def scale(value: Any, factor: float) -> Any:
        return value * factor if isinstance(value, (int, float)) and not isinstance(value, bool) else value

    out = dict(action)
    if "x" in out:
        out["x"] = scale(out["x"], sx)
    if "y" in out:
        out["y"] = scale(out["y"], sy)
    path = out.get("path")
    if isinstance(path, list):
        out["path"] = [{**p, "x": scale(p.get("x"), sx), "y": scale(p.get("y"), sy)} if isinstance(p, dict)
                       else [scale(p[0], sx), scale(p[1], sy)] if isinstance(p, (list, tuple)) and len(p) == 2
                       else p for p in path]
    return out


def draw_overlay(image: Image.Image, overlay: dict[str, Any]) -> Image.Image:
    """``image`` (RGB, frame px) with ``overlay`` drawn on it (:func:`controller.model.marks.overlay`
    made for the image's size, plus ``boxes`` as :func:`controller.report.steps.browser_boxes` gives
    them: ``n``, ``x``, ``y``, ``w``, ``h``, ``label``): each mark in its colour over a dark halo, its label
    in white with a dark outline, and the labels of actions without a point in a strip along the bottom
    edge. Returns a new RGB image; ``image`` is not changed. An overlay with nothing to draw returns
    ``image`` itself."""
    marks, boxes, notes = overlay.get("marks") or [], overlay.get("boxes") or [], overlay.get("notes") or []
    if not marks and not boxes and not notes:
        return image
    layer = Image.new("RGBA", image.size, (0, 0, 0, 0))
    draw = ImageDraw.Draw(layer)
    unit = max(image.size) / 1280
    line = max(2, round(3 * unit))
    halo = line * 2 + 1
    font_px = round(float(overlay.get("font") or 22 * unit))
    font = _font(font_px)
    stroke = max(1, round(font_px * 0.1))  # the report's outline: half of .22em shows outside the glyph
    dark = _rgb(HALO, 178)
    for mark in marks:
        _mark(draw, mark, _rgb(COLORS.get(mark.get("kind"), "#ffffff")), dark, line, halo)
        draw.text((float(mark["lx"]), float(mark["ly"])), str(mark.get("label", "")), font=font,
                  anchor="rs" if mark.get("anchor") == "end" else "ls", fill=(255, 255, 255, 255),
                  stroke_width=stroke, stroke_fill=_rgb(HALO))
    color = _rgb(COLORS["box"])
    for box in boxes:
        x, y, w, h = (float(box[k]) for k in ("x", "y", "w", "h"))
        draw.rectangle((x, y, x + w, y + h), outline=dark, width=halo)
        draw.rectangle((x, y, x + w, y + h), outline=color, width=line)
        draw.text((x, y - font_px * 0.3), str(box.get("label", "")), font=font, anchor="ls",
                  fill=(255, 255, 255, 255), stroke_width=stroke, stroke_fill=_rgb(HALO))
    if notes:
        _notes(draw, [str(n.get("label", "")) for n in notes], image.size, font, font_px)
    out = image.convert("RGBA")
    out.alpha_composite(layer)
    return out.convert("RGB")


def _circle(draw: ImageDraw.ImageDraw, x: float, y: float, r: float, **kwargs: Any) -> None:
    draw.ellipse((x - r, y - r, x + r, y + r), **kwargs)


def _mark(draw: ImageDraw.ImageDraw, mark: dict[str, Any], color: tuple[int, ...], dark: tuple[int, ...],
          line: int, halo: int) -> None:
    """One mark of the overlay (its ``kind``'s shape, as the report's template draws it)."""
    kind = mark.get("kind")
    x, y, r = float(mark["x"]), float(mark["y"]), float(mark["r"])
    if kind == "drag":
        points = _points(mark["points"])
        draw.line(points, fill=dark, width=halo, joint="curve")
        draw.line(points, fill=color, width=line, joint="curve")
        draw.polygon(_points(mark["head"]), fill=color, outline=dark)
        _circle(draw, x, y, r, fill=color, outline=dark)
    elif kind == "scroll":
        if "head" in mark:
            end = (float(mark["x2"]), float(mark["y2"]))
            draw.line([(x, y), end], fill=dark, width=halo)
            draw.line([(x, y), end], fill=color, width=line)
            draw.polygon(_points(mark["head"]), fill=color, outline=dark)
        _circle(draw, x, y, r, fill=color, outline=dark)
    elif kind == "move":
        diamond = _points(mark["diamond"])
        draw.polygon(diamond, outline=dark, width=halo)
        draw.polygon(diamond, fill=RING_FILL, outline=color, width=line)
    else:  # click, double_click
        _circle(draw, x, y, r, outline=dark, width=halo)
        _circle(draw, x, y, r, fill=RING_FILL, outline=color, width=line)
        if "r2" in mark:  # a double click's inner ring (controller.model.marks._mark)
            _circle(draw, x, y, float(mark["r2"]), outline=color, width=line)
        else:
            _circle(draw, x, y, float(mark.get("rd", r * 0.22)), fill=color, outline=dark)


def _notes(draw: ImageDraw.ImageDraw, labels: list[str], size: tuple[int, int], font: Any, font_px: int) -> None:
    """The labels of actions without a point, on one strip along the bottom edge (cut at its end)."""
    width, height = size
    pad = max(2, font_px // 4)
    top = height - font_px - 2 * pad
    draw.rectangle((0, top, width, height), fill=NOTE_BACKDROP)
    draw.text((pad * 2, height - pad), "  \u00b7  ".join(labels), font=font, anchor="ld", fill=_rgb(NOTE_COLOR))
