"""The MCP server's tools, and how a session finds its sandbox (:class:`controller.mcp.session.SessionHub`).

``build_server(hub)`` makes an :class:`mcp.server.mcpserver.MCPServer` with the tools of
:data:`TOOLS`. Each tool call finds its MCP session's :class:`~controller.mcp.session.McpSession` on the
transport's connection (one per stdio process, one per streamable-HTTP session: the connection's exit
stack ends it), runs on a worker thread (the sandbox started by the session's first call), and answers a
``CallToolResult``: bad input or a refusal is an ``isError`` result whose text says why, and the sandbox
stays usable. While a call runs, the session's approval questions are asked by elicitation on that
call's request (:mod:`controller.mcp.elicit`).

Protocol era: the server serves the initialize-handshake protocol versions (2025-xx), where a session
exists and a server may ask its client mid-call; a sandbox lives as long as its session. A client that
probes the session-less 2026-07-28 era with ``server/discover`` is answered ``Method not found`` on stdio
(and a 400 JSON-RPC error over HTTP, :mod:`controller.mcp.http`), and falls back to the handshake (the
``mcp`` package's ``Client`` in its default ``auto`` mode does).
"""

import asyncio
import base64
import logging
import threading
from pathlib import Path
from typing import Annotated, Any, Callable, Literal

import anyio
import anyio.to_thread
from mcp.server.mcpserver import Context, MCPServer
from mcp_types import CallToolResult, ImageContent, TextContent, ToolAnnotations
from pydantic import BaseModel, Field

from controller.mcp.elicit import Elicitor
from controller.mcp.session import CallAbandoned, McpSession, SessionClosed, SessionHub, SessionsFull
from controller.model.errors import DesktopSandboxError
from controller.text import clean
from wire.actions import ACTION_TYPES, MAX_CHORD_KEYS, MAX_PATH_POINTS, MAX_SCROLL_PX, MAX_TEXT_CHARS, KeyName

log = logging.getLogger(__name__)

SERVER_NAME = "desktop-sandbox"
STATE_KEY = "desktop_sandbox.mcp.session"
"""Where a connection's :class:`McpSession` is kept (the connection's per-connection ``state``)."""
READ_CAP = 262_144
"""Most bytes of a guest file ``read_file`` returns."""
ERROR_CHARS = 1000
"""Longest error text of a tool result (characters, escaped)."""
CALL_TIMEOUT_S = 300.0
"""Longest a tool call on a running sandbox may take (seconds; an approval waits within it): then the
run is cancelled, as a call that does not return leaves the desktop in an unknown state."""
RESULT_CHARS = 2000
"""Longest model message ``run_task`` returns (characters, escaped)."""

Button = Literal["left", "right", "middle", "back", "forward", "wheel"]
Coord = Annotated[int, Field(description="px of the last screenshot returned (screen px before the first one)")]
ScrollPx = Annotated[int, Field(ge=-MAX_SCROLL_PX, le=MAX_SCROLL_PX, description="px (never mapped)")]
KeyNames = Annotated[list[KeyName], Field(description="key names to hold while clicking, e.g. [\"SHIFT\"]",
                                     max_length=MAX_CHORD_KEYS)] | None


class Point(BaseModel):
    """A point of a drag path (px of the last screenshot returned)."""

    x: int
    y: int


def _lowlevel(server: MCPServer) -> Any:
    """The low-level :class:`mcp.server.lowlevel.server.Server` under ``server`` (the stdio loop is driven
    on it directly, as :class:`mcp.Client` does for an in-process server)."""
    low = getattr(server, "_lowlevel_server", None)
    if low is None:  # pragma: no cover - another mcp version
        raise RuntimeError("this version of the mcp package keeps no low-level server on MCPServer")
    return low


def _connection(ctx: Context) -> Any:
    """The transport connection of a tool call (:class:`mcp.server.connection.Connection`): its ``state``
    and ``exit_stack`` are the connection's own (one stdio process, or one streamable-HTTP session)."""
    connection = getattr(ctx.request_context.session, "_connection", None)
    if connection is None:  # pragma: no cover - another mcp version
        raise RuntimeError("this version of the mcp package gives a tool call no connection")
    return connection


def _elicits(ctx: Context) -> bool:
    """Whether the client declared form elicitation (``elicitation: {}`` means form, as the 2025-06 spec had it)."""
    caps = ctx.request_context.session.client_capabilities
    elicitation = getattr(caps, "elicitation", None) if caps is not None else None
    return elicitation is not None and (elicitation.form is not None or elicitation.url is None)


def _client_name(ctx: Context) -> str | None:
    params = ctx.request_context.session.client_params
    info = getattr(params, "client_info", None)
    return clean(info.name, 80) if info is not None and info.name else None


def _text(text: str) -> TextContent:
    return TextContent(type="text", text=text)


def _error(text: str) -> CallToolResult:
    return CallToolResult(content=[_text(clean(text, ERROR_CHARS))], is_error=True)


def _describe(exc: BaseException) -> str:
    """An exception as a tool error's text: its message, with the kind of refusal when it says more."""
    from controller.agent_client import AgentError
    from controller.run.attended import ActionDenied
    from controller.run.mapping import OutOfModelBounds

    if isinstance(exc, (OutOfModelBounds, ActionDenied)):
        return str(exc)
    if isinstance(exc, AgentError):
        code = getattr(exc, "code", None)
        return f"the guest refused ({code}): {getattr(exc, 'message', None) or exc}"
    if isinstance(exc, SessionsFull):
        return str(exc)
    if isinstance(exc, SessionClosed):
        return f"{exc}: open a new session"
    if isinstance(exc, (ValueError, PermissionError)):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"


class Tools:
    """The tools of one server over its :class:`SessionHub` (module docstring)."""

    def __init__(self, hub: SessionHub) -> None:
        self.hub = hub

    # -- the session of a call ----------------------------------------------------------------------
    def session(self, ctx: Context) -> McpSession:
        """The MCP session's :class:`McpSession`, opened on its first tool call; ended with the connection."""
        connection = _connection(ctx)
        session = connection.state.get(STATE_KEY)
        if session is None:
            elicitor = Elicitor(asyncio.get_running_loop()) if _elicits(ctx) else None
            session = self.hub.open(client=_client_name(ctx), elicitor=elicitor)
            connection.state[STATE_KEY] = session
            connection.exit_stack.callback(self.hub.end, session, "the MCP session ended")
        return session

    async def run(self, ctx: Context, fn: Callable[[McpSession, Any], CallToolResult], *,
                  attended: bool = True, fast: Callable[[McpSession, Any, Any], CallToolResult] | None = None
                  ) -> CallToolResult:
        """``fn(session, sandbox)`` on a worker thread as a call of the session (its questions asked on
        this call meanwhile); an exception becomes an ``isError`` result. ``fast(session, sandbox, run)``:
        the same call made on the attended run's own thread, awaited with no worker thread in between
        (:meth:`McpSession.submit`), when the sandbox is up and its run the session's."""
        try:
            session = self.session(ctx)
        except SessionClosed as exc:
            return _error(_describe(exc))
        if session.elicitor is None:
            return await self._call(session, fn, attended, fast)
        result: CallToolResult | None = None
        async with anyio.create_task_group() as tg:
            tg.start_soon(session.elicitor.ask_during, ctx.request_context.session, ctx.request_context.request_id)
            try:
                result = await self._call(session, fn, attended, fast)
            finally:
                tg.cancel_scope.cancel()
        assert result is not None
        return result

    @staticmethod
    async def _call(session: McpSession, fn: Callable[[McpSession, Any], CallToolResult], attended: bool,
                    fast: Callable[[McpSession, Any, Any], CallToolResult] | None) -> CallToolResult:
        try:
            on_run = (lambda sandbox, run: fast(session, sandbox, run)) if fast is not None else None
            future = session.submit(on_run) if on_run is not None else None
            if future is None and on_run is not None:
                # what is missing (the sandbox, the session's run) starts on a worker thread; the call itself
                # then goes to the run's thread as every later one does, where a cancel can withdraw it
                await anyio.to_thread.run_sync(session.prepare, abandon_on_cancel=True)
                future = session.submit(on_run)
            if future is None:
                return await Tools._on_worker(session, fn, attended)
            try:
                with anyio.fail_after(CALL_TIMEOUT_S):
                    result = await asyncio.wrap_future(future)
                session.cut_off = False
                return result
            except TimeoutError:
                if not future.cancel() and session.sandbox is not None:  # under way and stuck: stop the run
                    session.sandbox.cancel(f"mcp: a call took longer than {CALL_TIMEOUT_S:g} s")
                raise
            except BaseException:
                # the client cancelled the call (or the session ends): one not begun never runs; one under
                # way has the question it waits on withdrawn, so nothing of it runs later (another call's
                # approval cannot revive it) and the run's thread is free for the next call at once
                session.cut_off = True  # the session's end (when this is why) ends its run cancelled
                if not future.cancel() and future.running():
                    session.withdraw_questions("the client cancelled the call")
                raise
        except Exception as exc:  # noqa: BLE001 - every failure is the call's answer
            if not isinstance(exc, (DesktopSandboxError, ValueError, PermissionError, SessionClosed)):
                log.exception("a tool call failed")
            return _error(_describe(exc))

    @staticmethod
    async def _on_worker(session: McpSession, fn: Callable[[McpSession, Any], CallToolResult],
                         attended: bool) -> CallToolResult:
        """``fn`` as :meth:`McpSession.call` on a worker thread (a call without a form for the run's thread:
        ``launch``, ``read_file``, ``run_task``). When its client cancels it: a call not begun yet never
        runs; a ``run_task`` model loop under way is cancelled (it stops within a step; its record says
        so) rather than left to act on the desktop for a client that stopped waiting."""
        gone, begun, finished = threading.Event(), threading.Event(), threading.Event()
        gate = threading.Lock()

        def work() -> CallToolResult:
            with gate:
                if gone.is_set():
                    raise CallAbandoned("the client cancelled the call before it began: nothing of it ran")
                begun.set()
            try:
                return session.call(lambda sandbox: fn(session, sandbox), attended=attended, gone=gone)
            finally:
                finished.set()

        try:
            result = await anyio.to_thread.run_sync(work, abandon_on_cancel=True)
            session.cut_off = False
            return result
        except anyio.get_cancelled_exc_class():
            session.cut_off = True
            with gate:
                gone.set()
                under_way = begun.is_set()
            if under_way and not attended:
                threading.Thread(target=session.stop_model_loop, args=(finished, "mcp: the client cancelled run_task"),
                                 name=f"mcp-stop-{session.key}", daemon=True).start()
            raise

    # -- screenshots --------------------------------------------------------------------------------
    def screenshot(self, session: McpSession, sandbox: Any, region: list[int] | None, run: Any = None
                   ) -> CallToolResult:
        """The screenshot tool's answer (taken through ``run`` when on its thread, else the sandbox)."""
        o = session.options
        crop = None
        if region is not None:
            x, y, w, h = (int(v) for v in region)
            sw, sh = sandbox.screen_size
            if x < 0 or y < 0 or w < 1 or h < 1 or x + w > sw or y + h > sh:
                raise ValueError(f"region [{x}, {y}, {w}, {h}] is not a rectangle inside the {sw}x{sh} screen "
                                 "(x, y >= 0; w, h >= 1; screen px)")
            crop = (x, y, w, h)
        if run is None:
            shot = sandbox.screenshot(max_width=o.max_edge, max_height=o.max_edge, crop=crop, max_bytes=o.max_bytes)
        else:
            from desktop_sandbox import Screenshot

            policy = sandbox._screenshot_policy(max_width=o.max_edge, max_height=o.max_edge, crop=crop,
                                                max_bytes=o.max_bytes)
            shot = Screenshot._of(run.screenshot(policy))
        session.last_shot = shot
        fx, fy, fw, fh = shot.frame
        sw, sh = shot.screen_size
        text = (f"screenshot {shot.width}x{shot.height} px ({shot.mime}, {len(shot.data)} bytes). The points of "
                f"later actions are px of this image, until the next screenshot. It shows the screen region "
                f"x={fx} y={fy} w={fw} h={fh} (screen px) of the {sw}x{sh} screen.")
        return CallToolResult(
            content=[ImageContent(type="image", data=base64.b64encode(shot.data).decode("ascii"), mime_type=shot.mime),
                     _text(text)],
            structured_content={"width": shot.width, "height": shot.height, "frame": [fx, fy, fw, fh],
                                "screen_size": [sw, sh], "mime": shot.mime, "bytes": len(shot.data)})

    # -- actions ------------------------------------------------------------------------------------
    @staticmethod
    def _where(session: McpSession, x: int, y: int) -> str:
        shot = session.last_shot
        if shot is None:
            return f"({x}, {y}) screen px"
        sx, sy = shot.to_screen(x, y)
        return f"({x}, {y}) of the last {shot.width}x{shot.height} screenshot = screen px ({sx}, {sy})"

    async def action(self, ctx: Context, action: dict[str, Any], done: Callable[[McpSession], str]) -> CallToolResult:
        """``action`` as one call of the session (recorded, checked, asked about, sent), then a line saying
        what was done: ``done(session)``."""
        def go(session: McpSession, sandbox: Any) -> CallToolResult:
            sandbox.actions([action])
            return CallToolResult(content=[_text(done(session))])

        def fast(session: McpSession, _sandbox: Any, run: Any) -> CallToolResult:
            run.act([dict(action)])
            return CallToolResult(content=[_text(done(session))])
        return await self.run(ctx, go, fast=fast)


def build_server(hub: SessionHub) -> MCPServer:
    """The MCP server of ``hub``'s sessions, with every tool of this module (module docstring)."""
    o = hub.options
    tools = Tools(hub)
    server = MCPServer(
        SERVER_NAME, title="desktop-sandbox", log_level="WARNING",
        instructions=(
            "A real Linux desktop in a sandbox behind a default-deny network gateway. Take a screenshot first; "
            "every point you send is in px of the last screenshot returned. One sandbox per MCP session, "
            "started by the session's first tool call (a few seconds) and removed when the session ends."))

    start_note = ("The session's sandbox is started by its first tool call (a few seconds) and removed when the "
                  "session ends.")
    points = ("x, y are px of the last screenshot returned (screen px before the first one); a point outside "
              "that image is refused and nothing is sent.")
    asked = ("Action types the server was told to confirm are asked about first (by elicitation when the client "
             "supports it; otherwise they are refused).")
    edge, limit = o.max_edge, o.max_bytes

    @server.tool(name="screenshot", annotations=ToolAnnotations(read_only_hint=True), description=(
        f"Capture the desktop. The image's longest edge is at most {edge} px and its data at most {limit} bytes "
        f"(re-encoded as JPEG, then scaled down further, when PNG would be larger). Coordinate rule: the points of "
        f"every later action are px of the LAST image this tool returned: a point (x, y) of it lands on screen px "
        f"frame.x + round(x * frame.w / width), frame.y + round(y * frame.h / height). Optional region [x, y, w, h] "
        f"in screen px zooms in: that part of the screen at full resolution (scaled down only when it exceeds the "
        f"limits); later points are then px of the zoomed image. Returns the image and a line giving its width, "
        f"height, the frame (screen region it shows) and the screen size. {start_note}"))
    async def screenshot(ctx: Context, region: Annotated[list[int], Field(
            min_length=4, max_length=4,
            description="[x, y, w, h] in screen px: the part of the screen to show (default: all of it)")] | None = None
    ) -> CallToolResult:
        return await tools.run(ctx, lambda s, sb: tools.screenshot(s, sb, region),
                               fast=lambda s, sb, run: tools.screenshot(s, sb, region, run))

    @server.tool(name="click", description=f"Click a mouse button at (x, y). {points} {asked} {start_note}")
    async def click(ctx: Context, x: Coord, y: Coord, button: Button = "left", keys: KeyNames = None) -> CallToolResult:
        action: dict[str, Any] = {"type": "click", "x": x, "y": y, "button": button}
        if keys:
            action["keys"] = list(keys)
        return await tools.action(ctx, action, lambda s: f"clicked {button} at {tools._where(s, x, y)}")

    @server.tool(name="double_click", description=f"Double-click the left button at (x, y). {points} {asked} "
                                                  f"{start_note}")
    async def double_click(ctx: Context, x: Coord, y: Coord, keys: KeyNames = None) -> CallToolResult:
        action: dict[str, Any] = {"type": "double_click", "x": x, "y": y}
        if keys:
            action["keys"] = list(keys)
        return await tools.action(ctx, action, lambda s: f"double-clicked at {tools._where(s, x, y)}")

    @server.tool(name="move", description=f"Move the pointer to (x, y). {points} {asked} {start_note}")
    async def move(ctx: Context, x: Coord, y: Coord) -> CallToolResult:
        action = {"type": "move", "x": x, "y": y}
        return await tools.action(ctx, action, lambda s: f"moved to {tools._where(s, x, y)}")

    @server.tool(name="scroll", description=(
        f"Scroll at (x, y) by scroll_x / scroll_y pixels (positive scroll_y scrolls down). {points} {asked} "
        f"{start_note}"))
    async def scroll(ctx: Context, x: Coord, y: Coord, scroll_x: ScrollPx = 0, scroll_y: ScrollPx = 0
                     ) -> CallToolResult:
        action = {"type": "scroll", "x": x, "y": y, "scroll_x": scroll_x, "scroll_y": scroll_y}
        return await tools.action(ctx, action,
                                  lambda s: f"scrolled ({scroll_x}, {scroll_y}) at {tools._where(s, x, y)}")

    @server.tool(name="drag", description=(
        f"Press the left button at the first point, move through the others, release at the last (two or more "
        f"points). Every point is checked before anything is sent. {points} {asked} {start_note}"))
    async def drag(ctx: Context,
                   path: Annotated[list[Point], Field(min_length=2, max_length=MAX_PATH_POINTS)]) -> CallToolResult:
        action = {"type": "drag", "path": [{"x": p.x, "y": p.y} for p in path]}
        return await tools.action(ctx, action, lambda s: f"dragged from {tools._where(s, path[0].x, path[0].y)} "
                                                         f"to {tools._where(s, path[-1].x, path[-1].y)}")

    @server.tool(name="keypress", description=(
        f"Press a key combination together, e.g. [\"CTRL\", \"L\"] or [\"ENTER\"] (key names as computer-use "
        f"models send them). {asked} {start_note}"))
    async def keypress(ctx: Context,
                       keys: Annotated[list[KeyName], Field(min_length=1, max_length=MAX_CHORD_KEYS)]
                       ) -> CallToolResult:
        action = {"type": "keypress", "keys": list(keys)}
        return await tools.action(ctx, action, lambda s: f"pressed {clean('+'.join(keys), 200)}")

    @server.tool(name="type", description=(
        f"Type text into the focused control (the run record keeps its length only). {asked} {start_note}"))
    async def type_text(ctx: Context, text: Annotated[str, Field(max_length=MAX_TEXT_CHARS)]) -> CallToolResult:
        action = {"type": "type", "text": text}
        return await tools.action(ctx, action, lambda s: f"typed {len(text)} characters")

    @server.tool(name="wait", description=f"Wait until the screen stops changing (bounded). {start_note}")
    async def wait(ctx: Context) -> CallToolResult:
        return await tools.action(ctx, {"type": "wait"}, lambda s: "waited for a stable screen")

    @server.tool(name="launch", description=(
        f"Start an app of the guest's allowlist (e.g. terminal, browser) with extra arguments; returns its pid. "
        f"{start_note}"))
    async def launch(ctx: Context, app: Annotated[str, Field(min_length=1, max_length=64)],
                     args: Annotated[list[str], Field(max_length=64)] = []) -> CallToolResult:  # noqa: B006
        def go(s: McpSession, sb: Any) -> CallToolResult:
            pid = sb.launch(app, *args)
            return CallToolResult(content=[_text(f"started {clean(app, 64)} (pid {pid})")],
                                  structured_content={"pid": pid})
        return await tools.run(ctx, go)

    @server.tool(name="read_file", annotations=ToolAnnotations(read_only_hint=True), description=(
        f"Read a file of the guest (under the desktop user's home). Returns its first max_bytes bytes (at most "
        f"{READ_CAP}) as text when they are UTF-8, else as base64, after a line saying which and the file's "
        f"size. {start_note}"))
    async def read_file(ctx: Context, path: Annotated[str, Field(min_length=1, max_length=4096)],
                        max_bytes: Annotated[int, Field(ge=1, le=READ_CAP)] = READ_CAP) -> CallToolResult:
        def go(s: McpSession, sb: Any) -> CallToolResult:
            data = sb.read_file(path)
            part = data[:max_bytes]
            text = _utf8(part)
            cut = f", cut at {len(part)}" if len(part) < len(data) else ""
            if text is not None:
                return CallToolResult(content=[_text(f"{clean(path, 300)}: {len(data)} bytes, text (utf-8){cut}"),
                                               _text(text)])
            return CallToolResult(content=[_text(f"{clean(path, 300)}: {len(data)} bytes, base64{cut}"),
                                           _text(base64.b64encode(part).decode("ascii"))])
        return await tools.run(ctx, go)

    @server.tool(name="run_task", description=(
        "Run a task file's model loop on this session's sandbox (the desktop as the calls left it): the live model "
        "when the server has OPENAI_API_KEY, else the task's offline script; then verify its checks. TASK is a "
        "path of a task TOML under the server's current directory, for the same screen size as this sandbox. "
        "Returns status (passed | failed | cancelled | error), reason and the run's record folder. Afterwards "
        f"points are screen px again until the next screenshot. {start_note}"))
    async def run_task(ctx: Context, task: Annotated[str, Field(min_length=1, max_length=4096)],
                       max_steps: Annotated[int | None, Field(ge=1, le=500)] = None) -> CallToolResult:
        try:
            path = _task_path(o.workdir, task)
        except ValueError as exc:
            return _error(str(exc))

        def go(s: McpSession, sb: Any) -> CallToolResult:
            from controller.run.tasks import load_task

            loaded = load_task(path)
            size = (loaded.screen.width, loaded.screen.height)
            if size != tuple(sb.screen_size):
                raise ValueError(f"the task is for a {size[0]}x{size[1]} screen; this sandbox's is "
                                 f"{sb.screen_size[0]}x{sb.screen_size[1]}")
            outcome = sb.run(loaded, max_steps=max_steps)
            s.last_shot = None
            checks = [{"kind": c.get("kind"), "passed": c.get("passed")} for c in outcome.checks]
            final = clean(outcome.final_message, RESULT_CHARS) if outcome.final_message else None
            text = (f"status: {outcome.status}\nreason: {clean(outcome.reason, 500)}\nrecord: {outcome.record_dir}"
                    + (f"\nfinal message: {final}" if final else ""))
            return CallToolResult(content=[_text(text)], is_error=outcome.status == "error",
                                  structured_content={"status": outcome.status, "reason": clean(outcome.reason, 500),
                                                      "record_dir": str(outcome.record_dir), "checks": checks,
                                                      "final_message": final})
        return await tools.run(ctx, go, attended=False)

    return server


def _utf8(data: bytes) -> str | None:
    """``data`` as text when it is UTF-8 without NUL (a character cut at the end is left out), else None."""
    if b"\x00" in data:
        return None
    for trim in range(4):
        try:
            return data[: len(data) - trim].decode("utf-8")
        except UnicodeDecodeError as exc:
            if exc.start < len(data) - 4:
                return None
    return None


def _task_path(workdir: Path, given: str) -> Path:
    """The task file ``given`` names, which must be a file under ``workdir`` (symbolic links resolved);
    ValueError otherwise."""
    root = Path(workdir).resolve()
    try:
        path = (root / given).resolve()
    except (OSError, RuntimeError, ValueError) as exc:
        raise ValueError(f"task {clean(given, 300)}: {exc}") from None
    if not path.is_relative_to(root):
        raise ValueError(f"task {clean(given, 300)}: run_task takes a task file under the server's current "
                         f"directory ({clean(root, 300)})")
    if not path.is_file():
        raise ValueError(f"task {clean(given, 300)}: no such task file")
    return path


TOOLS = ("screenshot", "click", "double_click", "move", "scroll", "drag", "keypress", "type", "wait", "launch",
         "read_file", "run_task")
"""The server's tools, in the order it lists them."""
assert set(ACTION_TYPES) <= set(TOOLS), "every action of the schema (wire.actions) is a tool"
