"""GuestBrowserDriver: the openai SDK's sync ``BrowserDriver`` over the agent's chromium (contract 9).

``BrowserToolset(driver, members=..., confirm=driver.confirm, url_policy=driver.url_policy)`` runs the
model's ``browser_*`` function calls; each member method here is one ``POST /v1/browser/call`` to the
agent (:meth:`controller.agent_client.AgentClient.browser_call`), ``state()`` one ``GET
/v1/browser/state``. The guest is hostile: every answer is checked by the wire schema
(:mod:`wire.browser_tools`) in the client and then by the SDK's own result rules
(``openai.lib.browser._read_result`` / ``_browser_image``) here, so nothing the SDK would refuse after the
call (which would end the whole run) is handed to it: such an answer is a failed call instead.

Errors: a 422 refusal of the agent (``wire.browser_tools.REFUSAL_CODES``: a stale ref, an unknown tab,
an element that cannot be acted on, a wait that timed out, an unsupported URL, too many tabs) raises
``openai.lib.browser.BrowserError`` with ``CODE: message`` (the agent's message, escaped): the SDK sends
that text to the model. Anything else (``AgentError``, :class:`BrowserDriverError`) raises as it is;
the SDK tells the model "Browser action failed." and the record keeps the real reason
(:attr:`GuestBrowserDriver.last`).

**The observation.** The SDK checks that each state's ``observation`` continues the one before (its
``sequence`` never goes back, the changes it still holds are unchanged). The driver owns that
observation (:class:`ChangeLog`): the agent's changes are taken in order and numbered anew, and the
driver adds its own ``navigation_refused`` (reason ``policy``) when :meth:`GuestBrowserDriver.url_policy`
refuses a URL. Changes the agent dropped before the driver saw them, or an agent whose sequence went
back (a new browser), make the driver drop every change it retained: they are counted in
``dropped_changes`` and the SDK's rules still hold.

**URLs** (:class:`UrlRules`): only ``http``, ``https`` and ``about:blank``; the origin must be one the
task's ``[network]`` policy lets through (its ``allow`` tier; in mode ``ask`` an origin of the ``ask``
tier that is not ``quiet`` goes through and the gateway asks the person, as for any guest traffic);
the gateway's own names and addresses and the agent's own port are refused in every mode, and a
special IP literal (private, link-local, metadata...) unless an ``allow_addresses`` rule names it. A
loopback origin (the guest's own services, which chromium reaches without the gateway) is admitted only
when the task's ``[[launch]]`` of chromium opens a page on it or the ``allow`` tier names it. The
guest-local and gateway part of these rules (:meth:`UrlRules.guest_rule`) is what the agent applies to
every request its chromium makes (redirects, links, scripts, frames: the run hands it over before the
launch), so a page is held to the same rule as the model's own URLs.

**Before the model's next observation** (:class:`StepObservation`): the run's ``before_capture`` chain
(the wait for pending origin requests, then the sign-in flow: the same one the computer driver runs
before each screenshot) runs once per model step, right before the SDK reads the browser state that
follows the step's last browser call -- the last state the model gets for that step -- so what the
model sees next comes after a person's (or the gateway's) decision. A step whose browser call fails
has its later browser calls skipped by the SDK (each only reads the state), so it runs before the read
after the failed call.

**Confirmation** (:meth:`GuestBrowserDriver.confirm`): ``True`` unless the member is among the run's
``--confirm-actions`` (or ``--step`` is on); then the person is asked through the run's approval
registry exactly as the computer actions' :class:`controller.run.approvals.ActionGate` asks (the same
gate: terminal, console, timeout, one ``approval`` line with ``what: action``).
"""

from __future__ import annotations

import base64
import binascii
import io
import ipaddress
import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable
from urllib.parse import urlsplit

from openai.lib.browser import BrowserError, _browser_image, _read_result

from controller.agent_client import MAX_SCREEN_PX, AgentError
from controller.gateway.origin import Origin, PolicyError
from controller.model.errors import DesktopSandboxError
from controller.redaction import Redactor, image_boxes, paint
from controller.run.approvals import ActionGate, Decision
from controller.run.recording import BROWSER_ENDS
from controller.text import clean
from wire.browser_tools import (GUEST_MEMBERS, MAX_CHANGES, MAX_IMAGE_BYTES, MAX_RULE_ENTRIES, REFUSAL_CODES,
                                REFUSED_AGENT, REFUSED_GATEWAY, REFUSED_LOCAL, GuestUrlRule, guest_local, loopback_host)

RICH_READS = frozenset({"read_page", "get_page_text", "find"})
"""Members whose result is a read report (the SDK's ``BrowserReadV1``)."""
IMAGES = frozenset({"screenshot", "zoom"})
"""Members whose result is an ``input_image``."""
NAVIGATIONS = frozenset({"navigate", "new_tab"})
"""Members that load a URL (the SDK asks :meth:`GuestBrowserDriver.url_policy` first)."""


class BrowserDriverError(DesktopSandboxError, RuntimeError):
    """An answer of the agent the driver cannot hand to the SDK (a result of the wrong kind, an image
    that is not PNG or JPEG or over ``wire.browser_tools.MAX_IMAGE_BYTES``)."""


# -- the observation ---------------------------------------------------------------------------------
class ChangeLog:
    """The observation the driver reports (``openai.lib.browser.BrowserObservationV1``), the agent's
    changes numbered anew plus the driver's own, at most ``retain`` of them kept (older ones counted in
    ``dropped_changes``). Invariants (the SDK's ``_state``): ``sequence == dropped_changes +
    len(changes)``, change ``i`` has ``sequence == dropped_changes + i + 1``, and a change once reported
    is reported unchanged for as long as it is retained. Thread-safe."""

    def __init__(self, retain: int = MAX_CHANGES) -> None:
        self.retain = retain
        self._dropped = 0
        self._changes: list[dict[str, Any]] = []
        self._seen: int | None = None  # the agent's sequence taken so far
        self._lock = threading.Lock()

    def take(self, agent: dict[str, Any]) -> None:
        """Take the agent's observation (``{"sequence", "dropped_changes", "changes"}``, already checked
        by the wire schema): its changes after the last one taken are added in order. When some were
        dropped by the agent before they were taken, or the agent's sequence went back (a new browser,
        a new agent), every change retained here is dropped too (counted in ``dropped_changes``)."""
        sequence, dropped = int(agent["sequence"]), int(agent["dropped_changes"])
        changes = list(agent["changes"])
        with self._lock:
            if self._seen is None or sequence < self._seen:
                new, lost = changes, dropped
            else:
                new, lost = changes[max(0, self._seen - dropped):], max(0, dropped - self._seen)
            if lost:
                self._dropped += len(self._changes) + lost
                self._changes = []
            for change in new:
                self._append({k: v for k, v in change.items() if k != "sequence"})
            self._seen = sequence

    def add(self, change: dict[str, Any]) -> None:
        """Add one change of the driver's own (``type``, ``tab_id`` and its fields; numbered here)."""
        with self._lock:
            self._append(dict(change))

    def _append(self, change: dict[str, Any]) -> None:
        change["sequence"] = self._dropped + len(self._changes) + 1
        self._changes.append(change)
        while len(self._changes) > self.retain:
            self._changes.pop(0)
            self._dropped += 1

    def observation(self, title_truncated: bool = False) -> dict[str, Any]:
        """The observation as the SDK reads it (a fresh copy)."""
        with self._lock:
            return {"version": 1, "sequence": self._dropped + len(self._changes), "dropped_changes": self._dropped,
                    "title_truncated": bool(title_truncated), "changes": [dict(c) for c in self._changes]}


# -- the step's observation ---------------------------------------------------------------------------
class StepObservation:
    """Which state read of a model step comes after all of the step's browser calls (module docstring,
    "Before the model's next observation"). The SDK reads the state before and after each browser call
    it runs, and once for each call it skips after a failed one; it reports each call's end (a
    diagnostic) before the read after it. :meth:`plan` takes a new step's browser calls, :meth:`ended`
    each call's end, and :meth:`take` answers, once per step, True for the read the hook must precede:
    the one after the step's last call, or after the first call that failed (nothing of the step runs
    after it). Used from the model loop's thread only."""

    def __init__(self) -> None:
        self._last: str | None = None
        self._due = False
        self._done = True

    def plan(self, call_ids: Iterable[str]) -> None:
        """A new model step whose browser calls the SDK runs are ``call_ids``, in order (none: nothing is
        due in this step)."""
        calls = list(call_ids)
        self._last = calls[-1] if calls else None
        self._due, self._done = False, not calls

    def ended(self, call_id: Any, completed: bool) -> None:
        """The SDK ended the call ``call_id`` (``completed``: it succeeded; else it failed or was refused)."""
        if not self._done and (not completed or call_id == self._last):
            self._due = True

    def take(self) -> bool:
        """True once per step: for the state read right after the step's last call (or its first failed
        one); False for every other read."""
        if not self._due or self._done:
            return False
        self._due, self._done = False, True
        return True


# -- URLs --------------------------------------------------------------------------------------------
_loopback = loopback_host
"""Whether a host is the guest itself (``wire.browser_tools.loopback_host``: ``localhost`` names, loopback
and unspecified addresses in any literal form, an IPv4-mapped one included)."""


@dataclass(frozen=True)
class UrlRules:
    """What the model may load in the agent's chromium (module docstring, "URLs").

    ``network``: the task's ``controller.gateway.policy.NetworkPolicy``; ``local``: loopback origins the
    task's own pages are on (its chromium ``[[launch]]`` URLs); ``gateway_hosts``: the gateway's names
    and guest-side addresses (canonical, as :class:`controller.gateway.origin.Origin` writes hosts);
    ``agent_port``: the agent's port in the guest (refused on loopback), None when unknown.
    """

    network: Any
    local: frozenset[Origin] = frozenset()
    gateway_hosts: frozenset[str] = frozenset({"gateway"})
    agent_port: int | None = None

    @classmethod
    def for_task(cls, task: Any, topology: Any = None, agent_url: str | None = None) -> "UrlRules":
        """The rules for ``task`` (a :class:`controller.run.tasks.Task`) on a sandbox with ``topology``
        (``controller.sandbox.topology.NetworkTopology``, or None) whose agent the controller reaches
        at ``agent_url`` (its port is the agent's when the topology does not say)."""
        from controller.run.tasks import CHANNEL_BROWSER

        local: set[Origin] = set()
        for launch in task.launch:
            if launch.app != CHANNEL_BROWSER:
                continue
            for arg in launch.args:
                try:
                    origin = Origin.from_url(arg)
                except PolicyError:
                    continue
                if _loopback(origin.host):
                    local.add(origin)
        hosts = {"gateway"}
        for name in ("gateway_guest_ip", "proxy_host"):
            value = getattr(topology, name, None)
            if isinstance(value, str) and value:
                try:
                    hosts.add(Origin.from_parts("http", value).host)
                except PolicyError:
                    pass
        port = getattr(topology, "agent_port", None)
        if not isinstance(port, int) and agent_url:
            try:
                parts = urlsplit(agent_url)
                port = parts.port if parts.hostname and _loopback(parts.hostname) else None
            except ValueError:
                port = None
        return cls(network=task.network, local=frozenset(local), gateway_hosts=frozenset(hosts),
                   agent_port=port if isinstance(port, int) else None)

    def guest_rule(self) -> GuestUrlRule:
        """What the agent applies to every request its chromium makes, whatever started it (a redirect, a
        link, a script, a form, a frame; ``PUT /v1/browser/rule``, contract 9): the guest-local origins
        the task's launch opens or its ``allow`` tier names (at most ``MAX_RULE_ENTRIES``), the gateway's
        hosts and the agent's port. Other origins are the gateway's to decide, connection by connection."""
        allowed = {o for o in self.network.origins if self.network.admits_origin(o) and guest_local(o.host)}
        local = sorted({str(o) for o in (*self.local, *allowed)})[:MAX_RULE_ENTRIES]
        return GuestUrlRule(local_origins=local, gateway_hosts=sorted(self.gateway_hosts)[:MAX_RULE_ENTRIES],
                            agent_port=self.agent_port)

    def refusal(self, url: str) -> str | None:
        """Why ``url`` may not be loaded (a short reason, safe to show), or None when it may."""
        if url == "about:blank":
            return None
        try:
            origin = Origin.from_url(url)
        except PolicyError:
            return "only http(s) URLs and about:blank may be loaded"
        if origin.host in self.gateway_hosts:
            return REFUSED_GATEWAY
        if _loopback(origin.host):
            if self.agent_port is not None and origin.port == self.agent_port:
                return REFUSED_AGENT
            if origin in self.local or self.network.admits_origin(origin):
                return None
            return REFUSED_LOCAL
        if origin.is_ip_literal:
            category = self.network.address_refusal(ipaddress.ip_address(origin.host))
            if category is not None:
                return f"a special address ({category}) the task's network policy does not name"
        if self.network.admits_origin(origin):
            return None
        if self.network.mode == "ask":
            if self.network.quiet_match(origin) is not None:
                return "an origin the task's network policy refuses without asking"
            if self.network.ask_match(origin) is not None:
                return None  # the gateway asks the person, as for any guest traffic
        return f"an origin the task's network policy (mode {self.network.mode}) does not let through"


# -- one call's outcome, for the record -------------------------------------------------------------
@dataclass
class BrowserImage:
    """An image a ``screenshot`` or ``zoom`` returned: ``data`` (PNG or JPEG bytes), ``mime``,
    ``size`` (w, h image px) and ``frame`` (x, y, w, h: the screen region it shows, screen px; the
    agent's chromium runs at device scale 1, so viewport CSS px are taken as screen px); ``redacted``: the
    held regions filled in it (screen px boxes, :mod:`controller.redaction`)."""

    data: bytes
    mime: str
    size: tuple[int, int]
    frame: tuple[int, int, int, int]
    redacted: tuple[tuple[int, int, int, int], ...] = ()


@dataclass
class CallOutcome:
    """What one member call did (:attr:`GuestBrowserDriver.last`): ``member``, ``arguments`` (as the SDK
    gave them; typed text included: the record keeps its length only), ``error`` (None when it
    succeeded; escaped text), ``result`` (the summary: ``kind`` none | text | read | image, ``text_length``,
    ``elements``, ``omitted``), ``target`` (``{x, y, width, height}`` viewport CSS px), ``viewport``
    (``{x, y, width, height}`` screen px), ``image`` (:class:`BrowserImage`), ``ms`` (milliseconds)."""

    member: str
    arguments: dict[str, Any]
    error: str | None = None
    result: dict[str, Any] | None = None
    target: dict[str, Any] | None = None
    viewport: dict[str, Any] | None = None
    image: BrowserImage | None = None
    ms: float | None = None


def summarize_result(member: str, result: Any) -> dict[str, Any]:
    """A result as the record keeps it: ``{"kind": "none"}``, ``{"kind": "text", "text_length"}``,
    ``{"kind": "read", "text_length", "elements", "omitted"}`` or ``{"kind": "image"}`` (never the text)."""
    if result is None:
        return {"kind": "none"}
    if isinstance(result, str):
        return {"kind": "text", "text_length": len(result)}
    if member in IMAGES:
        return {"kind": "image"}
    return {"kind": "read", "text_length": len(result.get("text") or ""), "elements": len(result.get("elements") or []),
            "omitted": [clean(o, 40) for o in result.get("omitted") or []]}


def _decode_image(image: dict[str, Any]) -> tuple[bytes, str, tuple[int, int]]:
    from PIL import Image

    url = image.get("image_url")
    prefix, _, payload = (url or "").partition(",")
    if prefix not in ("data:image/png;base64", "data:image/jpeg;base64"):
        raise BrowserDriverError("the image is not a data:image/png or data:image/jpeg URL")
    if len(payload) > (MAX_IMAGE_BYTES + 2) // 3 * 4:
        raise BrowserDriverError(f"the image is over {MAX_IMAGE_BYTES} bytes")
    try:
        data = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise BrowserDriverError("the image is not base64") from None
    mime = prefix[5:-7]
    magic = b"\x89PNG\r\n\x1a\n" if mime == "image/png" else b"\xff\xd8\xff"
    if not data.startswith(magic):
        raise BrowserDriverError(f"the image's bytes are not {mime}")
    try:
        with Image.open(io.BytesIO(data), formats=["PNG" if mime == "image/png" else "JPEG"]) as img:
            size = (int(img.size[0]), int(img.size[1]))
    except Exception:  # noqa: BLE001 - any decoder failure is a bad image
        raise BrowserDriverError("the image cannot be read") from None
    if size[0] > MAX_SCREEN_PX or size[1] > MAX_SCREEN_PX:  # from its header: no pixel decoded yet
        raise BrowserDriverError(f"the image is {size[0]}x{size[1]} px, larger than {MAX_SCREEN_PX} px a side "
                                 "(the largest screen)")
    return data, mime, size


def describe_call(member: str, arguments: dict[str, Any], *, redact: bool = True) -> str:
    """One line for a browser call: ``browser click target=e12``, ``browser type <12 chars> target=e3``
    (``redact=False``: the text itself, escaped), ``browser navigate url=https://...``; every value
    escaped and cut (:func:`controller.text.clean`)."""
    parts = [f"browser {clean(member, 40)}"]
    for name, value in arguments.items():
        if value is None:
            continue
        if name == "text" and member == "type":
            parts.append(f"<{len(value)} chars>" if redact or not isinstance(value, str) else
                         clean(json.dumps(value, ensure_ascii=False), 200))
            continue
        shown = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
        parts.append(f"{clean(name, 40)}={clean(shown, 200)}")
    return " ".join(parts)


# -- the driver --------------------------------------------------------------------------------------
class GuestBrowserDriver:
    """The SDK's sync ``BrowserDriver`` for the agent's chromium (module docstring).

    ``agent``: the agent client (``browser_state``, ``browser_call``); ``rules``: :class:`UrlRules`
    (None: every http(s) URL may be loaded; the gateway's policy still applies); ``gate``: the run's
    :class:`controller.run.approvals.ActionGate` (None: nothing is confirmed); ``on_call``: called with
    each :class:`CallOutcome` as the call ends. Member methods take the SDK's arguments dict and return
    the SDK's result (None, a string, a read report dict, an ``input_image`` dict). The model loop tells
    the driver each step's calls (:meth:`plan_step`) and the SDK's diagnostics (:meth:`on_diagnostic`),
    so :meth:`state` runs :attr:`before_observe` once per step (module docstring).
    """

    def __init__(self, agent: Any, *, rules: UrlRules | None = None, gate: ActionGate | None = None,
                 on_call: Callable[[CallOutcome], None] | None = None) -> None:
        self.agent = agent
        self.rules = rules
        self.gate = gate
        self.on_call = on_call
        self.changes = ChangeLog()
        self.last: CallOutcome | None = None
        """The outcome of the latest member call (the record's ``browser_call`` line reads it)."""
        self.refused_url: str | None = None
        """Why :meth:`url_policy` refused the latest URL (None when it let it through)."""
        self.denied: str | None = None
        """The call a confirmation was denied for (``browser click target=...``; None while none was):
        the run's loop ends there, failed, as a denied computer action ends it."""
        self.before_observe: Callable[[], Any] | None = None
        """The run's ``before_capture`` chain (origin wait, sign-in; its answer is not used), run by
        :meth:`state` before the read that follows a step's browser calls (:class:`StepObservation`)."""
        self.observation = StepObservation()
        self._tabs: list[dict[str, Any]] = []

    # -- the model loop's step ---------------------------------------------------------------------
    def plan_step(self, output: Iterable[Any], names: Iterable[str]) -> None:
        """A new model response, before its tools run: its ``output`` items (the SDK's response items)
        whose browser calls the SDK's toolset runs -- complete ``function_call`` items named by one of
        ``names``, the toolset's tool names (``browser_click``...)."""
        served = frozenset(names)
        self.observation.plan(
            getattr(item, "call_id", None) for item in output
            if getattr(item, "type", None) == "function_call" and getattr(item, "name", None) in served
            and getattr(item, "status", None) in (None, "completed"))

    def on_diagnostic(self, event: dict[str, Any]) -> None:
        """One of the SDK's diagnostics: a browser call's end (``controller.run.recording.BROWSER_ENDS``)
        goes to :attr:`observation`; anything else is ignored."""
        if event.get("api") == "browser" and (event.get("stage"), event.get("reason")) in BROWSER_ENDS:
            self.observation.ended(event.get("call_id"), event.get("reason") == "completed")

    # -- the SDK's protocol ------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        """The SDK's ``BrowserState`` with the driver's observation: the agent's tabs and its changes
        taken into :attr:`changes`. The read that follows a step's browser calls first runs
        :attr:`before_observe` (:class:`StepObservation`). A chromium that is not running (409
        ``no_browser`` / ``no_page``) shows no tabs. Raises AgentError for anything else."""
        if self.observation.take() and self.before_observe is not None:
            self.before_observe()
        try:
            state = self.agent.browser_state()
        except AgentError as exc:
            if exc.status == 409 and exc.code in ("no_browser", "no_page"):
                self._tabs = []
                return {"tabs": [], "observation": self.changes.observation()}
            raise
        observation = state["observation"]
        self.changes.take(observation)
        self._tabs = [dict(t) for t in state["tabs"]]
        return {"tabs": [dict(t) for t in state["tabs"]],
                "observation": self.changes.observation(observation.get("title_truncated", False))}

    def url_policy(self, ctx: dict[str, Any], url: str) -> bool:
        """The SDK's ``url_policy``: True when :attr:`rules` let ``url`` be loaded; else a
        ``navigation_refused`` change (reason ``policy``) on the tab it was for (``navigate``'s tab,
        the active one when the call names none; None for ``new_tab``) and False."""
        why = self.rules.refusal(url) if self.rules is not None else (
            None if url == "about:blank" or url.lower().startswith(("http://", "https://")) else "not http(s)")
        self.refused_url = why
        if why is None:
            return True
        tab = None
        if ctx.get("member") == "navigate":
            tab = (ctx.get("arguments") or {}).get("tab_id")
            if tab is None:
                tab = next((t["id"] for t in self._tabs if t.get("active")), None)
        self.changes.add({"type": "navigation_refused", "tab_id": tab, "reason": "policy"})
        return False

    def confirm(self, ctx: dict[str, Any], cancelled: Callable[[], bool] | None = None) -> bool:
        """The SDK's ``confirm`` (state-changing members only): exactly True unless :attr:`gate` asks
        before this member (``--confirm-actions`` names it, or ``--step``); then the person's answer
        through the run's approval registry (True only for an approval), as ActionGate asks. A no
        (or nobody to ask) sets :attr:`denied`."""
        gate = self.gate
        member = str(ctx.get("member"))
        if gate is None or not gate.asks(member):
            return True
        arguments = dict(ctx.get("arguments") or {})
        shown, logged = describe_call(member, arguments, redact=False), describe_call(member, arguments)
        if not gate.anyone:
            msg = "denied: confirmation required but there is no terminal to ask"
            gate.console.print(f"{logged}: {msg}", style="red", markup=False, emoji=False, highlight=False)
            if gate.on_decision is not None:
                gate.on_decision(Decision(what="action", decision="denied", by="no-approver", action=logged,
                                          call_id=ctx.get("call_id"), message=msg))
            self.denied = logged
            return False
        question = f"Run {shown}?"
        request = gate.open("action", question, actions=[shown], call_id=ctx.get("call_id"))
        gate.ask(request, question, cancelled)
        if gate.on_decision is not None:
            gate.on_decision(Decision(what="action", decision=request.state, by=request.by or "terminal",
                                      action=logged, call_id=ctx.get("call_id"), message=request.reason,
                                      request_id=request.id, latency_ms=request.latency_ms,
                                      screenshot=request.screenshot))
        if not request.approved:
            self.denied = logged
        return True if request.approved else False

    # -- one call ----------------------------------------------------------------------------------
    def call(self, member: str, arguments: dict[str, Any]) -> Any:
        """Run ``member`` on the agent and return the SDK's result (see the class docstring). Raises
        BrowserError for the agent's 422 refusals (``CODE: message``, escaped), AgentError or
        :class:`BrowserDriverError` otherwise; :attr:`last` holds the outcome either way."""
        outcome = CallOutcome(member=member, arguments=dict(arguments))
        self.last = outcome
        started = time.monotonic()
        redactor = getattr(self.agent, "redactor", None)
        since = redactor.mark() if isinstance(redactor, Redactor) else started
        try:
            answer = self.agent.browser_call(member, outcome.arguments)
            outcome.target = answer.target.model_dump() if answer.target is not None else None
            outcome.viewport = answer.viewport.model_dump() if answer.viewport is not None else None
            raw = answer.wire()["result"]
            result = self._checked(member, raw, outcome, since)
            outcome.result = summarize_result(member, result)
            return result
        except AgentError as exc:
            if exc.status == 422 and exc.code in REFUSAL_CODES:
                outcome.error = clean(f"{exc.code}: {exc.message}", 300)
                raise BrowserError(outcome.error) from None
            outcome.error = clean(str(exc), 300)
            raise
        except Exception as exc:
            outcome.error = clean(f"{type(exc).__name__}: {exc}", 300)
            raise
        finally:
            outcome.ms = round((time.monotonic() - started) * 1000, 2)
            if self.on_call is not None:
                self.on_call(outcome)

    def _checked(self, member: str, raw: Any, outcome: CallOutcome, since: float) -> Any:
        """``raw`` as the SDK will accept it after the call, or BrowserDriverError. An image has the
        regions held since ``since`` (the agent's redactor, :mod:`controller.redaction`) filled before the
        SDK or the record gets it."""
        if member in RICH_READS:
            try:
                return _read_result(member, raw)
            except Exception:  # noqa: BLE001 - the SDK's own rule refused it
                raise BrowserDriverError(f"the agent's {member} answer is not a read report the SDK accepts") from None
        if member in IMAGES:
            try:
                image = _browser_image(member, raw)
            except Exception:  # noqa: BLE001
                raise BrowserDriverError(f"the agent's {member} answer is not an input_image") from None
            data, mime, size = _decode_image(dict(image))
            frame = self._frame(member, outcome, size)
            redactor = getattr(self.agent, "redactor", None)
            boxes = redactor.boxes(since, (MAX_SCREEN_PX, MAX_SCREEN_PX)) if isinstance(redactor, Redactor) else []
            if boxes:
                # without the viewport's place on the screen a held box cannot be placed: all of it is filled
                inside = image_boxes(boxes, frame, size) if outcome.viewport else [(0, 0, size[0], size[1])]
                try:
                    data = paint(data, mime, inside, size=size)
                except ValueError:
                    raise BrowserDriverError("the image cannot be read") from None
                image = {**dict(image), "image_url": f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}"}
            outcome.image = BrowserImage(data=data, mime=mime, size=size, frame=frame,
                                         redacted=tuple(boxes) if boxes else ())
            return image
        if raw is not None and not isinstance(raw, str):
            raise BrowserDriverError(f"the agent's {member} answer is not a string or null")
        return raw

    @staticmethod
    def _frame(member: str, outcome: CallOutcome, size: tuple[int, int]) -> tuple[int, int, int, int]:
        view = outcome.viewport or {}
        x, y = int(view.get("x", 0)), int(view.get("y", 0))
        if member == "zoom":
            left, top, right, bottom = (int(v) for v in outcome.arguments["region"])
            return (x + left, y + top, right - left, bottom - top)
        return (x, y, int(view.get("width", size[0])), int(view.get("height", size[1])))


def _member(name: str) -> Callable[..., Any]:
    def method(self: GuestBrowserDriver, action: dict[str, Any]) -> Any:
        return self.call(name, action)

    method.__name__ = method.__qualname__ = name
    method.__doc__ = f"The SDK's ``{name}``: one ``POST /v1/browser/call`` (:meth:`GuestBrowserDriver.call`)."
    return method


for _name in GUEST_MEMBERS:
    setattr(GuestBrowserDriver, _name, _member(_name))
del _name

