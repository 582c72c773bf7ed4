"""What a request may say: the subset of the Agents API's request bodies this server honours, as
pydantic models of the SDK's own request shapes (``openai.types.beta.agents.session_create_params``,
``openai.types.beta.agent_session_input_param``) narrowed to that subset.

Anything outside the subset is refused with 400 ``unsupported`` naming it, never ignored; a body of
the wrong shape is 400 ``invalid_request`` naming the field (``param``: ``events[0].input[1].content[0].text``).
The models are strict (no coercion: ``"1"`` is no number, ``1`` no string) and forbid keys they do not
know, except that null counts as absent for every key. The subset:

* session create (:class:`CreateBody`): ``agent`` (``model``; ``instructions``; ``tools``:
  ``[{"type": "computer_use", "include_screenshots": bool}]`` only), ``environment`` (``type:
  "openai_hosted"``, ``desktop: {"enabled": true}``, ``network.access``: ``disabled`` | ``enabled`` |
  ``restricted`` with ``allowed_domains``, ``container_size: "medium"``), ``metadata`` (at most 16
  string pairs, keys 1-64 and values up to 512 characters), ``input`` (a string or user messages:
  the first turn), ``review: "none"``, ``stream: false``;
* events (:class:`EventsBody`): ``agent.session.input.message`` (user messages of ``input_text``
  parts), ``agent.session.input.computer_use_approval_request_result`` (``request_id`` and a
  ``response`` of ``{"type": TYPE, "decision": ...}`` with a type and a decision of the approval
  request kinds' table (:mod:`controller.model.requests`: ``browser_origin_access`` approve | deny |
  cancel, ``safety_check`` approve | deny), or for a sign-in request ``{"type":
  "browser_authentication", "action": "submit", "fields": [{"field_id", "value"}],
  "selected_option"?}`` | ``{"type": "browser_authentication", "action": "cancel"}``),
  ``agent.session.input.cancel``.

A refusal is built from the first error pydantic reports (one outside the subset before a malformed
one), in the terms of :func:`_refusal`: never with the value that was sent. A sign-in submit's values
are credentials: they are checked here for shape only (the registry checks them against the request,
:meth:`controller.run.registry.ApprovalRegistry.answer_signin`), and :class:`InputEvent` keeps them
out of its ``repr``. Input events are not stored: they are applied.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal, Optional, Union

from pydantic import AfterValidator, BaseModel, ConfigDict, Discriminator, Field, Tag, ValidationError
from pydantic import field_validator, model_validator
from pydantic_core import PydanticCustomError

from controller.agents_api.errors import ApiError, invalid, unsupported
from controller.model.requests import SIGN_IN as SIGN_IN_KIND
from controller.model.requests import api_answers, api_types, request_kind

MAX_TEXT = 100_000
"""Longest user message text (characters)."""
MAX_EVENTS = 16
"""Most input events in one request (and most fields in a sign-in submit)."""
OFFLINE_PREFIX = "offline:"
SIGN_IN = request_kind(SIGN_IN_KIND).api_type
"""The response type of an answer to a sign-in request."""
INVALID, UNSUPPORTED = "invalid_request", "unsupported"
"""The error codes of a refusal: the error ``type`` a model's own checks raise
(:class:`PydanticCustomError`) to choose one; every other error is :data:`INVALID`."""


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


# -- the models ----------------------------------------------------------------------------------------

def _refuse(code: str, message: str, at: str | None = None, **context: Any) -> PydanticCustomError:
    """A model's own refusal: ``code`` (:data:`INVALID` | :data:`UNSUPPORTED`), ``message`` said after
    the field's name (a template over ``context``), ``at`` a key below the field it is raised on (the
    field the refusal names)."""
    return PydanticCustomError(code, message, {**context, "at": at} if at else context)


def _text(limit: int, *, empty: bool = False) -> Any:
    """A string of at most ``limit`` characters, without NUL, not blank unless ``empty``."""

    def check(value: str) -> str:
        if len(value) > limit:
            raise _refuse(INVALID, "is longer than {limit} characters", limit=limit)
        if not empty and not value.strip():
            raise _refuse(INVALID, "must not be empty")
        if "\x00" in value:
            raise _refuse(INVALID, "must not contain NUL")
        return value

    return Annotated[str, AfterValidator(check)]


class _Subset(BaseModel):
    """A part of a request body: strict, keys outside the model refused (``unsupported``), except null
    ones (null counts as absent)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    @model_validator(mode="before")
    @classmethod
    def _absent(cls, data: Any) -> Any:
        if isinstance(data, dict):
            return {k: v for k, v in data.items() if v is not None or k in cls.model_fields}
        return data


class _Tool(_Subset):
    """``{"type": "computer_use", "include_screenshots": bool}`` (the SDK's ``AgentToolParam``)."""

    type: Literal["computer_use"]
    include_screenshots: Optional[bool] = None


class _Agent(_Subset):
    """``agent`` (the SDK's ``session_create_params.Agent``): ``model``, ``instructions``, ``tools``."""

    model: _text(4096)
    instructions: Optional[_text(MAX_TEXT, empty=True)] = None
    tools: Optional[list[_Tool]] = None

    @field_validator("tools", mode="before")
    @classmethod
    def _computer_use_only(cls, value: Any) -> Any:
        if isinstance(value, list):
            others = sorted({str(t.get("type")) if isinstance(t, dict) else "?" for t in value} - {"computer_use"})
            if others:
                raise _refuse(UNSUPPORTED, "types {types} (only computer_use)", types=", ".join(others))
        return value


class _Desktop(_Subset):
    enabled: Optional[bool] = Field(None, validate_default=True)

    @field_validator("enabled")
    @classmethod
    def _a_desktop(cls, value: Optional[bool]) -> bool:
        if value is not True:
            raise _refuse(UNSUPPORTED, "other than true (every session here is a desktop)")
        return value


class _Network(_Subset):
    """``environment.network``: ``access``, ``allowed_domains`` (``restricted`` only: 1 to 100)."""

    access: Literal["disabled", "enabled", "restricted"]
    allowed_domains: Optional[list[_text(253)]] = None
    blocked_domains: Optional[list[Any]] = None

    @field_validator("blocked_domains")
    @classmethod
    def _none_blocked(cls, value: Optional[list[Any]]) -> Optional[list[Any]]:
        if value:
            raise _refuse(UNSUPPORTED, "(only allowed_domains)")
        return value

    @model_validator(mode="after")
    def _domains_fit_access(self) -> "_Network":
        domains = self.allowed_domains or []
        if self.access != "restricted" and domains:
            raise _refuse(INVALID, "needs access \"restricted\"", at="allowed_domains")
        if self.access == "restricted" and not 1 <= len(domains) <= 100:
            raise _refuse(INVALID, "needs 1 to 100 domains with access \"restricted\"", at="allowed_domains")
        return self


class _Environment(_Subset):
    """``environment`` (the SDK's ``EnvironmentParam``, its ``openai_hosted`` desktop only)."""

    type: Optional[str] = Field(None, validate_default=True)
    desktop: Optional[_Desktop] = None
    network: Optional[_Network] = None
    container_size: Optional[str] = None

    @field_validator("type")
    @classmethod
    def _hosted(cls, value: Optional[str]) -> str:
        if value != "openai_hosted":
            raise _refuse(UNSUPPORTED, "{value} (only openai_hosted: a desktop sandbox)", value=repr(value)[:80])
        return value

    @field_validator("container_size")
    @classmethod
    def _one_size(cls, value: Optional[str]) -> Optional[str]:
        if value not in (None, "medium"):
            raise _refuse(UNSUPPORTED, "{value} (the sandbox has one size)", value=repr(value)[:80])
        return value


class _TextPart(_Subset):
    type: Literal["input_text"]
    text: _text(MAX_TEXT)


class _OtherPart(_Subset):
    """A content part of another type: outside the subset."""

    @model_validator(mode="before")
    @classmethod
    def _refused(cls, data: Any) -> Any:
        kind = data.get("type") if isinstance(data, dict) else None
        raise _refuse(UNSUPPORTED, "{kind} (only input_text)", at="type", kind=repr(kind)[:80])


def _tag_of(key: str, tags: dict[Any, str], other: str | None) -> Any:
    """A callable discriminator: the tag of ``tags`` for the value's ``key`` (``other`` for another
    value; None, a refusal, when ``other`` is None); a value that is no object goes to the first tag's
    model, which says it must be one."""

    def tag(value: Any) -> str | None:
        if not isinstance(value, dict):
            return next(iter(tags.values()))
        found = value.get(key)
        return tags.get(found, other) if isinstance(found, str) else other

    return tag


_Part = Annotated[Union[Annotated[_TextPart, Tag("~input_text")], Annotated[_OtherPart, Tag("~other")]],
                  Discriminator(_tag_of("type", {"input_text": "~input_text"}, "~other"))]


def _string_or_list(value: Any) -> str | None:
    return "~string" if isinstance(value, str) else "~list" if isinstance(value, list) else None


class _Message(_Subset):
    """A user message (the SDK's ``AgentSessionInputMessageParam``; its ``content`` may also be a string)."""

    role: Literal["user"]
    type: Optional[Literal["message"]] = None
    content: Annotated[Union[Annotated[_text(MAX_TEXT), Tag("~string")],
                             Annotated[list[_Part], Field(min_length=1), Tag("~list")]],
                       Discriminator(_string_or_list, custom_error_type=INVALID,
                                     custom_error_message="must be a string or a non-empty list")]

    def texts(self) -> list[str]:
        return [self.content] if isinstance(self.content, str) else [part.text for part in self.content]


_Messages = Annotated[Union[Annotated[_text(MAX_TEXT), Tag("~string")],
                            Annotated[list[_Message], Field(min_length=1), Tag("~list")]],
                      Discriminator(_string_or_list, custom_error_type=INVALID,
                                    custom_error_message="must be a string or a non-empty list of messages")]
"""A turn's input: a string, or user messages (the SDK's ``input``)."""


class CreateBody(_Subset):
    """A ``sessions.create`` body (the SDK's ``SessionCreateParamsNonStreaming``, narrowed)."""

    agent: Optional[_Agent] = Field(None, validate_default=True)
    environment: _Environment
    metadata: Optional[dict[str, _text(512, empty=True)]] = None
    input: Optional[_Messages] = None
    review: Optional[str] = None
    stream: Optional[Any] = None

    @field_validator("agent")
    @classmethod
    def _given(cls, value: Optional[_Agent]) -> _Agent:
        if value is None:
            raise _refuse(INVALID, "is required (agent_id, saved agents, are not supported)")
        return value

    @field_validator("metadata")
    @classmethod
    def _pairs(cls, value: Optional[dict[str, str]]) -> Optional[dict[str, str]]:
        if value is not None and len(value) > 16:
            raise _refuse(INVALID, "has more than 16 keys")
        if value is not None and not all(1 <= len(key) <= 64 for key in value):
            raise _refuse(INVALID, "keys must be 1 to 64 characters")
        return value

    @field_validator("review")
    @classmethod
    def _no_review(cls, value: Optional[str]) -> Optional[str]:
        if value not in (None, "none"):
            raise _refuse(UNSUPPORTED, "{value} (only \"none\")", value=repr(value)[:80])
        return value

    @field_validator("stream")
    @classmethod
    def _not_streamed(cls, value: Any) -> Any:
        if value is not None and value is not False:
            raise _refuse(UNSUPPORTED, "true on create (open GET /v1/agents/sessions/{id}/events instead)")
        return value


class _SignInField(_Subset):
    field_id: _text(200)
    value: str = Field(repr=False)


class _SignInSubmit(_Subset):
    """A sign-in submit (the SDK's ``AgentBrowserAuthenticationSubmitParamParam``)."""

    type: str
    action: Literal["submit"]
    fields: list[_SignInField] = Field(repr=False, max_length=MAX_EVENTS)  # the registry holds the real limit
    selected_option: Optional[_text(200)] = None


class _SignInCancel(_Subset):
    """A sign-in cancel (the SDK's ``AgentBrowserAuthenticationCancelParamParam``)."""

    type: str
    action: Literal["cancel"]
    fields: Optional[Any] = Field(None, repr=False)
    selected_option: Optional[Any] = Field(None, repr=False)

    @field_validator("fields", "selected_option")
    @classmethod
    def _left_out(cls, value: Any) -> Any:
        if value is not None:
            raise _refuse(INVALID, "is not part of a cancel (leave it out)")
        return value


class _Decision(_Subset):
    """An answer by decision word (the SDK's ``AgentBrowserOriginAccessParamParam``; this server's
    ``safety_check``): a ``type`` and a ``decision`` of the approval request kinds' table."""

    type: str
    decision: str

    @model_validator(mode="after")
    def _known(self) -> "_Decision":
        decisions = api_answers(self.type)
        if decisions is None or "submit" in decisions:
            raise _refuse(INVALID, "must be one of {types}", at="type", types=", ".join(api_types()))
        if self.decision not in decisions:
            raise _refuse(INVALID, "must be one of {decisions}", at="decision", decisions=", ".join(decisions))
        return self


def _response_tag(value: Any) -> str | None:
    """The answer's model: a sign-in submit or cancel (by ``action``; None, a refusal, for another
    action), else an answer by decision word (:class:`_Decision` checks its ``type``)."""
    if isinstance(value, dict) and value.get("type") == SIGN_IN:
        action = value.get("action")
        return {"submit": "~submit", "cancel": "~cancel"}.get(action) if isinstance(action, str) else None
    return "~decision"


_Response = Annotated[Union[Annotated[_SignInSubmit, Tag("~submit")], Annotated[_SignInCancel, Tag("~cancel")],
                            Annotated[_Decision, Tag("~decision")]],
                      Discriminator(_response_tag, custom_error_type=INVALID, custom_error_message="must be submit or cancel",
                                    custom_error_context={"at": "action"})]


class _MessageEvent(_Subset):
    type: Literal["agent.session.input.message"]
    input: _Messages


class _CancelEvent(_Subset):
    type: Literal["agent.session.input.cancel"]


class _AnswerEvent(_Subset):
    type: Literal["agent.session.input.computer_use_approval_request_result"]
    request_id: _text(200)
    response: _Response


class _ToolEvent(_Subset):
    """A function or MCP result: outside the subset."""

    @model_validator(mode="before")
    @classmethod
    def _refused(cls, data: Any) -> Any:
        raise _refuse(UNSUPPORTED, "{kind} (no function or MCP tools here)", at="type", kind=data.get("type"))


_EVENT_TAGS = {"agent.session.input.message": "~message", "agent.session.input.cancel": "~cancel",
               "agent.session.input.computer_use_approval_request_result": "~answer",
               "agent.session.input.tool_result": "~tool", "agent.session.input.mcp_approval_request_result": "~tool"}
_Event = Annotated[Union[Annotated[_MessageEvent, Tag("~message")], Annotated[_CancelEvent, Tag("~cancel")],
                         Annotated[_AnswerEvent, Tag("~answer")], Annotated[_ToolEvent, Tag("~tool")]],
                   Discriminator(_tag_of("type", _EVENT_TAGS, None), custom_error_type=INVALID,
                                 custom_error_message="is not an input event type", custom_error_context={"at": "type"})]


class EventsBody(_Subset):
    """A ``sessions.events.create`` body: ``{"events": [...]}``, 1 to :data:`MAX_EVENTS` input events
    (the SDK's ``AgentSessionInputParam``, narrowed)."""

    events: list[_Event] = Field(min_length=1, max_length=MAX_EVENTS)


# -- from a body to what the server applies ------------------------------------------------------------

_TAGS = frozenset({"~input_text", "~other", "~string", "~list", "~submit", "~cancel", "~decision",
                   "~message", "~answer", "~tool"})
"""The tags the models' discriminators put into an error's location: not fields, left out of ``param``."""
_SAID = {"missing": "is required", "string_type": "must be a string", "bool_type": "must be a boolean",
         "list_type": "must be a list", "dict_type": "must be an object", "model_type": "must be an object",
         "model_attributes_type": "must be an object"}
"""How a refusal says pydantic's own error types (after the field's name)."""


def _refusal(exc: ValidationError) -> ApiError:
    """The 400 for the first error of ``exc`` (one outside the subset first): ``unsupported`` for a key
    outside the models or a model's own :data:`UNSUPPORTED`, else ``invalid_request``; ``param`` the
    field (``events[0].response.decision``, ``body`` for the whole body). The message names the field and
    what is wrong, from this module's words only: never the value sent (a sign-in value is a
    credential)."""
    errors = exc.errors(include_url=False, include_input=False)
    error = next((e for e in errors if e["type"] in (UNSUPPORTED, "extra_forbidden")), errors[0])
    context = error.get("ctx") or {}
    param = ""
    for part in [*error["loc"], *([context["at"]] if context.get("at") else [])]:
        if isinstance(part, int):
            param += f"[{part}]"
        elif part not in _TAGS:
            param += f".{part}" if param else str(part)
    kind = error["type"]
    if kind == "extra_forbidden":
        return unsupported(param, param)
    if kind == UNSUPPORTED:
        return unsupported(f"{param} {error['msg']}", param)
    if kind == INVALID:
        said = error["msg"]
    elif kind == "literal_error":
        said = f"must be {context.get('expected', 'one of the listed values')}"
    elif kind == "too_short":
        least = context.get("min_length", 1)
        said = "must not be empty" if least == 1 else f"must have at least {least} entries"
    elif kind == "too_long":
        said = f"has more than {context.get('max_length', MAX_EVENTS)} entries"
    else:
        said = _SAID.get(kind, "is not valid")
    return invalid(f"{param or 'body'} {said}", param or "body")


def _validated(model: type[_Subset], body: Any) -> Any:
    """``body`` as ``model``; :class:`ApiError` 400 (:func:`_refusal`) otherwise."""
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        raise _refusal(exc) from None


def _joined(value: Any, param: str) -> str:
    """A turn's input (:data:`_Messages`, validated) as one text: the parts joined by blank lines, at
    most :data:`MAX_TEXT` characters (:class:`ApiError` 400 naming ``param`` otherwise)."""
    text = value if isinstance(value, str) else "\n\n".join(t for message in value for t in message.texts())
    if len(text) > MAX_TEXT:
        raise invalid(f"{param} is longer than {MAX_TEXT} characters", param)
    return text


def parse_create(body: Any) -> SessionParams:
    """A create body as :class:`SessionParams`; :class:`ApiError` 400 otherwise."""
    create: CreateBody = _validated(CreateBody, body)
    agent, env = create.agent, create.environment
    network = env.network
    return SessionParams(model=agent.model, instructions=agent.instructions,
                         include_screenshots=any(t.include_screenshots for t in agent.tools or []),
                         network=network.access if network else "disabled", metadata=dict(create.metadata or {}),
                         input=None if create.input is None else _joined(create.input, "input"),
                         domains=list(network.allowed_domains or []) if network and network.access == "restricted" else [])


def parse_events(body: Any) -> list[InputEvent]:
    """An events body (``{"events": [...]}``) as :class:`InputEvent` s, every one checked before any
    is applied; :class:`ApiError` 400 otherwise (more than one message: ``unsupported``)."""
    checked: EventsBody = _validated(EventsBody, body)
    out: list[InputEvent] = []
    for i, event in enumerate(checked.events):
        if isinstance(event, _MessageEvent):
            out.append(InputEvent("message", text=_joined(event.input, f"events[{i}].input")))
        elif isinstance(event, _CancelEvent):
            out.append(InputEvent("cancel"))
        elif isinstance(event.response, _Decision):
            out.append(InputEvent("approval", request_id=event.request_id, response_type=event.response.type,
                                  decision=event.response.decision))
        else:
            answer = event.response
            submitted = answer.fields if isinstance(answer, _SignInSubmit) else []
            out.append(InputEvent("approval", request_id=event.request_id, response_type=SIGN_IN,
                                  action=answer.action, selected_option=getattr(answer, "selected_option", None),
                                  fields=[{"field_id": f.field_id, "value": f.value} for f in submitted]))
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
