"""The run record's entries (record format :data:`FORMAT`): one pydantic model per entry ``type``.

A record is ``runs/<run-id>/record.jsonl``: one JSON object a line, each one of the models below
(:data:`Entry`, a union discriminated on ``type``). The first line is ``run_started``, which carries
``format`` (the format this code writes, :data:`FORMAT`); a reader refuses a record whose format is
newer than the one it knows. A ``run_started`` without ``format`` is format 1.

Time: ``ts`` is the controller's UTC time (ISO-8601, milliseconds) when the line was written. Lines
are in the order written and their ``ts`` never decreases (a wall clock stepping back repeats the
last ``ts``). Network decisions come from the gateway, which has its own clock: a ``network`` entry
is written when the controller read the decision from the gateway's log (after the action during
which it was made, or at teardown at the latest), so its ``ts`` orders it among the actions; the
gateway's own time is ``at``, kept for reference and never used for ordering.

Typed text never enters the record (``type`` actions carry ``text_length`` only) and nothing here
ever sees the API key. Sizes: model px for actions, screen px for frames, as named per field.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Mapping
from typing import Annotated, Any, Literal, Optional, Union

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

from controller.model.errors import DesktopSandboxError
from controller.text import clean

FORMAT = 9
"""The record format this code writes and the newest it reads. Format 2 added the approval registry's
fields to ``approval`` (``request_id``, ``latency_ms``, ``screenshot``, decision ``withdrawn``), the model's
words to ``model_response`` (``text``) and the ``human_action`` and ``takeover`` entries. Format 3 added
origin access: ``approval`` lines for origin requests (``what`` origin_access, ``origin``, decisions
``cancelled`` and ``timeout``), ``request_id`` and ``held_ms`` on ``network`` and ``waited_for_origin_ms`` on
``screenshot``. Format 4 added ``agents_event`` (a run that is a turn of a local Agents API session).
Format 5 added ``sign_in`` (a sign-in request and what came of it, contract 8) and ``page`` checks.
Format 6 added ``browser_call`` (a call of the SDK's browser tools, contract 9). Format 7 added
``destination`` to ``sign_in``. Format 8 added ``claim`` to ``run_started`` (a sandbox from a warm pool or
a cold start beside one) and the ``policy`` entry (the network policy swapped at runtime). Format 9
added the ``video`` entry (the run's video, ``run.webm``), the ``web_recording`` entry (the run's recorded
web origins, ``web/``), the ``redaction`` entry and ``redacted`` on ``screenshot`` (regions kept out of
pictures). Records of formats 1 to 8 read unchanged."""


def _utc_timestamp(value: str) -> str:
    when = _dt.datetime.fromisoformat(value)
    if when.utcoffset() is None:
        raise ValueError("timestamp without a time zone")
    return value


Timestamp = Annotated[str, AfterValidator(_utc_timestamp)]
"""ISO-8601 time with its offset (``2030-01-01T00:00:00.000+00:00``)."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, protected_namespaces=())


class _Entry(_Model):
    """Fields every entry has. ``ts``: None until :class:`controller.run.record.RunRecord` writes it
    (a record read from disk has it on every line)."""

    ts: Optional[Timestamp] = None

    def as_json(self) -> dict[str, Any]:
        """The entry as the JSON object written to the record (``ts`` and ``type`` first)."""
        return self.model_dump(mode="json", fallback=str)


class TaskRef(_Model):
    """The task a run ran: its ``name``, task file (``source``) and that file's ``sha256`` (hex)."""

    name: Optional[str] = None
    source: Optional[str] = None
    sha256: Optional[str] = None


REPLAY_RUNNER = "replay"
"""``run_started.runner`` of a replay's run (its summary then shows steps replayed, not model figures)."""


class RunStarted(_Entry):
    """The sandbox is up (or did not start: ``sandbox`` None). ``format``: the record format;
    ``mode``: live | offline | attended (the steps are its caller's calls, not a model's responses:
    :mod:`controller.run.attended`); ``model``: the live model, ``scripted``, or for an attended run who
    called (the MCP client's name, or the runner); ``image``: what runs the guest
    (``sha256:...``); ``time_scale``: the sandbox's slowness factor; ``policy``: the network policy;
    ``screen`` / ``model_view``: the task's screen and model-image settings; ``script``: the offline
    script path; ``sandbox_start_s``: seconds the sandbox took to start; ``runner``: the model loop that
    drove the run (``sdk``: the openai SDK's ``ComputerToolset``, or its ``ResponsesToolRunner`` for a task
    with the browser tools; ``agent-framework``: an Agent Framework agent, ``run-task --runner``; ``replay``:
    the SDK's loop on a recorded run's steps, ``desktop-sandbox replay``; for an attended run ``python``
    (:mod:`desktop_sandbox`), ``mcp`` (``desktop-sandbox mcp``) or ``agents-sdk``
    (:mod:`desktop_sandbox.agents`)); ``claim``: where the sandbox
    came from when someone handed it out (``source``: ``pool`` (a warm pool's, ``claim_s``: seconds the
    claim took: token, policy swap) or ``cold`` (started for this run beside a pool: ``reason``
    ``empty``, ``no_template`` or ``claim_failed``), ``template``: the pool template's key); None: started
    for this run with no pool;
    ``screen_binding``: the comparison rule approvals were bound to the screen with (``margin``,
    ``tolerance``, ``max_changed``; None: the task's ``[approvals] bind_screen = false``, approved calls
    ran unchecked); ``typed_text``: typed text is kept in ``computer_call`` lines (``--record-typed-text``)."""

    type: Literal["run_started"] = "run_started"
    format: int = Field(FORMAT, strict=True, ge=1, le=FORMAT)
    task: TaskRef
    mode: Optional[str] = None
    model: Optional[str] = None
    legacy: Optional[bool] = None
    image: Optional[str] = None
    sandbox: Optional[str] = None
    time_scale: Optional[float] = None
    policy: Optional[dict[str, Any]] = None
    max_steps: Optional[int] = None
    screen: Optional[dict[str, Any]] = None
    model_view: Optional[dict[str, Any]] = None
    script: Optional[str] = None
    sandbox_start_s: Optional[float] = None
    runner: Optional[str] = None
    screen_binding: Optional[dict[str, Any]] = None
    typed_text: bool = False
    claim: Optional[dict[str, Any]] = None


class Usage(_Model):
    """Token counts of one model response (None when the response did not say)."""

    input_tokens: Optional[int] = None
    output_tokens: Optional[int] = None
    total_tokens: Optional[int] = None


class ModelResponse(_Entry):
    """One ``/responses`` answer: ``http_status`` (a failed request: >= 400 with the body's ``error``),
    ``response_id``, ``usage`` (None when the response had none), ``text``: the model's words in it
    (its ``output_text`` parts joined, escaped and cut to :data:`MAX_MODEL_TEXT` characters; None when
    it said nothing)."""

    type: Literal["model_response"] = "model_response"
    response_id: Optional[str] = None
    http_status: Optional[int] = None
    usage: Optional[Usage] = None
    error: Any = None
    text: Optional[str] = None


MAX_MODEL_TEXT = 4000
"""Most characters of a response's text the record keeps (``model_response.text``)."""


class ComputerCall(_Entry):
    """A computer_call the model sent: ``form`` (``actions`` list or the legacy single ``action``),
    ``actions`` as sent (coordinates in model px; ``type`` actions redacted to ``text_length``, with
    ``text`` beside it only when the run records typed text: ``run_started.typed_text``),
    ``pending_checks``: its pending safety checks (``{"id", "code"?, "message"?}``)."""

    type: Literal["computer_call"] = "computer_call"
    call_id: Optional[str] = None
    form: Optional[Literal["actions", "action"]] = None
    actions: list[Any] = Field(default_factory=list)
    pending_checks: list[Any] = Field(default_factory=list)


class Action(_Entry):
    """One driver call the SDK made: ``action`` (the action type, or ``screenshot``), ``duration_ms``
    (milliseconds), ``error`` (None when it succeeded; ``cancelled`` when a signal stopped it)."""

    type: Literal["action"] = "action"
    call_id: Optional[str] = None
    action: Optional[str] = None
    duration_ms: Optional[float] = None
    error: Optional[str] = None


class Screenshot(_Entry):
    """An image sent to the model, stored beside the record as ``file``: its ``sha256`` (hex),
    ``mime``, ``image_size`` (model px), ``frame`` (x, y, w, h of the screen it shows, screen px),
    ``screen_size`` (screen px), ``reencoded`` (cut down to fit the size limit), ``waited_for_origin_ms``
    (milliseconds the screenshot waited for pending origin requests to be decided, so that it shows
    the page after the decision; None when none was pending). A browser ``screenshot`` or ``zoom``
    (contract 9) is one too: its ``call_id`` is the browser call's, ``image_size`` the image's px and
    ``frame`` the part of the screen the tab's viewport (or the zoomed region) covers. ``redacted``: the
    regions (screen px ``x, y, w, h``) filled before the image was sent or saved, because a secret could
    be there (a ``redaction`` line says why; None: none)."""

    type: Literal["screenshot"] = "screenshot"
    file: str
    sha256: str
    mime: str
    image_size: tuple[int, int]
    frame: tuple[int, int, int, int]
    screen_size: Optional[tuple[int, int]] = None
    reencoded: bool = False
    call_id: Optional[str] = None
    waited_for_origin_ms: Optional[float] = Field(None, ge=0)
    redacted: Optional[list[tuple[int, int, int, int]]] = None


class Approval(_Entry):
    """A decision on a safety check, an action or an origin request (``what``: safety_check | action |
    origin_access), or an opt-in given on the command line (``what``: opt-in, with ``codes`` approved
    unattended by ``--approve-safety-check`` or the ``origin`` approved by ``--approve-origin``).
    ``decision``: approved | denied | withdrawn (the run was cancelled or ended while it was pending:
    nothing of it ran), and for an origin request also cancelled (its held connections were refused,
    nothing remembered) | timeout (the gateway's deadline passed: refused); ``by``: who decided --
    terminal | console (a person), timeout (``--approval-timeout`` or the gateway's deadline passed),
    opt-in, no-approver (nobody could be asked: a deny), cancel, command line (an opt-in, or
    ``--approve-origin``), replay (a replay refusing what its record shows refused, ``message`` the
    recorded answer), gateway (decided at the gateway by another client), gateway_log (written at
    teardown for a request found only in the gateway's decision log); ``origin``: the origin an origin
    request is about (``scheme://host[:port]``, escaped); ``request_id``: the approval registry's id
    (an origin request's is the gateway's ``oreq_...``, the same as on its ``network`` lines);
    ``latency_ms``: from asking to the decision; ``screenshot``: the file of the screenshot the model
    had when it asked (the person was shown). ``action`` shows typed text as its length only.
    ``decision: screen_changed`` (``by: agent``): an approval made void just before the call's first
    action, because the screen no longer showed, where the actions land, what that screenshot showed
    (contract 6, bound approvals): nothing ran, ``message`` says how much changed and ``screenshot`` is
    the new screen the person is then asked on (an image the model was not sent)."""

    type: Literal["approval"] = "approval"
    what: Literal["safety_check", "action", "origin_access", "opt-in"]
    decision: Literal["approved", "denied", "cancelled", "timeout", "withdrawn", "screen_changed"]
    by: str
    call_id: Optional[str] = None
    codes: list[Optional[str]] = Field(default_factory=list)
    check_ids: list[Optional[str]] = Field(default_factory=list)
    action: Optional[str] = None
    message: Optional[str] = None
    request_id: Optional[str] = None
    latency_ms: Optional[float] = Field(None, ge=0)
    screenshot: Optional[str] = None
    origin: Optional[str] = None


class HumanAction(_Entry):
    """An action a person performed from the console while they had control (after ``takeover``):
    ``action`` described in screen px, typed text as its length only; ``input`` the action as sent to
    the agent (screen px; ``type`` as ``text_length``, with ``text`` only when the run records typed
    text), what ``replay`` performs again; ``by``: the view it came from (console, or replay)."""

    type: Literal["human_action"] = "human_action"
    action: str
    input: Optional[dict[str, Any]] = None
    by: str = "console"


class Takeover(_Entry):
    """Control of the desktop changed hands at a step boundary: ``control`` human (a person took over:
    the model loop waits) or model (the person resumed the run); ``by``: the view (console)."""

    type: Literal["takeover"] = "takeover"
    control: Literal["human", "model"]
    by: str = "console"


class Redaction(_Entry):
    """A region of the screen kept out of every picture from this line on (the model's screenshots, the
    saved files, the console's live view, the video), filled with black, because a secret could be there
    (:mod:`controller.redaction`): ``why`` ``sign_in`` (the agent filling a sign-in form: the whole screen
    until the fill answered) or ``typing`` (a person typed during a takeover: the window the keys went to,
    until control went back to the model); ``box``: the region, screen px ``x, y, w, h`` (None: the whole screen);
    ``held_before``: held before this run began (an earlier run on the same sandbox)."""

    type: Literal["redaction"] = "redaction"
    why: Literal["sign_in", "typing"]
    box: Optional[tuple[int, int, int, int]] = None
    held_before: bool = False


class Network(_Entry):
    """One gateway decision, written when the controller read it (see the module's note on time).

    ``seq``: its line number in the gateway's decision log (1-based; one line per decision, so the
    record holds each line once); ``origin``, ``decision``, ``reason``, ``via``: as the gateway wrote
    them (:class:`controller.gateway.policy.Decision`, control characters escaped, cut); ``at``: the
    gateway's own time of the decision. A connection to an origin of the task's ask tier also has
    ``request_id`` (the origin request it waited on: the ``approval`` line with that id says who
    decided) and ``held_ms`` (how long the gateway held it, milliseconds); its ``reason`` is then
    approved, approved_earlier, user_denied, denied_earlier, cancelled, timeout, client_gone (the
    client left while held), gateway_stopped (the gateway stopped while it held it), or without a
    request quiet, policy, address_refused, prompt_limit."""

    type: Literal["network"] = "network"
    seq: Optional[int] = None
    origin: str
    decision: Literal["allow", "deny"]
    reason: Optional[str] = None
    via: Optional[str] = None
    at: Optional[str] = None
    request_id: Optional[str] = None
    held_ms: Optional[float] = Field(None, ge=0)


class NetworkLog(_Entry):
    """Once, at teardown: whether the gateway's decision log was read in full (``complete``: every
    line is in the record as a ``network`` entry), ``decisions`` (lines in that log) and why not
    (``error``)."""

    type: Literal["network_log"] = "network_log"
    complete: bool
    decisions: int = 0
    error: Optional[str] = None


class Check(_Entry):
    """One verification result: ``kind`` (file | sqlite), ``target`` (guest path), ``rule``,
    ``expected``, ``observed`` (None when nothing could be read: ``detail`` says why), ``passed``;
    ``expected_hex`` / ``observed_hex`` when bytes differ, ``bound`` (files bound into a query) and
    ``copied`` (database files copied) for sqlite checks."""

    type: Literal["check"] = "check"
    kind: Optional[str] = None
    target: Optional[str] = None
    rule: Optional[str] = None
    expected: Any = None
    observed: Any = None
    passed: bool
    detail: Optional[str] = None
    expected_hex: Optional[str] = None
    observed_hex: Optional[str] = None
    bound: Optional[dict[str, Optional[str]]] = None
    copied: Optional[list[str]] = None


class UnmetExpectation(_Model):
    """One screen expectation that did not hold: its ``index`` in the turn, ``kind``, the
    ``expectation`` as scripted (regions in model px), ``expected`` (described) and ``observed``."""

    index: Optional[int] = None
    kind: Optional[str] = None
    expectation: Optional[dict[str, Any]] = None
    expected: Optional[str] = None
    observed: Any = None


class Expectation(_Entry):
    """An offline script turn whose screen expectations were resolved: ``met`` (after ``waits``
    inserted waits, ``waited_s`` seconds, ``retries`` redone steps), or given up on (``reason``,
    ``timeout_s``, ``unmet``)."""

    type: Literal["expectation"] = "expectation"
    turn: Optional[int] = None
    call_id: Optional[str] = None
    met: bool
    waits: int = 0
    waited_s: Optional[float] = None
    retries: Optional[int] = None
    expected: Optional[list[str]] = None
    reason: Optional[str] = None
    timeout_s: Optional[float] = None
    unmet: list[UnmetExpectation] = Field(default_factory=list)


class AgentsEvent(_Entry):
    """An event the local Agents API (``desktop-sandbox serve``, contract 7) sent for the session this run
    is a turn of, written as it was sent (the events sent for the turn before the run began -- the turn
    and the user's message -- when the run began): `event_id` (its SSE id, `evt_N`), `event` (its type,
    e.g. `agent.session.turn.item.done`), `session_id`, `turn_id`, `item_id` (the item it carries, if any).
    The event itself is in the server's database."""

    type: Literal["agents_event"] = "agents_event"
    event_id: str
    event: str
    session_id: str
    turn_id: Optional[str] = None
    item_id: Optional[str] = None


class PolicySwap(_Entry):
    """The sandbox's network policy was replaced at runtime, through the gateway's control channel
    (never the guest): ``policy``, enforced from this line on; ``closed``: connections the gateway had
    open that the new policy refuses, which it closed (each also a ``network`` deny ``policy_swapped``);
    ``pending_refused``: origin requests the new policy does not ask about, answered ``cancelled``;
    ``why``: ``claim`` (a warm pool's sandbox given the task's policy before the run began)."""

    type: Literal["policy"] = "policy"
    policy: dict[str, Any]
    closed: int = 0
    pending_refused: int = 0
    why: Literal["claim", "swap"] = "claim"


class ViewDropped(_Entry):
    """A follower of the run (``view``: its name on the run's bus, e.g. the Agents API's session or a
    console feed) fell behind by ``queued`` events and was dropped: it got nothing after this line, and
    the run went on without waiting for it."""

    type: Literal["view_dropped"] = "view_dropped"
    view: str
    queued: int


class SignIn(_Entry):
    """One sign-in request of the agent's chromium (contract 8) and what came of it, never a value:
    ``request_id``, ``step`` (1 for the first request of a sign-in, then 2, 3 for the method, the e-mail,
    the code...), ``origin`` (the browser's ``credential_origin``), ``destination`` (the origin the form
    sends to, when read), ``fields`` (the request's field ids),
    ``options`` (its option ids), ``method`` (the option chosen), ``submitted`` (the field ids a value
    was given for), ``outcome`` (the fill's, ``wire.browser.Outcome``: ``submitted``, ``origin_changed``,
    ``form_changed``, ``field_unstable``, ``no_form``, ``unsafe_form``, ``cross_origin_form``, ``invalid``,
    ``cross_origin_redirect`` (the site redirected the submit's POST to another origin, ``destination``)
    -- the two form refusals also without a request when the form as read has a method other than post
    or another destination, nobody asked; ``cancelled``, ``timeout``, ``withdrawn``, ``no_approver``
    when nothing was typed;
    ``refused_origin`` when the page's origin is not one the policy lets through, so nothing was asked;
    ``same_form`` when the site showed the same form again after a submit answered from a ``--sign-in``
    file, which would only give the same values again; ``error``), ``navigated`` (a new document loaded after the submit), ``by`` (who answered) and
    ``detail``."""

    type: Literal["sign_in"] = "sign_in"
    request_id: Optional[str] = None
    step: int = 1
    origin: str
    destination: Optional[str] = None
    fields: list[str] = Field(default_factory=list)
    options: list[str] = Field(default_factory=list)
    method: Optional[str] = None
    submitted: list[str] = Field(default_factory=list)
    outcome: str
    navigated: Optional[bool] = None
    by: Optional[str] = None
    detail: Optional[str] = None


def browser_arguments(member: str, arguments: Any) -> Any:
    """A browser call's arguments as the record keeps them: ``type``'s ``text`` replaced by
    ``text_length`` (typed text never enters the record); other values as given."""
    if not isinstance(arguments, Mapping):
        return None
    if member != "type":
        return dict(arguments)
    return {("text_length" if name == "text" else name):
            ((len(value) if isinstance(value, str) else None) if name == "text" else value)
            for name, value in arguments.items()}


class BrowserResult(_Model):
    """What a browser call returned, never its text: ``kind`` (none, text, read or image),
    ``text_length`` (characters), ``elements`` (a read report's element count), ``omitted`` (its
    omission codes)."""

    kind: Literal["none", "text", "read", "image"]
    text_length: Optional[int] = None
    elements: Optional[int] = None
    omitted: list[str] = Field(default_factory=list)


class BrowserCall(_Entry):
    """One call of the SDK's browser tools (contract 9) the loop handled: ``step`` (the model response it
    came in, counted from 1), ``call_id``, ``member`` (``click``, ``read_page``...), ``arguments`` as the
    model sent them (`type`'s text as its `text_length` only), ``ok``, ``error`` (why not, escaped: the
    agent's refusal, the SDK's, a policy's or a person's), ``result`` (its summary: kind, text length,
    element count, omissions), ``tab_id`` (the tab it named; None: the active one), ``target`` (the box of
    the element acted on, ``x, y, width, height`` viewport CSS px), ``viewport`` (where the tab's viewport
    lies on the screen, ``x, y, width, height`` screen px), ``screenshot`` (the file of the image a
    ``screenshot`` or ``zoom`` returned, stored beside the record with its own ``screenshot`` line),
    ``ms`` (milliseconds the call took)."""

    type: Literal["browser_call"] = "browser_call"
    step: Optional[int] = None
    call_id: Optional[str] = None
    member: Optional[str] = None
    arguments: Optional[dict[str, Any]] = None
    ok: bool
    error: Optional[str] = None
    result: Optional[BrowserResult] = None
    tab_id: Optional[str] = None
    target: Optional[dict[str, float]] = None
    viewport: Optional[dict[str, float]] = None
    screenshot: Optional[str] = None
    ms: Optional[float] = Field(None, ge=0)


class Video(_Entry):
    """The run's video (``--video``, a task's ``[record] video``; format 9), once, the last line before
    ``run_finished``: ``file`` (``run.webm`` beside the record, WebM; None when there is none: ``error``
    says why), ``frames`` encoded, ``unchanged`` (grabs not encoded: the screen and the marks were as in
    the frame before, which stays on screen), ``dropped`` (frames let go because the encoder was behind:
    the run never waits for it), ``cut`` (frame times after ``limit`` at which no frame was added),
    ``limit`` (``duration``: the video's longest time was reached; ``bytes``: its file-size cap; None),
    ``fps`` (frames a second asked), ``duration_s``, ``size`` (w, h of a frame, px: the screen scaled to
    the video's longest side), ``bytes`` (the file's size), ``grab_ms`` (median milliseconds a grab took),
    ``grab_errors`` (grabs that failed or were refused), ``error``, ``started_at`` (UTC time of the first
    frame, the video's time 0: a frame at time t was grabbed at ``started_at`` + t, so it lines up with
    the record's ``ts``)."""

    type: Literal["video"] = "video"
    file: Optional[str] = None
    frames: int = Field(0, ge=0)
    unchanged: int = Field(0, ge=0)
    dropped: int = Field(0, ge=0)
    cut: int = Field(0, ge=0)
    limit: Optional[Literal["duration", "bytes"]] = None
    fps: Optional[float] = Field(None, gt=0)
    duration_s: float = Field(0.0, ge=0)
    size: Optional[tuple[int, int]] = None
    bytes: int = Field(0, ge=0)
    grab_ms: Optional[float] = Field(None, ge=0)
    grab_errors: int = Field(0, ge=0)
    error: Optional[str] = None
    started_at: Optional[str] = None


class WebRecording(_Entry):
    """The run's recorded web origins (format 9; :mod:`controller.run.web`), once, at the run's settle:
    ``mode`` ``record`` (``--record-web``, a task's ``[record] web``: the plain-HTTP responses the policy let
    through were kept in ``dir``, ``web`` beside the record: ``index.jsonl`` and one file per body, named
    by its SHA-256) or ``serve`` (``replay --offline-web``, a task's ``[offline] web``: the gateway answered
    from the recording in ``source`` and fetched nothing); ``origins`` the recording holds; ``responses``
    and ``bytes`` (distinct bodies) it holds; ``skipped``: responses not kept, by reason (``tunnel``:
    HTTPS passes through untouched and is never recorded; ``method``, ``request_body``, ``credentials``,
    ``sets_cookie``, ``status``, ``url``, ``too_large``, ``total_cap``, ``count_cap``, ``unverified``:
    :data:`controller.gateway.web.SKIPS`); ``served`` / ``missing``: requests answered from the recording,
    and denied because it held no answer (each also a ``network`` deny ``not_recorded`` or
    ``tunnel_not_recorded``); ``complete``: the recording was read back whole (``error`` says why not)."""

    type: Literal["web_recording"] = "web_recording"
    mode: Literal["record", "serve"]
    dir: Optional[str] = None
    source: Optional[str] = None
    origins: list[str] = Field(default_factory=list)
    responses: int = Field(0, ge=0)
    bytes: int = Field(0, ge=0)
    skipped: dict[str, int] = Field(default_factory=dict)
    served: Optional[int] = Field(None, ge=0)
    missing: Optional[int] = Field(None, ge=0)
    complete: bool = True
    error: Optional[str] = None


RunStatus = Literal["passed", "failed", "cancelled", "error"]


class RunFinished(_Entry):
    """The last line: ``status``, ``reason``, the model's ``final_message``, phase ``timings``
    (seconds per phase) and ``wall_s`` (seconds, sandbox start and teardown included)."""

    type: Literal["run_finished"] = "run_finished"
    status: RunStatus
    reason: str = ""
    final_message: Optional[str] = None
    timings: Optional[dict[str, float]] = None
    wall_s: Optional[float] = None


Entry = Annotated[
    Union[RunStarted, ModelResponse, ComputerCall, Action, Screenshot, Approval, HumanAction, Takeover, Redaction,
          Network,
          NetworkLog, Check, Expectation, AgentsEvent, ViewDropped, SignIn, BrowserCall, PolicySwap, Video, WebRecording,
          RunFinished],
    Field(discriminator="type"),
]
"""Any record entry."""

ENTRY_TYPES: dict[str, type[_Entry]] = {
    cls.model_fields["type"].default: cls
    for cls in (RunStarted, ModelResponse, ComputerCall, Action, Screenshot, Approval, HumanAction, Takeover, Redaction,
                Network,
                NetworkLog, Check, Expectation, AgentsEvent, ViewDropped, SignIn, BrowserCall, PolicySwap, Video,
                WebRecording, RunFinished)
}
"""Entry model per ``type``."""

class EntryError(DesktopSandboxError, ValueError):
    """A JSON object that is not a record entry; the message names the field and the problem."""


def problem(exc: ValidationError) -> str:
    """The first error of ``exc`` as ``field.path: message`` (plus how many more there are)."""
    errors = exc.errors(include_url=False)
    first = errors[0]
    where = ".".join(str(p) for p in first["loc"]) or "entry"
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"{where}: {first['msg']}{more}"


def as_entry(data: Any) -> Any:
    """``data`` as its entry model: an entry is returned as is, a mapping is validated. Raises
    :class:`EntryError` (a ValueError) naming the type and the field that is wrong."""
    if isinstance(data, _Entry):
        return data
    if not isinstance(data, Mapping):
        raise EntryError(f"an entry must be a JSON object, not {type(data).__name__}")
    kind = data.get("type")
    if not isinstance(kind, str) or kind not in ENTRY_TYPES:
        raise EntryError("entry without a type" if kind is None else f"unknown entry type {clean(kind, 40)!r}")
    try:
        return ENTRY_TYPES[kind].model_validate(dict(data))
    except ValidationError as exc:
        raise EntryError(f"{kind} entry: {problem(exc)}") from None


def entry_format(data: Any) -> Optional[int]:
    """The record format a parsed line declares: ``format`` of a ``run_started`` object (1 when it
    has none); None for any other line."""
    if isinstance(data, Mapping) and data.get("type") == "run_started":
        value = data.get("format", 1)
        return value if isinstance(value, int) and not isinstance(value, bool) else None
    return None


def reference_markdown() -> str:
    """The record reference, rendered from the models above (markdown: one row per entry type with
    its fields and its docstring; docs/ARCHITECTURE.md carries it between ``<!-- record-reference -->``
    markers, kept equal by a test)."""
    lines = ["| `type` | fields (besides `ts`, `type`) | what it is |", "|---|---|---|"]
    for kind, cls in ENTRY_TYPES.items():
        fields = ", ".join(f"`{n}`" for n in cls.model_fields if n not in ("ts", "type"))
        doc = " ".join((cls.__doc__ or "").split()).replace("``", "`").replace("|", "\\|")
        lines.append(f"| `{kind}` | {fields} | {doc} |")
    return "\n".join(lines) + "\n"


__all__ = [
    "ENTRY_TYPES", "FORMAT", "PolicySwap", "Action", "AgentsEvent", "Approval", "BrowserCall", "BrowserResult", "Check",
    "ComputerCall", "browser_arguments", "Entry", "EntryError", "Expectation",
    "HumanAction", "Redaction", "Takeover",
    "ModelResponse", "Network", "NetworkLog", "RunFinished", "RunStarted", "RunStatus", "Screenshot", "TaskRef",
    "UnmetExpectation", "Usage", "Video", "ViewDropped", "WebRecording", "as_entry", "entry_format", "problem", "reference_markdown",
]


if __name__ == "__main__":  # pragma: no cover - a helper for editing the docs
    print(reference_markdown(), end="")
