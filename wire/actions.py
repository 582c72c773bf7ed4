"""The computer action schema: every action type, its fields, and the rules that need no screen.

Actions use the field names of the Responses computer tool (the openai SDK's
``openai.types.responses.computer_action``). One action is a JSON object with a ``type``:

================  =====================================================  =========================
type              fields                                                 points (:meth:`points`)
================  =====================================================  =========================
``click``         ``x, y, button = "left", keys?``                       ``(x, y)``
``double_click``  ``x, y, keys?``                                        ``(x, y)``
``drag``          ``path: [{x, y}, ...]`` (2..:data:`MAX_PATH_POINTS`),  every path point, in order
                  ``keys?``
``keypress``      ``keys`` (1..:data:`MAX_CHORD_KEYS` key names)         none
``move``          ``x, y, keys?``                                        ``(x, y)``
``scroll``        ``x, y, scroll_x = 0, scroll_y = 0, keys?``            ``(x, y)``
``type``          ``text`` (at most :data:`MAX_TEXT_CHARS` characters)   none
``wait``          (none)                                                 none
``screenshot``    (none)                                                 none
================  =====================================================  =========================

Units: ``x``/``y`` are pixels of the sender's space: model px (pixels of the image last sent to the
model) from the model and in offline scripts, screen px once the controller's driver has mapped them
(what the guest agent receives). ``scroll_x``/``scroll_y`` are scroll amounts in px (positive: right,
down) and are never mapped. Coordinates and scroll amounts must be JSON integers (``true``, ``"5"``
and ``5.0`` are refused, never read as numbers). ``keys`` on an action with points are held down
during it; on ``keypress`` they are pressed as one chord. ``button`` is one of :data:`BUTTONS`.
Key names are checked by the guest (``guest.keys``), which knows the keysyms.

Rules that need a size (a point inside a W x H screen or image) are not part of the models:
:func:`first_outside` checks them for a given size, and without one only that no coordinate is
negative. The guest refuses a point outside its screen (``out_of_bounds``); the driver refuses one
outside the model image (``controller.run.mapping.OutOfModelBounds``).

Reading an action, two forms:

- the agent's form, :data:`ACTION_ADAPTER` (``ACTION_ADAPTER.validate_python(raw)``): unknown fields
  are ignored, ``button`` defaults to ``"left"``, ``scroll_x``/``scroll_y`` to 0. Raises pydantic's
  ``ValidationError`` (the guest turns its first error into a 400 ``invalid_action``).
- the model's form, :func:`parse_action`: what the Responses API sends and what an offline script
  must hold. On top of the agent's form, unknown fields are refused and the fields the API always
  sends (those without a default, and those marked ``model_required``: ``button``, ``scroll_x``,
  ``scroll_y``) must be present. Raises :class:`ActionInvalid`.

Descriptions: :func:`describe` gives one short line per action (``click (640,250) left``, ``type
<12 chars>``), used by the controller's progress lines, approval questions and the CLI. Typed text is
shown only as its length unless ``redact=False``. Every value shown passes through the ``clean``
function the caller gives (the controller passes ``controller.text.clean``, the one home of the
rule that escapes control characters): this package imports nothing from the controller, and the
guest never describes actions.

Adding an action type: a model here (with its ``example``, and ``quick`` / ``by_person`` when they differ
from the defaults: the guest's fast path and what a person may send derive from them), listed in
:data:`ACTION_MODELS`, and the guest executor's handler (``guest.actions.Executor._do_<type>``).

Over 400 lines: this is the one home of the action vocabulary -- the models, both reading forms, the
descriptions and the rendered reference -- so that nothing else defines an action.
"""

from __future__ import annotations

import typing
from typing import Annotated, Any, Callable, ClassVar, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, StrictInt, TypeAdapter, ValidationError

MAX_TEXT_CHARS = 20_000
"""Longest ``type`` text (characters)."""
MAX_PATH_POINTS = 2_000
"""Most points in a ``drag`` path."""
MAX_CHORD_KEYS = 16
"""Most keys in one ``keypress`` chord (and held with one pointer action)."""
MAX_KEY_NAME_CHARS = 64
"""Longest key name (characters); the longest keysym name is far shorter."""
MAX_SCROLL_PX = 1_000_000
"""Largest scroll amount either way (px): far past any page, small enough for every step of the guest's
arithmetic."""
BUTTONS: tuple[str, ...] = ("left", "right", "wheel", "back", "forward")
"""Mouse buttons a ``click`` may name."""

Button = Literal["left", "right", "wheel", "back", "forward"]
KeyName = Annotated[str, Field(max_length=MAX_KEY_NAME_CHARS)]
"""A key name as a model sends it (``ctrl``, ``Return``, ``a``): checked against the keysyms by the guest."""

_MODEL_REQUIRED = {"model_required": True}


class Point(BaseModel):
    """One point ``{x, y}``: integers, px of the sender's space (model px or screen px)."""

    x: StrictInt
    y: StrictInt


class BaseAction(BaseModel):
    """Base of every action model. ``example``: one valid instance as JSON (screen px well inside a
    64x64 screen), for documentation and for the tests that run each type through every layer."""

    model_config = ConfigDict(extra="ignore")
    example: ClassVar[dict[str, Any]]
    quick: ClassVar[bool] = False
    """Runs in a bounded handful of X requests (a click: about 0.3 ms on an idle server): not a ``wait``,
    nor text to type (up to :data:`MAX_TEXT_CHARS` keys) or a path to drag (up to :data:`MAX_PATH_POINTS`
    points, each interpolated). The guest's fast path (``guest.actions.quick``) takes only these."""
    by_person: ClassVar[bool] = True
    """A person may send it from a view (the console's take-over, a replayed person's actions); not the
    loop's own ``wait`` and ``screenshot``."""

    def points(self) -> list[tuple[int, int]]:
        """The points this action touches, ``[(x, y), ...]`` in the sender's px: ``(x, y)`` when
        the model has ``x``/``y``, then every point of each list-of-:class:`Point` field, in order."""
        out: list[tuple[int, int]] = []
        if _has_xy(type(self)):
            out.append((self.x, self.y))  # type: ignore[attr-defined]
        for name in _point_list_fields(type(self)):
            out.extend((p.x, p.y) for p in getattr(self, name))
        return out

    def with_points(self, points: list[tuple[int, int]]) -> "BaseAction":
        """A copy with its points replaced by ``points`` (same count and order as :meth:`points`),
        e.g. mapped from model px to screen px; every other field unchanged. Raises ValueError when
        the count differs."""
        if len(points) != len(self.points()):
            raise ValueError(f"{self.type} has {len(self.points())} points, got {len(points)}")  # type: ignore[attr-defined]
        rest = list(points)
        update: dict[str, Any] = {}
        if _has_xy(type(self)):
            update["x"], update["y"] = rest.pop(0)
        for name in _point_list_fields(type(self)):
            count = len(getattr(self, name))
            update[name] = [Point(x=x, y=y) for x, y in rest[:count]]
            rest = rest[count:]
        return self.model_copy(update=update)

    def to_wire(self) -> dict[str, Any]:
        """The action as JSON for the agent: every field, ``None`` ones (absent ``keys``) left out."""
        return self.model_dump(exclude_none=True)


class Click(BaseAction):
    """Press and release ``button`` at (x, y); ``keys`` held meanwhile."""

    type: Literal["click"]
    x: StrictInt
    y: StrictInt
    button: Button = Field("left", json_schema_extra=_MODEL_REQUIRED)
    keys: list[KeyName] | None = Field(None, max_length=MAX_CHORD_KEYS)
    example: ClassVar[dict[str, Any]] = {"type": "click", "x": 10, "y": 20, "button": "left"}
    quick: ClassVar[bool] = True


class DoubleClick(BaseAction):
    """Two left clicks at (x, y); ``keys`` held meanwhile."""

    type: Literal["double_click"]
    x: StrictInt
    y: StrictInt
    keys: list[KeyName] | None = Field(None, max_length=MAX_CHORD_KEYS)
    example: ClassVar[dict[str, Any]] = {"type": "double_click", "x": 10, "y": 20}
    quick: ClassVar[bool] = True


class Drag(BaseAction):
    """Left button down at the first point of ``path``, moved through every point, up at the last."""

    type: Literal["drag"]
    path: list[Point] = Field(min_length=2, max_length=MAX_PATH_POINTS)
    keys: list[KeyName] | None = Field(None, max_length=MAX_CHORD_KEYS)
    example: ClassVar[dict[str, Any]] = {"type": "drag", "path": [{"x": 5, "y": 5}, {"x": 30, "y": 40}]}


class Keypress(BaseAction):
    """Press ``keys`` as one chord (in order), release them in reverse."""

    type: Literal["keypress"]
    keys: list[KeyName] = Field(min_length=1, max_length=MAX_CHORD_KEYS)
    example: ClassVar[dict[str, Any]] = {"type": "keypress", "keys": ["shift"]}
    quick: ClassVar[bool] = True


class Move(BaseAction):
    """Move the pointer to (x, y); ``keys`` held meanwhile."""

    type: Literal["move"]
    x: StrictInt
    y: StrictInt
    keys: list[KeyName] | None = Field(None, max_length=MAX_CHORD_KEYS)
    example: ClassVar[dict[str, Any]] = {"type": "move", "x": 10, "y": 20}
    quick: ClassVar[bool] = True


class Scroll(BaseAction):
    """Scroll by (scroll_x, scroll_y) px with the pointer at (x, y); ``keys`` held meanwhile."""

    type: Literal["scroll"]
    x: StrictInt
    y: StrictInt
    scroll_x: StrictInt = Field(0, ge=-MAX_SCROLL_PX, le=MAX_SCROLL_PX, json_schema_extra=_MODEL_REQUIRED)
    scroll_y: StrictInt = Field(0, ge=-MAX_SCROLL_PX, le=MAX_SCROLL_PX, json_schema_extra=_MODEL_REQUIRED)
    keys: list[KeyName] | None = Field(None, max_length=MAX_CHORD_KEYS)
    example: ClassVar[dict[str, Any]] = {"type": "scroll", "x": 10, "y": 20, "scroll_x": 0, "scroll_y": 100}
    quick: ClassVar[bool] = True


class Type(BaseAction):
    """Type ``text`` into the focused window."""

    type: Literal["type"]
    text: str = Field(max_length=MAX_TEXT_CHARS)
    example: ClassVar[dict[str, Any]] = {"type": "type", "text": "hi"}


class Wait(BaseAction):
    """Let the screen settle (the guest's settle rule)."""

    type: Literal["wait"]
    example: ClassVar[dict[str, Any]] = {"type": "wait"}
    by_person: ClassVar[bool] = False


class Screenshot(BaseAction):
    """Nothing to do on the guest: the image is fetched separately."""

    type: Literal["screenshot"]
    example: ClassVar[dict[str, Any]] = {"type": "screenshot"}
    quick: ClassVar[bool] = True
    by_person: ClassVar[bool] = False


ACTION_MODELS: tuple[type[BaseAction], ...] = (Click, DoubleClick, Drag, Keypress, Move, Scroll, Type, Wait,
                                               Screenshot)
"""Every action model, in the order types are listed to people."""

Action = Annotated[Union[ACTION_MODELS], Field(discriminator="type")]  # type: ignore[valid-type]
"""One action of any type (discriminated by ``type``)."""

ACTION_ADAPTER: TypeAdapter[Any] = TypeAdapter(Action)
"""Validates one action in the agent's form (see module doc); raises pydantic ``ValidationError``."""

MODELS: dict[str, type[BaseAction]] = {
    typing.get_args(m.model_fields["type"].annotation)[0]: m for m in ACTION_MODELS
}
"""Action type name -> model."""

ACTION_TYPES: tuple[str, ...] = tuple(MODELS)
"""Every action type name: ``("click", "double_click", "drag", ..., "screenshot")``."""


def _has_xy(model: type[BaseModel]) -> bool:
    return "x" in model.model_fields and "y" in model.model_fields


def _point_list_fields(model: type[BaseModel]) -> list[str]:
    return [name for name, info in model.model_fields.items() if info.annotation == list[Point]]


def model_required(model: type[BaseAction]) -> set[str]:
    """The fields of ``model`` that an action in the model's form must carry (``type`` included)."""
    return {name for name, info in model.model_fields.items()
            if info.is_required() or (isinstance(info.json_schema_extra, dict)
                                      and info.json_schema_extra.get("model_required"))}


class ActionInvalid(ValueError):
    """An action :func:`parse_action` refuses. ``str()``: one line saying where and what, e.g.
    ``click.x: Input should be a valid integer (got '5')`` or ``unknown fields for move: ['z']``."""


def _short_repr(value: Any, limit: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def parse_action(raw: Any) -> BaseAction:
    """Validate one action in the model's form (see module doc) and return its model.

    ``raw``: a JSON object (dict). Raises :class:`ActionInvalid`: not an object, unknown ``type``,
    unknown fields, a field the Responses API always sends missing, or any schema rule (integers,
    button names, key list shape, path length, text length). Coordinates are not bounds-checked
    (see :func:`first_outside`).
    """
    if not isinstance(raw, dict):
        raise ActionInvalid("an action must be a JSON object")
    kind = raw.get("type")
    model = MODELS.get(kind) if isinstance(kind, str) else None
    if model is None:
        raise ActionInvalid(f"unknown action type {_short_repr(kind)} (one of {', '.join(ACTION_TYPES)})")
    extra = set(raw) - set(model.model_fields)
    if extra:
        raise ActionInvalid(f"unknown fields for {kind}: {sorted(str(k)[:40] for k in extra)}")
    missing = model_required(model) - set(raw)
    if missing:
        raise ActionInvalid(f"{kind} needs {sorted(missing)}")
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in (kind, *first.get("loc", ())))
        got = first.get("input")
        detail = f" (got {_short_repr(got)})" if not isinstance(got, (dict, list)) else ""
        raise ActionInvalid(f"{where}: {first.get('msg')}{detail}") from None


def first_outside(action: BaseAction, size: tuple[int, int] | None = None) -> tuple[int, int] | None:
    """The first point of ``action`` outside ``size`` = (W, H) (valid: 0..W-1, 0..H-1, in the same
    px as the action), or with ``size`` None the first with a negative coordinate; None when all
    points are inside."""
    for x, y in action.points():
        if x < 0 or y < 0 or (size is not None and (x >= size[0] or y >= size[1])):
            return x, y
    return None


def as_dict(action: Any) -> dict[str, Any] | None:
    """An action as a plain dict: a dict as is (copied), an openai SDK action (``to_dict``) or any
    pydantic model with ``None`` fields left out; None for anything else."""
    if isinstance(action, dict):
        return dict(action)
    if callable(getattr(action, "to_dict", None)):
        return {k: v for k, v in action.to_dict(mode="python", exclude_none=True).items() if v is not None}
    if isinstance(action, BaseModel):
        return action.model_dump(exclude_none=True)
    return None


Clean = Callable[[Any, int], str]
"""``clean(value, limit) -> str``: the value as one printable line of at most ``limit`` characters
(``controller.text.clean``)."""

SHOWN_TEXT_CHARS = 1000
"""Longest typed text :func:`describe` shows with ``redact=False`` (characters, after escaping)."""

# Pairs of fields shown together: first field -> (second field, format, limit per value).
_PAIRS = {"x": ("y", "({},{})", 12), "scroll_x": ("scroll_y", "{},{}", 8)}


def _as_point(p: Any) -> dict[str, Any]:
    """A path point, ``{"x","y"}`` or ``[x, y]``, as a dict (empty when neither)."""
    if isinstance(p, dict):
        return p
    if isinstance(p, (list, tuple)) and len(p) == 2:
        return {"x": p[0], "y": p[1]}
    return {}


def describe(action: Any, *, clean: Clean, redact: bool = True) -> str:
    """One short line describing ``action`` (a dict, an SDK action or a model from here; need not be
    valid): the type, then its fields in schema order, coordinates as given (model px from the
    model, screen px after mapping).

    ``click (640,250) left``, ``double_click (1,2)``, ``drag (1,2)->(30,40) 3 points``, ``keypress
    ctrl+c``, ``move (5,6) holding shift``, ``scroll (640,400) 0,-300``, ``type <12 chars>``,
    ``wait``, ``screenshot``. Keys on an action with points are shown as ``holding k1+k2``; fields
    the schema does not know as ``name='value'``. A ``type`` action shows ``<N chars>`` (from
    ``text`` or a redacted record's ``text_length``), and its text only with ``redact=False``.
    An unknown type shows just its name; a non-action its class name. ``clean``: see :data:`Clean`.
    """
    data = as_dict(action)
    if data is None:
        return clean(type(action).__name__, 20)
    kind = data.get("type")
    model = MODELS.get(kind) if isinstance(kind, str) else None
    parts = [clean(kind, 20)]
    if model is None:
        return parts[0]
    with_points = _has_xy(model) or bool(_point_list_fields(model))
    names = [n for n in model.model_fields if n != "type"]
    names += [n for n in data if n not in model.model_fields and n not in ("type", "text_length")]
    done: set[str] = set()
    for name in names:
        if name in done:
            continue
        value = data.get(name)
        if name in _PAIRS and _PAIRS[name][0] in model.model_fields:
            other, form, limit = _PAIRS[name]
            done.add(other)
            parts.append(form.format(clean(value, limit), clean(data.get(other), limit)))
        elif name in model.model_fields and name in _point_list_fields(model):
            points = [_as_point(p) for p in value] if isinstance(value, list) else []
            if not points:
                parts.append("(no path)")
            else:
                first, last = points[0], points[-1]
                parts.append(f"({clean(first.get('x'), 12)},{clean(first.get('y'), 12)})->"
                             f"({clean(last.get('x'), 12)},{clean(last.get('y'), 12)}) {len(points)} points")
        elif name == "text" and name in model.model_fields:
            if redact or not isinstance(value, str):
                n = data.get("text_length")
                if n is None and isinstance(value, str):
                    n = len(value)
                parts.append(f"<{n if isinstance(n, int) and not isinstance(n, bool) else '?'} chars>")
            else:
                parts.append(clean(repr(value), SHOWN_TEXT_CHARS))
        elif name == "keys" and name in model.model_fields:
            if value is None:
                continue
            keys = "+".join(clean(k, 20) for k in value) if isinstance(value, list) else "?"
            parts.append(f"holding {keys}" if with_points else keys)
        elif value is None:
            continue
        elif name in model.model_fields:
            parts.append(clean(value, 20))
        else:
            parts.append(f"{clean(name, 20)}={clean(_short_repr(value), 40)}")
    return " ".join(parts)


__all__ = [
    "ACTION_ADAPTER", "ACTION_MODELS", "ACTION_TYPES", "BUTTONS", "MAX_CHORD_KEYS", "MAX_PATH_POINTS",
    "MAX_TEXT_CHARS", "MODELS", "SHOWN_TEXT_CHARS", "Action", "ActionInvalid", "BaseAction", "Button", "Clean",
    "Click", "DoubleClick", "Drag", "Keypress", "Move", "Point", "Screenshot", "Scroll", "Type", "Wait",
    "as_dict", "describe", "first_outside", "model_required", "parse_action",
]


def _field_text(name: str, info: Any) -> str:
    """One field as the reference shows it: ``name``, ``name = default`` or ``name?`` (optional)."""
    if info.is_required():
        return f"`{name}`"
    if info.default is None:
        return f"`{name}?`"
    return f"`{name} = {info.default!r}`".replace("'", '"')


def reference_markdown() -> str:
    """The action reference, rendered from the models (markdown: one row per type with its fields in
    the agent's form, the fields a model must send, and its example; docs/ARCHITECTURE.md carries it
    between ``<!-- action-reference -->`` markers, kept equal by a test)."""
    import json

    lines = ["| `type` | fields | the model must send | example | what it does |", "|---|---|---|---|---|"]
    for kind, model in MODELS.items():
        fields = ", ".join(_field_text(n, i) for n, i in model.model_fields.items() if n != "type") or "–"
        needed = ", ".join(f"`{n}`" for n in sorted(model_required(model) - {"type"})) or "–"
        doc = " ".join((model.__doc__ or "").split()).replace("``", "`")
        lines.append(f"| `{kind}` | {fields} | {needed} | `{json.dumps(model.example)}` | {doc} |")
    limits = (f"Limits: `type` text at most {MAX_TEXT_CHARS} characters; `drag` path 2 to {MAX_PATH_POINTS} "
              f"points; `keypress` 1 to {MAX_CHORD_KEYS} keys; `button` one of "
              + ", ".join(f"`{b}`" for b in BUTTONS) + ".")
    return "\n".join(lines) + "\n\n" + limits + "\n"


if __name__ == "__main__":  # pragma: no cover - a helper for editing the docs
    print(reference_markdown(), end="")

