"""The API's response objects, built as the openai SDK's types read them (``openai.types.beta``:
``AgentSession``, ``Turn``, the ``agent.session.*`` events, the session items). Pure functions of
plain data; every string that came from the model, a page or the guest is escaped by the caller
(:func:`controller.text.clean`) before it reaches them."""

from __future__ import annotations

import secrets
from typing import Any

from controller.model.requests import SIGN_IN, request_kind

AGENT_ID = "agent_desktop_sandbox"
"""The one agent id this server reports (there are no saved agents)."""


SPEND_CONTROL = {"consumed": None, "limit": None}
"""``AgentSession.spend_control``: no spending limit, consumption unknown (a local server spends nothing)."""


def new_id(prefix: str) -> str:
    """``prefix`` + ``_`` + 96 random bits in hex (``sess_…``, ``turn_…``, ``msg_…``)."""
    return f"{prefix}_{secrets.token_hex(12)}"


def agent(model: str, instructions: str | None, include_screenshots: bool) -> dict[str, Any]:
    """``AgentSession.agent``."""
    return {"id": AGENT_ID, "instructions": instructions, "model": model, "name": None,
            "multi_agent": {"enabled": False, "max_concurrent_subagents": None},
            "reasoning": {"effort": None, "summary": None}, "service_tier": "auto",
            "text": {"format": {"type": "text"}, "verbosity": "medium"},
            "tools": [{"type": "computer_use", "include_screenshots": include_screenshots}]}


def environment(env_id: str, access: str, domains: list[str] | None = None) -> dict[str, Any]:
    """``AgentSession.environment``: an ``openai_hosted`` environment with a desktop."""
    return {"type": "openai_hosted", "id": env_id, "capability_directories": [], "files": [],
            "network": {"access": access, "allowed_domains": list(domains or [])},
            "packages": {"npm": [], "python": [], "system": []}, "plugins": [], "skills": [],
            "container_size": "medium", "desktop": {"enabled": True}}


def turn(turn_id: str, session_id: str, *, status: str, created_at: int, started_at: int | None = None,
         completed_at: int | None = None, error: dict[str, str] | None = None) -> dict[str, Any]:
    """A ``Turn`` (status queued | in_progress | waiting | completed | failed | cancelled; ``error``:
    ``{"code", "message"}`` with a ``SessionTurnError`` code)."""
    return {"id": turn_id, "object": "agent.session.turn", "agent_id": AGENT_ID, "session_id": session_id,
            "status": status, "created_at": created_at, "started_at": started_at, "completed_at": completed_at,
            "error": error, "subagent_id": None, "usage": None}


def user_message(item_id: str, turn_id: str, text: str) -> dict[str, Any]:
    """The user's message as a session item (``AgentSessionMessage``)."""
    return {"id": item_id, "type": "message", "role": "user", "status": "completed", "turn_id": turn_id,
            "phase": None, "content": [{"type": "input_text", "text": text}]}


def assistant_message(item_id: str, turn_id: str, text: str) -> dict[str, Any]:
    """The turn's answer (``AgentSessionAssistantMessage``)."""
    return {"id": item_id, "type": "message", "role": "assistant", "status": "completed", "turn_id": turn_id,
            "phase": "final_answer", "content": [{"type": "output_text", "text": text}]}


def computer_call(item_id: str, turn_id: str, *, title: str | None, status: str,
                  shot: str | None = None) -> dict[str, Any]:
    """A ``computer_use_call`` item; ``shot``: the record's screenshot file that ends it (kept as
    ``_shot``, a private key: the stream turns it into ``output``, the item list leaves it out)."""
    item: dict[str, Any] = {"id": item_id, "type": "computer_use_call", "turn_id": turn_id, "title": title,
                            "status": status, "output": None}
    if shot is not None:
        item["_shot"] = shot
    return item


def approval_action(request: Any, turn_id: str) -> dict[str, Any]:
    """A registry request (:class:`controller.run.registry.Request`, strings escaped there) as a
    ``computer_use_approval_request`` required action: ``{"type", "request_id", "turn_id", "request":
    {"type": <its kind's api_type>, ...}}``, the ``request`` built by its kind's entry in
    :data:`controller.model.requests.REQUEST_KINDS`. An origin request is the hosted API's
    ``browser_origin_access``; a sign-in request its ``browser_authentication`` (:func:`signin_request`);
    a safety check or an action is ``safety_check`` (this server's own kind: ``checks``, ``actions``,
    ``call_id``, ``question``), answered with ``{"type": "safety_check", "decision": ...}``. A request of
    a kind outside the table is :class:`controller.model.errors.UnknownKind` (naming it), never shown
    as another kind."""
    kind = request_kind(request.kind)
    return {"type": "computer_use_approval_request", "request_id": request.id, "turn_id": turn_id,
            "request": {"type": kind.api_type, **kind.api_request(request)}}


def signin_request(request: Any) -> dict[str, Any]:
    """A sign-in request's ``request`` as the hosted API shows it (the SDK's
    ``BrowserAuthenticationRequestItemResourceRequest``): ``{"type": "browser_authentication",
    "reason", "credential_origin", "fields": [{id, label, type, required}], "options": [{id, label,
    field_ids}]}`` -- the registry's field ``kind`` left out; never a value (a request has none)."""
    kind = request_kind(SIGN_IN)
    return {"type": kind.api_type, **kind.api_request(request)}


def signin_request_item(item_id: str, request: Any, turn_id: str) -> dict[str, Any]:
    """The credential-free history item of a sign-in request (the SDK's
    ``BrowserAuthenticationRequestItemResource``): ``{"id", "type": "computer_use_approval_request",
    "request_id", "turn_id", "request": <signin_request>}``."""
    return {"id": item_id, "type": "computer_use_approval_request", "request_id": request.id, "turn_id": turn_id,
            "request": signin_request(request)}


def signin_result_item(item_id: str, request: Any, turn_id: str) -> dict[str, Any]:
    """The history item of the answer a sign-in request took (the SDK's
    ``ComputerUseApprovalRequestResultItemResource``), without values: ``{"id", "type":
    "computer_use_approval_request_result", "request_id", "turn_id", "response": {"type":
    "browser_authentication", "action": "submit", "selected_option"} | {"type": "browser_authentication",
    "action": "cancel"}}`` for a request ``submitted`` | ``cancelled``."""
    api_type = request_kind(SIGN_IN).api_type
    if request.state == "submitted":
        response: dict[str, Any] = {"type": api_type, "action": "submit", "selected_option": request.selected_option}
    else:
        response = {"type": api_type, "action": "cancel"}
    return {"id": item_id, "type": "computer_use_approval_request_result", "request_id": request.id,
            "turn_id": turn_id, "response": response}


def environment_state(env_id: str, status: str, error: str | None = None) -> dict[str, Any]:
    """``AgentSessionEnvironmentState`` (status pending | ready | failed ...)."""
    return {"id": env_id, "type": "desktop", "status": status,
            "error": None if error is None else {"code": "sandbox_error", "message": error,
                                                 "type": "environment_error"}}


def session_deleted(session_id: str) -> dict[str, Any]:
    """``AgentSessionDeleted``."""
    return {"id": session_id, "object": "agent.session.deleted", "deleted": True}


def page(data: list[dict[str, Any]], has_more: bool) -> dict[str, Any]:
    """A cursor page (``SyncCursorPage``): the SDK asks for the next one ``after`` the last item's id."""
    return {"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None, "has_more": has_more}
