"""The offline script (contract 3): a JSONL file, one model turn a line, loaded and checked before
any sandbox starts, so a typo is reported with its file and line rather than as a failed run.

Each turn is one of the four contract shapes (``actions``, the legacy single ``action``, ``browser``
or ``message``), with the optional ``pending_safety_checks`` (computer turns), ``usage`` (null only),
``comment`` (a string), screen expectations and input expectations (``expect_input``), both in
:mod:`controller.offline.expectations`. A script answers a conversation of several user messages (an
Agents API session): the turns of the first message up to and including the first ``message`` turn,
then those of the second message up to the next ``message`` turn, and so on. Actions follow
the action schema in its model form (:func:`wire.actions.parse_action`) with no negative coordinate
(model px); whether a point lies inside the model image is known only at run time. Browser calls
follow the SDK's own tool schemas (:mod:`controller.offline.browser`). A script larger than
:data:`MAX_SCRIPT_BYTES` is refused unread.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from controller.offline import browser as br
from controller.offline import expectations as ex
from controller.model.errors import DesktopSandboxError
from controller.validation import lone_surrogate, read_input_or_raise
from wire.actions import ActionInvalid, first_outside, parse_action

MAX_SCRIPT_BYTES = 16 * 1024 * 1024
"""Largest script file read (bytes)."""


class ScriptError(DesktopSandboxError, ValueError):
    """A script line is not a valid model turn (contract 3)."""


def load_script(path: str | Path, *, tools: Sequence[str] | None = None,
                browser_members: Sequence[str] = ()) -> list[dict[str, Any]]:
    """Read a JSONL script; blank lines and lines starting with ``//`` are skipped.

    ``tools`` (``[model] tools``: ``computer``, ``browser``) and ``browser_members`` (the task's
    ``BrowserToolset`` members): when given, every turn must call only those, as the scripted model's
    requests declare only them (:func:`load_task_script` passes a task's). ``None``: not checked.

    Raises :class:`ScriptError` naming the file (and the line) for anything that is not a valid turn,
    a call of a tool or member the task does not give the model, and for files that cannot be read
    or are not UTF-8.
    """
    text = read_input_or_raise(path, MAX_SCRIPT_BYTES, ScriptError)
    turns: list[dict[str, Any]] = []
    # "\n" only: str.splitlines would also split at a U+2028, U+0085 or \x0b inside a JSON string
    for number, line in enumerate(text.split("\n"), 1):
        stripped = line.strip()
        if not stripped or stripped.startswith("//"):
            continue
        try:
            turn = json.loads(stripped)
        except json.JSONDecodeError as exc:
            raise ScriptError(f"{path}:{number}: {exc}") from None
        except RecursionError:
            raise ScriptError(f"{path}:{number}: JSON nested too deeply") from None
        except ValueError as exc:  # e.g. an integer over Python's 4300-digit conversion limit
            raise ScriptError(f"{path}:{number}: {' '.join(str(exc).split())[:200]}") from None
        if lone_surrogate(turn):
            raise ScriptError(f"{path}:{number}: a string holds a lone UTF-16 surrogate (\\ud800-\\udfff), "
                              "which no model sends and the guest refuses")
        validate_turn(turn, where=f"{path}:{number}")
        if tools is not None:
            _check_declared(turn, f"{path}:{number}", tools, browser_members)
        if not turns:
            validate_first_turn(turn, where=f"{path}:{number}")
        turns.append(turn)
    if not turns:
        raise ScriptError(f"{path}: empty script")
    return turns


def load_task_script(task: Any, path: str | Path | None = None) -> list[dict[str, Any]]:
    """The offline script of ``task`` (a :class:`controller.run.tasks.Task`): ``path``, or its
    ``[offline] script``, read by :func:`load_script` with the task's tools and browser members.
    Raises :class:`ScriptError`, or :class:`controller.run.tasks.TaskError` when the task has no
    ``[offline]`` script and no ``path`` is given."""
    members = task.browser_members if "browser" in task.model.tools else ()
    return load_script(path or task.offline_script_path(), tools=task.model.tools, browser_members=members)


def _check_declared(turn: dict[str, Any], where: str, tools: Sequence[str], members: Sequence[str]) -> None:
    """Raise :class:`ScriptError` when valid ``turn`` calls a tool not in ``tools`` or a browser member
    not in ``members``."""
    if "browser" in turn:
        if "browser" not in tools:
            raise ScriptError(f"{where}: a browser turn, but the task gives the model no browser tool "
                              f"([model] tools = {json.dumps(list(tools))})")
        needed = [(f"browser[{i}].member", call["member"]) for i, call in enumerate(turn["browser"])]
        if "expect" in turn:  # its waits are browser_screenshot calls
            needed.append(("expect", "screenshot"))
        if br.described_targets(turn["browser"]):  # a description is resolved by browser_read_page calls
            needed.append(("target (an element description)", "read_page"))
        for at, member in needed:
            if member not in members:
                raise ScriptError(
                    f"{where}: {at}: needs {member!r}, not one of the task's browser members "
                    f"({', '.join(members)}); name it in [model] browser_members (which replaces the SDK's "
                    "defaults)")
    elif ("actions" in turn or "action" in turn) and "computer" not in tools:
        raise ScriptError(f"{where}: a computer turn, but the task gives the model no computer tool "
                          f"([model] tools = {json.dumps(list(tools))})")


def validate_first_turn(turn: dict[str, Any], where: str) -> None:
    """Raise :class:`ScriptError` when the first turn expects a change or earlier input: it has no
    earlier turn."""
    parsed = ex.parse_turn(turn)
    for i, exp in enumerate(parsed.expect if parsed else []):
        if exp.kind == "changed":
            raise ScriptError(f"{where}: expect[{i}]: changed needs an earlier turn to compare with; "
                              "the first turn has none")
    if ex.INPUT_FIELD in turn:
        raise ScriptError(f"{where}: {ex.INPUT_FIELD}: the first turn's request holds no earlier turn to "
                          "expect")


def validate_turn(turn: Any, where: str = "turn") -> None:
    """Raise :class:`ScriptError` unless ``turn`` is one of the four contract shapes."""
    if not isinstance(turn, dict):
        raise ScriptError(f"{where}: a turn must be a JSON object")
    kinds = [k for k in ("actions", "action", "message", "browser") if k in turn]
    if len(kinds) != 1:
        raise ScriptError(f"{where}: a turn needs exactly one of actions, action, browser, message")
    if kinds[0] == "browser":
        _validate_browser_turn(turn, where)
        return
    allowed = {kinds[0], "usage", "comment"} | ({"pending_safety_checks"} if kinds[0] != "message" else set())
    extra = set(turn) - allowed - ex.TURN_FIELDS - {ex.INPUT_FIELD}
    if extra:
        raise ScriptError(f"{where}: unknown fields {sorted(extra)}")
    try:
        expected = ex.parse_turn(turn)
        ex.parse_input(turn)
    except ValueError as exc:
        raise ScriptError(f"{where}: {exc}") from None
    if expected is not None and expected.expect_retry is not None:
        for i, action in enumerate(expected.expect_retry.actions):
            _validate_action(action, f"{where}: expect_retry.actions[{i}]")
    if kinds[0] == "actions" and (not isinstance(turn["actions"], list) or not turn["actions"]):
        raise ScriptError(f"{where}: actions must be a non-empty list")
    if kinds[0] == "action" and not isinstance(turn["action"], dict):
        raise ScriptError(f"{where}: action must be an object")
    if kinds[0] == "message" and not isinstance(turn["message"], str):
        raise ScriptError(f"{where}: message must be a string")
    if "comment" in turn and not isinstance(turn["comment"], str):
        raise ScriptError(f"{where}: comment must be a string")
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


def _validate_browser_turn(turn: dict[str, Any], where: str) -> None:
    """Raise :class:`ScriptError` unless ``turn`` is a valid browser turn: its calls as
    :func:`controller.offline.browser.validate_entries` accepts them, ``comment``, ``usage`` (null), and
    ``expect`` / ``expect_timeout_s``; ``expect_timeout_s`` alone only where a call's target is an element
    description (it bounds their re-reads). ``expect_retry`` and ``pending_safety_checks`` belong to
    computer turns."""
    extra = set(turn) - {"browser", "usage", "comment"} - ex.TURN_FIELDS - {ex.INPUT_FIELD}
    if extra:
        raise ScriptError(f"{where}: unknown fields {sorted(extra)}")
    if "expect_retry" in turn:
        raise ScriptError(f"{where}: expect_retry: only a computer turn redoes actions; a browser turn has none")
    try:
        br.validate_entries(turn["browser"], where)
    except ValueError as exc:
        raise ScriptError(str(exc)) from None
    described = br.described_targets(turn["browser"])
    try:
        ex.parse_input(turn)
        if "expect" in turn or not described:
            ex.parse_turn(turn)
        else:
            ex.timeout_s(turn)
    except ValueError as exc:
        raise ScriptError(f"{where}: {exc}") from None
    if "comment" in turn and not isinstance(turn["comment"], str):
        raise ScriptError(f"{where}: comment must be a string")
    if "usage" in turn and turn["usage"] is not None:
        raise ScriptError(f"{where}: usage may only be null (leave usage out of that response)")


def _validate_action(action: Any, where: str) -> None:
    """Raise :class:`ScriptError` (``where: what``) unless ``action`` is a Responses computer action in
    the schema's model form (:func:`wire.actions.parse_action`) with no negative coordinate."""
    try:
        parsed = parse_action(action)
    except ActionInvalid as exc:
        raise ScriptError(f"{where}: {exc}") from None
    negative = first_outside(parsed)
    if negative is not None:
        raise ScriptError(f"{where}: coordinates must not be negative (model px), got {negative}")
