"""The offline scripted Responses server: a stand-in model for runs without an API key.

It answers ``POST /v1/responses`` with valid Response JSON, one scripted turn per request, and
listens on 127.0.0.1 only. Script format (contract, JSONL, one model turn a line):

- ``{"actions": [...], "pending_safety_checks": [{"id","code","message"}]}`` -> one GA
  ``computer_call`` with batched ``actions``;
- ``{"action": {...}, "pending_safety_checks": [...]}`` -> the legacy single-``action`` form;
- ``{"browser": [{"member", "arguments"}, ...]}`` -> one ``function_call`` per entry, named
  ``browser_<member>`` (the SDK's structured browser tools, :mod:`controller.offline.browser`), call ids
  ``call_NNNN_bKK`` (turn NNNN, entry KK from 0), ``tab_id`` null where it is left out;
- ``{"message": "..."}`` -> the final assistant message.

Optional per line: ``"usage": null`` leaves usage out of that response (the run record then marks
the token total incomplete); ``"comment"``; ``"expect": [...]`` and ``"expect_timeout_s"``, screen
expectations (:mod:`controller.offline.expectations`, the schema's one home). Coordinates in the script are
model px, exactly as a live model sends.

Screen expectations: before answering a turn that has them, the server checks each against the
latest screenshot of the request. While one does not hold it answers a ``computer_call`` with one
``wait`` action and no pending safety checks (call id ``call_NNNN_wait_MMM``: turn NNNN, wait MMM),
and checks again on the next request; these waits are not script turns. With ``expect_retry``
(``after_s``, ``actions``), every ``after_s`` (times :attr:`ScriptedModel.time_scale`) of waiting the
call carries those actions instead of the ``wait`` -- a step redone, as a live model would when it
sees that it did not take. Once the turn's
``expect_timeout_s`` has passed since its first wait (or after :data:`MAX_WAITS_PER_TURN` waits, or at
once when an expectation can never hold, e.g. its region is outside the image) it answers a final
assistant message saying so and keeps the failure in :attr:`ScriptedModel.unmet`; the runner then
ends the run ``failed``. ``on_expectation`` (optional) sees one entry per resolved turn (met, or
given up), for the run record.

Browser turns: a ``target`` given as an element description ``{"label", "role"}`` is sent as the ref
of the matching element in the latest read report of the request (:func:`controller.offline.browser.resolve`).
While one matches no element the server answers a ``browser_read_page`` call (``filter``
``interactive``; call id ``call_NNNN_read_MMM``) instead, as a live model would read the page again;
these reads are waits like the expectation waits (not script turns, :attr:`ScriptedModel.wait_allowance`)
and end the same way: after the turn's ``expect_timeout_s`` (times ``time_scale``) since the first
read, or :data:`MAX_WAITS_PER_TURN` reads, it gives up with a final message and an ``unmet`` entry
whose items have kind ``target``. A browser turn's screen expectations are checked first, on the
latest image of the request (a browser screenshot's ``input_image`` counts as a computer screenshot
does), and their waits are ``browser_screenshot`` calls. A turn's calls must be declared in the
request's tools (a computer turn: the computer tool; a browser turn: each ``browser_<member>``, with
``browser_screenshot`` for expectations and ``browser_read_page`` for element descriptions), else 400
``invalid_tools``.

Input expectations (``expect_input``, :mod:`controller.offline.expectations`): before answering a turn
that has them, the server checks each against the request's input items (an earlier user message's
text, an assistant message's text, a call and its output: what the conversation carried from earlier
turns). One that does not hold gives up at once (the final message naming it, an ``unmet`` entry whose
items have the input kind), as waiting cannot add an earlier item.

Each line is checked when the script is loaded (:mod:`controller.offline.script`).

The turn to answer is derived from the request's conversation: the request's last user message is the
conversation's Nth (an Agents API session sends one a turn), which starts at the script turn after the
(N-1)th ``message`` turn (the first at turn 0); to that come the ``computer_call_output`` items after
that user message that answer script turns (not waits) and the browser turns that
``function_call_output`` items after it answer. So the server is stateless across runs (except for
the time each turn's first wait was answered, kept by that wait's item id, and the conversations
below). A request may continue an earlier one with ``previous_response_id`` (as Agent Framework's
Responses client does): the server keeps each answered request's new input and output under the
response id it gave, and reads such a request as that chain's items followed by its own, exactly as
the real API does; nothing else about the field matters (an id it never gave is 400
``previous_response_not_found``; a request with ``"store": false`` is not kept). Like the
real API, it refuses a request whose ``computer_call_output`` does not acknowledge exactly the
pending safety checks of its call (ids, codes and messages, in order), a ``function_call_output`` for
no ``function_call`` of the conversation, or a screenshot (or a ``function_call_output``'s
``input_image``) that is not a well-formed ``data:image/png|jpeg;base64,`` URL whose bytes match the
mime; and it refuses
(``invalid_image``) a request for a turn with expectations whose screenshot it cannot decode. A request
that holds no screenshot at all (a loop that sends only the user's text first, as the Agents SDK's does)
is answered with a ``screenshot`` call, as a model asks to look before it acts.
Refusals are HTTP 400 ``{"error": {"code", "message", "param", "type"}}``.

Only its run reaches it: each :class:`ScriptedServer` makes a random key (:data:`KEY_BYTES` bytes) and
answers a request without ``Authorization: Bearer <key>`` (compared in constant time) with 401
``invalid_api_key`` in the same shape, before the script sees it (no turn is used, nothing is kept), and
only a request with the key marks its connection authenticated under the connection rules
(:mod:`wire.connections`). The key is handed to the run's client only; it is never printed or recorded.

Over 400 lines: :class:`ScriptedModel` is one state machine (turns, waits, retries, give-ups) whose
request checks mirror the real API's; split, each half would need the other's state.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import secrets
import threading
import time
import uuid
from typing import Any, Callable

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from controller.offline import browser as br
from controller.offline import expectations as ex
from controller.offline.expectations import MAX_WAITS_PER_TURN
from controller.offline.script import (  # noqa: F401 - ScriptError, load_script: re-exported
    ScriptError, load_script, validate_first_turn, validate_turn,
)
from wire.connections import ConnectionGuard, bearer_matches, listen, uvicorn_config


IMAGE_TOKENS = 1105
KEY_BYTES = 32
"""Random bytes in each server's key (``secrets.token_urlsafe``)."""


def _error_body(status: int, code: str, message: str, param: str | None = None) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, "param": param, "type": "invalid_request_error"}}


def _error(status: int, code: str, message: str, param: str | None = None) -> JSONResponse:
    return JSONResponse(_error_body(status, code, message, param), status_code=status)


def _check_data_url(url: Any) -> str | None:
    """None when url is one well-formed PNG/JPEG data URL whose bytes match the mime, else why not."""
    if not isinstance(url, str) or not url.startswith("data:"):
        return "screenshot image_url is not a data URL"
    head, sep, payload = url.partition(",")
    if not sep or head not in ("data:image/png;base64", "data:image/jpeg;base64"):
        return f"screenshot data URL header {head[:40]!r} is not image/png or image/jpeg base64"
    try:
        data = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        return "screenshot data URL payload is not valid base64"
    magic = b"\x89PNG\r\n\x1a\n" if head == "data:image/png;base64" else b"\xff\xd8\xff"
    if not data.startswith(magic):
        return "screenshot bytes do not match the data URL mime"
    return None


_WAIT_CALL = re.compile(r"^call_(\d{4,})_wait_(\d{3,})$")


class ScriptedModel:
    """Turns requests into scripted responses. ``requests`` keeps every request body received.

    ``on_expectation``: called (from the server's thread) with one dict per turn whose expectations
    were resolved -- met (``met: True``, ``waits``, ``waited_s``, ``expected``) or given up
    (``met: False`` plus ``reason``, ``timeout_s`` and ``unmet``: one ``{index, kind, expectation,
    expected, observed}`` per expectation that did not hold, regions in model px; for a browser turn's
    element descriptions, kind ``target``, ``index`` the call's place in the turn, ``expectation`` the
    description, ``observed`` what the latest read report held, escaped). Its exceptions are ignored.
    ``unmet``: the given-up entry once the scripted model gave up, else None.
    ``clock``: seconds, monotonic (tests may pass their own).
    """

    def __init__(self, turns: list[dict[str, Any]], *, model: str = "scripted-computer-use",
                 on_expectation: Callable[[dict[str, Any]], None] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        for i, turn in enumerate(turns):
            validate_turn(turn, where=f"turn {i}")
        if turns:
            validate_first_turn(turns[0], where="turn 0")
        self.turns = turns
        self.model = model
        self.requests: list[dict[str, Any]] = []
        self.errors: list[dict[str, Any]] = []
        self.on_expectation = on_expectation
        self.unmet: dict[str, Any] | None = None
        self._expect = [ex.parse_turn(turn) if "expect" in turn or "expect_timeout_s" not in turn else None
                        for turn in turns]
        self._targets = [br.described_targets(turn["browser"]) if "browser" in turn else [] for turn in turns]
        self._timeouts = [ex.timeout_s(turn) for turn in turns]
        self._inputs = [ex.parse_input(turn) for turn in turns]
        self._starts = [0] + [i + 1 for i, turn in enumerate(turns) if "message" in turn]
        """The script turn each user message of a conversation starts at: the first at turn 0, each next
        one after the ``message`` turn that answered the one before."""
        self._inputs_met: set[int] = set()  # turns whose input expectations were recorded as met
        self._clock = clock
        self.time_scale = 1.0
        """Multiplies every turn's ``expect_timeout_s`` (the sandbox's ``time_scale``: a slower guest
        gets proportionally longer to show what a turn expects)."""
        self._wait_started: dict[str, float] = {}  # first wait's item id -> clock() when it was answered
        self._retried: dict[int, float] = {}  # turn -> clock() of its last expect_retry
        self._retries: dict[int, int] = {}  # turn -> expect_retry calls sent
        self._stored: dict[str, tuple[str | None, list[Any], list[Any]]] = {}
        """Response id -> (the request's ``previous_response_id``, its own input items, the response's
        output items): one link of a conversation continued with ``previous_response_id``."""
        self._lock = threading.Lock()

    @property
    def wait_allowance(self) -> int:
        """The most ``wait`` calls this script can insert in one run (:data:`MAX_WAITS_PER_TURN` for
        each turn with expectations, and as many again for each browser turn with element descriptions,
        for its re-reads): requests a client's step limit should allow beyond the turns."""
        return MAX_WAITS_PER_TURN * (sum(1 for e in self._expect if e is not None) + sum(1 for t in self._targets if t))

    def _call_ids(self, index: int) -> tuple[str, str]:
        return f"cu_{index:04d}_{uuid.uuid4().hex[:8]}", f"call_{index:04d}"

    def answer(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """Return (HTTP status, JSON body) for one ``POST /v1/responses`` request body.

        ``requests`` keeps ``body`` as received; a body with ``previous_response_id`` is answered as the
        whole conversation it continues (see the module docstring)."""
        with self._lock:
            self.requests.append(body)
        previous = body.get("previous_response_id")
        own = body.get("input")
        if previous is not None:
            if not isinstance(previous, str):
                return self._refuse("invalid_input", "previous_response_id must be a string")
            if isinstance(own, str):
                own = [{"role": "user", "content": own}]
            if not isinstance(own, list):
                return self._refuse("invalid_input", "input must be a string or a list of items")
            earlier = self._conversation(previous)
            if earlier is None:
                return self._refuse("previous_response_not_found",
                                    f"previous response {previous[:80]!r} was not given by this server")
            body = {**body, "input": earlier + own}
        status, payload = self._answer(body)
        if status == 200 and body.get("store") is not False:
            new_items = own if isinstance(own, list) else [{"role": "user", "content": own}]
            with self._lock:
                self._stored[payload["id"]] = (previous, list(new_items), list(payload.get("output", [])))
        return status, payload

    def _conversation(self, response_id: str) -> list[Any] | None:
        """The items of the conversation that ended with response ``response_id`` (every request's
        own input, then its response's output, oldest first); None for an id this server never kept."""
        links: list[tuple[list[Any], list[Any]]] = []
        current: str | None = response_id
        with self._lock:
            while current is not None:
                link = self._stored.get(current)
                if link is None:
                    return None
                current, own, output = link
                links.append((own, output))
        return [item for own, output in reversed(links) for item in (*own, *output)]

    def _answer(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        problem = self._validate_request(body)
        if problem is not None:
            status, payload = 400, {"error": {"code": problem[0], "message": problem[1], "param": None,
                                              "type": "invalid_request_error"}}
            with self._lock:
                self.errors.append(payload["error"])
            return status, payload
        items = body.get("input", [])
        items = items if isinstance(items, list) else []
        users = [i for i, item in enumerate(items) if _is_user_message(item)]
        message = max(len(users) - 1, 0)  # which user message of the conversation this request answers
        answered = sum(1 for start in self._starts if start < len(self.turns))
        if message >= answered:
            return self._refuse("script_exhausted",
                                f"the script answers {answered} user message{'' if answered == 1 else 's'} (the "
                                "turns up to each message turn); "
                                f"this request continues user message {message + 1}")
        since = items[users[-1]:] if users else items
        index = self._starts[message] + sum(
            1 for item in since if isinstance(item, dict) and item.get("type") == "computer_call_output"
            and not _WAIT_CALL.match(str(item.get("call_id", ""))))
        index += len({match.group(1) for item in since if isinstance(item, dict)
                      and item.get("type") == "function_call_output"
                      and (match := br.BROWSER_CALL.match(str(item.get("call_id", ""))))})
        if index >= len(self.turns):
            return self._refuse("script_exhausted",
                                f"the script has {len(self.turns)} turns; turn {index} was requested")
        missing = self._undeclared(index, body)
        if missing is not None:
            return self._refuse("invalid_tools", missing)
        if self._inputs[index] is not None:
            given_up = self._input_expectations(index, self._inputs[index], items, body)
            if given_up is not None:
                return 200, given_up
        expected = self._expect[index]
        reads = [item for item in items if isinstance(item, dict) and item.get("type") == "function_call"
                 and str(item.get("call_id", "")).startswith(f"call_{index:04d}_read_")]
        if expected is not None and not reads:  # once re-reads began, the expectations had held
            try:
                answer = self._expectations(index, expected, items, body)
            except ValueError as exc:
                return self._refuse("invalid_image", str(exc))
            if answer is not None:
                return 200, answer
        if self._targets[index]:
            return 200, self._resolve(index, items, reads, body)
        return 200, self._response(index, self.turns[index], body)

    def _undeclared(self, index: int, body: dict[str, Any]) -> str | None:
        """Why turn ``index`` cannot be answered with the request's tools, or None: a computer turn needs
        the computer tool; a browser turn each ``browser_<member>`` it calls, ``browser_screenshot`` for
        its expectation waits and ``browser_read_page`` for its element descriptions."""
        turn = self.turns[index]
        tools = [t for t in body.get("tools") or [] if isinstance(t, dict)]
        if "actions" in turn or "action" in turn:
            if not any(t.get("type") in ("computer", "computer_use_preview") for t in tools):
                return f"turn {index} is a computer turn but the request declares no computer tool"
            return None
        if "browser" not in turn:
            return None
        declared = {t.get("name") for t in tools if t.get("type") == "function"}
        needed = [f"browser_{entry['member']}" for entry in turn["browser"]]
        needed += ["browser_screenshot"] if self._expect[index] is not None else []
        needed += ["browser_read_page"] if self._targets[index] else []
        absent = sorted({name for name in needed if name not in declared})
        if absent:
            return f"turn {index} calls {', '.join(absent)}, which the request's tools do not declare"
        return None

    def _resolve(self, index: int, items: list[Any], reads: list[dict[str, Any]],
                 body: dict[str, Any]) -> dict[str, Any]:
        """Browser turn ``index`` with each element description replaced by its ref in the request's
        latest read report; while one matches nothing, a ``browser_read_page`` re-read; past the turn's
        deadline (or :data:`MAX_WAITS_PER_TURN` reads) the final message that gives up."""
        turn = self.turns[index]
        elements, seen = br.latest_read(items)
        refs: dict[int, str] = {}
        misses: list[tuple[int, dict[str, Any]]] = []
        for i, target in self._targets[index]:
            ref = br.resolve(target, elements) if elements is not None else None
            if ref is None:
                misses.append((i, target))
            else:
                refs[i] = ref
        now = self._clock()
        with self._lock:
            started = self._wait_started.get(str(reads[0].get("id"))) if reads else None
        waited = round(now - started, 3) if started is not None else 0.0
        entry: dict[str, Any] = {"turn": index, "call_id": f"call_{index:04d}_b00", "waits": len(reads),
                                 "waited_s": waited}
        if not misses:
            if reads:
                self._emit({**entry, "met": True, "expected": [br.describe(t) for _, t in self._targets[index]]})
            return self._response(index, turn, body, refs=refs)
        timeout = self._timeouts[index] * self.time_scale
        reason = None
        if waited >= timeout:
            reason = f"deadline of {timeout:g}s passed"
        elif len(reads) >= MAX_WAITS_PER_TURN:
            reason = f"{MAX_WAITS_PER_TURN} reads answered"
        if reason is None:
            tab = turn["browser"][misses[0][0]]["arguments"].get("tab_id")
            number = len(reads) + 1
            ids = (f"fc_{index:04d}_r{number:03d}_{uuid.uuid4().hex[:8]}", f"call_{index:04d}_read_{number:03d}")
            if number == 1:
                with self._lock:
                    self._wait_started[ids[0]] = now
            return self._response(index, turn, body, calls=[
                (*ids, "browser_read_page",
                 {"filter": "interactive", "tab_id": tab if isinstance(tab, str) else None})])
        unmet = [{"index": i, "kind": "target", "expectation": dict(target), "expected": br.describe(target),
                  "observed": seen if elements is None else br.observed_labels(target, elements)}
                 for i, target in misses]
        return self._give_up(index, body, {**entry, "met": False, "reason": reason, "timeout_s": timeout,
                                           "unmet": unmet}, f"after {len(reads)} reads, {waited:g}s",
                             lambda u: f"browser[{u['index']}] target {u['expected']}")

    def _refuse(self, code: str, message: str) -> tuple[int, dict[str, Any]]:
        payload = {"error": {"code": code, "message": message, "param": None, "type": "invalid_request_error"}}
        with self._lock:
            self.errors.append(payload["error"])
        return 400, payload

    def _emit(self, entry: dict[str, Any]) -> None:
        if self.on_expectation is not None:
            try:
                self.on_expectation(entry)
            except Exception:  # noqa: BLE001 - recording must not break the model
                pass

    def _input_expectations(self, index: int, expected: list[Any], items: list[Any],
                            body: dict[str, Any]) -> dict[str, Any] | None:
        """None when turn ``index``'s input expectations hold on the request's ``items`` (recorded once as
        met when the turn has no screen expectations of its own to record); else the final message that
        gives up, at once: waiting cannot add an earlier item to the conversation."""
        outcomes = [ex.check_input(e, items) for e in expected]
        entry: dict[str, Any] = {"turn": index, "call_id": f"call_{index:04d}", "waits": 0, "waited_s": 0.0}
        if all(o.held for o in outcomes):
            with self._lock:
                first = index not in self._inputs_met
                self._inputs_met.add(index)
            if first and self._expect[index] is None:
                self._emit({**entry, "met": True, "expected": [ex.describe_input(e) for e in expected]})
            return None
        unmet = [{"index": i, "kind": e.kind, "expectation": e.model_dump(), "expected": ex.describe_input(e),
                  "observed": o.observed} for i, (e, o) in enumerate(zip(expected, outcomes)) if not o.held]
        return self._give_up(index, body, {**entry, "met": False, "reason": "the request's input does not hold it",
                                           "unmet": unmet}, "at once",
                             lambda u: f"{ex.INPUT_FIELD}[{u['index']}] {u['expected']}")

    def _expectations(self, index: int, expected: ex.TurnExpectations, items: list[Any],
                      body: dict[str, Any]) -> dict[str, Any] | None:
        """None when turn ``index``'s expectations hold on the request's latest screenshot (the turn is
        answered as scripted); else the response to send: a ``wait`` call, or the final message that
        gives up; a ``screenshot`` call when the request holds none. Raises ValueError for an unreadable one."""
        images, before_call = _screenshots(items)
        if not images:  # nothing to look at yet (a client that sends no first screenshot): ask for one
            return self._look(index, items, body)
        latest = ex.decode_image(images[-1])
        baseline = None
        if any(e.kind == "changed" for e in expected.expect):
            seen = before_call.get(f"call_{index - 1:04d}", 0)
            baseline = ex.decode_image(images[seen - 1]) if seen else None
        outcomes = [ex.check(e, latest, baseline) for e in expected.expect]
        waits = [item for item in items if isinstance(item, dict)
                 and item.get("type") in ("computer_call", "function_call")
                 and str(item.get("call_id", "")).startswith(f"call_{index:04d}_wait_")]
        now = self._clock()
        with self._lock:
            started = self._wait_started.get(str(waits[0].get("id"))) if waits else None
        waited = round(now - started, 3) if started is not None else 0.0
        entry: dict[str, Any] = {"turn": index, "call_id": f"call_{index:04d}", "waits": len(waits),
                                 "waited_s": waited}
        with self._lock:
            if self._retries.get(index):
                entry["retries"] = self._retries[index]
        if all(o.held for o in outcomes):
            self._emit({**entry, "met": True, "expected": [ex.describe(e) for e in expected.expect]})
            return None
        unmet = [{"index": i, "kind": e.kind, "expectation": e.model_dump(), "expected": ex.describe(e),
                  "observed": o.observed} for i, (e, o) in enumerate(zip(expected.expect, outcomes)) if not o.held]
        reason = None
        if not all(o.possible for o in outcomes):
            reason = "cannot hold on this screenshot"
        elif waited >= expected.expect_timeout_s * self.time_scale:
            reason = f"deadline of {expected.expect_timeout_s * self.time_scale:g}s passed"
        elif len(waits) >= MAX_WAITS_PER_TURN:
            reason = f"{MAX_WAITS_PER_TURN} waits answered"
        if reason is None:
            retry = expected.expect_retry
            if retry is not None and started is not None:
                with self._lock:
                    since = now - self._retried.get(index, started)
                    due = since >= retry.after_s * self.time_scale
                    if due:
                        self._retried[index] = now
                        self._retries[index] = self._retries.get(index, 0) + 1
                if due:
                    return self._wait(index, len(waits) + 1, body, now, actions=retry.actions)
            return self._wait(index, len(waits) + 1, body, now)
        return self._give_up(index, body, {**entry, "met": False, "reason": reason,
                                           "timeout_s": expected.expect_timeout_s * self.time_scale, "unmet": unmet},
                             f"after {len(waits)} waits, {waited:g}s", lambda u: f"expect[{u['index']}] {u['expected']}")

    def _look(self, index: int, items: list[Any], body: dict[str, Any]) -> dict[str, Any]:
        """A ``screenshot`` call for turn ``index`` when the request holds no screenshot (the SDK's loop
        sends only the user's text first): what a model asks for before it can act; counted as one of the
        turn's waits (same call ids), so a client that never sends one still ends within
        :data:`MAX_WAITS_PER_TURN`."""
        waits = [item for item in items if isinstance(item, dict) and item.get("type") == "computer_call"
                 and str(item.get("call_id", "")).startswith(f"call_{index:04d}_wait_")]
        if len(waits) >= MAX_WAITS_PER_TURN:
            raise ValueError(f"turn {index} has screen expectations but no screenshot came after "
                             f"{len(waits)} screenshot calls")
        legacy = any(isinstance(t, dict) and t.get("type") == "computer_use_preview" for t in body.get("tools") or [])
        if "browser" in self.turns[index]:
            return self._wait(index, len(waits) + 1, body, self._clock())
        ids = (f"cu_{index:04d}_w{len(waits) + 1:03d}_{uuid.uuid4().hex[:8]}", f"call_{index:04d}_wait_{len(waits) + 1:03d}")
        turn: dict[str, Any] = {"action": {"type": "screenshot"}} if legacy else {"actions": [{"type": "screenshot"}]}
        return self._response(index, turn, body, ids=ids)

    def _give_up(self, index: int, body: dict[str, Any], failure: dict[str, Any], spent: str,
                 name: Callable[[dict[str, Any]], str]) -> dict[str, Any]:
        """Turn ``index``'s end without its expectations (``failure``: the ``expectation`` entry, kept
        as :attr:`unmet` when it is the first): the final message naming the first unmet one
        (``name(unmet)``) and what was ``spent`` waiting."""
        with self._lock:
            if self.unmet is None:
                self.unmet = failure
        self._emit(failure)
        unmet = failure["unmet"]
        first = unmet[0]
        more = f" (and {len(unmet) - 1} more)" if len(unmet) > 1 else ""
        text = (f"scripted model gave up at turn {index} ({failure['reason']}, {spent}): "
                f"{name(first)}: observed {first['observed']}{more}")
        return self._response(index, {"message": text}, body)

    def _wait(self, index: int, number: int, body: dict[str, Any], now: float,
              actions: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        """The ``wait`` call answering turn ``index`` for the ``number``-th time (1-based); with
        ``actions`` (the turn's ``expect_retry``), a call carrying those instead, under the same call
        id scheme (the legacy single-action form only ever gets a ``wait``). A browser turn's wait is a
        ``browser_screenshot`` call (of its first call's tab)."""
        ids = (f"cu_{index:04d}_w{number:03d}_{uuid.uuid4().hex[:8]}", f"call_{index:04d}_wait_{number:03d}")
        if number == 1:
            with self._lock:
                self._wait_started[ids[0]] = now
        if "browser" in self.turns[index]:
            tab = self.turns[index]["browser"][0]["arguments"].get("tab_id")
            return self._response(index, self.turns[index], body, calls=[
                (*ids, "browser_screenshot", {"tab_id": tab if isinstance(tab, str) else None})])
        legacy = any(isinstance(t, dict) and t.get("type") == "computer_use_preview" for t in body.get("tools") or [])
        turn: dict[str, Any] = {"action": {"type": "wait"}} if legacy else {"actions": list(actions or [{"type": "wait"}])}
        return self._response(index, turn, body, ids=ids)

    def _validate_request(self, body: dict[str, Any]) -> tuple[str, str] | None:
        tools = body.get("tools")
        if not isinstance(tools, list) or not tools or not all(isinstance(t, dict) for t in tools) or \
                sum(t.get("type") in ("computer", "computer_use_preview") for t in tools) > 1 or \
                not all(t.get("type") in ("computer", "computer_use_preview", "function") for t in tools):
            return "invalid_tools", "tools must be at most one computer tool and function tools, at least one"
        if body.get("stream"):
            return "unsupported", "streaming is not supported by the scripted server"
        items = body.get("input")
        if isinstance(items, str):
            return None  # a plain user message: the first turn
        if not isinstance(items, list):
            return "invalid_input", "input must be a string or a list of items"
        calls: dict[str, dict[str, Any]] = {}
        functions: set[str] = set()
        for item in items:
            if not isinstance(item, dict):
                continue
            if item.get("type") in ("function_call", "function_call_output"):
                problem = _function_item_problem(item, functions)
                if problem is not None:
                    return problem
                continue
            if item.get("type") in ("computer_call", "computer_call_output") and \
                    not isinstance(item.get("call_id", ""), str):
                return "invalid_input", f"{item.get('type')}.call_id must be a string"
            if item.get("type") == "computer_call":
                calls[item.get("call_id", "")] = item
            elif item.get("type") == "computer_call_output":
                call = calls.get(item.get("call_id", ""))
                if call is None:
                    return "invalid_input", f"computer_call_output for unknown call_id {item.get('call_id')!r}"
                pending_raw = call.get("pending_safety_checks") or []
                acked_raw = item.get("acknowledged_safety_checks") or []
                for name, raw in (("pending_safety_checks", pending_raw), ("acknowledged_safety_checks", acked_raw)):
                    if not isinstance(raw, list) or not all(isinstance(c, dict) for c in raw):
                        return "invalid_input", f"{name} must be a list of objects"
                pending = [{"id": c.get("id"), "code": c.get("code"), "message": c.get("message")}
                           for c in pending_raw]
                acked = [{"id": c.get("id"), "code": c.get("code"), "message": c.get("message")}
                         for c in acked_raw]
                if acked != pending:
                    return ("safety_checks_not_acknowledged",
                            f"call {call.get('call_id')} acknowledged {acked} but its pending checks are {pending}")
                output = item.get("output")
                if not isinstance(output, dict) or output.get("type") != "computer_screenshot":
                    return "invalid_input", "computer_call_output.output must be a computer_screenshot"
                why = _check_data_url(output.get("image_url"))
                if why is not None:
                    return "invalid_image", why
        return None

    def _response(self, index: int, turn: dict[str, Any], body: dict[str, Any],
                  ids: tuple[str, str] | None = None, refs: dict[int, str] | None = None,
                  calls: list[tuple[str, str, str, dict[str, Any]]] | None = None) -> dict[str, Any]:
        """The Response answering turn ``index`` with ``turn``; ``ids`` (item id, call id) of its computer
        call; ``refs``: entry index -> the ref sent for a browser entry's element description; ``calls``:
        ``(item id, call id, name, arguments)`` function calls to send instead of the turn's."""
        item_id, call_id = ids or self._call_ids(index)
        if calls is None and "browser" in turn:
            calls = []
            for k, entry in enumerate(turn["browser"]):
                arguments = br.fill_defaults(entry["member"], entry["arguments"])
                if k in (refs or {}):
                    arguments["target"] = refs[k]
                calls.append((f"fc_{index:04d}_{k:02d}_{uuid.uuid4().hex[:8]}", f"call_{index:04d}_b{k:02d}",
                              f"browser_{entry['member']}", arguments))
        if calls is not None and "message" not in turn:
            output: list[dict[str, Any]] = [
                {"type": "function_call", "id": fc_id, "call_id": fc_call, "name": name,
                 "arguments": json.dumps(arguments), "status": "completed"}
                for fc_id, fc_call, name, arguments in calls]
        elif "message" in turn:
            output = [{
                "type": "message", "id": f"msg_{index:04d}_{uuid.uuid4().hex[:8]}", "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": turn["message"], "annotations": []}],
            }]
        else:
            call: dict[str, Any] = {"type": "computer_call", "id": item_id, "call_id": call_id,
                                    "status": "completed",
                                    "pending_safety_checks": list(turn.get("pending_safety_checks", []))}
            if "actions" in turn:
                call["actions"] = turn["actions"]
            else:
                call["action"] = turn["action"]
            output = [call]
        created = time.time()
        response: dict[str, Any] = {
            "id": f"resp_{index:04d}_{uuid.uuid4().hex[:12]}",
            "object": "response",
            "created_at": created,
            "completed_at": created,
            "status": "completed",
            "model": self.model,
            "output": output,
            "parallel_tool_calls": False,
            "tool_choice": "auto",
            "tools": body.get("tools", []),
            "error": None,
            "incomplete_details": None,
            "instructions": None,
            "metadata": {},
            "temperature": None,
            "top_p": None,
        }
        if turn.get("usage", True) is not None:
            # Synthetic counts: the scripted model has no tokenizer. Text is ~4 bytes a token and
            # each image counts as IMAGE_TOKENS, roughly what a high-detail screenshot costs.
            text = json.dumps(body.get("input", []))
            images = text.count("data:image/")
            text = re.sub(r"data:image/[a-z]+;base64,[A-Za-z0-9+/=]*", "", text)
            input_tokens = len(text) // 4 + images * IMAGE_TOKENS
            output_tokens = len(json.dumps(output)) // 4
            response["usage"] = {
                "input_tokens": input_tokens,
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": output_tokens,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": input_tokens + output_tokens,
            }
        return response


def _screenshots(items: list[Any]) -> tuple[list[str], dict[str, int]]:
    """The image URLs of a request's input, in order (``input_image`` parts of messages and of
    ``function_call_output`` items, ``computer_call_output`` screenshots), and for each ``computer_call``
    id (and each browser turn, as ``call_NNNN``) how many came before its call."""
    images: list[str] = []
    before_call: dict[str, int] = {}
    for item in items:
        if not isinstance(item, dict):
            continue
        if item.get("type") == "computer_call":
            before_call[str(item.get("call_id", ""))] = len(images)
        elif item.get("type") == "computer_call_output":
            output = item.get("output")
            if isinstance(output, dict) and isinstance(output.get("image_url"), str):
                images.append(output["image_url"])
        elif item.get("type") == "function_call":
            match = br.BROWSER_CALL.match(str(item.get("call_id", "")))
            if match:
                before_call.setdefault(f"call_{match.group(1)}", len(images))
        elif item.get("type") == "function_call_output":
            images += br.output_images(item)
        elif isinstance(item.get("content"), list):
            images += [part["image_url"] for part in item["content"] if isinstance(part, dict)
                       and part.get("type") == "input_image" and isinstance(part.get("image_url"), str)]
    return images, before_call


def _is_user_message(item: Any) -> bool:
    """Whether a request's input item is a user message (``role: user``; ``type`` message or left out)."""
    return isinstance(item, dict) and item.get("role") == "user" and item.get("type", "message") == "message"


def _function_item_problem(item: dict[str, Any], functions: set[str]) -> tuple[str, str] | None:
    """Why a ``function_call`` / ``function_call_output`` item is refused, as the real API refuses it
    (``(code, message)``), or None; ``functions`` collects the call ids of the calls seen so far."""
    call_id = item.get("call_id")
    if not isinstance(call_id, str):
        return "invalid_input", f"{item.get('type')}.call_id must be a string"
    if item.get("type") == "function_call":
        functions.add(call_id)
        return None
    if call_id not in functions:
        return "invalid_input", f"function_call_output for unknown call_id {call_id[:80]!r}"
    output = item.get("output")
    if isinstance(output, str):
        return None
    if not isinstance(output, list):
        return "invalid_input", "function_call_output.output must be a string or a list of content parts"
    for part in output:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "input_text" and isinstance(part.get("text"), str):
            continue
        if kind == "input_image" and "image_url" in part:
            why = _check_data_url(part["image_url"])
            if why is not None:
                return "invalid_image", why
            continue
        if kind in ("input_image", "input_file") and isinstance(part.get("file_id"), str):
            continue
        return "invalid_input", f"function_call_output part {str(kind)[:40]!r} is not a valid content part"
    return None


def create_app(model: ScriptedModel, key: str) -> FastAPI:
    """The FastAPI app: ``POST /v1/responses`` and ``GET /livez``; anything else is 404 JSON. Every
    request must carry ``Authorization: Bearer <key>``: without it (a wrong key, another header, two
    of them), 401 ``invalid_api_key`` before ``model`` sees the request."""
    app = FastAPI(title="scripted responses", openapi_url=None, docs_url=None, redoc_url=None)
    expected = key.encode()

    @app.middleware("http")
    async def authenticate(request: Request, call_next: Callable[[Request], Any]) -> Response:
        if not bearer_matches(request.scope.get("headers") or (), expected):
            return JSONResponse(_error_body(401, "invalid_api_key", "missing or incorrect API key: this server "
                                            "answers only the run that started it"),
                                status_code=401, headers={"WWW-Authenticate": "Bearer"})
        return await call_next(request)

    @app.get("/livez")
    def livez() -> dict[str, str]:
        return {"status": "ok"}

    @app.post("/v1/responses")
    async def responses(request: Request) -> JSONResponse:
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
            return _error(400, "invalid_json", "request body is not JSON (or is nested too deeply)")
        if not isinstance(body, dict):
            return _error(400, "invalid_json", "request body must be a JSON object")
        status, payload = model.answer(body)
        return JSONResponse(payload, status_code=status)

    return app


class ScriptedServer:
    """Runs :func:`create_app` with uvicorn on 127.0.0.1 (an ephemeral port unless given) in a thread.

    Use as a context manager; ``base_url`` is ``http://127.0.0.1:<port>/v1`` and ``key`` the API key
    (``secrets.token_urlsafe`` of :data:`KEY_BYTES` bytes, made here) for ``openai.OpenAI``
    (:func:`controller.run.model_client.offline_client`). Keep ``key`` out of output and records.
    """

    def __init__(self, model: ScriptedModel, port: int = 0) -> None:
        self.model = model
        self.key = secrets.token_urlsafe(KEY_BYTES)
        self._sock = listen("127.0.0.1", port)
        self.port = self._sock.getsockname()[1]
        # the connection rules (wire.connections): only a request with the key authenticates its connection
        app = ConnectionGuard(create_app(model, self.key), token=self.key, error=_error_body)
        config = uvicorn_config(app, log_level="warning", access_log=False, lifespan="off")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._sock]},
                                        name="scripted-responses", daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self, timeout_s: float = 10.0) -> "ScriptedServer":
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("scripted server did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        self._sock.close()

    def __enter__(self) -> "ScriptedServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
