"""Task check kinds: what a task's ``[[checks]]`` entries may be, and the one table that lists them.

:data:`CHECK_KINDS` maps each check kind to its task-file model (a pydantic model whose ``kind`` field is
that name, so a task file naming another kind is refused at load, naming it); :data:`Check` is the
task schema's discriminated union of those models. Verification (:mod:`controller.run.verify`)
registers one runner per kind and calls :func:`check_runners` when it is imported: a kind without a
runner, or a runner without a kind, stops the import naming it (:class:`IncompleteVocabulary`).
:func:`check_kind` is the lookup for a name from elsewhere: an unknown one is :class:`UnknownKind`,
never a default.

=========== =============================================================== ========================
kind        compares                                                        model
=========== =============================================================== ========================
``file``    a guest file with ``value`` by ``match`` (exact, text, regex,  :class:`FileCheck`
            json)
``sqlite``  a read-only query's rows on a copy of a guest database          :class:`SqliteCheck`
``page``    the text of a page as the agent's chromium loads it (contract   :class:`PageCheck`
            8), by the file rules
=========== =============================================================== ========================

The models also hold the rules a task's values are checked by at load (:func:`check_guest_path`, one
read-only SQL statement, a value that fits its comparison rule). Pure: no I/O.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Annotated, Any, Callable, Literal, Mapping, Union, get_args

from pydantic import BaseModel, ConfigDict, Field, StrictStr, field_validator, model_validator

from controller import json_semantics
from controller.model.errors import IncompleteVocabulary, UnknownKind


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", protected_namespaces=())


def check_guest_path(path: str) -> str:
    """A guest path as tasks may name it: absolute, or ``~/...`` under the guest user's home.

    Raises ValueError for empty or relative paths, ``~user`` forms, NUL characters and ``..``
    segments (the agent's allowed roots are the real boundary; this keeps tasks from pointing past
    them by accident).
    """
    if not isinstance(path, str) or not path:
        raise ValueError("guest path must not be empty")
    if "\x00" in path:
        raise ValueError("guest path must not contain NUL")
    if not (path.startswith("/") or path.startswith("~/")):
        raise ValueError(f"guest path must be absolute or start with ~/: {path!r}")
    if ".." in PurePosixPath(path).parts:
        raise ValueError(f"guest path must not contain '..': {path!r}")
    return path


GuestPath = Annotated[StrictStr, Field(min_length=1)]


def _check_read_only_query(query: str) -> str:
    """One SELECT / WITH / VALUES statement (comments and one trailing ``;`` allowed), else ValueError."""
    tokens = _sql_tokens(query)
    if not tokens:
        raise ValueError("query is empty")
    if tokens[-1] == ";":
        tokens = tokens[:-1]
    if ";" in tokens:
        raise ValueError("query must be a single statement")
    if not tokens or tokens[0].upper() not in ("SELECT", "WITH", "VALUES"):
        raise ValueError("query must be one SELECT, WITH or VALUES statement: checks only read")
    return query


_SQL_TOKEN = re.compile(r"""
    \s+ | --[^\n]*(?:\n|$) | /\*.*?(?:\*/|$)        # space and comments: skipped
    | '(?:[^']|'')*'? | "(?:[^"]|"")*"? | `[^`]*`? | \[[^\]]*\]?   # literals and quoted names
    | [A-Za-z_][A-Za-z0-9_$]* | ; | .                 # words, statement ends, anything else
""", re.VERBOSE | re.DOTALL)


def _sql_tokens(query: str) -> list[str]:
    out = []
    for match in _SQL_TOKEN.finditer(query):
        token = match.group(0)
        if token.isspace() or token.startswith(("--", "/*")):
            continue
        out.append(token)
    return out


class FileCheck(_Strict):
    """Compare a guest file with ``value`` by ``match``.

    exact: bytes equal the UTF-8 of value; text: equal after removing trailing whitespace on both;
    regex: Python ``re.search(value, text)``; json: the file is strict JSON equal to value (a TOML
    table/array or a JSON string) by JSON's data model (:mod:`controller.json_semantics`).
    """

    kind: Literal["file"]
    path: GuestPath
    match: Literal["exact", "text", "regex", "json"]
    value: Any

    @field_validator("path")
    @classmethod
    def _guest_path(cls, v: str) -> str:
        return check_guest_path(v)

    @model_validator(mode="after")
    def _value_fits_rule(self) -> "FileCheck":
        _check_value(self.match, self.value)
        return self


def _check_value(match: str, value: Any) -> None:
    """Raise ValueError when ``value`` does not fit the comparison rule ``match`` (exact, text, regex, json)."""
    if match in ("exact", "text", "regex") and not isinstance(value, str):
        raise ValueError(f"value must be a string for match = {match!r}")
    if match == "regex":
        try:
            re.compile(value)
        except re.error as exc:
            raise ValueError(f"value is not a valid regex: {exc}") from None
    if match == "json":
        if isinstance(value, str):
            try:
                json_semantics.loads(value)
            except ValueError as exc:
                raise ValueError(f"value is not valid JSON text: {exc}") from None
        else:
            try:
                json.dumps(value, allow_nan=False)
            except (TypeError, ValueError):
                raise ValueError("value must be JSON text or a TOML value JSON can express "
                                 "(no dates or times)") from None


PAGE_URL = re.compile(r"https?://[^\s/?#]+(/[^\s#]*)?")


class PageCheck(_Strict):
    """Compare the text of a page the agent's chromium loads (contract 8) with ``value`` by ``match``.

    The agent opens ``url`` in a background tab of its chromium, with the browser's cookies (so the page
    is the site's own state for the signed-in person: ``/session`` of the sign-in demo), takes the body's
    text (at most 1 MiB) and closes the tab; the rules are the file check's (text, regex, json). Needs a
    task that launches ``chromium``; the load goes through the gateway like any other guest traffic.
    """

    kind: Literal["page"]
    url: StrictStr
    match: Literal["text", "regex", "json"]
    value: Any

    @field_validator("url")
    @classmethod
    def _http_url(cls, v: str) -> str:
        if len(v) > 2048 or not PAGE_URL.fullmatch(v):
            raise ValueError("must be an http:// or https:// URL of at most 2048 characters, no spaces or fragment")
        return v

    @model_validator(mode="after")
    def _value_fits_rule(self) -> "PageCheck":
        _check_value(self.match, self.value)
        return self


class SqliteCheck(_Strict):
    """Run ``query`` on a copy of the guest's SQLite database (with its -wal/-shm), opened read-only.

    ``rows``: the expected result, a list of rows (each a list of values), compared exactly and in
    order. ``bind_files``: guest files whose text (trailing whitespace removed) is bound, in order,
    to the query's ``?`` parameters -- this is how a check ties a file to a database record.
    """

    kind: Literal["sqlite"]
    path: GuestPath
    query: StrictStr
    rows: list[list[Any]]
    bind_files: list[GuestPath] = []

    @field_validator("path")
    @classmethod
    def _guest_path(cls, v: str) -> str:
        return check_guest_path(v)

    @field_validator("query")
    @classmethod
    def _read_only(cls, v: str) -> str:
        return _check_read_only_query(v)

    @field_validator("bind_files")
    @classmethod
    def _bind_paths(cls, v: list[str]) -> list[str]:
        return [check_guest_path(p) for p in v]


@dataclass(frozen=True)
class CheckKind:
    """One check kind: ``name`` (the ``kind`` a task file writes) and ``model`` (its task-file model,
    whose ``kind`` field is ``Literal[name]``)."""

    name: str
    model: type[BaseModel]


CHECK_KINDS: dict[str, CheckKind] = {kind.name: kind for kind in (
    CheckKind("file", FileCheck),
    CheckKind("sqlite", SqliteCheck),
    CheckKind("page", PageCheck),
)}
"""Every check kind of the task schema, by name, in the order a refusal lists them."""


def check_check_kinds(table: Mapping[str, CheckKind]) -> None:
    """Check that each entry of ``table`` is filed under the ``kind`` its model declares
    (``kind: Literal[name]``, required); :class:`IncompleteVocabulary` naming the first that is not."""
    for key, kind in table.items():
        field = kind.model.model_fields.get("kind") if isinstance(kind, CheckKind) else None
        if field is None or kind.name != key or get_args(field.annotation) != (key,) or not field.is_required():
            raise IncompleteVocabulary(f"check kinds: {key!r}: its model does not declare the required field "
                                       f"kind: Literal[{key!r}]")


check_check_kinds(CHECK_KINDS)

Check = Annotated[Union[tuple(kind.model for kind in CHECK_KINDS.values())],  # type: ignore[valid-type]
                  Field(discriminator="kind")]
"""A ``[[checks]]`` entry: one of the :data:`CHECK_KINDS` models, chosen by its ``kind``."""


def check_runners(runners: Mapping[str, Callable[..., Any]], table: Mapping[str, CheckKind] | None = None) -> None:
    """Check that ``runners`` (check kind -> the function that runs a check of it) has exactly one
    runner per kind of ``table`` (:data:`CHECK_KINDS` when None); :class:`IncompleteVocabulary`
    naming every kind without a runner and every runner whose kind is not in the table."""
    kinds = CHECK_KINDS if table is None else table
    missing = [name for name in kinds if not callable(runners.get(name))]
    extra = [name for name in runners if name not in kinds]
    if missing or extra:
        parts = ([f"no runner for check kind {', '.join(map(repr, missing))}"] if missing else []) + \
                ([f"a runner for {', '.join(map(repr, extra))}, which is not a check kind"] if extra else [])
        raise IncompleteVocabulary("check kinds: " + "; ".join(parts))


def check_kind(name: Any) -> CheckKind:
    """The entry of the check kind ``name``; :class:`UnknownKind` (naming it and the known kinds) for
    any other name or a value that is not a string."""
    kind = CHECK_KINDS.get(name) if isinstance(name, str) else None
    if kind is None:
        raise UnknownKind(name, CHECK_KINDS, "check kind")
    return kind
