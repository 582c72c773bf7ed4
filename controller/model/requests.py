"""Approval request kinds: what each kind of question to a person is, for every view of it.

A request of the run's approval registry (:class:`controller.run.registry.ApprovalRegistry`) has a
``kind``; :data:`REQUEST_KINDS` holds, per kind, everything the views need:

========================== ================= ===================== ========================== ==================
kind                       label             answers               Agents API ``type``        fields of its own
========================== ================= ===================== ========================== ==================
``safety_check``           safety check      approve, deny         ``safety_check``           --
``action``                 action            approve, deny         ``safety_check``           --
``origin_access``          origin request    approve, deny, cancel ``browser_origin_access``  --
``browser_authentication`` sign-in request   submit, cancel        ``browser_authentication`` credential_origin,
                                                                                              fields, options,
                                                                                              selected_option,
                                                                                              submitted_fields
========================== ================= ===================== ========================== ==================

* **answers**: what a person may answer. Decision words (``approve``, ``deny``, ``cancel``) go through
  :meth:`ApprovalRegistry.answer`; a kind answered ``submit`` / ``cancel`` is answered with a filled
  form (:attr:`RequestKind.form`, :meth:`ApprovalRegistry.answer_signin`). The console shows one
  button per answer; the terminal's default (an empty line) is ``deny``.
* **label**: how the terminal and the console name the kind (one line, plain text).
* **Agents API**: a pending request is a ``computer_use_approval_request`` required action whose
  ``request`` is ``{"type": api_type, **api_request(request)}``, and an answer to it must carry
  ``response.type`` ``api_type`` (contract 7). Kinds that share an ``api_type`` share their answers.
* **fields**: the request fields only this kind has; the request's JSON (what the console and
  ``GET /runs/{id}/approvals`` serve) holds them for this kind only.

A kind outside the table is an error (:class:`UnknownKind` from :func:`request_kind`), never a
default. :func:`check_request_kinds` checks the table when this module is imported (and again for
each :func:`register_request_kind`): a bad entry stops the import with
:class:`IncompleteVocabulary` naming it.

Pure: the ``api_request`` builders read attributes of the request they are given (the registry's
:class:`Request`; every string in it already escaped there) and do no I/O.
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from controller.model.errors import IncompleteVocabulary, UnknownKind

SAFETY_CHECK = "safety_check"
"""A computer_call's pending safety checks."""
ACTION = "action"
"""One action asked about under ``--confirm-actions`` / ``--step``."""
ORIGIN_ACCESS = "origin_access"
"""A guest connection the gateway holds until it is answered (``[network] mode = "ask"``)."""
SIGN_IN = "browser_authentication"
"""A sign-in form of the agent's chromium, filled by a person (contract 8)."""

DECISIONS = ("approve", "deny", "cancel")
"""The decision words a decision kind's answers are drawn from (``approve`` and ``deny`` always)."""
FORM_ANSWERS = ("submit", "cancel")
"""The answers of a kind answered with a filled form."""

ApiRequest = Callable[[Any], dict[str, Any]]
"""Builds the Agents API ``request`` object of a required action from a registry request, without
its ``type`` (``{"type": RequestKind.api_type, **api_request(request)}``)."""

_NAME = re.compile(r"[a-z][a-z0-9_]{0,63}")


@dataclass(frozen=True)
class RequestKind:
    """One kind of approval request (see the module docstring).

    ``name``: the registry's ``kind``; ``label``: the terminal's and console's name for it;
    ``answers``: what a person may answer (decision words, or ``submit`` / ``cancel`` for a form);
    ``api_type``: the Agents API ``request.type`` of its required action and the ``response.type`` of
    an answer; ``api_request``: builds the rest of that ``request`` object (:data:`ApiRequest`);
    ``fields``: the request fields only this kind has (kept out of other kinds' JSON)."""

    name: str
    label: str
    answers: tuple[str, ...]
    api_type: str
    api_request: ApiRequest
    fields: tuple[str, ...] = ()

    @property
    def form(self) -> bool:
        """True when a person answers with a filled form (``submit`` / ``cancel``), not a decision word."""
        return "submit" in self.answers


def _call_request(request: Any) -> dict[str, Any]:
    """A safety check's or an action's ``request``: ``checks`` (``[{id, code, message}]``), ``actions``
    (one line per action of the call), ``call_id`` and ``question`` -- this server's own kind."""
    return {"checks": request.checks, "actions": request.actions, "call_id": request.call_id,
            "question": request.question}


def _origin_request(request: Any) -> dict[str, Any]:
    """An origin request's ``request``, the hosted API's ``browser_origin_access``: ``origin``
    (``scheme://host[:port]``) and the gateway's ``reason`` (None when it gave none)."""
    return {"origin": request.origin, "reason": request.origin_reason or None}


def _sign_in_request(request: Any) -> dict[str, Any]:
    """A sign-in request's ``request`` as the hosted API shows it (the SDK's
    ``BrowserAuthenticationRequestItemResourceRequest``): ``reason``, ``credential_origin``, ``fields``
    (``[{id, label, type, required}]``: the registry's field ``kind`` left out) and ``options``
    (``[{id, label, field_ids}]``); never a value (a request has none)."""
    return {"reason": request.question or None, "credential_origin": request.credential_origin or None,
            "fields": [{"id": f["id"], "label": f["label"], "type": f["type"], "required": bool(f["required"])}
                       for f in request.fields],
            "options": [{"id": o["id"], "label": o["label"], "field_ids": list(o["field_ids"])}
                        for o in request.options]}


REQUEST_KINDS: dict[str, RequestKind] = {kind.name: kind for kind in (
    RequestKind(SAFETY_CHECK, "safety check", ("approve", "deny"), "safety_check", _call_request),
    RequestKind(ACTION, "action", ("approve", "deny"), "safety_check", _call_request),
    RequestKind(ORIGIN_ACCESS, "origin request", ("approve", "deny", "cancel"), "browser_origin_access",
                _origin_request),
    RequestKind(SIGN_IN, "sign-in request", FORM_ANSWERS, "browser_authentication", _sign_in_request,
                fields=("credential_origin", "fields", "options", "selected_option", "submitted_fields")),
)}
"""Every approval request kind, by name (see the module docstring). Changed only through
:func:`register_request_kind`."""

_changing = threading.Lock()


def check_request_kinds(table: Mapping[str, RequestKind]) -> None:
    """Check that the entries of ``table`` fit together; :class:`IncompleteVocabulary` naming the first
    entry that does not: a name that is not its key (or not ``[a-z][a-z0-9_]*``, at most 64
    characters), an empty or repeated label, answers that are not a form's ``submit, cancel`` nor
    decision words with ``approve`` and ``deny``, a missing ``api_type`` or builder, two kinds with one
    ``api_type`` but different answers, a form kind whose ``api_type`` a decision kind uses too."""
    labels: dict[str, str] = {}
    by_type: dict[str, RequestKind] = {}
    for key, kind in table.items():
        where = f"approval request kinds: {key!r}"
        if not isinstance(kind, RequestKind):
            raise IncompleteVocabulary(f"{where} is not a RequestKind")
        if kind.name != key or not _NAME.fullmatch(key):
            raise IncompleteVocabulary(f"{where} is filed under another name ({kind.name!r}) or is not a "
                                       "lower-case name of letters, digits and _")
        if not kind.label.strip() or "\n" in kind.label or kind.label in labels:
            raise IncompleteVocabulary(f"{where} has an empty, multi-line or repeated label {kind.label!r}"
                                       + (f" (also {labels[kind.label]!r}'s)" if kind.label in labels else ""))
        labels[kind.label] = key
        answers = kind.answers
        if len(set(answers)) != len(answers) or not (
                set(answers) == set(FORM_ANSWERS)
                or ({"approve", "deny"} <= set(answers) and set(answers) <= set(DECISIONS))):
            raise IncompleteVocabulary(f"{where} has answers {answers!r}: a form's {FORM_ANSWERS!r}, or "
                                       f"approve and deny and optionally cancel")
        if not kind.api_type or not callable(kind.api_request):
            raise IncompleteVocabulary(f"{where} has no Agents API type or no builder for its required action")
        other = by_type.setdefault(kind.api_type, kind)
        if other is not kind and set(other.answers) != set(answers):
            raise IncompleteVocabulary(f"{where} shares the Agents API type {kind.api_type!r} with "
                                       f"{other.name!r} but not its answers")
        if not all(isinstance(f, str) and f for f in kind.fields):
            raise IncompleteVocabulary(f"{where} has a field name that is not a string")


check_request_kinds(REQUEST_KINDS)


def request_kind(name: Any) -> RequestKind:
    """The entry of the approval request kind ``name``; :class:`UnknownKind` (naming it and the known
    kinds) for any other name or a value that is not a string."""
    kind = REQUEST_KINDS.get(name) if isinstance(name, str) else None
    if kind is None:
        raise UnknownKind(name, REQUEST_KINDS, "approval request kind")
    return kind


def api_answers(api_type: Any) -> tuple[str, ...] | None:
    """The answers an Agents API answer of ``response.type`` ``api_type`` may give (a decision kind's
    decision words, a form kind's ``submit`` / ``cancel``), or None when no kind has that type."""
    for kind in list(REQUEST_KINDS.values()):
        if kind.api_type == api_type:
            return kind.answers
    return None


def api_types() -> list[str]:
    """Every Agents API ``type`` of the table, sorted (for a refusal's message)."""
    return sorted({kind.api_type for kind in list(REQUEST_KINDS.values())})


def register_request_kind(kind: RequestKind) -> Callable[[], None]:
    """Add ``kind`` to :data:`REQUEST_KINDS` (for a kind defined outside this module, such as a test's
    throwaway one: the project's own kinds are entries of the table above). The table with it must
    pass :func:`check_request_kinds`; a name already there is refused too (both
    :class:`IncompleteVocabulary`; the table is left as it was). Returns the function that removes it
    again (a second call does nothing). Requests of the kind still open in a registry keep it: remove
    it only once they are gone."""
    with _changing:
        if kind.name in REQUEST_KINDS:
            raise IncompleteVocabulary(f"approval request kinds: {kind.name!r} is already defined")
        check_request_kinds({**REQUEST_KINDS, kind.name: kind})
        REQUEST_KINDS[kind.name] = kind

    def unregister() -> None:
        with _changing:
            if REQUEST_KINDS.get(kind.name) is kind:
                del REQUEST_KINDS[kind.name]

    return unregister
