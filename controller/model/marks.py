"""Actions drawn over an image of the screen they were chosen on: the one geometry and colours of marks.

Two readers draw them: the HTML report (``controller.report``: SVG over the screenshot a step's
actions were chosen on) and the run's video (:mod:`controller.run.video_marks`: pixels of each frame).

Units: everything here is in the px of the image drawn on, given as ``size``. For the report that is
**model px** -- pixels of the screenshot image the model was sent, the space of the record's
``computer_call`` ``actions`` -- never screen px (the driver maps model px to the screen; the record
keeps the actions as the model sent them). So the overlay's SVG viewBox is ``0 0 W H`` with ``(W, H)``
the screenshot entry's ``image_size``, laid over the image however large the page shows it. For the
video it is the frame's px (actions as sent, screen px, scaled by the frame's size).

:func:`overlay` turns numbered actions into a plain dict the report template draws:

* ``width``, ``height``: the viewBox (model px); ``font``: label size (model px);
* ``marks``: one dict per action with a point, each with ``kind`` (``click``, ``double_click``,
  ``move``, ``scroll``, ``drag``), ``n`` (the action's number in the step), ``x``/``y`` (its point),
  ``label`` with ``lx``/``ly``/``anchor`` (where the label goes) and per kind: ``r`` (marker radius),
  ``rd`` (click's centre dot), ``r2`` (double_click's inner ring), ``diamond`` (move's polygon), ``x2``/``y2`` and ``head``
  (scroll's arrow line end and arrowhead polygon), ``points`` and ``head`` (drag's polyline and the
  arrowhead at its end);
* ``notes``: labels for actions without a point (``typed N chars``, ``keys ctrl+c``, ``wait``, an
  unknown type, or an action whose coordinates are not numbers), each with ``n`` and ``label``. The
  page lists them in a strip under the screenshot, never over it: however many there are, they
  hide nothing the model saw.

Every number is formatted here (a string of digits); every label is passed through
:func:`controller.text.clean` (the template escapes HTML). Typed text is never shown: a ``type``
action is drawn from its ``text_length`` only.
"""

from __future__ import annotations

import math
from typing import Any

from controller.text import clean
from wire.actions import MODELS

MAX_MARKS = 200
"""Most actions of one step drawn (the rest are still listed beside the image)."""

MAX_NOTES = 12
"""Most point-less labels listed under the screenshot; the rest are summed up as ``+N more``."""

MAX_PATH_POINTS = 1000
"""Most points of one drag path drawn."""

POINTED = tuple(kind for kind, model in MODELS.items() if {"x", "y"} <= set(model.model_fields))
"""Action types with one ``x``/``y`` point (``wire.actions``: click, double_click, move, scroll)."""

COLORS = {"click": "#ff2d78", "double_click": "#ff8c00", "drag": "#00c8ff", "scroll": "#5cff3a", "move": "#ffd400",
          "box": "#b48cff"}
"""The colour of each kind of mark (``#rrggbb``): the report's CSS and the video's pixels both take it from
here. ``box``: the element a browser call acted on."""

HALO = "#000000"
"""The dark outline under every mark and label, so that it shows on any screen."""

NOTE_COLOR = "#ffe066"
"""The colour of the labels of actions without a point (typing, keys), listed in a strip."""
assert set(COLORS) == {*POINTED, "drag", "box"}, "every kind of mark has its colour, and no colour is spare"


def num(value: float) -> str:
    """``value`` as SVG wants it: an integer without a fraction, else two decimals."""
    return str(int(value)) if float(value).is_integer() else f"{value:.2f}"


def _coord(value: Any) -> float | None:
    """A coordinate from the record: a finite int or float (never a bool or a string), else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, int) and abs(value) > 10**9:
        return None
    value = float(value)
    return value if math.isfinite(value) and abs(value) <= 1e9 else None


def _point(data: Any) -> tuple[float, float] | None:
    """``{"x", "y"}`` or ``[x, y]`` as a point, None when either is not a number."""
    if isinstance(data, dict):
        x, y = _coord(data.get("x")), _coord(data.get("y"))
    elif isinstance(data, (list, tuple)) and len(data) == 2:
        x, y = _coord(data[0]), _coord(data[1])
    else:
        return None
    return None if x is None or y is None else (x, y)


def _keys(keys: Any) -> str:
    """``keys`` (a list of key names) joined with ``+``, escaped and cut."""
    if not isinstance(keys, list) or not keys:
        return ""
    return clean("+".join(str(k) for k in keys[:8]), 60)


def _head(tip: tuple[float, float], direction: tuple[float, float], size: float) -> str:
    """An arrowhead polygon (SVG ``points``) at ``tip`` pointing along ``direction``."""
    dx, dy = direction
    length = math.hypot(dx, dy) or 1.0
    dx, dy = dx / length, dy / length
    bx, by = tip[0] - dx * size, tip[1] - dy * size
    px, py = -dy * size * 0.55, dx * size * 0.55
    return " ".join(f"{num(a)},{num(b)}" for a, b in ((tip[0], tip[1]), (bx + px, by + py), (bx - px, by - py)))


def label_text(n: int, action: dict[str, Any]) -> str:
    """The short label of action number ``n`` (``3 left``, ``4 typed 12 chars``, ``5 keys ctrl+c``)."""
    kind = action.get("type")
    held = _keys(action.get("keys")) if kind != "keypress" else ""
    suffix = f" +{held}" if held else ""
    if kind == "click":
        return f"{n} {clean(action.get('button', 'left'), 12)}{suffix}"
    if kind == "double_click":
        return f"{n} double{suffix}"
    if kind == "move":
        return f"{n} move{suffix}"
    if kind == "drag":
        return f"{n} drag{suffix}"
    if kind == "scroll":
        return f"{n} scroll {clean(action.get('scroll_x', 0), 8)},{clean(action.get('scroll_y', 0), 8)}{suffix}"
    if kind == "type":
        length = action.get("text_length")
        if isinstance(length, int) and not isinstance(length, bool):
            return f"{n} typed {length} char{'' if length == 1 else 's'}"
        return f"{n} typed ? chars"
    if kind == "keypress":
        return f"{n} keys {_keys(action.get('keys')) or '?'}"
    return f"{n} {clean(kind, 20)}"


def overlay(actions: list[tuple[int, Any]], size: tuple[int, int]) -> dict[str, Any]:
    """The marks of ``actions`` (``(number, action)`` pairs; an action is the record's dict, model
    px) over an image of ``size`` (model px). See the module docstring for the shape."""
    width, height = size
    unit = max(width, height) / 1280
    font = 22 * unit
    marks: list[dict[str, Any]] = []
    notes: list[dict[str, Any]] = []
    for n, action in actions[:MAX_MARKS]:
        if not isinstance(action, dict):
            notes.append({"n": n, "label": f"{n} {clean(type(action).__name__, 20)}"})
            continue
        mark = _mark(n, action, width, unit, font)
        if mark is None:
            label = label_text(n, action)
            if action.get("type") in (*POINTED, "drag"):
                label += " (no valid point)"
            notes.append({"n": n, "label": label})
        else:
            marks.append(mark)
    if len(actions) > MAX_MARKS:
        notes.append({"n": None, "label": f"+{len(actions) - MAX_MARKS} actions not drawn"})
    if len(notes) > MAX_NOTES:
        notes = notes[:MAX_NOTES - 1] + [{"n": None, "label": f"+{len(notes) - MAX_NOTES + 1} more"}]
    return {"width": num(width), "height": num(height), "font": num(font), "marks": marks, "notes": notes}


def _mark(n: int, action: dict[str, Any], width: float, unit: float, font: float) -> dict[str, Any] | None:
    """The mark of one action with a point (None: no point, or no valid one)."""
    kind = action.get("type")
    r = 16 * unit
    if kind in POINTED:
        point = _point(action)
        if point is None:
            return None
        x, y = point
        mark: dict[str, Any] = {"kind": kind, "n": n, "x": num(x), "y": num(y), "r": num(r)}
        if kind == "click":
            mark["rd"] = num(r * 0.22)
        elif kind == "double_click":
            mark["r2"] = num(r * 0.5)
        elif kind == "move":
            d = r * 0.7
            mark["diamond"] = " ".join(f"{num(a)},{num(b)}" for a, b in ((x, y - d), (x + d, y), (x, y + d), (x - d, y)))
        elif kind == "scroll":
            sx, sy = _coord(action.get("scroll_x", 0)) or 0.0, _coord(action.get("scroll_y", 0)) or 0.0
            mark["r"] = num(r * 0.4)
            if sx or sy:
                length = 70 * unit
                norm = math.hypot(sx, sy)
                tip = (x + sx / norm * length, y + sy / norm * length)
                mark.update(x2=num(tip[0]), y2=num(tip[1]), head=_head(tip, (sx, sy), 16 * unit))
    elif kind == "drag":
        raw = action.get("path")
        points = [p for p in (_point(q) for q in raw[:MAX_PATH_POINTS]) if p is not None] if isinstance(raw, list) else []
        if len(points) < 2:
            return None
        x, y = points[0]
        end, before = points[-1], next((p for p in reversed(points[:-1]) if p != points[-1]), points[0])
        mark = {"kind": "drag", "n": n, "x": num(x), "y": num(y), "r": num(r * 0.45),
                "points": " ".join(f"{num(a)},{num(b)}" for a, b in points),
                "head": _head(end, (end[0] - before[0], end[1] - before[1]), 18 * unit)}
    else:
        return None
    right = x > width * 0.75
    mark.update(label=label_text(n, action), anchor="end" if right else "start",
                lx=num(x - r - 6 * unit if right else x + r + 6 * unit),
                ly=num(y + r + font if y < font * 1.5 else y - r * 0.4))
    return mark
