"""Task files (``tasks/*.toml``): what the model is asked to do, how it sees the screen, what runs
in the guest first, the network policy, and how the outcome is verified.

Schema (contract): ``name``, ``instructions``, ``[screen]`` (width, height; default 1280x800),
``[model]`` (max_width, max_height, optional crop = [x, y, w, h] in screen px), ``[[launch]]``
(app, args), ``[network]`` (mode "deny-all" | "allowlist", allow = origins), ``[[checks]]``
(kind "file" | "sqlite" | "page": :data:`controller.model.checks.CHECK_KINDS`, the check models'
home), ``[offline]`` (script, relative to the task file).

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

import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import (BaseModel, ValidationInfo, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr,
                      ValidationError, field_validator, model_validator)

from controller.gateway.policy import NetworkPolicy
from controller.model.errors import DesktopSandboxError
from controller.model.checks import (  # noqa: F401 - the check models, used here and by verification
    CHECK_KINDS, Check, FileCheck, GuestPath, PageCheck, SqliteCheck, check_guest_path)
from controller.validation import describe_validation_error, read_input_or_raise
from wire.screen_match import MatchRule


MAX_TASK_BYTES = 1024 * 1024
"""Largest task file read (bytes)."""


CHECKS_OPTIONAL = "checks_optional"
"""Validation context key: a task validated with it true may have no checks (the task of a sandbox driven
by its caller, :mod:`controller.run.attended`, where nothing is verified unless checks are given)."""


class TaskError(DesktopSandboxError, ValueError):
    """A task file cannot be used; the message is one line: ``FILE: FIELD: why (got VALUE)``."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", protected_namespaces=())


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
    --record-typed-text`` does the same); leave it off for tasks whose typing may hold secrets.
    ``video`` (default false) records a video of every run of the task, ``runs/<id>/run.webm``, with the
    default settings (``run-task --video`` does the same; docs/video.md).
    ``web`` (default false) keeps the plain-HTTP responses the policy let through in ``runs/<id>/web/``
    (``run-task --record-web`` does the same; docs/replay.md), for ``replay --offline-web``."""

    typed_text: StrictBool = False
    video: StrictBool = False
    web: StrictBool = False


CHANNEL_BROWSER = "chromium"
"""The allowlisted app that is the agent's browser under its DevTools pipe (images/apps.json, contract 8)."""


class Offline(_Strict):
    """The scripted model turns (contract 3), path relative to the task file. ``web``: a web recording's
    folder (``index.jsonl`` and its bodies, as ``run-task --record-web`` writes it in ``runs/<id>/web``),
    relative to the task file: every run of the task, live or scripted, gets its pages from it and from
    nothing else (the gateway serves it; a request it holds no answer for is denied ``not_recorded``)."""

    script: StrictStr = Field(min_length=1)
    legacy: StrictBool = False
    web: StrictStr | None = Field(None, min_length=1, max_length=4096)

    @field_validator("web")
    @classmethod
    def _web_folder(cls, v: str | None) -> str | None:
        if v is not None and ("\x00" in v or not v.strip()):
            raise ValueError("must name a folder (no NUL, not blank)")
        return v


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
    def _some_checks(cls, v: Any, info: ValidationInfo) -> Any:
        if isinstance(v, list) and not v and not (info.context or {}).get(CHECKS_OPTIONAL):
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

    def pool_apps(self) -> tuple[tuple[tuple[str, tuple[str, ...]], ...], tuple[tuple[str, float], ...]]:
        """The apps a warm pool may launch for this task before it is claimed, and the ready files that
        say they are up: ``(((app, (args...)), ...), ((file, timeout_s), ...))``
        (:class:`controller.sandbox.pool.Template`). Empty unless the task's network is deny-all (the pool
        launches under deny-all: an app that loads a page of an allowed origin would get a refusal) and
        the task drives no browser channel (its rule is set before the launch)."""
        if self.network.mode != "deny-all" or self.browser_channel or not self.launch:
            return (), ()
        return (tuple((launch.app, tuple(launch.args)) for launch in self.launch),
                tuple((ready.file, float(ready.timeout_s)) for ready in self.ready))

    def offline_web_path(self) -> Path | None:
        """Absolute path of the task's web recording (``[offline] web``), or None when it has none."""
        if self.offline is None or self.offline.web is None:
            return None
        base = self.source.parent if self.source else Path.cwd()
        return (base / self.offline.web).resolve()

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
        raise TaskError(f"{path}: {describe_validation_error(exc, known_keys=_KNOWN_KEYS, tags={'checks': tuple(CHECK_KINDS)})}"
                        ) from None
    return task.model_copy(update={"source": path.resolve()})


_KNOWN_KEYS = {name for model in (Task, Screen, ModelView, Launch, Ready, NetworkPolicy, SignIn, Offline,
                                  *(kind.model for kind in CHECK_KINDS.values()))
               for name in model.model_fields} - {"source"}
