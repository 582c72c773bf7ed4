"""What a request may say: the subset of the Agents API's request bodies this server honours, each
checked field by field (the SDK's ``session_create_params`` and ``agent_session_input_param``).

Anything outside the subset is refused with 400 ``unsupported`` naming it, never ignored; a body of
the wrong shape is 400 ``invalid_request`` naming the field. The subset:

* session create: ``agent`` (``model``; ``instructions``; ``tools``: ``[{"type": "computer_use",
  "include_screenshots": bool}]`` only), ``environment`` (``type: "openai_hosted"``, ``desktop:
  {"enabled": true}``, ``network.access``: ``disabled`` | ``enabled`` | ``restricted`` with
  ``allowed_domains``), ``metadata`` (at most 16
  string pairs, keys 1-64 and values up to 512 characters), ``input`` (a string or user messages:
  the first turn), ``review: "none"``, ``stream: false``; null counts as absent for optional fields;
* events: ``agent.session.input.message`` (user messages of ``input_text`` parts),
  ``agent.session.input.computer_use_approval_request_result`` (``request_id`` and a ``response`` of
  ``{"type": "browser_origin_access", "decision": approve | deny | cancel}``, for a safety check
  ``{"type": "safety_check", "decision": approve | deny}``, or for a sign-in request
  ``{"type": "browser_authentication", "action": "submit", "fields": [{"field_id", "value"}],
  "selected_option"?}`` | ``{"type": "browser_authentication", "action": "cancel"}``),
  ``agent.session.input.cancel``.

A sign-in submit's values are credentials: they are checked here for shape only (the registry checks
them against the request, :meth:`controller.run.registry.ApprovalRegistry.answer_signin`), every
refusal names the field (``events[0].response.fields[1].value``) and never holds a value, and
:class:`InputEvent` keeps them out of its ``repr``. Input events are not stored: they are applied.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from controller.agents_api.errors import invalid, unsupported

MAX_TEXT = 100_000
"""Longest user message text (characters)."""
MAX_EVENTS = 16
"""Most input events in one request."""
OFFLINE_PREFIX = "offline:"


@dataclass
class SessionParams:
    """A checked create request: ``model``, ``instructions`` (or None), ``include_screenshots``,
    ``network`` (disabled | enabled | restricted), ``metadata``, ``input`` (the first turn's text, or
    None), ``domains`` (``restricted``'s ``allowed_domains``)."""

    model: str
    instructions: str | None
    include_screenshots: bool
    network: str
    metadata: dict[str, str] = field(default_factory=dict)
    input: str | None = None
    domains: list[str] = field(default_factory=list)


@dataclass
class InputEvent:
    """A checked input event: ``type`` (message | approval | cancel); ``text`` for a message;
    ``request_id`` and ``response_type`` for an approval answer, with ``decision`` (origin access, safety
    check) or, for ``browser_authentication``, ``action`` (submit | cancel), ``fields`` (a submit's
    ``[{"field_id", "value"}]``: credentials, left out of ``repr``) and ``selected_option`` (or None)."""

    type: str
    text: str | None = None
    request_id: str | None = None
    response_type: str | None = None
    decision: str | None = None
    action: str | None = None
    fields: list[dict[str, str]] = field(default_factory=list, repr=False)
    selected_option: str | None = None


def _obj(value: Any, param: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise invalid(f"{param} must be an object", param)
    return value


def _only(obj: dict[str, Any], allowed: set[str], param: str) -> None:
    """Refuse every key of ``obj`` outside ``allowed`` whose value is not null."""
    for key, value in obj.items():
        if key not in allowed and value is not None:
            raise unsupported(f"{param}.{key}" if param else str(key), f"{param}.{key}" if param else str(key))


def _str(value: Any, param: str, *, limit: int, empty: bool = False) -> str:
    if not isinstance(value, str):
        raise invalid(f"{param} must be a string", param)
    if len(value) > limit:
        raise invalid(f"{param} is longer than {limit} characters", param)
    if not empty and not value.strip():
        raise invalid(f"{param} must not be empty", param)
    if "\x00" in value:
        raise invalid(f"{param} must not contain NUL", param)
    return value


def messages_text(value: Any, param: str) -> str:
    """A string, or a list of user messages of ``input_text`` parts, as one text (parts joined by
    blank lines)."""
    if isinstance(value, str):
        return _str(value, param, limit=MAX_TEXT)
    if not isinstance(value, list) or not value:
        raise invalid(f"{param} must be a string or a non-empty list of messages", param)
    parts: list[str] = []
    for i, message in enumerate(value):
        where = f"{param}[{i}]"
        message = _obj(message, where)
        _only(message, {"role", "content", "type"}, where)
        if message.get("type", "message") != "message":
            raise invalid(f"{where}.type must be \"message\"", f"{where}.type")
        if message.get("role") != "user":
            raise invalid(f"{where}.role must be \"user\"", f"{where}.role")
        content = message.get("content")
        if isinstance(content, str):
            parts.append(_str(content, f"{where}.content", limit=MAX_TEXT))
            continue
        if not isinstance(content, list) or not content:
            raise invalid(f"{where}.content must be a non-empty list", f"{where}.content")
        for j, part in enumerate(content):
            at = f"{where}.content[{j}]"
            part = _obj(part, at)
            if part.get("type") != "input_text":
                raise unsupported(f"{at}.type {part.get('type')!r} (only input_text)", f"{at}.type")
            _only(part, {"type", "text"}, at)
            parts.append(_str(part.get("text"), f"{at}.text", limit=MAX_TEXT))
    text = "\n\n".join(parts)
    if len(text) > MAX_TEXT:
        raise invalid(f"{param} is longer than {MAX_TEXT} characters", param)
    return text


def parse_metadata(value: Any, param: str = "metadata") -> dict[str, str]:
    """At most 16 string pairs, keys 1-64 characters, values up to 512 (the API's limits)."""
    if value is None:
        return {}
    value = _obj(value, param)
    if len(value) > 16:
        raise invalid(f"{param} has more than 16 keys", param)
    out: dict[str, str] = {}
    for key, text in value.items():
        if not 1 <= len(key) <= 64:
            raise invalid(f"{param} keys must be 1 to 64 characters", param)
        out[key] = _str(text, f"{param}.{key}", limit=512, empty=True)
    return out


def parse_create(body: Any) -> SessionParams:
    """A create body as :class:`SessionParams`; :class:`ApiError` 400 otherwise."""
    body = _obj(body, "body")
    _only(body, {"agent", "environment", "metadata", "input", "review", "stream"}, "")
    if body.get("stream") not in (None, False):
        raise unsupported("stream: true on create (open GET /v1/agents/sessions/{id}/events instead)", "stream")
    if body.get("review") not in (None, "none"):
        raise unsupported(f"review {body.get('review')!r} (only \"none\")", "review")
    agent = _obj(body.get("agent"), "agent") if body.get("agent") is not None else None
    if agent is None:
        raise invalid("agent is required (agent_id, saved agents, are not supported)", "agent")
    _only(agent, {"model", "instructions", "tools"}, "agent")
    model = _str(agent.get("model"), "agent.model", limit=4096)
    instructions = agent.get("instructions")
    if instructions is not None:
        instructions = _str(instructions, "agent.instructions", limit=MAX_TEXT, empty=True)
    tools = agent.get("tools") or []
    if not isinstance(tools, list):
        raise invalid("agent.tools must be a list", "agent.tools")
    include = False
    kinds = [t.get("type") if isinstance(t, dict) else None for t in tools]
    others = sorted({str(k) for k in kinds if k != "computer_use"})
    if others:
        raise unsupported(f"tool types {', '.join(others)} (only computer_use)", "agent.tools")
    for i, tool in enumerate(tools):
        _only(tool, {"type", "include_screenshots"}, f"agent.tools[{i}]")
        shots = tool.get("include_screenshots", False)
        if not isinstance(shots, bool):
            raise invalid(f"agent.tools[{i}].include_screenshots must be a boolean", f"agent.tools[{i}].include_screenshots")
        include = include or shots
    env = _obj(body.get("environment"), "environment")
    if env.get("type") != "openai_hosted":
        raise unsupported(f"environment.type {env.get('type')!r} (only openai_hosted: a desktop sandbox)",
                          "environment.type")
    _only(env, {"type", "desktop", "network", "container_size"}, "environment")
    desktop = env.get("desktop")
    if desktop is not None:
        desktop = _obj(desktop, "environment.desktop")
        _only(desktop, {"enabled"}, "environment.desktop")
        if desktop.get("enabled") is not True:
            raise unsupported("environment.desktop.enabled false (every session here is a desktop)",
                              "environment.desktop.enabled")
    network = env.get("network")
    access = "disabled"
    domains: list[str] = []
    if network is not None:
        network = _obj(network, "environment.network")
        _only(network, {"access", "allowed_domains", "blocked_domains"}, "environment.network")
        access = network.get("access")
        if access not in ("disabled", "enabled", "restricted"):
            raise invalid("environment.network.access must be disabled, enabled or restricted",
                          "environment.network.access")
        if network.get("blocked_domains"):
            raise unsupported("environment.network.blocked_domains", "environment.network.blocked_domains")
        allowed = network.get("allowed_domains") or []
        if access != "restricted" and allowed:
            raise invalid("environment.network.allowed_domains needs access \"restricted\"",
                          "environment.network.allowed_domains")
        if access == "restricted":
            if not isinstance(allowed, list) or not allowed or len(allowed) > 100:
                raise invalid("access \"restricted\" needs 1 to 100 allowed_domains",
                              "environment.network.allowed_domains")
            domains = [_str(d, "environment.network.allowed_domains[]", limit=253) for d in allowed]
    size = env.get("container_size")
    if size not in (None, "medium"):
        raise unsupported(f"environment.container_size {size!r} (the sandbox has one size)", "environment.container_size")
    text = None if body.get("input") is None else messages_text(body.get("input"), "input")
    return SessionParams(model=model, instructions=instructions, include_screenshots=include, network=access,
                         metadata=parse_metadata(body.get("metadata")), input=text, domains=domains)


DECISIONS = {"browser_origin_access": ("approve", "deny", "cancel"), "safety_check": ("approve", "deny")}
SIGN_IN = "browser_authentication"
"""The response type of an answer to a sign-in request."""


def _signin_response(response: dict[str, Any], where: str) -> tuple[str, list[dict[str, str]], str | None]:
    """A ``browser_authentication`` response's ``(action, fields, selected_option)``, checked for shape
    only (the SDK's ``AgentBrowserAuthenticationSubmitParam`` / ``...CancelParam``): a submit has a
    ``fields`` list of ``{"field_id": str, "value": str}`` and an optional ``selected_option`` string; a
    cancel has neither. :class:`ApiError` 400 naming the field otherwise -- never a value."""
    _only(response, {"type", "action", "fields", "selected_option"}, where)
    action = response.get("action")
    if action == "cancel":
        for key in ("fields", "selected_option"):
            if response.get(key) is not None:
                raise invalid(f"{where}.{key} is not part of a cancel (leave it out)", f"{where}.{key}")
        return "cancel", [], None
    if action != "submit":
        raise invalid(f"{where}.action must be submit or cancel", f"{where}.action")
    raw = response.get("fields")
    if not isinstance(raw, list):
        raise invalid(f"{where}.fields must be a list of {{field_id, value}} (empty: [])", f"{where}.fields")
    if len(raw) > MAX_EVENTS:  # the registry holds the real limit; this only bounds the work here
        raise invalid(f"{where}.fields has more than {MAX_EVENTS} entries", f"{where}.fields")
    fields: list[dict[str, str]] = []
    for j, entry in enumerate(raw):
        at = f"{where}.fields[{j}]"
        entry = _obj(entry, at)
        _only(entry, {"field_id", "value"}, at)
        field_id = _str(entry.get("field_id"), f"{at}.field_id", limit=200)
        value = entry.get("value")
        if not isinstance(value, str):
            raise invalid(f"{at}.value must be a string", f"{at}.value")
        fields.append({"field_id": field_id, "value": value})
    option = response.get("selected_option")
    if option is not None:
        option = _str(option, f"{where}.selected_option", limit=200)
    return "submit", fields, option


def parse_events(body: Any) -> list[InputEvent]:
    """An events body (``{"events": [...]}``) as :class:`InputEvent` s, every one checked before any
    is applied; :class:`ApiError` 400 otherwise."""
    body = _obj(body, "body")
    _only(body, {"events"}, "")
    events = body.get("events")
    if not isinstance(events, list) or not events:
        raise invalid("events must be a non-empty list", "events")
    if len(events) > MAX_EVENTS:
        raise invalid(f"at most {MAX_EVENTS} events a request", "events")
    out: list[InputEvent] = []
    for i, event in enumerate(events):
        where = f"events[{i}]"
        event = _obj(event, where)
        kind = event.get("type")
        if kind == "agent.session.input.message":
            _only(event, {"type", "input"}, where)
            out.append(InputEvent("message", text=messages_text(event.get("input"), f"{where}.input")))
        elif kind == "agent.session.input.cancel":
            _only(event, {"type"}, where)
            out.append(InputEvent("cancel"))
        elif kind == "agent.session.input.computer_use_approval_request_result":
            _only(event, {"type", "request_id", "response"}, where)
            request_id = _str(event.get("request_id"), f"{where}.request_id", limit=200)
            response = _obj(event.get("response"), f"{where}.response")
            rtype = response.get("type")
            if rtype == SIGN_IN:
                action, fields, option = _signin_response(response, f"{where}.response")
                out.append(InputEvent("approval", request_id=request_id, response_type=rtype, action=action,
                                      fields=fields, selected_option=option))
                continue
            if rtype not in DECISIONS:
                raise invalid(f"{where}.response.type must be browser_origin_access, browser_authentication "
                              "or safety_check", f"{where}.response.type")
            _only(response, {"type", "decision"}, f"{where}.response")
            decision = response.get("decision")
            if decision not in DECISIONS[rtype]:
                raise invalid(f"{where}.response.decision must be one of {', '.join(DECISIONS[rtype])}",
                              f"{where}.response.decision")
            out.append(InputEvent("approval", request_id=request_id, response_type=rtype, decision=decision))
        elif kind in ("agent.session.input.tool_result", "agent.session.input.mcp_approval_request_result"):
            raise unsupported(f"{where}.type {kind} (no function or MCP tools here)", f"{where}.type")
        else:
            raise invalid(f"{where}.type is not an input event type", f"{where}.type")
    if sum(1 for e in out if e.type == "message") > 1:
        raise unsupported("more than one message in a request (one turn at a time)", "events")
    return out


def offline_task_path(model: str) -> str | None:
    """The task file of an ``offline:TASK_FILE`` model, or None for another model."""
    if model.startswith(OFFLINE_PREFIX):
        return model[len(OFFLINE_PREFIX):]
    return None


def confined_task_file(model: str, tasks_dir: Path) -> Path:
    """The task file an ``offline:TASK_FILE`` model names, confined to ``tasks_dir`` (an absolute
    path without symlinks): ``TASK_FILE`` is a ``.toml`` path, relative to the working directory or
    absolute, whose real location (every symlink followed, ``..`` applied) is a regular file inside
    ``tasks_dir``. :class:`ApiError` 400 naming ``agent.model`` otherwise, saying only what is wrong
    with the path: whether something exists outside ``tasks_dir`` is never told, and nothing of a
    file is read before it is known to be inside."""
    text = offline_task_path(model) or ""
    shown = f"agent.model {model!r}"
    where = "agent.model"
    if not text.endswith(".toml"):  # only task files are read
        raise invalid(f"{shown}: an offline task is a .toml task file (e.g. offline:tasks/pickup.toml)", where)
    try:
        real = Path(os.path.realpath(text))
    except (OSError, ValueError):
        raise invalid(f"{shown}: not a path to a task file", where) from None
    if not real.is_relative_to(tasks_dir) or real == tasks_dir:
        raise invalid(f"{shown}: an offline task must be a .toml file in the server's tasks directory "
                      f"({tasks_dir}); this path leads outside it (paths are relative to the server's working "
                      f"directory, e.g. offline:tasks/pickup.toml)", where)
    try:
        mode = os.stat(real).st_mode
    except FileNotFoundError:
        raise invalid(f"{shown}: no such task file in the server's tasks directory", where) from None
    except OSError as exc:
        raise invalid(f"{shown}: cannot read this task file: {exc.strerror or 'error'}", where) from None
    if not stat.S_ISREG(mode):
        raise invalid(f"{shown}: not a regular file", where)
    return real
