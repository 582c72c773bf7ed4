"""The synchronous :class:`Sandbox` (the package docstring says what the API is and its units)."""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Iterable, Literal, Mapping, Sequence

from controller.run.attended import ActionDenied, AttendedRun, AttendedRunError
from controller.run.driver import DriverError, ScreenshotPolicy, SentScreenshot
from controller.run.runner import RunOptions
from controller.run.video import VideoSettings
from controller.run.tasks import CHECKS_OPTIONAL, Task, TaskError, load_task
from controller.text import clean
from wire.actions import ACTION_TYPES

Button = Literal["left", "right", "wheel", "back", "forward"]
"""A mouse button as computer-use models name it (``wheel``: the middle button)."""
Approver = Callable[["ApprovalRequest"], "bool | None"]


class SandboxClosed(AttendedRunError):
    """The sandbox was closed (or its run ended): it takes no more calls."""


@dataclass(frozen=True)
class Screenshot:
    """One screenshot as returned to the caller.

    ``data``: the encoded image (PNG, or JPEG when asked or when ``max_bytes`` forced a re-encode);
    ``mime``: ``image/png`` | ``image/jpeg``; ``width`` x ``height``: the image's size in **model px**
    (the unit every later point is read in, until the next screenshot); ``frame``: ``(x, y, w, h)``, the
    screen region the image shows, in **screen px**; ``screen_size``: ``(w, h)`` of the whole screen in
    screen px. A point (mx, my) of this image lands on screen px
    ``frame.x + round(mx * frame.w / width)``, ``frame.y + round(my * frame.h / height)`` (halves up).
    """

    data: bytes
    mime: str
    width: int
    height: int
    frame: tuple[int, int, int, int]
    screen_size: tuple[int, int]

    @classmethod
    def _of(cls, shot: SentScreenshot) -> "Screenshot":
        f = shot.frame
        return cls(shot.data, shot.mime, shot.image_size[0], shot.image_size[1], (f.x, f.y, f.w, f.h),
                   (int(shot.screen_size[0]), int(shot.screen_size[1])))

    def to_screen(self, x: int, y: int) -> tuple[int, int]:
        """The screen px a point of this image (model px) lands on: the driver's own mapping rule."""
        from controller.run.mapping import Frame, ModelSpace

        return ModelSpace(self.width, self.height, Frame(*self.frame)).to_screen(x, y)


@dataclass(frozen=True)
class RunResult:
    """What :meth:`Sandbox.run` returns: ``status`` (``passed`` | ``failed`` | ``cancelled`` |
    ``error``), ``reason``, ``record_dir`` (``runs/<id>/``, its ``record.jsonl`` the run's record),
    ``checks`` (each check's result), ``final_message`` (the model's last text)."""

    status: str
    reason: str
    record_dir: Path
    checks: list[dict[str, Any]]
    final_message: str | None

    @property
    def passed(self) -> bool:
        return self.status == "passed"


@dataclass(frozen=True)
class ApprovalRequest:
    """A question the sandbox asks its approver: ``id``, ``kind`` (``action``: an action under
    ``confirm_actions``; ``origin_access``: a page asked for an origin the policy asks about;
    :data:`controller.model.requests.REQUEST_KINDS`), ``question`` (escaped text), ``actions``
    (descriptions of the actions, typed text redacted), ``origin`` (for an origin request)."""

    id: str
    kind: str
    question: str
    actions: tuple[str, ...] = ()
    origin: str | None = None


def _task_for(task: str | Path | Task | None, *, policy: Any, apps: Iterable[Any], screen: tuple[int, int] | None,
              browser: bool) -> Task:
    """The task a sandbox is started from: ``task`` (a file, a Task, or an empty desktop under deny-all)
    with the overrides given, validated again as a whole (the task's own rules apply to the result).
    Raises :class:`TaskError` (one line: the field and why) for a task or override it cannot use."""
    from pydantic import ValidationError

    from controller.validation import describe_validation_error

    try:
        return _merged_task(task, policy=policy, apps=apps, screen=screen, browser=browser)
    except TaskError:
        raise
    except ValidationError as exc:
        raise TaskError(f"the sandbox's task: {describe_validation_error(exc)}") from None
    except (TypeError, ValueError) as exc:
        raise TaskError(f"the sandbox's task: {' '.join(str(exc).split())[:300]}") from None


def _merged_task(task: str | Path | Task | None, *, policy: Any, apps: Iterable[Any],
                 screen: tuple[int, int] | None, browser: bool) -> Task:
    if isinstance(task, Task):
        base = task
    elif task is not None:
        base = load_task(task)
    else:
        base = Task.model_validate({"name": "sandbox", "instructions": "A desktop driven by its caller."},
                                   context={CHECKS_OPTIONAL: True})
    data = base.model_dump()
    if screen is not None:
        data["screen"] = {**data["screen"], "width": int(screen[0]), "height": int(screen[1])}
    if policy is not None:
        data["network"] = policy.model_dump() if hasattr(policy, "model_dump") else dict(policy)
    for app in apps:
        if isinstance(app, str):
            data["launch"].append({"app": app, "args": []})
        elif isinstance(app, Mapping):
            data["launch"].append({"app": app.get("app"), "args": list(app.get("args", []))})
        else:
            name, *args = list(app)
            data["launch"].append({"app": name, "args": [str(a) for a in args]})
    if browser and "browser" not in data["model"]["tools"]:
        data["model"]["tools"] = [*data["model"]["tools"], "browser"]
    return Task.model_validate(data, context={CHECKS_OPTIONAL: True})


def _confirm_types(confirm_actions: Sequence[str]) -> list[str]:
    """``confirm_actions`` checked: a list of known action types (a computer action type or a browser
    member). A bare string is refused (``"type"`` is not ``["t", "y", "p", "e"]``). Raises TaskError."""
    from wire.actions import ACTION_TYPES
    from wire.browser_tools import GUEST_MEMBERS

    if isinstance(confirm_actions, (str, bytes)):
        raise TaskError(f"confirm_actions must be a list of action types, not a string: [{confirm_actions!r}]"[:300])
    known = [*ACTION_TYPES, *(m for m in GUEST_MEMBERS if m not in ACTION_TYPES)]
    chosen = list(confirm_actions)
    unknown = [a for a in chosen if a not in known]
    if unknown:
        raise TaskError(f"confirm_actions: unknown action type {str(unknown[0])[:60]!r} (a computer action type: "
                        f"{', '.join(ACTION_TYPES)}; or a browser member: {', '.join(GUEST_MEMBERS)})")
    return chosen


def _keys(keys: Sequence[str]) -> list[str]:
    """A list of key names; a bare string is refused (``"ctrl"`` would be the keys c, t, r, l)."""
    if isinstance(keys, (str, bytes)) or not isinstance(keys, Iterable):
        raise DriverError(f"keys must be a list of key names (e.g. ['CTRL', 'L']), not {type(keys).__name__}")
    return list(keys)


class Sandbox:
    """A guest desktop behind its default-deny gateway, driven from Python (package docstring).

    Use :meth:`start` (a context manager: the sandbox is removed on exit). Every method is safe to call
    from any thread; calls run one at a time.
    """

    def __init__(self, backend_sandbox: Any, task: Task, run_options: RunOptions, *, own: bool,
                 approver: Approver | None, runner: str, client: str | None, start_timeout_s: float,
                 approver_name: str = "approver") -> None:
        self._sandbox = backend_sandbox
        self.task = task
        self._options = run_options
        self._own = own
        self._approver, self._approver_name = approver, approver_name
        self._runner, self._client = runner, client
        self._start_timeout_s = start_timeout_s
        self._lock = threading.RLock()
        self._run: AttendedRun | None = None
        self._launched = False
        self._closed = False
        self._start_s: float | None = None
        self._writable: tuple[str, ...] = ()
        self._task_run: Any = None  # the task's Run under way in run(), for cancel()
        self._cancel_lock = threading.Lock()
        self.outcomes: list[Any] = []
        """The outcome of each run this sandbox ended (:class:`controller.run.runner.RunOutcome`), oldest first."""

    # -- lifetime ----------------------------------------------------------------------------------
    @classmethod
    def start(cls, *, backend: str = "docker", task: str | Path | Task | None = None, policy: Any = None,
              apps: Iterable[Any] = (), screen: tuple[int, int] | None = None, browser: bool = False,
              pool: Any = None, image: str | None = None, confirm_actions: Sequence[str] = (),
              step: bool = False, approver: Approver | None = None, approval_timeout_s: float | None = 300.0,
              runs_dir: str | Path = "runs", ready_timeout_s: float = 90.0, start_timeout_s: float = 180.0,
              runner: str = "python", client: str | None = None, approver_name: str = "approver",
              writable: Sequence[str] = (), options: Mapping[str, Any] | None = None,
              video: bool = False) -> "Sandbox":
        """Start (or claim) a sandbox and return it ready: the task's apps launched, a stable screen.

        ``backend``: ``docker`` | ``vm`` (:mod:`controller.sandbox.registry`); ``task``: a task file or
        :class:`controller.run.tasks.Task` whose screen, network policy, apps and checks the sandbox
        takes (default: an empty desktop under deny-all); ``policy``: a ``[network]`` table (mapping) that
        replaces the task's (``{"mode": "allowlist", "allow": ["https://example.com"]}``); ``apps``:
        more apps to launch (``"terminal"``, ``("browser", "about:blank")`` or ``{"app", "args"}``); ``screen``:
        ``(width, height)`` in screen px; ``browser``: drive the agent's chromium channel; ``pool``: a
        :class:`controller.sandbox.pool.WarmPool` or a keeper socket path (``desktop-sandbox up --pool``):
        claimed from it when it holds one of the task's template, else started cold; ``image``: the guest
        image; ``confirm_actions`` / ``step``: action types asked about before they run (all in step
        mode), answered by ``approver`` (called with an :class:`ApprovalRequest`, on a thread of its own;
        ``True`` approves, None leaves it unanswered (to the deadline), anything else -- False, an exception, "yes" --
        denies; without one a confirmed action is denied; an approver still silent after
        ``approval_timeout_s`` is taken as a no);
        ``approval_timeout_s``: seconds a question waits; ``approver_name``: who the record says answered
        (``by``; the MCP server's is ``mcp``); ``writable``: guest folders under the home that
        :meth:`write_file` may write in (``["~/inbox"]``; default none); ``runs_dir``: where records go; ``options``:
        fields of the backend's options to set (``DockerOptions``: ``apps_file``, ``extra_labels``, ...);
        ``video``: record a video of the run, ``<runs_dir>/<run id>/run.webm`` (``controller.run.video``:
        2 frames a second, the actions drawn on them), finished when the run ends.

        Raises :class:`controller.sandbox.BackendUnavailable` (no Docker, no QEMU),
        :class:`controller.run.tasks.TaskError` for a bad task, policy, screen, app entry or
        ``confirm_actions`` (an unknown action type, or a bare string), :class:`controller.sandbox.SandboxError`
        for an unknown backend or backend option and when the start fails, :class:`AttendedRunError` when
        the desktop was not ready within ``start_timeout_s`` (the sandbox is removed in every case). The
        arguments are all checked before anything starts.
        """
        from controller.sandbox.errors import SandboxError
        from controller.sandbox.registry import get_backend

        t = _task_for(task, policy=policy, apps=apps, screen=screen, browser=browser)
        roots = _writable_roots(writable)
        confirm = _confirm_types(confirm_actions)
        try:
            backend_cls = get_backend(backend)
        except KeyError as exc:
            raise SandboxError(str(exc.args[0] if exc.args else exc)) from None
        run_options = RunOptions(runs_dir=Path(runs_dir), confirm_actions=confirm, step=bool(step),
                                 approval_timeout_s=approval_timeout_s, ready_timeout_s=ready_timeout_s,
                                 video=VideoSettings() if video else None)
        backend_options = backend_cls.make_options(image=image)
        if options:
            try:
                backend_options = dataclasses.replace(backend_options, **dict(options))
            except (TypeError, ValueError) as exc:
                fields = ", ".join(f.name for f in dataclasses.fields(backend_options))
                raise SandboxError(f"options: {' '.join(str(exc).split())[:200]} (the fields: {fields})") from None
        backend_options = backend_cls.ensure_image(backend_options, lambda _msg: None)
        spec = t.sandbox_spec(backend_cls.default_ready_timeout)
        launch, ready = t.pool_apps()
        started = time.monotonic()
        if pool is None:
            backend_sandbox = backend_cls.start(spec, backend_options)
        elif isinstance(pool, (str, Path)):
            from controller.sandbox.pool_keeper import claim_from

            backend_sandbox = claim_from(pool, spec, backend_cls, start_cold=lambda: backend_cls.start(spec, backend_options),
                                         launch=launch, ready=ready)
        else:
            backend_sandbox = pool.claim(spec, launch=launch, ready=ready, cold_options=backend_options)
        sandbox = cls(backend_sandbox, t, run_options, own=True, approver=approver, runner=runner, client=client,
                      start_timeout_s=start_timeout_s, approver_name=clean(approver_name, 40))
        sandbox._start_s = time.monotonic() - started
        sandbox._writable = roots
        try:
            sandbox._attended()
        except BaseException:
            sandbox.close()
            raise
        return sandbox

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, exc_type: Any, exc: Any, _tb: Any) -> None:
        failure = None
        if exc is not None and not isinstance(exc, (KeyboardInterrupt, SystemExit)):
            failure = f"{exc_type.__name__}: {exc}"
        self.close(failure=failure)

    def close(self, *, failure: str | None = None) -> None:
        """End the run under way (its record finished, inputs released) and remove the sandbox (when
        this object started it). ``failure``: why the caller stops on an error (the ``with`` block's
        exception does so): the record ends ``error`` with it. Safe to call twice."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            try:
                self._end_run(failure=failure)
            finally:
                if self._own:
                    self._sandbox.close()

    @property
    def closed(self) -> bool:
        return self._closed

    # -- facts -------------------------------------------------------------------------------------
    @property
    def id(self) -> str:
        """The backend's sandbox id (``desktop-sandbox down ID`` removes it)."""
        return str(self._sandbox.id)

    @property
    def backend(self) -> Any:
        """The backend's sandbox object (:class:`controller.sandbox.Sandbox`), for what this API does not
        wrap; it stays owned by this object."""
        return self._sandbox

    @property
    def screen_size(self) -> tuple[int, int]:
        """The guest screen's (width, height) in screen px."""
        return self.task.screen.width, self.task.screen.height

    @property
    def record_dir(self) -> Path | None:
        """The folder of the current run's record (``record.jsonl``), or of the last one."""
        if self._run is not None:
            return self._run.record.dir
        return self.outcomes[-1].record_dir if self.outcomes else None

    @property
    def provenance(self) -> dict[str, Any] | None:
        """Where the sandbox came from when claimed (``source``: ``pool`` | ``cold``, ``claim_s``, ...)."""
        return getattr(self._sandbox, "provenance", None)

    # -- the run under way ---------------------------------------------------------------------------
    def _attended(self) -> AttendedRun:
        with self._lock:
            if self._closed:
                raise SandboxClosed("the sandbox is closed")
            if self._run is not None and self._run.takes_calls:
                return self._run
            if self._run is not None:  # ended by a cancel or a failure: kept in outcomes
                self._end_run()
            task = self.task if not self._launched else self.task.model_copy(update={"launch": [], "ready": []})
            run = AttendedRun(task, self._options, runner=self._runner, client=self._client,
                              sandbox_start_s=self._start_s)
            self._start_s = None  # the next run on this sandbox did not start it
            if self._approver is not None:
                run.registry.views.add(self._approver_name)
                run.answered_by(lambda registry, _cancel: _CallbackAnswerer(registry, self._approver, self._approver_name))
            self._launched = True
            self._run = run
            run.begin(self._sandbox, start_timeout_s=self._start_timeout_s)
            return run

    def _end_run(self, failure: str | None = None) -> None:
        run, self._run = self._run, None
        if run is not None:
            outcome = run.end(failure=failure)
            if outcome is not None:
                self.outcomes.append(outcome)

    def _call(self, fn: Callable[[AttendedRun], Any], timeout: float | None = 300.0) -> Any:
        run = self._attended()
        return run.call(lambda: fn(run), timeout=timeout)

    def _submit(self, fn: Callable[[AttendedRun], Any]) -> Any:
        """``fn(run)`` handed to the attended run's thread without waiting (a ``concurrent.futures.Future``),
        or None when that run is not up (then use a blocking call: starting one takes time). For an event
        loop (the MCP server): it never blocks."""
        with self._lock:
            run = self._run
            if self._closed or run is None or not run.takes_calls:
                return None
        try:
            return run.submit(lambda: fn(run))
        except AttendedRunError:
            return None

    def cancel(self, why: str = "cancelled by its caller") -> None:
        """Cancel what runs on the sandbox now (a call, or a task's model loop under :meth:`run`): its
        record ends ``cancelled`` and the call under way raises; the sandbox stays up for the next call."""
        with self._cancel_lock:
            for run in (self._run, self._task_run):
                if run is not None:
                    run.cancel_by_view(why)

    @property
    def attended_run(self) -> AttendedRun:
        """The run the calls go to (started on first use after :meth:`run`): its ``registry`` is where
        questions wait, its ``bus`` what views follow."""
        return self._attended()

    # -- screenshots -------------------------------------------------------------------------------
    def screenshot(self, *, max_width: int | None = None, max_height: int | None = None,
                   crop: tuple[int, int, int, int] | None = None, format: Literal["png", "jpeg"] = "png",
                   quality: int = 85, max_bytes: int = 4 * 1024 * 1024) -> Screenshot:
        """A screenshot, scaled to fit ``max_width`` x ``max_height`` (model px, aspect kept, never up; None:
        full resolution), of ``crop`` (x, y, w, h in screen px; None: the whole screen), encoded as
        ``format`` and brought under ``max_bytes`` (re-encoded as JPEG, then down-scaled). Its size is
        the model space later points are read in. Raises ``DriverError`` for a ``crop`` that is not four
        integers or an image that cannot be brought under ``max_bytes``, ``AgentError`` when the guest
        refuses the settings (a crop outside the screen, ``max_width`` < 1, ...) or fails to capture; a
        screenshot that failed leaves the model space as it was."""
        policy = self._screenshot_policy(max_width=max_width, max_height=max_height, crop=crop, format=format,
                                         quality=quality, max_bytes=max_bytes)
        return Screenshot._of(self._call(lambda run: run.screenshot(policy)))

    @staticmethod
    def _screenshot_policy(*, max_width: int | None = None, max_height: int | None = None,
                           crop: tuple[int, int, int, int] | None = None, format: Literal["png", "jpeg"] = "png",
                           quality: int = 85, max_bytes: int = 4 * 1024 * 1024) -> ScreenshotPolicy:
        """The driver's policy for :meth:`screenshot`'s arguments (``DriverError`` for a bad ``crop``)."""
        if crop is not None:
            try:
                box = tuple(crop)
            except TypeError:
                box = ()
            if len(box) != 4 or not all(isinstance(v, int) and not isinstance(v, bool) for v in box):
                raise DriverError(f"crop must be four integers (x, y, w, h in screen px), got {crop!r}"[:200])
            crop = box  # type: ignore[assignment]
        return ScreenshotPolicy(format=format, quality=quality, max_width=max_width, max_height=max_height,
                                crop=tuple(crop) if crop else None, max_bytes=max_bytes)

    # -- actions (points in model px: the last screenshot's; screen px before any) ------------------------
    def actions(self, actions: list[dict[str, Any]]) -> None:
        """Run a list of actions in the openai computer action shapes (``{"type": "click", "x", "y",
        "button"}``, ...) as one call: every one checked before any runs. Raises ``DriverError`` (an
        unsupported action), ``OutOfModelBounds`` (a point outside the last screenshot), ``ActionDenied``
        (an approval was refused), ``AgentError`` (the guest refused). ``actions`` must be a list (or
        tuple) of mappings, else ``DriverError`` with nothing sent; a ``screenshot`` action is recorded and
        skipped (:meth:`screenshot` takes images)."""
        acts = _action_list(actions)
        self._call(lambda run: run.act(acts))

    def click(self, x: int, y: int, button: Button = "left", *, keys: Sequence[str] | None = None) -> None:
        """Click at (x, y) model px with ``button``, holding ``keys`` (key names) when given."""
        action: dict[str, Any] = {"type": "click", "x": x, "y": y, "button": button}
        if keys is not None and _keys(keys):
            action["keys"] = _keys(keys)
        self.actions([action])

    def double_click(self, x: int, y: int, *, keys: Sequence[str] | None = None) -> None:
        """Double-click at (x, y) model px."""
        action: dict[str, Any] = {"type": "double_click", "x": x, "y": y}
        if keys is not None and _keys(keys):
            action["keys"] = _keys(keys)
        self.actions([action])

    def move(self, x: int, y: int) -> None:
        """Move the pointer to (x, y) model px."""
        self.actions([{"type": "move", "x": x, "y": y}])

    def scroll(self, x: int, y: int, scroll_x: int = 0, scroll_y: int = 0) -> None:
        """Scroll at (x, y) model px by ``scroll_x``/``scroll_y`` (pixels as the model sends them: positive
        ``scroll_y`` scrolls down)."""
        self.actions([{"type": "scroll", "x": x, "y": y, "scroll_x": scroll_x, "scroll_y": scroll_y}])

    def drag(self, path: Sequence[tuple[int, int]]) -> None:
        """Press at the first point, move through the others, release at the last (model px: integers;
        2 to 2000 points). Raises ``DriverError`` for a path that is not a sequence of (x, y) pairs."""
        try:
            points = [{"x": x, "y": y} for x, y in path]
        except (TypeError, ValueError):
            raise DriverError("a drag path is a sequence of (x, y) pairs of integers") from None
        self.actions([{"type": "drag", "path": points}])

    def keypress(self, keys: Sequence[str]) -> None:
        """Press a key combination together (``["CTRL", "L"]``; names as computer-use models send them; a
        bare string is refused with ``DriverError``; an unknown name with the guest's ``AgentError``)."""
        self.actions([{"type": "keypress", "keys": _keys(keys)}])

    def type(self, text: str) -> None:
        """Type ``text`` (a str of at most 20,000 characters) into the focused control (the record keeps its
        length only). Raises ``DriverError`` for anything else, ``AgentError`` for a character the guest
        cannot type (a NUL)."""
        if not isinstance(text, str):
            raise DriverError(f"type takes a str, not {type(text).__name__}")
        self.actions([{"type": "type", "text": text}])

    def wait(self) -> None:
        """Let the desktop settle (the agent's ``wait``: until the screen stops changing, bounded)."""
        self.actions([{"type": "wait"}])

    # -- the guest ----------------------------------------------------------------------------------
    def launch(self, app: str, *args: str) -> int:
        """Start an allowlisted guest app (``browser``, ``terminal``, ``probe``, ...: the image's allowlist) with extra
        arguments; returns its pid. Raises ``AgentError`` (``unknown_app``) otherwise."""
        argv = [str(a) for a in args]
        return int(self._call(lambda run: run.launch(app, argv)))

    def read_file(self, path: str) -> bytes:
        """A guest file's bytes: under the guest's readable roots (the desktop user's home), at most the
        agent client's cap. Raises ``AgentError`` (``not_found``, ``forbidden``, ``too_large``)."""
        return bytes(self._call(lambda run: run.read_file(path)))

    def write_file(self, path: str, data: bytes) -> str:
        """Write ``data`` (at most 8 MiB) to the guest file ``path`` (``~`` is the desktop user's home) as
        the desktop user, when it lies under one of the ``writable`` folders the sandbox was started with
        (symbolic links followed in the guest); missing folders are made, an existing file replaced whole.
        Returns the guest path written. Raises ``PermissionError`` (no such folder, or outside them) and
        ``ValueError`` (too large, a bad path)."""
        from desktop_sandbox._guest_files import write_guest_file

        if not isinstance(data, (bytes, bytearray)):
            raise DriverError("data must be bytes")
        blob = bytes(data)
        return self._call(lambda run: write_guest_file(self._sandbox, self._writable, path, blob,
                                                       home=getattr(self._sandbox, "guest_home", None) or
                                                       "/home/sandbox"))

    def set_policy(self, policy: Any) -> dict[str, Any]:
        """Swap the network policy now (``[network]`` table as a mapping); the gateway's answer
        (:meth:`controller.sandbox.Sandbox.set_policy`)."""
        return self._call(lambda run: self._sandbox.set_policy(policy))

    def run(self, task: str | Path | Task, *, live: bool | None = None, model: str | None = None,
            script: str | Path | None = None, max_steps: int | None = None) -> RunResult:
        """Run a task's model loop on this sandbox (the desktop as the calls left it) and return its
        verdict: the live model with ``OPENAI_API_KEY`` (or ``live=True``), else the task's offline
        script. The calls' run is ended first (its record finished); the next call starts a new one."""
        from controller.run.runner import Run

        t = task if isinstance(task, Task) else load_task(task)
        with self._lock:
            if self._closed:
                raise SandboxClosed("the sandbox is closed")
            self._end_run()
            if self._launched:  # the apps this sandbox launched already run: not a second time
                t = t.model_copy(update={"launch": [app for app in t.launch if app not in self.task.launch]})
            options = replace(self._options, live=live, model=model, script=Path(script) if script else None,
                              max_steps=max_steps, terminal=False, runner=None)
            run = Run(t, options, _quiet_console())
            with self._cancel_lock:
                self._task_run = run
            if self._approver is not None:
                run.registry.views.add(self._approver_name)
                run.answered_by(lambda registry, _cancel: _CallbackAnswerer(registry, self._approver, self._approver_name))
            try:
                outcome = run.execute(lambda _t: self._sandbox, own=False)
            finally:
                with self._cancel_lock:
                    self._task_run = None
            self.outcomes.append(outcome)
            return RunResult(outcome.status, outcome.reason, outcome.record_dir, list(outcome.checks),
                             outcome.final_message)

    def check(self) -> list[dict[str, Any]]:
        """Run the task's checks on the guest as it is now (files, sqlite records: what a run verifies)
        and return each check's result (``{"kind", "passed", "detail", ...}``); an empty list when the
        task has none. The results are written to the current run's record too, and its verdict follows
        the last of them (``failed`` when one failed)."""
        return list(self._call(lambda run: run.run_checks()))

    # -- snapshots --------------------------------------------------------------------------------
    def snapshot(self, *, root: str | Path | None = None) -> Any:
        """Save this sandbox's state (:func:`controller.sandbox.snapshot.take_snapshot`): the snapshot
        (its ``id`` and ``path``). Raises ``CapabilityMissing`` when the backend cannot."""
        from controller.sandbox.snapshot import take_snapshot

        return self._call(lambda run: take_snapshot(self._sandbox, task=self.task, root=root), timeout=600)

    def fork(self, count: int = 1, *, root: str | Path | None = None) -> list["Sandbox"]:
        """Save this sandbox and restore ``count`` new ones from it, each a :class:`Sandbox` of its own
        (close each). Raises ``CapabilityMissing`` when the backend cannot snapshot."""
        from controller.sandbox.snapshot import restore

        snap = self.snapshot(root=root)
        restored = restore(snap.path, count=count)
        forks = []
        try:
            for backend_sandbox in restored:
                fork = Sandbox(backend_sandbox, self.task, self._options, own=True, approver=self._approver,
                               approver_name=self._approver_name,
                               runner=self._runner, client=self._client, start_timeout_s=self._start_timeout_s)
                fork._launched = True  # the apps come with the state (or start again, per the backend)
                fork._writable = self._writable
                forks.append(fork)
                fork._attended()
        except BaseException:
            for fork in forks:
                fork.close()
            for backend_sandbox in restored[len(forks):]:
                with contextlib.suppress(Exception):
                    backend_sandbox.close()
            raise
        return forks


def _writable_roots(writable: Any) -> tuple[str, ...]:
    """The ``writable`` folders as guest paths, each under the desktop user's home (TaskError otherwise)."""
    from controller.sandbox.guest import GUEST_HOME
    from desktop_sandbox._guest_files import guest_path

    if isinstance(writable, str):
        raise TaskError("writable: a list of guest folders, not a single string")
    roots = []
    for root in writable:
        try:
            path = guest_path(root)
        except ValueError as exc:
            raise TaskError(f"writable: {exc}") from None
        if path != GUEST_HOME and not path.startswith(GUEST_HOME + "/"):
            raise TaskError(f"writable: {clean(root, 200)} is not under the desktop user's home ({GUEST_HOME})")
        roots.append(path)
    return tuple(roots)


def _action_list(actions: Any) -> list[dict[str, Any]]:
    """``actions`` as a list of dicts, or ``DriverError`` when it is not a list (or tuple) of mappings."""
    if not isinstance(actions, (list, tuple)) or not all(isinstance(a, Mapping) for a in actions):
        raise DriverError("actions must be a list of action mappings ({'type': 'click', ...})")
    return [dict(a) for a in actions]


class _CallbackAnswerer:
    """Answers a run's questions with the Python approver (each on a thread of its own: the approver
    may take its time; the question's own deadline still applies)."""

    def __init__(self, registry: Any, approver: Approver, name: str = "approver") -> None:
        self.registry, self.approver, self.name = registry, approver, name
        self._seen: set[str] = set()
        self._unsubscribe = registry.subscribe(self._changed)

    def _changed(self, request: Any) -> None:
        if request.state != "pending" or request.id in self._seen or request.kind == "browser_authentication":
            return
        self._seen.add(request.id)
        threading.Thread(target=self._ask, args=(request,), daemon=True, name="approver").start()

    def _ask(self, request: Any) -> None:
        asked = ApprovalRequest(id=request.id, kind=request.kind, question=request.question,
                                actions=tuple(request.actions or ()), origin=getattr(request, "origin", None))
        try:
            verdict = self.approver(asked)
        except Exception:  # noqa: BLE001 - an approver that fails denies
            verdict = False
        if verdict is None:
            return
        verdict = verdict is True  # only True approves: "no", 1, a mock object deny
        from controller.model.requests import request_kind

        answers = request_kind(request.kind).answers
        word = "approve" if verdict else ("deny" if "deny" in answers else "cancel")
        with contextlib.suppress(Exception):  # decided elsewhere first, or withdrawn
            self.registry.answer(request.id, word, by=self.name)

    def stop(self) -> None:
        self._unsubscribe()


def _quiet_console() -> Any:
    from rich.console import Console

    return Console(quiet=True)


assert all(callable(getattr(Sandbox, kind, None)) for kind in ACTION_TYPES), \
    "every action of the schema (wire.actions) is a method of Sandbox"

__all__ = ["ActionDenied", "ApprovalRequest", "RunResult", "Sandbox", "SandboxClosed", "Screenshot"]
