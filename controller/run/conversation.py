"""The model conversation a run continues and the one it leaves behind.

A session (the Agents API, later MCP and the Python API) is one conversation across many runs: each run's
first request starts from the items the previous run ended with, then its own user message (the
instructions and the first screenshot). The conversation is carried as **items**, not as a
``previous_response_id``: the SDK's ``ComputerToolset`` and ``ResponsesToolRunner`` replay the complete
input history on every request (they refuse ``previous_response_id`` and ``conversation``) so that the
same loop works with response storage off, offline against the scripted server, and after the model
provider forgot a response. :class:`ConversationTail` watches the run's model exchanges (the httpx hook
of :class:`controller.run.recording.BodyMeter`) and keeps the last request's ``input`` with the last
answer's ``output``: what a next run continues from. Before a session hands it on,
:func:`continuable` cuts a call no output answers (a run cancelled or failed mid-call) and
:func:`bound_images` leaves out the screenshots of all but its last turns (placeholders instead).
"""

from __future__ import annotations

import json
import threading
from typing import Any

MAX_CONVERSATION_BYTES = 64 * 1024 * 1024
"""The most a carried conversation may weigh as JSON (bytes): past it its oldest turns are left out
(:func:`trimmed`), so a session never grows without end nor sends a request the API refuses."""


class ConversationTail:
    """The last model exchange of a run: ``observe(request_body, response_body)`` per ``/responses``
    call (bytes as sent; the answer's parsed JSON); :meth:`items` the conversation to continue from."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._input: list[Any] | None = None
        self._output: list[Any] | None = None

    def observe(self, request_body: bytes, response_body: Any) -> None:
        """Keep one exchange when it succeeded (an answer with ``output``); ignore anything else."""
        if not isinstance(response_body, dict) or not isinstance(response_body.get("output"), list):
            return
        try:
            sent = json.loads(request_body)
        except (ValueError, UnicodeDecodeError):
            return
        items = sent.get("input") if isinstance(sent, dict) else None
        if isinstance(items, str):
            items = [{"role": "user", "content": items}]
        if not isinstance(items, list):
            return
        with self._lock:
            self._input, self._output = items, response_body["output"]

    def items(self) -> list[dict[str, Any]]:
        """The conversation after the last exchange: its request's input items and its answer's output
        items, in order ([] before any exchange)."""
        with self._lock:
            if self._input is None or self._output is None:
                return []
            return [item for item in [*self._input, *self._output] if isinstance(item, dict)]


# -- what a session carries from one run to the next -------------------------------------------------

KEEP_IMAGE_TURNS = 2
"""How many of a conversation's last turns (a turn: a user message and what follows it) keep their
screenshots in :func:`bound_images`; every earlier screenshot becomes a placeholder."""
OMITTED_TEXT = "(a screenshot of an earlier turn, left out)"
"""What an ``input_image`` part of an earlier turn becomes (an ``input_text`` part)."""
OMITTED_IMAGE_URL = ("data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR42mNoaGgAAAMEAY"
                     "F1LgG8AAAAAElFTkSuQmCC")
"""What a ``computer_call_output`` screenshot of an earlier turn becomes: a 1x1 grey PNG (69 bytes), as
the API takes only an image there."""
_CALLS = {"computer_call": "computer_call_output", "function_call": "function_call_output"}


def is_user_message(item: Any) -> bool:
    """Whether ``item`` (a Responses input item) is a user message (``role: user``, ``type`` message or
    left out): where a turn of a conversation begins."""
    return isinstance(item, dict) and item.get("role") == "user" and item.get("type", "message") == "message"


def continuable(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``items`` cut before the first call no output answers (a ``computer_call`` or ``function_call``
    of a run that was cancelled or failed before the call's result went back), with the ``reasoning``
    items just before it: the Responses API refuses a request whose call has no output, and what such
    a call did to the desktop is in the next turn's first screenshot. A conversation whose calls are all
    answered comes back unchanged (the same list)."""
    answered = {item.get("call_id") for item in items if item.get("type") in _CALLS.values()}
    for index, item in enumerate(items):
        if item.get("type") in _CALLS and item.get("call_id") not in answered:
            while index and items[index - 1].get("type") == "reasoning":
                index -= 1
            return items[:index]
    return items


def bound_images(items: list[dict[str, Any]], keep_turns: int = KEEP_IMAGE_TURNS) -> list[dict[str, Any]]:
    """``items`` with the screenshots of every turn but the last ``keep_turns`` left out: an
    ``input_image`` part (of a user message or of a ``function_call_output``) becomes an ``input_text``
    part saying :data:`OMITTED_TEXT`, a ``computer_call_output``'s ``image_url`` becomes
    :data:`OMITTED_IMAGE_URL`. A turn begins at a user message (:func:`is_user_message`); the items
    before the first one count with it. Texts, calls, call ids and item ids stay as they are, so the
    model still reads every earlier turn. Items that change are copies; ``items`` is left as it is."""
    starts = [i for i, item in enumerate(items) if is_user_message(item)]
    if len(starts) <= keep_turns:
        return items
    end = starts[len(starts) - keep_turns] if keep_turns > 0 else len(items)
    return [_without_images(item) for item in items[:end]] + items[end:]


def _without_images(item: dict[str, Any]) -> dict[str, Any]:
    """``item`` with its images replaced as :func:`bound_images` says (a copy when one was)."""
    if item.get("type") == "computer_call_output":
        output = item.get("output")
        if isinstance(output, dict) and isinstance(output.get("image_url"), str) \
                and output["image_url"] != OMITTED_IMAGE_URL:
            return {**item, "output": {**output, "image_url": OMITTED_IMAGE_URL}}
        return item
    key = "output" if item.get("type") == "function_call_output" else "content"
    parts = item.get(key)
    if not isinstance(parts, list) or not any(_is_image(part) for part in parts):
        return item
    return {**item, key: [{"type": "input_text", "text": OMITTED_TEXT} if _is_image(part) else part
                          for part in parts]}


def _is_image(part: Any) -> bool:
    return isinstance(part, dict) and part.get("type") == "input_image"


def _input_item_types() -> frozenset[str]:
    """The ``type`` of every Responses input item the installed SDK declares (its
    ``ResponseInputItemParam``): what a request may carry back to the API."""
    import typing

    from openai.types.responses.response_input_item_param import ResponseInputItemParam

    names: set[str] = set()
    for member in typing.get_args(ResponseInputItemParam):
        hint = getattr(member, "__annotations__", {}).get("type")
        text = getattr(hint, "__forward_arg__", str(hint))
        names.update(part.split("'")[1] for part in text.split("Literal[")[1:] if "'" in part)
    return frozenset(names)


INPUT_ITEM_TYPES = _input_item_types()
"""Item types a conversation may carry (the SDK's input items); an answer's item of another type (a
model or server of its own making) is not carried."""
if not {"message", "computer_call", "computer_call_output", "reasoning"} <= INPUT_ITEM_TYPES:
    raise ImportError("the installed openai SDK's input items lack the computer-use ones")


def sanitized(items: list[Any]) -> list[dict[str, Any]]:
    """``items`` fit to be sent again: only objects whose ``type`` is an input item type
    (:data:`INPUT_ITEM_TYPES`; a message may leave it out), every string with a lone surrogate
    (which UTF-8 cannot carry) replaced by ``?`` where it stood. Items that change are copies."""
    kept = []
    for item in items:
        if not isinstance(item, dict) or item.get("type", "message" if "role" in item else None) not in INPUT_ITEM_TYPES:
            continue
        kept.append(_encodable(item))
    return kept


def _encodable(value: Any) -> Any:
    if isinstance(value, str):
        try:
            value.encode("utf-8")
            return value
        except UnicodeEncodeError:
            return value.encode("utf-8", "replace").decode("utf-8")
    if isinstance(value, dict):
        return {_encodable(k): _encodable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_encodable(v) for v in value]
    return value


def trimmed(items: list[dict[str, Any]], max_bytes: int = MAX_CONVERSATION_BYTES) -> list[dict[str, Any]]:
    """``items`` within ``max_bytes`` of JSON: the oldest turns (a user message and what follows it,
    :func:`is_user_message`) left out, one at a time, the last turn always kept. Unchanged (the same
    list) when it fits."""
    size = len(json.dumps(items, ensure_ascii=False).encode("utf-8", "replace"))
    if size <= max_bytes:
        return items
    starts = [i for i, item in enumerate(items) if is_user_message(item)]
    for start in starts[1:]:
        rest = items[start:]
        if len(json.dumps(rest, ensure_ascii=False).encode("utf-8", "replace")) <= max_bytes:
            return rest
    return items[starts[-1]:] if starts else items

