"""A run's recorded web origins, the controller's side (docs/replay.md, ARCHITECTURE "Recorded web origins").

``run-task --record-web`` (or the task's ``[record] web = true``): at the run's start the gateway is told
to record (:mod:`controller.gateway.web`: the plain-HTTP responses the policy let through, by its rules),
at its settle the recording is read back -- the index and every body, each call bounded in time and
size, the index's shape checked, each body's SHA-256 checked here again (the gateway sits next to the
hostile guest) -- into ``runs/<id>/web/``: ``index.jsonl`` (one :class:`~controller.gateway.web.WebResponse`
a line) and one file per body, named by its SHA-256 and nothing else. A ``web_recording`` record entry
says what was kept and what was not, and why.

``replay --offline-web`` (or the task's ``[offline] web = "dir"``): the recording is read and verified
before the sandbox starts (:func:`load_recording`: a file whose SHA-256 does not match its name, a
symlink, a malformed or oversized index refuse the whole recording), then given to the gateway, which
serves it instead of fetching (mode ``serve``). A run that cannot set up the mode it asked for ends
``error`` before anything is launched: a recording run that records nothing, or a hermetic run that
fetches live, is never passed off as one.

Errors: :class:`WebRecordingError` (``code``, ``message``).
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

from pydantic import ValidationError

from controller import json_semantics
from controller.gateway.web import (
    DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_TOTAL_BYTES, MAX_BODY_LIMIT, MAX_INDEX_BYTES, MAX_RESPONSES, MAX_TOTAL_LIMIT,
    SHA256, WebAnswer, WebConfig, WebResponse,
)
from controller.model.errors import DesktopSandboxError
from controller.run.entries import WebRecording
from controller.run.origins.control import GatewayControl, GatewayError, _read_capped
from controller.text import clean

WEB_DIR = "web"
"""The recording's folder in a run's folder (``runs/<id>/web``)."""
INDEX = "index.jsonl"
"""The recording's index file in its folder."""
CALL_TIMEOUT_S = 30.0
"""Seconds one ``/v1/web`` call may take (a body of up to the per-body cap)."""
FETCH_BUDGET_S = 180.0
"""Seconds reading a whole recording back from the gateway may take; what is left then is ``unverified``."""
CANCELLED_BUDGET_S = 3.0
"""Seconds reading a recording back may still take once the run is cancelled (a signal ends the run within
seconds): what is left then is ``unverified``."""


class WebRecordingError(DesktopSandboxError, ValueError):
    """A recording that cannot be used, or a gateway that cannot record or serve: ``code`` (``no_control``,
    ``gateway``, ``bad_index``, ``bad_body``, ``hash_mismatch``, ``missing``, ``too_large``) and
    ``message`` (one line, escaped)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code, self.message = code, message


@dataclass
class Recording:
    """A verified recording: ``responses`` (the index, in order), ``bodies`` (SHA-256 -> the bytes whose
    hash it is), ``source`` (its folder)."""

    source: Path
    responses: list[WebResponse]
    bodies: dict[str, bytes] = field(default_factory=dict)

    @property
    def bytes(self) -> int:
        """Distinct body bytes."""
        return sum(len(b) for b in self.bodies.values())

    @property
    def origins(self) -> list[str]:
        """The origins it holds responses of, sorted."""
        return sorted({r.origin for r in self.responses})


def _read_regular(path: Path, max_bytes: int, what: str) -> bytes:
    """The bytes of ``path``, a regular file that is not a symlink, of at most ``max_bytes``. Raises
    WebRecordingError (``missing``, ``bad_body``, ``too_large``)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOFOLLOW)
    except FileNotFoundError:
        raise WebRecordingError("missing", f"{clean(str(path), 300)}: {what} is missing") from None
    except OSError as exc:
        raise WebRecordingError("bad_body", f"{clean(str(path), 300)}: cannot open {what} (a symlink is refused): "
                                            f"{clean(exc.strerror or exc, 100)}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise WebRecordingError("bad_body", f"{clean(str(path), 300)}: {what} is not a regular file")
        if st.st_size > max_bytes:
            raise WebRecordingError("too_large", f"{clean(str(path), 300)}: {what} is larger than {max_bytes} bytes")
        chunks, total = [], 0
        while chunk := os.read(fd, 1 << 20):
            total += len(chunk)
            if total > max_bytes:
                raise WebRecordingError("too_large", f"{clean(str(path), 300)}: {what} grew past {max_bytes} bytes")
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def parse_index(data: bytes, where: str) -> list[WebResponse]:
    """The responses of an ``index.jsonl`` (one :class:`WebResponse` a line, strict JSON, at most
    :data:`MAX_RESPONSES`). Raises WebRecordingError ``bad_index`` naming the line and the field."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise WebRecordingError("bad_index", f"{where}: not UTF-8") from None
    responses = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        if len(responses) >= MAX_RESPONSES:
            raise WebRecordingError("bad_index", f"{where}: more than {MAX_RESPONSES} responses")
        try:
            responses.append(WebResponse.model_validate(json_semantics.loads(line)))
        except (ValueError, RecursionError) as exc:
            raise WebRecordingError("bad_index", f"{where}:{number}: {clean(_problem(exc), 300)}") from None
    return responses


def _problem(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        first = exc.errors(include_url=False)[0]
        return f"{'.'.join(str(p) for p in first['loc']) or 'line'}: {first['msg']}"
    return str(exc) or type(exc).__name__


def load_recording(folder: str | Path) -> Recording:
    """The recording in ``folder`` (``index.jsonl`` and one file per body, named by its SHA-256), every
    body read and its hash checked. Refused whole (:class:`WebRecordingError`) when the folder or its
    index is missing or malformed, a body file is missing, a symlink, not a regular file, larger than
    its index says, or its SHA-256 is not its name (``hash_mismatch``), or the bodies together exceed
    :data:`~controller.gateway.web.MAX_TOTAL_LIMIT`. No name read from the index is used as a path: a
    body's file is the folder and a validated 64-hex-digit hash."""
    folder = Path(folder)
    if not folder.is_dir():
        raise WebRecordingError("missing", f"{clean(str(folder), 300)}: no web recording folder there")
    responses = parse_index(_read_regular(folder / INDEX, MAX_INDEX_BYTES, "the index"), clean(str(folder / INDEX), 300))
    recording = Recording(folder, responses)
    sizes: dict[str, int] = {}
    for number, response in enumerate(responses, 1):
        if sizes.setdefault(response.sha256, response.bytes) != response.bytes:
            raise WebRecordingError("bad_index", f"{clean(str(folder / INDEX), 300)}:{number}: bytes: the body "
                                                 f"{response.sha256[:16]}... is given another size before")
    total = 0
    for response in responses:
        if response.sha256 in recording.bodies:
            continue
        assert SHA256.fullmatch(response.sha256)  # WebResponse checked it: never a path of the index's choosing
        body = _read_regular(folder / response.sha256, min(response.bytes, MAX_BODY_LIMIT), "a body")
        if hashlib.sha256(body).hexdigest() != response.sha256 or len(body) != response.bytes:
            raise WebRecordingError("hash_mismatch", f"{clean(str(folder), 300)}: the body {response.sha256[:16]}... "
                                                     "does not have the SHA-256 it is named by: the recording is refused")
        total += len(body)
        if total > MAX_TOTAL_LIMIT:
            raise WebRecordingError("too_large", f"{clean(str(folder), 300)}: bodies over {MAX_TOTAL_LIMIT} bytes")
        recording.bodies[response.sha256] = body
    return recording


def _write_file(folder: Path, name: str, data: bytes) -> None:
    """``folder/name`` holds ``data``: written under a fresh name (never through a link) and renamed over
    whatever had the name (a symlink planted there is replaced, its target untouched)."""
    partial = folder / f".{name}.{os.getpid()}.{time.monotonic_ns()}.partial"
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        os.replace(partial, folder / name)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise


def write_recording(folder: Path, responses: Iterable[WebResponse], bodies: dict[str, bytes]) -> Path:
    """Write ``responses`` as ``folder/index.jsonl`` and each body as ``folder/<sha256>`` (``bodies``: hash
    -> bytes, every one checked by the caller), each file renamed into place (a name planted in an
    existing ``folder`` as a link is replaced, never followed); returns ``folder``. Raises OSError."""
    folder.mkdir(parents=True, exist_ok=True)
    for sha, body in bodies.items():
        assert SHA256.fullmatch(sha) and hashlib.sha256(body).hexdigest() == sha
        _write_file(folder, sha, body)
    lines = [json.dumps(r.model_dump(mode="json"), ensure_ascii=True) + "\n" for r in responses]
    _write_file(folder, INDEX, "".join(lines).encode("ascii"))
    return folder


def copy_recording(recording: Recording, folder: Path) -> Path:
    """Write the verified ``recording`` again as ``folder`` (``replay --write-task``); returns it."""
    return write_recording(folder, recording.responses, recording.bodies)


class WebControl(GatewayControl):
    """The gateway control API's ``/v1/web`` (:mod:`controller.gateway.control`), every call bounded as
    :class:`~controller.run.origins.control.GatewayControl`'s are; answers checked with the gateway's own
    models. Methods raise :class:`~controller.run.origins.control.GatewayError`."""

    def _exchange(self, method: str, path: str, *, body: bytes | None = None, content_type: bytes | None = None,
                  cap: int, deadline: float | None = None) -> tuple[int, bytes]:
        headers = [(b"Content-Type", content_type)] if content_type else []
        with self._open(method, path, deadline=self._deadline(deadline), headers=headers, body=body) as resp:
            raw = _read_capped(resp, cap, f"{method} {path}")
        return resp.status, raw

    def _answer(self, status: int, raw: bytes, what: str) -> WebAnswer:
        try:
            data = json_semantics.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError):
            raise GatewayError(status, "bad_response", f"{what}: the answer is not JSON") from None
        if status != 200:
            raise self._refusal(status, data, what)
        try:
            return WebAnswer.model_validate(data)
        except ValidationError as exc:
            raise GatewayError(status, "bad_response", clean(f"{what}: {_problem(exc)}", 300)) from None

    def state(self, *, deadline: float | None = None) -> WebAnswer:
        """``GET /v1/web``: the gateway's web state, checked (:class:`WebAnswer`)."""
        status, raw = self._exchange("GET", "/v1/web", cap=MAX_INDEX_BYTES, deadline=deadline)
        return self._answer(status, raw, "reading the web recording")

    def configure(self, config: WebConfig, *, deadline: float | None = None) -> WebAnswer:
        """``PUT /v1/web``: enter ``config``'s mode; the new state."""
        body = config.model_dump_json().encode()
        status, raw = self._exchange("PUT", "/v1/web", body=body, content_type=b"application/json",
                                     cap=MAX_INDEX_BYTES, deadline=deadline)
        return self._answer(status, raw, f"setting web mode {config.mode}")

    def body(self, sha256: str, size: int, *, deadline: float | None = None) -> bytes:
        """``GET /v1/web/bodies/<sha256>``: the body, checked to be ``size`` bytes with that SHA-256
        (``bad_response`` otherwise)."""
        if not SHA256.fullmatch(sha256):
            raise GatewayError(0, "bad_response", "not a SHA-256")
        status, raw = self._exchange("GET", f"/v1/web/bodies/{sha256}", cap=size, deadline=deadline)
        if status != 200:
            raise GatewayError(status, "bad_response", f"reading a body: HTTP {status}")
        if len(raw) != size or hashlib.sha256(raw).hexdigest() != sha256:
            raise GatewayError(status, "bad_response", "a body does not have the SHA-256 it was asked by")
        return raw

    def put_body(self, sha256: str, data: bytes, *, deadline: float | None = None) -> None:
        """``PUT /v1/web/bodies/<sha256>``: give the gateway one body of the recording it serves."""
        status, raw = self._exchange("PUT", f"/v1/web/bodies/{sha256}", body=data,
                                     content_type=b"application/octet-stream", cap=64 * 1024, deadline=deadline)
        if status != 204:
            try:
                data_ = json_semantics.loads(raw.decode("utf-8")) if raw.strip() else None
            except (UnicodeDecodeError, ValueError, RecursionError):
                data_ = None
            raise self._refusal(status, data_, "giving the gateway a body")


class RunWeb:
    """A run's recorded web origins (module docstring): ``mode`` ``record`` or ``serve`` (with the
    verified ``recording``). :meth:`start` once the sandbox is up, before anything is launched;
    :meth:`finish` at the run's settle, which writes the ``web_recording`` entry."""

    def __init__(self, mode: str, recording: Recording | None = None, *, max_body_bytes: int | None = None,
                 max_total_bytes: int | None = None) -> None:
        if mode not in ("record", "serve") or (mode == "serve") != (recording is not None):
            raise ValueError("RunWeb: mode record, or mode serve with a recording")
        self.mode, self.recording = mode, recording
        caps = {k: v for k, v in (("max_body_bytes", max_body_bytes), ("max_total_bytes", max_total_bytes)) if v}
        if recording is not None:  # caps that hold the verified recording (load_recording bounds it)
            largest = max((len(b) for b in recording.bodies.values()), default=0)
            caps.setdefault("max_body_bytes", max(DEFAULT_MAX_BODY_BYTES, largest))
            caps.setdefault("max_total_bytes", max(DEFAULT_MAX_TOTAL_BYTES, recording.bytes))
        self.config = WebConfig(mode=mode, responses=recording.responses if recording else [], **caps)
        self.control: WebControl | None = None
        self.started = False
        self._cancelled: Callable[[], bool] = lambda: False  # the run's flag, given to finish()

    def start(self, sandbox: Any, cancelled: Callable[[], bool] = lambda: False) -> None:
        """Set the sandbox's gateway to this mode (serving: the index, then every body). Returns at once,
        not started, once ``cancelled()`` (the run's flag, looked at between bodies). Raises
        WebRecordingError (``no_control``: its gateway has no control API; ``gateway``: it refused or
        did not answer)."""
        from controller.run.origins.access import control_endpoint

        endpoint = control_endpoint(sandbox)
        if endpoint is None:
            raise WebRecordingError("no_control", "this sandbox's gateway has no control API: it cannot "
                                                  f"{'record' if self.mode == 'record' else 'serve'} web origins")
        try:
            self.control = WebControl(*endpoint, timeout_s=CALL_TIMEOUT_S)
            state = self.control.configure(self.config)
            if self.recording is not None:
                for sha, body in self.recording.bodies.items():
                    if cancelled():
                        return
                    self.control.put_body(sha, body)
                state = self.control.state()
        except (GatewayError, ValueError) as exc:
            raise WebRecordingError("gateway", clean(f"the gateway did not take web mode {self.mode}: {exc}", 500)) \
                from None
        if state.mode != self.mode or (self.recording is not None and state.bodies != len(self.recording.bodies)):
            raise WebRecordingError("gateway", f"the gateway is in web mode {state.mode} with {state.bodies} bodies "
                                               f"after being set to {self.mode}")
        self.started = True

    def finish(self, record: Any, cancelled: Callable[[], bool] = lambda: False) -> WebRecording:
        """Read the gateway's recording back into ``record.dir/web`` (mode record) or what it served (mode
        serve), write the ``web_recording`` entry to ``record`` (a RunRecord) and end the gateway's mode.
        Once ``cancelled()`` (the run's flag) the reading gets :data:`CANCELLED_BUDGET_S` more at most.
        Never raises: a failure is the entry's ``error`` (``complete`` false)."""
        self._cancelled = cancelled
        entry = self._collect(record.dir / WEB_DIR)
        written = record.write(entry)
        if self.control is not None:
            try:
                self.control.configure(WebConfig(mode="off"))
            except GatewayError:
                pass  # the sandbox goes away, or its next run sets its own mode
            self.control.close()
        return written

    def _collect(self, folder: Path) -> WebRecording:
        source = str(self.recording.source) if self.recording is not None else None
        base = dict(mode=self.mode, source=source)
        if self.recording is not None:
            base.update(responses=len(self.recording.responses), bytes=self.recording.bytes,
                        origins=self.recording.origins)
        if not self.started or self.control is None:
            return WebRecording(**base, complete=False, error="the gateway's web mode was never set")
        try:
            state = self.control.state()
        except GatewayError as exc:
            return WebRecording(**base, complete=False, error=clean(f"reading the web recording: {exc}", 500))
        if state.mode != self.mode:
            return WebRecording(**base, complete=False, error=f"the gateway's web mode is {state.mode}, not {self.mode}")
        if self.mode == "serve":
            return WebRecording(**base, served=state.served, missing=state.missing, complete=True)
        return self._fetch(state, folder, base)

    def _fetch(self, state: WebAnswer, folder: Path, base: dict[str, Any]) -> WebRecording:
        """Every body of ``state``'s index read and checked; responses whose body cannot be (or would take the
        recording over its total cap) are left out, counted ``unverified``."""
        assert self.control is not None
        deadline = time.monotonic() + FETCH_BUDGET_S
        cancelled = self._cancelled
        skipped = dict(state.skipped)
        bodies: dict[str, bytes] = {}
        refused: set[str] = set()
        total = 0
        for response in state.responses:
            sha = response.sha256
            if sha in bodies or sha in refused:
                continue
            if total + response.bytes > min(state.max_total_bytes, MAX_TOTAL_LIMIT) or response.bytes > state.max_body_bytes:
                refused.add(sha)
                continue
            if cancelled():  # a signal ends the run within seconds: what is not read by then is left out
                deadline = min(deadline, time.monotonic() + CANCELLED_BUDGET_S)
            if time.monotonic() >= deadline:
                refused.add(sha)
                continue
            try:
                bodies[sha] = self.control.body(sha, response.bytes, deadline=deadline)
                total += response.bytes
            except GatewayError:
                refused.add(sha)
        kept = [r for r in state.responses if r.sha256 in bodies and r.bytes == len(bodies[r.sha256])]
        if len(kept) < len(state.responses):
            skipped["unverified"] = skipped.get("unverified", 0) + len(state.responses) - len(kept)
        try:
            write_recording(folder, kept, bodies)
        except OSError as exc:
            return WebRecording(**base, complete=False,
                                error=clean(f"writing {WEB_DIR}/: {exc.strerror or exc}", 300))
        return WebRecording(**{**base, "source": None}, dir=WEB_DIR, responses=len(kept), bytes=total,
                            origins=sorted({r.origin for r in kept}), skipped=skipped, complete=True)


__all__ = [
    "CALL_TIMEOUT_S", "FETCH_BUDGET_S", "INDEX", "Recording", "RunWeb", "WEB_DIR", "WebControl", "WebRecordingError",
    "copy_recording", "load_recording", "parse_index", "write_recording",
]
