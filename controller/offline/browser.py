"""Browser turns of the offline script (contract 3): the SDK's structured browser tools, scripted.

A browser turn ``{"browser": [{"member": "click", "arguments": {...}}, ...]}`` becomes one response
with one ``function_call`` per entry, named ``browser_<member>``, its arguments a JSON string. The
vocabulary is the SDK's own (:mod:`openai.lib.browser`): the members are those of ``BROWSER_MEMBERS``
the guest agent serves (:data:`SERVED`) and each member's argument schema is the one its
``BrowserToolset(...).tools`` declares to the model, read from the SDK here (never copied), then the
SDK's own run-time argument check and the agent's argument model (``wire.browser_tools``) on top, so
a script line the SDK or the agent would refuse when it runs is refused when the script is loaded.
A script loaded for a task (:func:`controller.offline.script.load_task_script`) may call only the
task's members.

``tab_id`` may be left out where the SDK's schema lets it be null (it is sent as null: the active
tab). A ``target`` may be an element description ``{"label": "...", "role": "..."}`` (``role``
optional, one of the SDK's read roles) instead of a ref: the scripted model resolves it to the ref
of the matching element in the latest read report (a ``browser_read_page`` or ``browser_find``
output) of the conversation; see :func:`resolve`.

Everything read from a request (read reports, labels) comes from the guest's pages: untrusted, it
is matched as data and shown only through :func:`controller.text.clean`.
"""

from __future__ import annotations

import json
import re
import typing
from functools import lru_cache
from typing import Any

from openai.lib import browser as sdk
from pydantic import ValidationError

from controller.text import clean
from wire.browser_tools import ARGUMENT_MODELS, GUEST_MEMBERS

MAX_CALLS_PER_TURN = 32
"""Most entries one browser turn may hold (one ``function_call`` each)."""

MAX_LABEL_BYTES = 256
"""Longest ``label`` a target description may give, UTF-8 bytes (the SDK's own bound on element labels)."""

MEMBERS: tuple[str, ...] = tuple(sdk.BROWSER_MEMBERS)
"""Every member of the SDK's ``BrowserToolset`` (``BROWSER_MEMBERS``): the tool schemas read here."""

SERVED: tuple[str, ...] = tuple(m for m in MEMBERS if m in GUEST_MEMBERS or m == "list_tabs")
"""The members a browser turn may call: those the guest agent serves (``wire.browser_tools.GUEST_MEMBERS``)
and ``list_tabs`` (the SDK answers it from the browser's state), in the SDK's order."""

ROLES: tuple[str, ...] = typing.get_args(typing.get_type_hints(sdk.BrowserReadElement)["role"])
"""The element roles of the SDK's read reports (``BrowserReadElement.role``)."""

READ_MEMBERS = frozenset({"read_page", "find"})
"""Members whose output is a read report a target description is resolved against."""

_TARGET_FIELD = "target"
_PLACEHOLDER_REF = "ref"
_SCHEMA_KEYWORDS = frozenset({"type", "enum", "minimum", "maximum", "items", "minItems", "maxItems", "properties",
                              "required", "additionalProperties", "description"})
_JSON_TYPES: dict[str, Any] = {
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
    "array": lambda v: isinstance(v, list),
    "object": lambda v: isinstance(v, dict),
}


class _SchemaDriver:
    """Never called: a driver object exposing every SDK member, only so that ``BrowserToolset`` lists
    each member's tool schema (a toolset declares only the members its driver has)."""

    def state(self) -> dict[str, Any]:
        return {"tabs": []}


for _member in MEMBERS:
    if _member != "list_tabs":
        setattr(_SchemaDriver, _member, lambda self, action: None)


@lru_cache(maxsize=1)
def tool_schemas() -> dict[str, dict[str, Any]]:
    """Member -> the JSON schema of its arguments, as the SDK's ``BrowserToolset.tools`` declares it.

    Raises RuntimeError when the SDK's schemas use a keyword this module does not check (so a new
    SDK is noticed, not half-checked)."""
    toolset = sdk.BrowserToolset(_SchemaDriver(), members=MEMBERS, confirm=lambda ctx: False,
                                 url_policy=lambda ctx, url: False)
    schemas = {tool["name"].removeprefix("browser_"): tool["parameters"] for tool in toolset.tools}
    for member, schema in schemas.items():
        _check_keywords(schema, member)
    return schemas


def _check_keywords(schema: Any, where: str) -> None:
    if not isinstance(schema, dict) or set(schema) - _SCHEMA_KEYWORDS:
        raise RuntimeError(f"the SDK's schema of browser_{where} uses keywords this check does not know: "
                           f"{sorted(set(schema) - _SCHEMA_KEYWORDS) if isinstance(schema, dict) else schema!r}")
    if "items" in schema:
        _check_keywords(schema["items"], where)
    for sub in schema.get("properties", {}).values():
        _check_keywords(sub, where)


def _schema_error(value: Any, schema: dict[str, Any], path: str) -> str | None:
    """The first way ``value`` breaks ``schema`` (``path: what``), or None."""
    kinds = schema.get("type")
    if kinds is not None:
        kinds = [kinds] if isinstance(kinds, str) else list(kinds)
        if not any(_JSON_TYPES[k](value) for k in kinds):
            return f"{path}: expected {' or '.join(kinds)}, got {_json_type(value)}"
    if "enum" in schema and not any(value == e and type(value) is type(e) for e in schema["enum"]):
        return f"{path}: must be one of {json.dumps(schema['enum'])}, got {json.dumps(value)[:80]}"
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            return f"{path}: must be at least {schema['minimum']}, got {value}"
        if "maximum" in schema and value > schema["maximum"]:
            return f"{path}: must be at most {schema['maximum']}, got {value}"
    if isinstance(value, list):
        if "minItems" in schema and len(value) < schema["minItems"]:
            return f"{path}: needs at least {schema['minItems']} items, got {len(value)}"
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            return f"{path}: takes at most {schema['maxItems']} items, got {len(value)}"
        for i, item in enumerate(value):
            problem = _schema_error(item, schema.get("items", {}), f"{path}[{i}]")
            if problem:
                return problem
    if isinstance(value, dict) and ("properties" in schema or "required" in schema):
        properties = schema.get("properties", {})
        if schema.get("additionalProperties") is False:
            extra = sorted(set(value) - set(properties))
            if extra:
                return f"{path}.{extra[0]}: unknown field (takes {', '.join(properties) or 'no fields'})"
        for name in schema.get("required", []):
            if name not in value:
                return f"{path}.{name}: required"
        for name, sub in properties.items():
            if name in value:
                problem = _schema_error(value[name], sub, f"{path}.{name}")
                if problem:
                    return problem
    return None


def _json_type(value: Any) -> str:
    for name in ("null", "boolean", "integer", "number", "string", "array", "object"):
        if _JSON_TYPES[name](value):
            return name
    return type(value).__name__


def _nullable(schema: dict[str, Any], name: str) -> bool:
    kinds = schema.get("properties", {}).get(name, {}).get("type")
    return kinds == "null" or (isinstance(kinds, list) and "null" in kinds)


def is_description(target: Any) -> bool:
    """True when ``target`` is an element description (an object), not a ref (a string) or null."""
    return isinstance(target, dict)


def described_targets(entries: list[dict[str, Any]]) -> list[tuple[int, dict[str, Any]]]:
    """``(entry index, description)`` for each entry of a (valid) browser turn whose target is an
    element description."""
    return [(i, e["arguments"][_TARGET_FIELD]) for i, e in enumerate(entries)
            if is_description(e.get("arguments", {}).get(_TARGET_FIELD))]


def validate_entries(entries: Any, where: str) -> None:
    """Raise ValueError (``where: browser[i]...: what``, one line) unless ``entries`` is a valid
    ``browser`` list: 1..:data:`MAX_CALLS_PER_TURN` objects ``{member, arguments}``, each member one of
    :data:`SERVED`, its arguments as the SDK's schema and run-time check and the guest agent's argument
    model accept them (with ``tab_id`` left out where it may be null, and element descriptions where a
    ``target`` is taken)."""
    if not isinstance(entries, list) or not entries:
        raise ValueError(f"{where}: browser must be a non-empty list of calls")
    if len(entries) > MAX_CALLS_PER_TURN:
        raise ValueError(f"{where}: browser holds {len(entries)} calls; a turn takes at most {MAX_CALLS_PER_TURN}")
    schemas = tool_schemas()
    for i, entry in enumerate(entries):
        at = f"{where}: browser[{i}]"
        if not isinstance(entry, dict):
            raise ValueError(f"{at}: a call must be an object {{member, arguments}}")
        extra = sorted(set(entry) - {"member", "arguments"})
        if extra:
            raise ValueError(f"{at}.{extra[0]}: unknown field (a call takes member, arguments)")
        member = entry.get("member")
        if isinstance(member, str) and member in schemas and member not in SERVED:
            raise ValueError(f"{at}.member: {member!r} is a member of the SDK's BrowserToolset the guest agent "
                             f"does not serve (served: {', '.join(SERVED)})")
        if not isinstance(member, str) or member not in schemas:
            raise ValueError(f"{at}.member: unknown member {json.dumps(member)[:80]} (one of: {', '.join(SERVED)})")
        arguments = entry.get("arguments")
        if not isinstance(arguments, dict):
            raise ValueError(f"{at}.arguments: required, an object")
        checked = dict(arguments)
        if is_description(checked.get(_TARGET_FIELD)) and _TARGET_FIELD in schemas[member].get("properties", {}):
            _validate_description(checked[_TARGET_FIELD], f"{at}.arguments.{_TARGET_FIELD}")
            checked[_TARGET_FIELD] = _PLACEHOLDER_REF
        checked = fill_defaults(member, checked)
        problem = _schema_error(checked, schemas[member], f"{at}.arguments")
        if problem:
            raise ValueError(problem)
        try:
            sdk._arguments(member, json.dumps(checked))  # the SDK's run-time check: unique keys, region order ...
        except sdk.BrowserError as exc:
            raise ValueError(f"{at}.arguments{_field_problem(member, checked) or ''}: refused by the SDK's own "
                             f"check: {exc}") from None
        problem = _field_problem(member, checked)
        if problem:  # what the agent refuses at run time (contract 9's limits), refused at load instead
            raise ValueError(f"{at}.arguments{problem}: refused by the guest agent's check")


def _field_problem(member: str, arguments: dict[str, Any]) -> str | None:
    """``.field (rule)`` for the first argument the agent's own model of ``member``
    (``wire.browser_tools.ARGUMENT_MODELS``) refuses, or None."""
    model = ARGUMENT_MODELS.get(member)
    if model is None:
        return None
    try:
        model.model_validate(arguments)
    except ValidationError as exc:
        first = exc.errors(include_input=False, include_url=False)[0]
        loc = ".".join(str(part) for part in first.get("loc", ()))
        return f".{loc} ({clean(str(first.get('msg', 'invalid')), 200)})" if loc else None
    return None


def _validate_description(target: dict[str, Any], at: str) -> None:
    extra = sorted(set(target) - {"label", "role"})
    if extra:
        raise ValueError(f"{at}.{extra[0]}: unknown field (an element description takes label, role)")
    label = target.get("label")
    if not isinstance(label, str) or not label.strip():
        raise ValueError(f"{at}.label: required, a non-empty string")
    if len(label.encode("utf-8")) > MAX_LABEL_BYTES:
        raise ValueError(f"{at}.label: longer than {MAX_LABEL_BYTES} UTF-8 bytes (no element label is)")
    if "role" in target and target["role"] not in ROLES:
        raise ValueError(f"{at}.role: must be one of {json.dumps(list(ROLES))}, got {json.dumps(target['role'])[:80]}")


def fill_defaults(member: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """``arguments`` with ``tab_id`` set to null when it is left out and the member's schema lets it be
    null (the active tab); everything else as given."""
    schema = tool_schemas()[member]
    if "tab_id" not in arguments and _nullable(schema, "tab_id"):
        return {**arguments, "tab_id": None}
    return dict(arguments)


def describe(target: dict[str, Any]) -> str:
    """``textbox labelled "Name"`` (``element labelled ...`` without a role): a description, one line."""
    return f"{target.get('role', 'element')} labelled \"{clean(target['label'])}\""


# -- reading the request: the SDK's function_call_output items ------------------------------------

def output_payload(item: dict[str, Any]) -> dict[str, Any] | None:
    """The JSON payload ``{ok, state, result|error}`` of a browser ``function_call_output`` item as
    the SDK sends it (its first ``input_text`` part; a plain string output is read the same way), or
    None when it holds none."""
    output = item.get("output")
    text = output if isinstance(output, str) else None
    if isinstance(output, list) and output and isinstance(output[0], dict) and output[0].get("type") == "input_text":
        text = output[0].get("text")
    if not isinstance(text, str):
        return None
    try:
        payload = json.loads(text)
    except (ValueError, RecursionError):
        return None
    return payload if isinstance(payload, dict) else None


def output_images(item: dict[str, Any]) -> list[str]:
    """The ``input_image`` URLs of a ``function_call_output`` (a browser screenshot or zoom)."""
    output = item.get("output")
    if not isinstance(output, list):
        return []
    return [part["image_url"] for part in output if isinstance(part, dict) and part.get("type") == "input_image"
            and isinstance(part.get("image_url"), str)]


_DOCUMENT_CHANGES = frozenset({"navigation", "tab_switched", "tab_closed"})


def _sequence(payload: dict[str, Any]) -> int | None:
    observation = (payload.get("state") or {}).get("observation") if isinstance(payload.get("state"), dict) else None
    sequence = observation.get("sequence") if isinstance(observation, dict) else None
    return sequence if isinstance(sequence, int) and not isinstance(sequence, bool) else None


def _changes(payload: dict[str, Any]) -> list[dict[str, Any]]:
    state = payload.get("state")
    observation = state.get("observation") if isinstance(state, dict) else None
    changes = observation.get("changes") if isinstance(observation, dict) else None
    return [c for c in changes if isinstance(c, dict)] if isinstance(changes, list) else []


def latest_read(items: list[Any]) -> tuple[list[dict[str, Any]] | None, str]:
    """The elements of the conversation's latest read report, and what was seen (one line).

    The latest ``function_call_output`` of a ``browser_read_page`` or ``browser_find`` call counts; its
    elements are None when that output holds no report (it failed, or is malformed), when there is
    none, or when a later browser output's observation reports that the document changed after it
    (a ``navigation``, ``tab_switched`` or ``tab_closed`` with a later sequence): its refs are stale."""
    names: dict[str, str] = {}
    read: dict[str, Any] | None = None
    after: list[dict[str, Any]] = []
    for item in items:
        if not isinstance(item, dict):
            continue
        if item.get("type") == "function_call" and isinstance(item.get("call_id"), str):
            names[item["call_id"]] = str(item.get("name", ""))
        elif item.get("type") == "function_call_output":
            name = names.get(str(item.get("call_id")), "")
            payload = output_payload(item)
            if name.removeprefix("browser_") in READ_MEMBERS and name.startswith("browser_"):
                read, after = payload or {}, []
            elif read is not None and payload is not None:
                after.append(payload)
    if read is None:
        return None, "no read report in the conversation"
    result = read.get("result")
    elements = result.get("elements") if isinstance(result, dict) else None
    if read.get("ok") is not True or not isinstance(elements, list):
        return None, "the latest read report failed: " + clean(read.get("error", "no elements"))
    since = _sequence(read)
    if since is not None and any(
            c.get("type") in _DOCUMENT_CHANGES and isinstance(c.get("sequence"), int) and c["sequence"] > since
            for payload in after for c in _changes(payload)):
        return None, "the document changed after the latest read report"
    return [e for e in elements if isinstance(e, dict)], f"{len(elements)} elements in the latest read report"


def resolve(target: dict[str, Any], elements: list[dict[str, Any]]) -> str | None:
    """The ref of the element ``target`` describes, or None.

    Among the elements of ``target``'s role (any role without one), the first whose label equals
    ``target["label"]``; failing that, the first whose label contains it, case-insensitively
    (``casefold``). Elements without a string ref or label are skipped."""
    wanted = target["label"]
    candidates = [e for e in elements if isinstance(e.get("ref"), str) and isinstance(e.get("label"), str)
                  and ("role" not in target or e.get("role") == target["role"])]
    for element in candidates:
        if element["label"] == wanted:
            return element["ref"]
    folded = wanted.casefold()
    for element in candidates:
        if folded in element["label"].casefold():
            return element["ref"]
    return None


def observed_labels(target: dict[str, Any], elements: list[dict[str, Any]], limit: int = 8) -> str:
    """What the report held for ``target``'s role, escaped for display: ``labels seen: "A", "B" (+3 more)``."""
    labels = [e["label"] for e in elements if isinstance(e.get("label"), str)
              and ("role" not in target or e.get("role") == target["role"])]
    if not labels:
        return f"no {target.get('role', 'element')} in the latest read report ({len(elements)} elements)"
    shown = ", ".join(f'"{clean(label, 60)}"' for label in labels[:limit])
    more = f" (+{len(labels) - limit} more)" if len(labels) > limit else ""
    return f"no label matches; {target.get('role', 'element')} labels seen: {shown}{more}"


BROWSER_CALL = re.compile(r"^call_(\d{4,})_b(\d{2,})$")
"""Call ids of a browser turn's entries: ``call_NNNN_bKK`` (script turn NNNN, entry KK, from 0)."""

READ_CALL = re.compile(r"^call_(\d{4,})_read_(\d{3,})$")
"""Call ids of the ``browser_read_page`` re-reads for a turn's element targets: ``call_NNNN_read_MMM``."""
