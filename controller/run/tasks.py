"""Task files (``tasks/*.toml``): what the model is asked to do, how it sees the screen, what runs
in the guest first, the network policy, and how the outcome is verified.

Schema (contract): ``name``, ``instructions``, ``[screen]`` (width, height; default 1280x800),
``[model]`` (max_width, max_height, optional crop = [x, y, w, h] in screen px), ``[[launch]]``
(app, args), ``[network]`` (mode "deny-all" | "allowlist", allow = origins), ``[[checks]]``
(kind "file" | "sqlite"), ``[offline]`` (script, relative to the task file).

Refused at load (:class:`TaskError`, one line naming the file and the field): unknown keys (a typo such
as ``[[check]]`` would otherwise drop every check), a task without checks (it could never be verified),
values of the wrong type (no coercion: ``width = "1280"`` is an error), a crop outside the screen,
origins the gateway would not parse (``[network]`` is the gateway's :class:`NetworkPolicy`, so the
same rules apply), regexes that do not compile, JSON values that do not parse, guest paths that are
relative or contain ``..``, and sqlite queries other than one ``SELECT`` / ``WITH`` / ``VALUES``
statement (verification also runs them under a read-only authorizer).

Extensions kept optional: ``max_steps``; ``[model]`` format/quality/max_bytes, ``tools`` (``computer``
and/or ``browser``; a ``browser`` task must launch ``chromium``) and ``browser_members``; ``[[ready]]``
conditions the runner waits for after launching (a file appearing in the guest); sqlite checks'
``bind_files`` (guest files whose text, trailing whitespace removed, is bound to the query's ``?``).
"""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path, PurePosixPath
from typing import Annotated, Any, Literal, Union

from pydantic import (BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr,
                      ValidationError, field_validator, model_validator)

from controller.gateway.policy import NetworkPolicy
from controller import json_semantics
from controller.validation import describe_validation_error, read_input_or_raise
from wire.screen_match import MatchRule


MAX_TASK_BYTES = 1024 * 1024
"""Largest task file read (bytes)."""


class TaskError(ValueError):
    """A task file cannot be used; the message is one line: ``FILE: FIELD: why (got VALUE)``."""


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


class Screen(_Strict):
    """Guest screen size in screen px."""

    width: StrictInt = Field(1280, ge=64, le=8192)
    height: StrictInt = Field(800, ge=64, le=8192)


TOOLS = ("computer", "browser")
"""The model's tools a task may give it (``[model] tools``): ``computer`` (the SDK's ``ComputerToolset``:
screenshots and pixels) and ``browser`` (the SDK's ``BrowserToolset`` over the agent's chromium)."""


def _browser_members() -> tuple[tuple[str, ...], tuple[str, ...]]:
    from openai.lib.browser import BROWSER_MEMBERS

    from wire.browser_tools import GUEST_MEMBERS

    return tuple(BROWSER_MEMBERS), (*GUEST_MEMBERS, "list_tabs")


SDK_BROWSER_MEMBERS, SERVED_BROWSER_MEMBERS = _browser_members()
"""The SDK's ``BrowserToolset`` members (``openai.lib.browser.BROWSER_MEMBERS``), and those a task may
enable: the agent's (``wire.browser_tools.GUEST_MEMBERS``) and ``list_tabs`` (the SDK answers it from
the browser's state)."""


class ModelView(_Strict):
    """What the model sees: bounding box (model px), optional crop (screen px), encoding and size cap;
    ``tools``: the model's tools (:data:`TOOLS`, default ``["computer"]``); ``browser_members``: the
    ``BrowserToolset`` members a ``browser`` task enables (None: the SDK's ``DEFAULT_BROWSER_MEMBERS``;
    explicit-only members such as ``click_at`` are enabled only by naming them here)."""

    max_width: StrictInt | None = Field(1280, ge=16)
    max_height: StrictInt | None = Field(800, ge=16)
    crop: tuple[StrictInt, StrictInt, StrictInt, StrictInt] | None = None
    format: Literal["png", "jpeg"] = "png"
    quality: StrictInt = Field(85, ge=1, le=100)
    max_bytes: StrictInt = Field(4 * 1024 * 1024, ge=1024)
    tools: list[Literal["computer", "browser"]] = Field(default_factory=lambda: ["computer"], min_length=1)
    browser_members: list[StrictStr] | None = Field(None, min_length=1)

    @field_validator("tools")
    @classmethod
    def _unique_tools(cls, v: list[str]) -> list[str]:
        if len(set(v)) != len(v):
            raise ValueError("each tool may be named once")
        return v

    @field_validator("browser_members")
    @classmethod
    def _served(cls, v: list[str] | None) -> list[str] | None:
        if v is None:
            return v
        for name in v:
            if name not in SDK_BROWSER_MEMBERS:
                raise ValueError(f"{name!r} is not a member of the SDK's BrowserToolset "
                                 f"({', '.join(SDK_BROWSER_MEMBERS)})")
            if name not in SERVED_BROWSER_MEMBERS:
                raise ValueError(f"{name!r} is not served by the guest agent (served: "
                                 f"{', '.join(SERVED_BROWSER_MEMBERS)})")
        if len(set(v)) != len(v):
            raise ValueError("each member may be named once")
        return v

    @model_validator(mode="after")
    def _members_need_browser(self) -> "ModelView":
        if self.browser_members is not None and "browser" not in self.tools:
            raise ValueError('browser_members needs "browser" in tools')
        return self

    @field_validator("crop")
    @classmethod
    def _crop_sane(cls, v: tuple[int, int, int, int] | None) -> tuple[int, int, int, int] | None:
        if v is not None and (v[0] < 0 or v[1] < 0 or v[2] <= 0 or v[3] <= 0):
            raise ValueError("crop must be [x, y, w, h] with x, y >= 0 and w, h > 0")
        return v


class Launch(_Strict):
    """An allowlisted app the agent starts before the loop."""

    app: StrictStr = Field(min_length=1)
    args: list[StrictStr] = []

    @field_validator("app", "args")
    @classmethod
    def _no_nul(cls, v: Any) -> Any:
        if any("\x00" in a for a in ([v] if isinstance(v, str) else v)):
            raise ValueError("must not contain NUL")
        return v


class Ready(_Strict):
    """A condition the runner waits for after launching: ``file`` exists in the guest."""

    file: GuestPath
    timeout_s: StrictFloat = Field(60.0, gt=0)

    @field_validator("file")
    @classmethod
    def _guest_path(cls, v: str) -> str:
        return check_guest_path(v)


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


class SignIn(_Strict):
    """``[signin]``: whether the appliance raises ``browser_authentication`` requests when the agent's
    chromium shows a sign-in form (contract 8). ``enabled = false``: never; the model just sees the page."""

    enabled: StrictBool = True


class Approvals(_Strict):
    """``[approvals]``: approvals of computer calls bound to the screen the person was shown (contract 6):
    ``bind_screen`` (default true; false: an approved call runs on whatever the screen shows then, and
    the record's ``run_started`` says so), and the comparison rule's ``margin`` (model px), ``tolerance``
    (0-255) and ``max_changed`` (0-1), defaults :class:`wire.screen_match.MatchRule`'s."""

    bind_screen: StrictBool = True
    margin: StrictInt = Field(MatchRule().margin, ge=0, le=256)
    tolerance: StrictInt = Field(MatchRule().tolerance, ge=0, le=255)
    max_changed: float = Field(MatchRule().max_changed, ge=0.0, le=1.0)

    def rule(self) -> MatchRule | None:
        """The rule approvals are bound with, or None when ``bind_screen`` is false."""
        if not self.bind_screen:
            return None
        return MatchRule(margin=self.margin, tolerance=self.tolerance, max_changed=self.max_changed)


class Record(_Strict):
    """``[record]``: ``typed_text`` (default false) keeps the text the model (and a person taking over)
    typed in the run record, so that ``desktop-sandbox replay`` can type it again (``run-task
    --record-typed-text`` does the same); leave it off for tasks whose typing may hold secrets."""

    typed_text: StrictBool = False


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


Check = Annotated[Union[FileCheck, SqliteCheck, PageCheck], Field(discriminator="kind")]

CHANNEL_BROWSER = "chromium"
"""The allowlisted app that is the agent's browser under its DevTools pipe (images/apps.json, contract 8)."""


class Offline(_Strict):
    """The scripted model turns (contract 3), path relative to the task file."""

    script: StrictStr = Field(min_length=1)
    legacy: StrictBool = False


class Task(_Strict):
    """A task file. ``source`` is the file it came from (set by :func:`load_task`)."""

    name: StrictStr
    instructions: StrictStr
    screen: Screen = Screen()
    model: ModelView = ModelView()
    launch: list[Launch] = []
    ready: list[Ready] = []
    network: NetworkPolicy = NetworkPolicy()
    checks: list[Check] = Field([], validate_default=True)
    offline: Offline | None = None
    signin: SignIn = SignIn()
    approvals: Approvals = Approvals()
    record: Record = Record()
    max_steps: StrictInt = Field(20, ge=1, le=500)
    source: Path | None = None

    @field_validator("name", "instructions")
    @classmethod
    def _not_blank(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("must not be empty")
        return v

    @field_validator("checks", mode="before")
    @classmethod
    def _some_checks(cls, v: Any) -> Any:
        if isinstance(v, list) and not v:
            raise ValueError("a task needs at least one [[checks]] entry: without checks nothing is verified")
        return v

    @model_validator(mode="after")
    def _crop_inside_screen(self) -> "Task":
        crop = self.model.crop
        if crop is not None:
            x, y, w, h = crop
            if x + w > self.screen.width or y + h > self.screen.height:
                raise ValueError(f"model.crop {list(crop)} reaches outside the "
                                 f"{self.screen.width}x{self.screen.height} screen")
        return self

    @model_validator(mode="after")
    def _browser_needs_chromium(self) -> "Task":
        if "browser" in self.model.tools and not self.browser_channel:
            raise ValueError(f'model.tools: "browser" drives the agent\'s chromium: the task must launch it '
                             f'([[launch]] app = "{CHANNEL_BROWSER}")')
        return self

    @property
    def browser_tools(self) -> bool:
        """True when the model gets the browser tools (``"browser"`` in ``[model] tools``)."""
        return "browser" in self.model.tools

    @property
    def computer_tools(self) -> bool:
        """True when the model gets the computer tool (``"computer"`` in ``[model] tools``)."""
        return "computer" in self.model.tools

    @property
    def browser_members(self) -> tuple[str, ...]:
        """The ``BrowserToolset`` members of a browser task: ``[model] browser_members``, or the SDK's
        ``DEFAULT_BROWSER_MEMBERS`` when the task names none."""
        from openai.lib.browser import DEFAULT_BROWSER_MEMBERS

        chosen = self.model.browser_members
        return tuple(chosen) if chosen is not None else tuple(DEFAULT_BROWSER_MEMBERS)

    @property
    def browser_channel(self) -> bool:
        """True when the task launches the agent's chromium (:data:`CHANNEL_BROWSER`)."""
        return any(launch.app == CHANNEL_BROWSER for launch in self.launch)

    def sandbox_spec(self, ready_timeout: float | None = None) -> Any:
        """The :class:`controller.sandbox.SandboxSpec` this task runs in (screen, policy, browser channel)."""
        from controller.sandbox import SandboxSpec

        extra = {} if ready_timeout is None else {"ready_timeout": ready_timeout}
        return SandboxSpec(screen_width=self.screen.width, screen_height=self.screen.height,
                           policy=self.network.model_dump(mode="json"), browser_channel=self.browser_channel, **extra)

    def offline_script_path(self) -> Path:
        """Absolute path of the offline script; raises TaskError when the task has none."""
        if self.offline is None:
            raise TaskError(f"task {self.name!r} has no [offline] script")
        base = self.source.parent if self.source else Path.cwd()
        return (base / self.offline.script).resolve()


def load_task(path: str | Path) -> Task:
    """Read and validate a task TOML file.

    Raises :class:`TaskError` (a ValueError) with a one-line message naming the file and the field:
    unreadable file, not UTF-8, TOML syntax, or any schema rule above.
    """
    path = Path(path)
    text = read_input_or_raise(path, MAX_TASK_BYTES, TaskError)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise TaskError(f"{path}: TOML syntax error: {exc}") from None
    except ValueError as exc:  # e.g. an integer over Python's 4300-digit conversion limit
        raise TaskError(f"{path}: {' '.join(str(exc).split())[:200]}") from None
    if "source" in data:
        raise TaskError(f"{path}: source: unknown key (the loader sets it from the file's location)")
    try:
        task = Task.model_validate(data)
    except ValidationError as exc:
        raise TaskError(f"{path}: {describe_validation_error(exc, known_keys=_KNOWN_KEYS, tags={'checks': ('file', 'sqlite', 'page')})}"
                        ) from None
    return task.model_copy(update={"source": path.resolve()})


_KNOWN_KEYS = {name for model in (Task, Screen, ModelView, Launch, Ready, NetworkPolicy, FileCheck, SqliteCheck,
                                  PageCheck, SignIn, Offline) for name in model.model_fields} - {"source"}
