"""The offline scripted Responses server: a stand-in model for runs without an API key.

It answers ``POST /v1/responses`` with valid Response JSON, one scripted turn per request, and
listens on 127.0.0.1 only. Script format (contract, JSONL, one model turn a line):

- ``{"actions": [...], "pending_safety_checks": [{"id","code","message"}]}`` -> one GA
  ``computer_call`` with batched ``actions``;
- ``{"action": {...}, "pending_safety_checks": [...]}`` -> the legacy single-``action`` form;
- ``{"message": "..."}`` -> the final assistant message.

Optional per line: ``"usage": null`` leaves usage out of that response (the run record then marks
the token total incomplete). Coordinates in the script are model px, exactly as a live model sends.

Each line is checked when the script is loaded, so a typo is reported with its line rather than as a
failed run: actions have a known ``type`` and only that type's fields, coordinates and scroll amounts
are integers (coordinates non-negative), keys are lists of strings, and pending safety checks are
``{"id", "code"?, "message"?}`` with string (or null) values. Whether a point lies inside the model
image is known only at run time; the driver refuses it then.

The turn to answer is derived from the request itself (the number of ``computer_call_output``
items in its input), so the server is stateless across runs. Like the real API, it refuses a
request whose ``computer_call_output`` does not acknowledge exactly the pending safety checks of
its call (ids, codes and messages, in order), or whose screenshot is not a well-formed
``data:image/png|jpeg;base64,`` URL whose bytes match the mime. Refusals are HTTP 400
``{"error": {"code", "message", "param", "type"}}``.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import socket
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse


IMAGE_TOKENS = 1105


class ScriptError(ValueError):
    """A script line is not a valid model turn (contract 3)."""


def load_script(path: str | Path) -> list[dict[str, Any]]:
    """Read a JSONL script; blank lines and lines starting with ``//`` are skipped.

    Raises :class:`ScriptError` naming the file (and the line) for anything that is not a valid turn,
    and for files that cannot be read or are not UTF-8.
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ScriptError(f"{path}: not UTF-8 text (byte {exc.start})") from None
    except OSError as exc:
        raise ScriptError(f"{path}: cannot read: {exc.strerror or exc}") from None
    turns: list[dict[str, Any]] = []
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if not stripped or stripped.startswith("//"):
            continue
        try:
            turn = json.loads(stripped)
        except json.JSONDecodeError as exc:
            raise ScriptError(f"{path}:{number}: {exc}") from None
        except RecursionError:
            raise ScriptError(f"{path}:{number}: JSON nested too deeply") from None
        validate_turn(turn, where=f"{path}:{number}")
        turns.append(turn)
    if not turns:
        raise ScriptError(f"{path}: empty script")
    return turns


def validate_turn(turn: Any, where: str = "turn") -> None:
    """Raise :class:`ScriptError` unless ``turn`` is one of the three contract shapes."""
    if not isinstance(turn, dict):
        raise ScriptError(f"{where}: a turn must be a JSON object")
    kinds = [k for k in ("actions", "action", "message") if k in turn]
    if len(kinds) != 1:
        raise ScriptError(f"{where}: a turn needs exactly one of actions, action, message")
    allowed = {kinds[0], "usage", "comment"} | ({"pending_safety_checks"} if kinds[0] != "message" else set())
    extra = set(turn) - allowed
    if extra:
        raise ScriptError(f"{where}: unknown fields {sorted(extra)}")
    if kinds[0] == "actions" and (not isinstance(turn["actions"], list) or not turn["actions"]):
        raise ScriptError(f"{where}: actions must be a non-empty list")
    if kinds[0] == "action" and not isinstance(turn["action"], dict):
        raise ScriptError(f"{where}: action must be an object")
    if kinds[0] == "message" and not isinstance(turn["message"], str):
        raise ScriptError(f"{where}: message must be a string")
    if "usage" in turn and turn["usage"] is not None:
        raise ScriptError(f"{where}: usage may only be null (leave usage out of that response)")
    actions = turn["actions"] if kinds[0] == "actions" else [turn["action"]] if kinds[0] == "action" else []
    for i, action in enumerate(actions):
        _validate_action(action, f"{where}: action {i}")
    checks = turn.get("pending_safety_checks", [])
    if not isinstance(checks, list):
        raise ScriptError(f"{where}: pending_safety_checks must be a list")
    for check in checks:
        if not isinstance(check, dict) or not isinstance(check.get("id"), str):
            raise ScriptError(f"{where}: each pending safety check needs a string id")
        extra = set(check) - {"id", "code", "message"}
        if extra:
            raise ScriptError(f"{where}: unknown pending safety check fields {sorted(extra)}")
        for name in ("code", "message"):
            if check.get(name) is not None and not isinstance(check[name], str):
                raise ScriptError(f"{where}: pending safety check {name} must be a string or null")


# Fields of each Responses computer action (required, optional), as the SDK validates them.
_ACTION_FIELDS: dict[str, tuple[set[str], set[str]]] = {
    "click": ({"x", "y", "button"}, {"keys"}),
    "double_click": ({"x", "y"}, {"keys"}),
    "drag": ({"path"}, {"keys"}),
    "keypress": ({"keys"}, set()),
    "move": ({"x", "y"}, {"keys"}),
    "scroll": ({"x", "y", "scroll_x", "scroll_y"}, {"keys"}),
    "type": ({"text"}, set()),
    "wait": (set(), set()),
    "screenshot": (set(), set()),
}
_BUTTONS = {"left", "right", "wheel", "back", "forward"}


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _validate_point(x: Any, y: Any, where: str) -> None:
    if not (_is_int(x) and _is_int(y)):
        raise ScriptError(f"{where}: coordinates must be integers (model px), got ({x!r}, {y!r})")
    if x < 0 or y < 0:
        raise ScriptError(f"{where}: coordinates must not be negative, got ({x}, {y})")


def _validate_action(action: Any, where: str) -> None:
    """Raise :class:`ScriptError` unless ``action`` is a well-formed Responses computer action."""
    if not isinstance(action, dict):
        raise ScriptError(f"{where}: an action must be a JSON object")
    kind = action.get("type")
    if kind not in _ACTION_FIELDS:
        raise ScriptError(f"{where}: unknown action type {kind!r} (one of {', '.join(_ACTION_FIELDS)})")
    required, optional = _ACTION_FIELDS[kind]
    missing = required - set(action)
    if missing:
        raise ScriptError(f"{where}: {kind} needs {sorted(missing)}")
    extra = set(action) - required - optional - {"type"}
    if extra:
        raise ScriptError(f"{where}: unknown fields for {kind}: {sorted(extra)}")
    if "x" in required:
        _validate_point(action["x"], action["y"], where)
    if kind == "click" and action["button"] not in _BUTTONS:
        raise ScriptError(f"{where}: button must be one of {sorted(_BUTTONS)}, got {action['button']!r}")
    if kind == "scroll":
        for name in ("scroll_x", "scroll_y"):
            if not _is_int(action[name]):
                raise ScriptError(f"{where}: {name} must be an integer, got {action[name]!r}")
    if kind == "drag":
        path = action["path"]
        if not isinstance(path, list) or len(path) < 2:
            raise ScriptError(f"{where}: drag path must list at least two points")
        for point in path:
            if not isinstance(point, dict) or set(point) != {"x", "y"}:
                raise ScriptError(f"{where}: drag path points must be {{x, y}}, got {point!r}")
            _validate_point(point["x"], point["y"], where)
    keys = action.get("keys")
    if keys is not None and (not isinstance(keys, list) or not all(isinstance(k, str) for k in keys)):
        raise ScriptError(f"{where}: keys must be a list of strings")
    if kind == "keypress" and not keys:
        raise ScriptError(f"{where}: keypress keys must not be empty")
    if kind == "type" and not isinstance(action["text"], str):
        raise ScriptError(f"{where}: type text must be a string")


def _error(status: int, code: str, message: str, param: str | None = None) -> JSONResponse:
    return JSONResponse(
        {"error": {"code": code, "message": message, "param": param, "type": "invalid_request_error"}},
        status_code=status,
    )


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


class ScriptedModel:
    """Turns requests into scripted responses. ``requests`` keeps every request body received."""

    def __init__(self, turns: list[dict[str, Any]], *, model: str = "scripted-computer-use") -> None:
        for i, turn in enumerate(turns):
            validate_turn(turn, where=f"turn {i}")
        self.turns = turns
        self.model = model
        self.requests: list[dict[str, Any]] = []
        self.errors: list[dict[str, Any]] = []
        self._lock = threading.Lock()

    def _call_ids(self, index: int) -> tuple[str, str]:
        return f"cu_{index:04d}_{uuid.uuid4().hex[:8]}", f"call_{index:04d}"

    def answer(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """Return (HTTP status, JSON body) for one ``POST /v1/responses`` request body."""
        with self._lock:
            self.requests.append(body)
        problem = self._validate_request(body)
        if problem is not None:
            status, payload = 400, {"error": {"code": problem[0], "message": problem[1], "param": None,
                                              "type": "invalid_request_error"}}
            with self._lock:
                self.errors.append(payload["error"])
            return status, payload
        items = body.get("input", [])
        items = items if isinstance(items, list) else []
        index = sum(1 for item in items if isinstance(item, dict) and item.get("type") == "computer_call_output")
        if index >= len(self.turns):
            payload = {"error": {"code": "script_exhausted", "param": None, "type": "invalid_request_error",
                                 "message": f"the script has {len(self.turns)} turns; turn {index} was requested"}}
            with self._lock:
                self.errors.append(payload["error"])
            return 400, payload
        return 200, self._response(index, self.turns[index], body)

    def _validate_request(self, body: dict[str, Any]) -> tuple[str, str] | None:
        tools = body.get("tools")
        if not isinstance(tools, list) or len(tools) != 1 or not isinstance(tools[0], dict) or \
                tools[0].get("type") not in ("computer", "computer_use_preview"):
            return "invalid_tools", "exactly one computer tool is required"
        if body.get("stream"):
            return "unsupported", "streaming is not supported by the scripted server"
        items = body.get("input")
        if isinstance(items, str):
            return None  # a plain user message: the first turn
        if not isinstance(items, list):
            return "invalid_input", "input must be a string or a list of items"
        calls: dict[str, dict[str, Any]] = {}
        for item in items:
            if not isinstance(item, dict):
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

    def _response(self, index: int, turn: dict[str, Any], body: dict[str, Any]) -> dict[str, Any]:
        item_id, call_id = self._call_ids(index)
        if "message" in turn:
            output: list[dict[str, Any]] = [{
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


def create_app(model: ScriptedModel) -> FastAPI:
    """The FastAPI app: ``POST /v1/responses`` and ``GET /livez``; anything else is 404 JSON."""
    app = FastAPI(title="scripted responses", openapi_url=None, docs_url=None, redoc_url=None)

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

    Use as a context manager; ``base_url`` is ``http://127.0.0.1:<port>/v1`` for ``openai.OpenAI``.
    """

    def __init__(self, model: ScriptedModel, port: int = 0) -> None:
        self.model = model
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", port))
        self.port = self._sock.getsockname()[1]
        config = uvicorn.Config(create_app(model), log_level="warning", access_log=False, lifespan="off")
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
