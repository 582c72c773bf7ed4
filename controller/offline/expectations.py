"""Screen expectations of the offline script (contract 3): what the screenshot must show before a
scripted turn is answered.

A script turn may carry ``"expect": [...]`` (and ``"expect_timeout_s"``). Before the scripted model
answers that turn it checks every expectation against the latest screenshot it received (the last
``computer_call_output`` image of the request, or the first request's ``input_image``). While one
does not hold it answers a ``computer_call`` with a single ``wait`` action, as a live model would,
and checks again on the next request; once the turn's deadline has passed it gives up and the run
ends ``failed`` with the unmet expectation in the record (see :mod:`controller.offline.scripted_server`).

This module is the one home of the expectation schema (pydantic, strict: unknown fields and kinds
are refused) and of the pixel checks. Regions are in **model px**: pixels of the image the model
was sent (after the driver's crop and scale), the same space as the script's action coordinates.
Colours are compared per RGB channel (0-255); an image's alpha is ignored.

:func:`reference_markdown` renders the field reference that ``docs/ARCHITECTURE.md`` holds (a test
keeps the two equal); ``python -m controller.offline.expectations`` prints it.
"""

from __future__ import annotations

import base64
import binascii
import io
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Optional, Union

from PIL import Image, ImageChops
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from controller.text import clean
from controller.validation import describe_validation_error
from wire.screen_match import MAX_REGION_PNG_BYTES, MatchRule, changed_share, decode_crop

DEFAULT_TIMEOUT_S = 30.0
"""Seconds a turn may wait for its expectations when it does not set ``expect_timeout_s``."""

MAX_TIMEOUT_S = 600.0
"""Largest ``expect_timeout_s`` a script may ask for, in seconds."""

MAX_WAITS_PER_TURN = 120
"""Most ``wait`` calls the scripted model answers for one turn, whatever the deadline: a safety net
against a client whose waits return at once. (A wait on the guest agent lasts at least its 0.3 s
quiet time plus a screenshot, so 120 waits outlast the default deadline.) The runner lets the SDK
make this many extra requests per turn that has expectations."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


Rgb = Annotated[str, Field(pattern=r"^#[0-9a-fA-F]{6}$")]


class _Region(_Strict):
    x: int = Field(ge=0, description="left edge of the region, model px")
    y: int = Field(ge=0, description="top edge of the region, model px")
    w: int = Field(ge=1, le=100_000, description="width of the region, model px")
    h: int = Field(ge=1, le=100_000, description="height of the region, model px")
    tolerance: int = Field(16, ge=0, le=255, description="largest difference in any RGB channel (0-255) that "
                                                          "still counts as the same colour")


class ColorExpectation(_Region):
    """At least ``fraction`` of the region's pixels are within ``tolerance`` of ``rgb`` in every channel
    (a control has this colour: a focus ring, a selection, an active title bar)."""

    kind: Literal["color"]
    rgb: Rgb = Field(description="the colour, `#rrggbb`")
    fraction: float = Field(0.9, gt=0, le=1, description="least share (0-1] of the region's pixels that must pass")


class NotColorExpectation(_Region):
    """At least ``fraction`` of the region's pixels differ from ``rgb`` by more than ``tolerance`` in some
    channel (something, such as text, now stands on a plain background)."""

    kind: Literal["not_color"]
    rgb: Rgb = Field(description="the colour, `#rrggbb`")
    fraction: float = Field(0.05, gt=0, le=1, description="least share (0-1] of the region's pixels that must pass")


class ChangedExpectation(_Region):
    """At least ``fraction`` of the region's pixels differ by more than ``tolerance`` in some channel from
    the same region of the screenshot the previous script turn was answered on (that turn's actions
    have shown). Not allowed on the first turn."""

    kind: Literal["changed"]
    fraction: float = Field(0.01, gt=0, le=1, description="least share (0-1] of the region's pixels that must pass")


class MatchesExpectation(_Region):
    """The region still shows what ``png`` shows (the same region of a recorded screenshot), by the screen
    comparison rule (`wire/screen_match.py`): at least ``fraction`` of its pixels are within
    ``tolerance`` in every channel of the recorded ones (what ``desktop-sandbox replay`` expects before each
    step; the defaults are the rule's)."""

    kind: Literal["matches"]
    png: str = Field(min_length=1, max_length=2 * MAX_REGION_PNG_BYTES,
                     description="the region as it was recorded: a base64 PNG of exactly `w` x `h` px")
    tolerance: int = Field(MatchRule().tolerance, ge=0, le=255,
                           description="largest difference in any RGB channel (0-255) that still counts as the "
                                       "same colour")
    fraction: float = Field(round(1 - MatchRule().max_changed, 6), gt=0, le=1,
                            description="least share (0-1] of the region's pixels that must pass")

    def reference(self) -> Image.Image:
        """The recorded region (RGB). Raises ValueError when ``png`` is not a PNG of ``w`` x ``h`` px."""
        img = decode_crop(self.png)
        if img.size != (self.w, self.h):
            raise ValueError(f"png is {img.width}x{img.height}, the region {self.w}x{self.h}")
        return img


Expectation = Annotated[Union[ColorExpectation, NotColorExpectation, ChangedExpectation, MatchesExpectation],
                        Field(discriminator="kind")]
KINDS = (ColorExpectation, NotColorExpectation, ChangedExpectation, MatchesExpectation)


class Retry(_Strict):
    """``expect_retry``: actions the scripted model sends again while the turn's expectations do not
    hold, as a live model would redo a step that did not take (a paste that found no selection yet)."""

    after_s: float = Field(gt=0, le=MAX_TIMEOUT_S,
                           description="seconds of waiting (times the sandbox's `time_scale`) after the turn's first "
                                       "`wait`, and after each retry, before the actions are sent again")
    actions: list[dict[str, Any]] = Field(min_length=1, max_length=32,
                                          description="the actions sent instead of a `wait` then; make them "
                                                      "idempotent (e.g. clear the line before typing again)")


class TurnExpectations(_Strict):
    """The expectation fields of one script turn."""

    expect: list[Expectation] = Field(min_length=1, max_length=32,
                                      description="conditions on the latest screenshot; all must hold before the "
                                                  "turn is answered")
    expect_timeout_s: float = Field(DEFAULT_TIMEOUT_S, gt=0, le=MAX_TIMEOUT_S,
                                    description="seconds the scripted model answers `wait` while they do not hold, "
                                                "counted from its first `wait` for the turn; then the run ends "
                                                "`failed`")
    expect_retry: Optional[Retry] = Field(None, description="`{after_s, actions}`: every `after_s` (times the "
                                                            "sandbox's `time_scale`) of waiting, send these actions "
                                                            "instead of a `wait` (a step redone, e.g. a paste that "
                                                            "found no selection yet); make them idempotent")


class TurnTimeout(_Strict):
    """``expect_timeout_s`` alone, on a browser turn without ``expect``: the deadline of its element
    targets (the same field, bounds and default as :class:`TurnExpectations`)."""

    expect_timeout_s: float = TurnExpectations.model_fields["expect_timeout_s"]


TURN_FIELDS = frozenset(TurnExpectations.model_fields)
"""The turn keys of the screen expectations: ``expect``, ``expect_timeout_s``, ``expect_retry``."""


# -- expectations on the request's input: what the conversation carries from earlier turns -----------

MAX_INPUT_TEXT = 4096
"""Longest ``text`` of an input expectation (characters)."""


class UserMessageExpectation(_Strict):
    """An earlier user message of the request's input (one before its last user message: a message of an
    earlier turn of the conversation) has a text part holding `text`."""

    kind: Literal["user_message"]
    text: str = Field(min_length=1, max_length=MAX_INPUT_TEXT,
                      description="the text to find, a substring (case-sensitive)")


class AssistantMessageExpectation(_Strict):
    """An assistant message of the request's input (an earlier answer of the model) has an `output_text`
    part holding `text`."""

    kind: Literal["assistant_message"]
    text: str = Field(min_length=1, max_length=MAX_INPUT_TEXT,
                      description="the text to find, a substring (case-sensitive)")


class CallExpectation(_Strict):
    """The request's input has the call `call_id` (a `computer_call` or `function_call`, e.g. `call_0001`
    of an earlier turn) and its output (`computer_call_output` or `function_call_output`)."""

    kind: Literal["call"]
    call_id: str = Field(min_length=1, max_length=200, description="the call's id")


InputExpectation = Annotated[Union[UserMessageExpectation, AssistantMessageExpectation, CallExpectation],
                             Field(discriminator="kind")]
INPUT_KINDS = (UserMessageExpectation, AssistantMessageExpectation, CallExpectation)


class TurnInput(_Strict):
    """The input expectations of one script turn."""

    expect_input: list[InputExpectation] = Field(
        min_length=1, max_length=32,
        description="conditions on the request's input items (the conversation so far), checked before the turn is "
                    "answered; one that does not hold ends the run `failed` at once (waiting cannot add an earlier "
                    "item)")


INPUT_FIELD = "expect_input"
"""The turn key of the input expectations."""

_KNOWN_KEYS = {name for model in (TurnExpectations, Retry, *KINDS, TurnInput, *INPUT_KINDS)
               for name in model.model_fields}


def parse_turn(turn: dict[str, Any]) -> TurnExpectations | None:
    """The turn's expectations, or None when it has neither ``expect`` nor ``expect_timeout_s``.

    Raises ValueError with one line naming the field (``expect[1].rgb: ...``): an unknown kind or
    field, a wrong type (no coercion), a value out of range, ``expect_timeout_s`` without ``expect``.
    """
    data = {k: turn[k] for k in TURN_FIELDS if k in turn}
    if not data:
        return None
    try:
        parsed = TurnExpectations.model_validate(data)
    except ValidationError as exc:
        tags = {"expect": tuple(m.model_fields["kind"].annotation.__args__[0] for m in KINDS)}
        raise ValueError(describe_validation_error(exc, known_keys=_KNOWN_KEYS, tags=tags)) from None
    for i, exp in enumerate(parsed.expect):
        if exp.kind == "matches":
            try:
                exp.reference()
            except ValueError as exc:
                raise ValueError(f"expect[{i}].png: {exc}") from None
    return parsed


def parse_input(turn: dict[str, Any]) -> list[UserMessageExpectation | AssistantMessageExpectation
                                                 | CallExpectation] | None:
    """The turn's input expectations (``expect_input``), or None without them. Raises ValueError with one
    line naming the field (``expect_input[0].text: ...``) as :func:`parse_turn` does."""
    if INPUT_FIELD not in turn:
        return None
    try:
        return TurnInput.model_validate({INPUT_FIELD: turn[INPUT_FIELD]}).expect_input
    except ValidationError as exc:
        tags = {INPUT_FIELD: tuple(m.model_fields["kind"].annotation.__args__[0] for m in INPUT_KINDS)}
        raise ValueError(describe_validation_error(exc, known_keys=_KNOWN_KEYS, tags=tags)) from None


def timeout_s(turn: dict[str, Any]) -> float:
    """The turn's ``expect_timeout_s`` (seconds, before the sandbox's ``time_scale``), its default when
    left out. Raises ValueError (one line naming the field) when it is not valid."""
    data = {"expect_timeout_s": turn["expect_timeout_s"]} if "expect_timeout_s" in turn else {}
    try:
        return TurnTimeout.model_validate(data).expect_timeout_s
    except ValidationError as exc:
        raise ValueError(describe_validation_error(exc, known_keys=_KNOWN_KEYS)) from None


def describe(exp: ColorExpectation | NotColorExpectation | ChangedExpectation | MatchesExpectation) -> str:
    """What ``exp`` asks for, one line: ``color #1d5fd1 +-16 in >=90% of 80x70 at (400,225)`` (model px)."""
    where = f"{exp.w}x{exp.h} at ({exp.x},{exp.y})"
    share = f">={exp.fraction * 100:g}%"
    if exp.kind == "changed":
        return f"changed by more than {exp.tolerance} in {share} of {where} since the previous turn"
    if exp.kind == "matches":
        return f"matches the recorded screen +-{exp.tolerance} in {share} of {where}"
    return f"{exp.kind} {exp.rgb.lower()} +-{exp.tolerance} in {share} of {where}"


def describe_input(exp: UserMessageExpectation | AssistantMessageExpectation | CallExpectation) -> str:
    """What ``exp`` asks for, one line: ``an earlier user message holds 'first'`` (escaped, cut)."""
    if exp.kind == "call":
        return f"call {clean(exp.call_id, 200)} and its output in the input"
    who = "an earlier user message" if exp.kind == "user_message" else "an assistant message"
    return f"{who} holds {clean(exp.text, 200)!r}"


def _texts(item: dict[str, Any], part_type: str) -> list[str]:
    """The texts of a message item: its ``content`` when a string, else its parts of ``part_type``."""
    content = item.get("content")
    if isinstance(content, str):
        return [content]
    if not isinstance(content, list):
        return []
    return [part["text"] for part in content if isinstance(part, dict) and part.get("type") == part_type
            and isinstance(part.get("text"), str)]


def _is_message(item: Any, role: str) -> bool:
    return isinstance(item, dict) and item.get("role") == role and item.get("type", "message") == "message"


def check_input(exp: UserMessageExpectation | AssistantMessageExpectation | CallExpectation,
                items: list[Any]) -> Outcome:
    """Check ``exp`` on a request's ``input`` items (Responses input items, as sent). ``observed`` says
    what the input holds instead (the last 80 characters of each text, escaped; at most 8 texts)."""
    if exp.kind == "call":
        calls = [str(item.get("call_id")) for item in items if isinstance(item, dict)
                 and item.get("type") in ("computer_call", "function_call")]
        outputs = {str(item.get("call_id")) for item in items if isinstance(item, dict)
                   and item.get("type") in ("computer_call_output", "function_call_output")}
        held = exp.call_id in calls and exp.call_id in outputs
        seen = [f"{clean(c, 40)}{'' if c in outputs else ' (no output)'}" for c in calls[-8:]]
        return Outcome(held, None, f"calls: {', '.join(seen) or 'none'}")
    if exp.kind == "user_message":
        users = [item for item in items if _is_message(item, "user")]
        texts = [text for item in users[:-1] for text in _texts(item, "input_text")]
        where = "earlier user messages"
    else:
        texts = [text for item in items if _is_message(item, "assistant") for text in _texts(item, "output_text")]
        where = "assistant messages"
    held = any(exp.text in text for text in texts)
    # the end of each text: a first message is the instructions, then what the person wrote
    seen = [repr(clean(text if len(text) <= 80 else "..." + text[-77:], 80)) for text in texts[-8:]]
    return Outcome(held, None, f"{where}: {', '.join(seen) or 'none'}")


@dataclass(frozen=True)
class Outcome:
    """One expectation checked against one screenshot.

    ``held``: it holds; ``share``: the share (0-1) of the region's pixels that passed (None when it
    could not be measured); ``observed``: what was seen, one line; ``possible``: False when it can
    never hold on this image (the region reaches outside it), so waiting is pointless.
    """

    held: bool
    share: float | None
    observed: str
    possible: bool = True


def decode_image(url: str) -> Image.Image:
    """The RGB image of a ``data:image/png|jpeg;base64,`` URL.

    Raises ValueError (one line) for anything else or bytes Pillow cannot read.
    """
    if not isinstance(url, str) or not url.startswith("data:image/") or ";base64," not in url:
        raise ValueError("screenshot is not a base64 data URL")
    try:
        data = base64.b64decode(url.partition(",")[2], validate=True)
        with Image.open(io.BytesIO(data)) as img:
            return img.convert("RGB")
    except (binascii.Error, ValueError, OSError, Image.DecompressionBombError) as exc:
        raise ValueError(f"screenshot cannot be decoded: {exc}") from None


def _rgb(text: str) -> tuple[int, int, int]:
    return int(text[1:3], 16), int(text[3:5], 16), int(text[5:7], 16)


def _channel_max(diff: Image.Image) -> Image.Image:
    """Per pixel, the largest of the three channel differences (an ``L`` image)."""
    r, g, b = diff.split()
    return ImageChops.lighter(ImageChops.lighter(r, g), b)


def _share_above(diff: Image.Image, tolerance: int) -> float:
    """Share of pixels whose largest channel difference is above ``tolerance``."""
    hist = _channel_max(diff).histogram()
    total = sum(hist)
    return sum(hist[tolerance + 1:]) / total if total else 0.0


def _dominant(region: Image.Image) -> str:
    """``most common #rrggbb 62%``: the region's most frequent colour and its share."""
    colors = region.getcolors(maxcolors=region.width * region.height) or []
    if not colors:
        return "no pixels"
    count, rgb = max(colors)
    return f"most common #{rgb[0]:02x}{rgb[1]:02x}{rgb[2]:02x} {count / (region.width * region.height):.0%}"


def _inside(exp: Any, image: Image.Image) -> bool:
    return exp.x + exp.w <= image.width and exp.y + exp.h <= image.height


def check(exp: ColorExpectation | NotColorExpectation | ChangedExpectation | MatchesExpectation, image: Image.Image,
          baseline: Image.Image | None = None) -> Outcome:
    """Check ``exp`` on ``image`` (RGB, model px); ``baseline`` is the earlier screenshot ``changed``
    compares with. Never raises for image content: a region outside the image, or a ``changed``
    without a baseline of the same size, is an outcome that can never hold."""
    if not _inside(exp, image):
        return Outcome(False, None, f"the region reaches outside the {image.width}x{image.height} image",
                       possible=False)
    box = (exp.x, exp.y, exp.x + exp.w, exp.y + exp.h)
    region = image.crop(box)
    if exp.kind == "matches":
        share = 1.0 - changed_share(exp.reference(), region, exp.tolerance)
        return Outcome(share >= exp.fraction, share, f"{share:.1%} of the region as recorded ({_dominant(region)})")
    if exp.kind == "changed":
        if baseline is None:
            return Outcome(False, None, "no earlier screenshot to compare with", possible=False)
        if baseline.size != image.size:
            return Outcome(False, None, f"the earlier screenshot is {baseline.width}x{baseline.height}, this one "
                                        f"{image.width}x{image.height}", possible=False)
        share = _share_above(ImageChops.difference(region, baseline.crop(box)), exp.tolerance)
        return Outcome(share >= exp.fraction, share, f"{share:.1%} of the region changed")
    diff = ImageChops.difference(region, Image.new("RGB", region.size, _rgb(exp.rgb)))
    off = _share_above(diff, exp.tolerance)
    share = 1.0 - off if exp.kind == "color" else off
    what = "within" if exp.kind == "color" else "further than"
    return Outcome(share >= exp.fraction, share,
                   f"{share:.1%} {what} {exp.tolerance} of {exp.rgb.lower()} ({_dominant(region)})")


# -- the reference in docs/ARCHITECTURE.md ---------------------------------------------------------

def _default(field: Any) -> str:
    return "required" if field.is_required() else f"`{field.default!r}`".replace("'", '"')


def reference_markdown() -> str:
    """The expectation reference, rendered from the models above: the screen expectations, then the
    input expectations (markdown; docs/ARCHITECTURE.md carries it between ``<!-- expect-reference -->``
    markers)."""
    lines = ["| turn field | default | meaning |", "|---|---|---|"]
    for name, field in TurnExpectations.model_fields.items():
        lines.append(f"| `{name}` | {_default(field)} | {field.description} |")
    lines += ["", "| kind | holds when |", "|---|---|"]
    for model in KINDS:
        kind = model.model_fields["kind"].annotation.__args__[0]
        doc = " ".join((model.__doc__ or "").split()).replace("``", "`")
        lines.append(f"| `{kind}` | {doc} |")
    lines += ["", "| expectation field | kinds | default | meaning |", "|---|---|---|---|",
              "| `kind` | all | required | " + ", ".join(
                  f"`{m.model_fields['kind'].annotation.__args__[0]}`" for m in KINDS) + " |"]
    names: list[str] = []
    for model in KINDS:
        names += [n for n in model.model_fields if n not in names and n != "kind"]
    for name in names:
        models = [m for m in KINDS if name in m.model_fields]
        kinds = ", ".join(f"`{m.model_fields['kind'].annotation.__args__[0]}`" for m in models)
        defaults = sorted({_default(m.model_fields[name]) for m in models})
        if len(defaults) > 1:
            defaults = [" / ".join(f"{_default(m.model_fields[name])} "
                                   f"(`{m.model_fields['kind'].annotation.__args__[0]}`)" for m in models)]
        lines.append(f"| `{name}` | {kinds} | {defaults[0]} | {models[0].model_fields[name].description} |")
    field = TurnInput.model_fields[INPUT_FIELD]
    lines += ["", "| turn field | default | meaning |", "|---|---|---|",
              f"| `{INPUT_FIELD}` | {_default(field)} | {field.description} |",
              "", "| input kind | fields | holds when |", "|---|---|---|"]
    for model in INPUT_KINDS:
        kind = model.model_fields["kind"].annotation.__args__[0]
        fields = "; ".join(f"`{n}`: {model.model_fields[n].description}" for n in model.model_fields if n != "kind")
        doc = " ".join((model.__doc__ or "").split())
        lines.append(f"| `{kind}` | {fields} | {doc} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":  # pragma: no cover - a helper for editing the docs
    print(reference_markdown(), end="")
