"""SandboxDriver: an ``openai.ComputerDriver`` that forwards actions to the guest agent.

Coordinates arrive in model space (pixels of the image last sent to the model) and are mapped to
screen px by :class:`controller.run.mapping.ModelSpace` (scale by the actual image size, round to
nearest, add the crop offset). Actions are read and mapped through the action schema
(:mod:`wire.actions`): every point of an action is bounds-checked in model space before anything is
sent, every other field (scroll deltas included: sign kept, no offset) is forwarded unchanged.

Screenshots come back as exactly one ``data:<mime>;base64,`` URL whose mime matches the bytes.
Above ``ScreenshotPolicy.max_bytes`` the image is re-encoded as JPEG, then down-scaled, and the
mapping follows the image actually sent.

Unsupported input (anything the schema's model form refuses: unknown types or fields, missing
fields, non-integers, drag paths under two points) raises; nothing is silently ignored. Errors raised: :class:`DriverError` (and its subclass
:class:`ModelSpaceUnknown`), :class:`controller.run.mapping.OutOfModelBounds`, and the agent client's
``AgentError`` for refusals from the guest.
"""

from __future__ import annotations

import base64
import io
import time
from dataclasses import dataclass
from typing import Any, Callable, Literal, Protocol

from PIL import Image

from controller.model.errors import DesktopSandboxError
from controller.run.mapping import Frame, ModelSpace, fit_size
from wire.actions import ActionInvalid, as_dict, parse_action
from wire.screen_match import MatchRule, ScreenBinding, bind

try:  # the SDK's protocol; the driver is structurally compatible either way
    from openai import ComputerDriver as _ComputerDriverBase
except ImportError:  # pragma: no cover - the controller extra always has it
    _ComputerDriverBase = object  # type: ignore[misc,assignment]


class DriverError(DesktopSandboxError, RuntimeError):
    """The driver cannot carry out an action as asked (unsupported input, no model space yet)."""


class ModelSpaceUnknown(DriverError):
    """A pointer action arrived before any screenshot was sent, so model px have no meaning yet."""


class ScreenChanged(DriverError):
    """An approved action did not run: the screen no longer showed, where it lands, what the person
    approved it on (the agent's 409 ``screen_changed``), and the approval was not given again (a no, or
    nobody to ask, or asked too often: the run's denials say which)."""


@dataclass(frozen=True)
class ScreenshotPolicy:
    """What the model is sent.

    ``format``: "png" or "jpeg"; ``quality``: JPEG quality 1-100; ``max_width``/``max_height``: the
    model image's bounding box (model px, aspect kept, never up-scaled); ``crop``: screen region
    (x, y, w, h in screen px) or None for the whole screen; ``max_bytes``: cap on the encoded image
    size in bytes (before base64); above it the image is re-encoded as JPEG, then down-scaled.
    """

    format: Literal["png", "jpeg"] = "png"
    quality: int = 85
    max_width: int | None = 1280
    max_height: int | None = 800
    crop: tuple[int, int, int, int] | None = None
    max_bytes: int = 4 * 1024 * 1024
    settle: bool = True


@dataclass(frozen=True)
class SentScreenshot:
    """One screenshot as sent to the model.

    ``data``: the encoded bytes; ``mime``: "image/png" or "image/jpeg"; ``image_size``: (w, h) in
    model px; ``frame``: the screen region it shows (screen px); ``screen_size``: (w, h) screen px;
    ``reencoded``: True when the size cap forced a re-encode or down-scale; ``redacted``: the regions
    (screen px boxes) filled in it before it left the agent client (:mod:`controller.redaction`).
    """

    data: bytes
    mime: str
    image_size: tuple[int, int]
    frame: Frame
    screen_size: tuple[int, int]
    reencoded: bool = False
    redacted: tuple[tuple[int, int, int, int], ...] = ()

    @property
    def data_url(self) -> str:
        return f"data:{self.mime};base64,{base64.b64encode(self.data).decode('ascii')}"


class AgentLike(Protocol):
    """The part of ``controller.agent_client.AgentClient`` the driver uses."""

    def actions(self, actions: list[dict[str, Any]], expect_screen: dict[str, Any] | None = None) -> Any: ...
    def screenshot(self, **kwargs: Any) -> Any: ...
    def release(self) -> Any: ...


_MIME_BY_MAGIC = ((b"\x89PNG\r\n\x1a\n", "image/png"), (b"\xff\xd8\xff", "image/jpeg"))


def sniff_mime(data: bytes) -> str:
    """The mime type the bytes really are (PNG or JPEG); raises DriverError for anything else."""
    for magic, mime in _MIME_BY_MAGIC:
        if data.startswith(magic):
            return mime
    raise DriverError("screenshot bytes are neither PNG nor JPEG")


def driver_actions(actions: list[Any]) -> int:
    """How many driver action calls a computer_call's ``actions`` make: every one but ``screenshot``
    (the SDK runs no handler for those; it captures once after the call, ``openai.lib.computer``)."""
    count = 0
    for action in actions:
        kind = action.get("type") if isinstance(action, dict) else getattr(action, "type", None)
        count += kind != "screenshot"
    return count


def _as_dict(action: Any) -> dict[str, Any]:
    data = as_dict(action)
    if data is None:
        raise DriverError(f"unsupported action object {type(action).__name__}")
    return {k: v for k, v in data.items() if v is not None}


class DriverSeam:
    """The one place a run hooks into the driver (``SandboxDriver(agent, policy, seam=...)``); this base
    does nothing, a run's seam (:class:`controller.run.seam.RunSeam`) overrides what it needs.

    Called on the loop's thread, in this order around a step: :meth:`step_boundary` before each action
    and before each screenshot the SDK asks for; :meth:`forwarding` with the actions about to be sent;
    :meth:`screen_changed` when the agent refused a bound action; :meth:`before_capture` before each
    capture, after the settle ``wait``; :meth:`screenshot_sent` with each image the model gets.
    """

    waits_before_capture = False
    """True when :meth:`before_capture` may wait (origin requests, a sign-in): the settle ``wait`` and
    the capture are then sent apart, so that the wait can run between them."""

    def step_boundary(self, screenshot: bool) -> bool:
        """Before each action (``screenshot`` False) and each screenshot the SDK asks for (True): the
        web console's take-over gate, a replay's person's actions. True when the desktop may have
        changed meanwhile (the screen is then captured anew)."""
        return False

    def forwarding(self, actions: list[dict[str, Any]]) -> None:
        """Actions about to be sent to the agent (screen px)."""

    def before_capture(self) -> bool:
        """Before each capture: True when it waited or asked (the screen is let settle and captured anew)."""
        return False

    def screen_changed(self, error: Any) -> bool:
        """The agent refused a bound action (``screen_changed``, its error): True to send it again (the
        approval was given anew), False to stop (:class:`ScreenChanged`)."""
        return False

    def screenshot_sent(self, shot: "SentScreenshot") -> None:
        """An image the model gets (the run record saves it)."""


class SandboxDriver(_ComputerDriverBase):
    """Drives the guest desktop through the agent API (``controller.agent_client.AgentClient``).

    ``agent``: the agent client; ``policy``: what screenshots look like (:class:`ScreenshotPolicy`);
    ``seam``: what the run adds around the calls (:class:`DriverSeam`; default: nothing);
    ``bind_rule``: the comparison rule approvals are bound to the screen with (:mod:`wire.screen_match`;
    None: approvals are not bound, the task's ``[approvals] bind_screen = false``);
    ``capture_with_last_action``: see the attribute.
    """

    def __init__(
        self,
        agent: AgentLike,
        policy: ScreenshotPolicy | None = None,
        *,
        seam: DriverSeam | None = None,
        bind_rule: MatchRule | None = None,
        capture_with_last_action: bool = True,
    ) -> None:
        self.agent = agent
        self.policy = policy or ScreenshotPolicy()
        self.seam = seam or DriverSeam()
        self.model_space: ModelSpace | None = None
        self.last_error: str | None = None
        self.screenshots_sent = 0
        self._input_since_capture = False
        self.capture_with_last_action = capture_with_last_action
        """Send the last action of a planned computer_call (:meth:`plan_calls`) together with the call's
        screenshot capture, in one request (``POST /v1/actions?screenshot=``: one round trip a step;
        the settle ``wait`` goes in it too): the action's method returns once it ran and the screen was
        captured, and :meth:`screenshot` then hands that image over. Turn it off when something must
        run between the last action and the screenshot (an approval gate that asks before the
        screenshot: ``controller.run.approvals.ActionGate``)."""
        self._plan: list[int] = []  # driver actions left in each planned call, in order
        self._taken: tuple[ScreenshotPolicy, Any] | None = None  # the image taken with the last action
        self.last_shot: SentScreenshot | None = None
        """The last screenshot sent to the model (what a person approving a call is shown)."""
        self.bind_rule = bind_rule
        self._binding: ScreenBinding | None = None
        self._last_point: tuple[int, int] | None = None  # screen px of the last point acted on

    # -- helpers -------------------------------------------------------------------------------
    def _space(self) -> ModelSpace:
        if self.model_space is None:
            raise ModelSpaceUnknown("no screenshot has been sent yet, so model coordinates cannot be mapped")
        return self.model_space

    def _send(self, actions: list[dict[str, Any]], **extra: Any) -> None:
        """Send mapped actions (screen px) in one request (``extra``: its ``expect_screen``)."""
        self.seam.forwarding(actions)
        self._input_since_capture = True
        try:
            self.agent.actions(actions, **extra)
        except Exception as exc:
            self.last_error = str(exc)
            raise

    # -- mapping: validate an action and turn it into the agent's screen-px JSON, sending nothing --
    def to_screen_action(self, action: Any) -> dict[str, Any]:
        """Validate one action (model px) and return it in screen px, ready for the agent.

        ``action``: an openai SDK computer action (GA or legacy) or its dict. It is read in the
        schema's model form (:func:`wire.actions.parse_action`: known type, no unknown fields, every
        field the API sends, integers), then each of its points (:meth:`wire.actions.BaseAction.points`)
        is bounds-checked in model space and mapped to screen px; other fields are kept. Returns the
        agent's JSON (``None`` fields left out). Raises :class:`DriverError`, :class:`ModelSpaceUnknown`
        or :class:`controller.run.mapping.OutOfModelBounds`; sends nothing.
        """
        data = _as_dict(action)
        try:
            parsed = parse_action(data)
        except ActionInvalid as exc:
            raise DriverError(f"unsupported action: {exc}") from None
        points = parsed.points()
        if points:
            space = self._space()
            parsed = parsed.with_points([space.to_screen(x, y) for x, y in points])
        return parsed.to_wire()

    def plan_calls(self, calls: list[int]) -> None:
        """The computer_calls of the model's latest response, in order, as the number of driver actions
        each holds (its actions that are not ``screenshot``): it tells which action is a call's last, to
        be sent with the call's capture (:attr:`capture_with_last_action`). Replaces any earlier plan.
        Only an optimisation: with no plan, or a wrong one, every action still runs alone or with a
        capture that a later action voids, and every screenshot shows the screen after the last action."""
        self._plan = [max(0, int(n)) for n in calls]

    def _last_of_call(self) -> bool:
        """Count one action against the plan; True when it is the last of its call."""
        while self._plan and self._plan[0] == 0:  # calls with no driver action are done
            self._plan.pop(0)
        if not self._plan:
            return False
        self._plan[0] -= 1
        if self._plan[0] == 0:
            self._plan.pop(0)
            return True
        return False

    # -- approvals bound to the screen ----------------------------------------------------------
    def bind_next(self, actions: list[Any], shot: SentScreenshot | None = None) -> ScreenBinding | None:
        """Bind the next action sent to ``shot`` (default: :attr:`last_shot`, the screenshot the person
        approving was shown): the regions ``actions`` (model px; an SDK call's actions or their dicts)
        touch, or around the last point acted on when they touch none (the whole screenshot when there is
        none yet), compared by :attr:`bind_rule`; the points are mapped from the model's px to ``shot``'s.
        The agent checks them before that action runs (``expect_screen``, contract 1). Returns the
        binding (None when binding is off or no screenshot was sent yet)."""
        shot = shot or self.last_shot
        if self.bind_rule is None or shot is None:
            self._binding = None
            return None
        points: list[tuple[int, int]] = []
        for action in actions:
            try:
                points += parse_action(_as_dict(action)).points()
            except (ActionInvalid, DriverError):
                continue  # the action itself is refused later, with its own error
        frame = shot.frame if isinstance(shot.frame, Frame) else Frame(*shot.frame)
        # The points are the model's (its last screenshot's px); ``shot`` may be another image (asked
        # again on a new screenshot of another size or frame): compare where the actions really land.
        fallback = self._last_point
        space = self.model_space
        if space is not None:
            def on_shot(sx: int, sy: int) -> tuple[int, int]:
                return ((sx - frame.x) * shot.image_size[0] // max(frame.w, 1),
                        (sy - frame.y) * shot.image_size[1] // max(frame.h, 1))
            points = [on_shot(*space.to_screen(*p)) for p in points]
            # the last point acted on is kept in screen px: a screenshot of another size or region since
            # then does not change where it was
            fallback = on_shot(*fallback) if fallback is not None else None
            if fallback is not None and not (0 <= fallback[0] < shot.image_size[0] and 0 <= fallback[1] < shot.image_size[1]):
                fallback = None  # acted on outside this image: the whole of it is bound
        quality = None
        if shot.mime == "image/jpeg":  # the driver's own re-encode (size cap) uses at most 85
            quality = min(self.policy.quality, 85) if shot.reencoded else self.policy.quality
        with Image.open(io.BytesIO(shot.data)) as img:
            binding = bind(img.convert("RGB"), (frame.x, frame.y, frame.w, frame.h), points, self.bind_rule,
                           fallback=fallback, jpeg_quality=quality)
        self._binding = binding
        return binding

    def look(self) -> SentScreenshot:
        """A screenshot under the policy for a person (a question asked again on the screen as it is
        now), leaving the model's space, :attr:`last_shot` and the record's screenshots alone."""
        raw = self.agent.screenshot(**self._shot_args(self.policy))
        data: bytes = raw.data
        mime = sniff_mime(data)
        frame = raw.frame if isinstance(raw.frame, Frame) else Frame(*raw.frame)
        with Image.open(io.BytesIO(data)) as img:
            size = img.size
        return self._cap(SentScreenshot(data, mime, size, frame, tuple(raw.screen_size),
                              redacted=tuple(getattr(raw, "redacted", ()))))

    def clear_binding(self) -> None:
        """Drop a binding no action used (its call was refused before any action ran)."""
        self._binding = None

    def _act(self, action: Any) -> None:
        """Map one action and send it (the last one of a planned call with the call's capture), with
        the screen binding of an approval (:meth:`bind_next`) when one waits; ``last_error`` says why
        when a step fails."""
        self.last_error = None
        self._taken = None  # an image taken before this action no longer shows the screen
        self.seam.step_boundary(False)
        try:
            mapped = self.to_screen_action(action)
        except Exception as exc:
            self.last_error = str(exc)
            raise
        last = self._last_of_call()
        while True:
            binding, self._binding = self._binding, None
            try:
                self._send_mapped(mapped, last, binding)
                break
            except Exception as exc:
                if binding is None or getattr(exc, "code", None) != "screen_changed":
                    raise
                if not self.seam.screen_changed(exc):
                    self.last_error = "screen_changed"
                    raise ScreenChanged("the screen changed where the approved action lands and the approval "
                                        "was not given again: nothing of it ran") from None
        try:
            points = parse_action(_as_dict(action)).points()
        except (ActionInvalid, DriverError):
            points = []
        if points and self.model_space is not None:
            self._last_point = self.model_space.to_screen(*points[-1])

    def _send_mapped(self, mapped: dict[str, Any], last: bool, binding: ScreenBinding | None) -> None:
        extra = {"expect_screen": binding.model_dump(mode="json")} if binding is not None else {}
        combined = getattr(self.agent, "actions_screenshot", None)
        if not (last and self.capture_with_last_action and combined is not None):
            self._send([mapped], **extra)
            return
        self.seam.forwarding([mapped])
        policy = self.policy
        actions = [mapped, {"type": "wait"}] if policy.settle else [mapped]
        try:
            step = combined(actions, **self._shot_args(policy), **extra)
        except Exception as exc:
            self.last_error = str(exc)
            raise
        self._input_since_capture = False
        self._taken = (policy, step.screenshot)

    # -- ComputerDriver ----------------------------------------------------------------------
    def click(self, action: Any) -> None:
        """Click at a model-space point; button and held keys forwarded as given."""
        self._act(action)

    def double_click(self, action: Any) -> None:
        """Double-click at a model-space point."""
        self._act(action)

    def move(self, action: Any) -> None:
        """Move the pointer to a model-space point."""
        self._act(action)

    def scroll(self, action: Any) -> None:
        """Scroll at a model-space point. scroll_x/scroll_y are forwarded unchanged (sign kept, no offset)."""
        self._act(action)

    def drag(self, action: Any) -> None:
        """Drag along a model-space path; every point is checked before anything is sent."""
        self._act(action)

    def keypress(self, action: Any) -> None:
        """Press a key combination (key names as the model sends them; the agent maps them to keysyms)."""
        self._act(action)

    def type(self, action: Any) -> None:
        """Type text into the focused control."""
        self._act(action)

    def wait(self, action: Any) -> None:
        """Let the environment settle (the agent's ``wait`` action)."""
        self._act(action)

    def screenshot(self) -> dict[str, str]:
        """Capture the screen and return ``{"type": "computer_screenshot", "image_url": "data:..."}``.

        The model space is updated to the image actually sent.
        """
        if self.seam.step_boundary(True):
            self._taken = None  # a person had the desktop meanwhile: the image taken before is old
        shot = self.capture()
        return {"type": "computer_screenshot", "image_url": shot.data_url}

    # -- capture -------------------------------------------------------------------------------
    @staticmethod
    def _shot_args(p: ScreenshotPolicy) -> dict[str, Any]:
        return dict(format=p.format, quality=p.quality, max_width=p.max_width, max_height=p.max_height, crop=p.crop)

    def capture(self) -> SentScreenshot:
        """Take one screenshot under the policy (or hand over the one taken with the call's last action,
        :attr:`capture_with_last_action`), apply the size cap, and make it the model space."""
        self.last_error = None
        taken, self._taken = self._taken, None
        try:
            return self._capture(taken[1] if taken is not None and taken[0] == self.policy else None)
        except Exception as exc:
            self.last_error = str(exc)
            raise

    def _capture(self, raw: Any = None) -> SentScreenshot:
        p = self.policy
        shot_args = self._shot_args(p)
        if raw is None:
            # The settle wait and the screenshot in one request when the agent client offers it
            # (AgentClient.actions_screenshot: one round trip, the image taken right after the wait).
            combined = None if self.seam.waits_before_capture else getattr(self.agent, "actions_screenshot", None)
            if combined is not None and p.settle and self._input_since_capture:
                self._input_since_capture = False
                raw = combined([{"type": "wait"}], **shot_args).screenshot
            elif p.settle and self._input_since_capture:
                self.agent.actions([{"type": "wait"}])
        self._input_since_capture = False
        if self.seam.before_capture():
            raw = None  # an origin request was pending: the image must show the page after the answer
            if p.settle:
                self.agent.actions([{"type": "wait"}])
        if raw is None:
            raw = self.agent.screenshot(**shot_args)
        data: bytes = raw.data
        mime = sniff_mime(data)
        declared = getattr(raw, "mime", None)
        if declared and declared.split(";")[0].strip() != mime:
            raise DriverError(f"agent said {declared} but the bytes are {mime}")
        frame = raw.frame if isinstance(raw.frame, Frame) else Frame(*raw.frame)
        with Image.open(io.BytesIO(data)) as img:
            size = img.size
        if tuple(raw.image_size) != size:
            raise DriverError(f"agent said image size {raw.image_size} but the bytes are {size}")
        shot = SentScreenshot(data, mime, size, frame, tuple(raw.screen_size),
                              redacted=tuple(getattr(raw, "redacted", ())))
        shot = self._cap(shot)
        self.model_space = ModelSpace(shot.image_size[0], shot.image_size[1], shot.frame)
        self.last_shot = shot
        self.screenshots_sent += 1
        self.seam.screenshot_sent(shot)
        return shot

    def _cap(self, shot: SentScreenshot) -> SentScreenshot:
        """Re-encode (JPEG) and then down-scale until the bytes fit ``policy.max_bytes``."""
        limit = self.policy.max_bytes
        if len(shot.data) <= limit:
            return shot
        with Image.open(io.BytesIO(shot.data)) as img:
            img = img.convert("RGB")
            width, height = img.size
            quality = min(self.policy.quality, 85)
            while True:
                current = img if (width, height) == img.size else img.resize((width, height), Image.LANCZOS)
                buf = io.BytesIO()
                current.save(buf, format="JPEG", quality=quality)
                data = buf.getvalue()
                if len(data) <= limit:
                    return SentScreenshot(data, "image/jpeg", (width, height), shot.frame, shot.screen_size, True,
                                          shot.redacted)
                if width <= 64 or height <= 64:
                    raise DriverError(f"screenshot cannot be brought under {limit} bytes")
                width, height = fit_size(width, height, int(width * 0.75), int(height * 0.75))

    def release(self) -> None:
        """Release every key and button held in the guest (an image taken with an action is dropped)."""
        self._taken = None
        self.agent.release()


def wait_for_stable_screen(agent: AgentLike, *, timeout_s: float = 20.0, min_interval_s: float = 0.2,
                           cancelled: Callable[[], bool] | None = None) -> bool:
    """Poll small screenshots until two consecutive ones are identical; True when stable.

    Used before a run starts so the first screenshot shows a settled desktop. Bounded by timeout_s,
    and by ``cancelled()`` (looked at before each screenshot: False once it is true).
    """
    deadline = time.monotonic() + timeout_s
    previous: bytes | None = None
    while time.monotonic() < deadline:
        if cancelled is not None and cancelled():
            return False
        started = time.monotonic()
        shot = agent.screenshot(format="png", quality=None, max_width=320, max_height=200, crop=None)
        if previous is not None and shot.data == previous:
            return True
        previous = shot.data
        remaining = min_interval_s - (time.monotonic() - started)
        if remaining > 0:
            time.sleep(remaining)
    return False


__all__ = [
    "DriverError",
    "ModelSpaceUnknown",
    "ScreenChanged",
    "ScreenshotPolicy",
    "SentScreenshot",
    "SandboxDriver",
    "driver_actions",
    "sniff_mime",
    "wait_for_stable_screen",
]
