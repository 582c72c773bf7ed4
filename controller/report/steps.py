"""A run record as the report shows it: entries grouped into steps, every string made safe to show.

:func:`build_view` takes the entry models :func:`controller.run.record.read_entries` returns and gives
one plain dict (the template's only input; nothing in it is a raw record string):

* ``header``: task, run id, status, reason, mode, model, image, start time, wall time (seconds), the
  summary's counts (:func:`controller.run.record.summarize`);
* ``before``: what came before the first model response (``approvals``: opt-ins given on the command
  line, and origin requests decided before it; ``network``; ``other``);
* ``steps``: one per ``model_response``. A step is that response and the ``computer_call`` entries
  after it, shown on the screenshot the model was looking at when it chose those actions (the last
  ``screenshot`` entry before the step's first ``computer_call``; for a step without one, before the
  response). Each step has ``n`` (1-based), ``ts``, ``response`` (id, HTTP status, tokens, error),
  ``text`` (the model's words: the run's ``final_message`` on a last step that sent no call),
  ``calls`` (each with ``call_id``, ``form``, ``pending`` safety checks and numbered ``actions``,
  described with :func:`wire.actions.describe`, typed text as its length only), ``shot`` (see
  :func:`shot_ref`), ``overlay`` (:func:`controller.model.marks.overlay`, model px, None without a
  screenshot), ``failed`` (driver calls that failed), ``approvals``, ``network``, ``expectations``,
  ``human`` (``human_action`` entries), ``browser`` (the step's ``browser_call`` entries: member,
  one line of text (:func:`controller.run.progress.browser_call_text`), ok, error, the image file a
  screenshot or zoom returned; the elements they acted on are the overlay's ``boxes``,
  :func:`browser_boxes`) and ``other`` (sign-ins, and entry types without a section of their own);
* ``unshown``: screenshots no step shows (e.g. the screen after the last call of a cancelled run);
* ``video``: the run's ``video`` entry (file, frames, dropped, unchanged and cut frames, the limit reached,
  fps, duration, size, bytes, why there is none), None when the run recorded none;
* ``web``: the run's ``web_recording`` entry (:func:`_web`: mode ``record`` or ``serve``, its folder, the
  responses kept or served, the requests it lacked, what was not kept by reason, bytes, origins, why it
  is incomplete), None when the run neither recorded nor served web origins;
* ``checks``: kind, target, rule, expected, observed (JSON text), passed, detail;
* ``verdict``: status, reason, final message, whether the gateway's decision log was read in full;
* ``timings``: ``(phase, seconds)`` pairs.

Approvals of origin requests (``what`` origin_access: the gateway held a guest connection until a
person, ``--approve-origin`` or its deadline decided) carry ``origin``, ``request_id`` and
``latency_ms``; ``network`` items carry the ``request_id`` they waited on and ``held_ms``.

Placement: the steps are the record's (:func:`controller.model.steps.steps`, whose rule says what
belongs to a step): approvals and failed driver calls go to the step whose call they name
(``call_id``), an expectation to the step whose call it names or else to the next step (a script
turn's expectations are resolved before the model answers), everything else to the step it was
written in; ``before`` is the record's opening. An entry type without a section of its own (an
``agents_event``) is shown generically, as its fields.

Every string from the record comes from the model, a page or the guest: it is passed through
:func:`controller.text.clean` (control and format characters escaped, cut to a length) here, and
the template escapes HTML on top.
"""

from __future__ import annotations

import re

import json
import math
from typing import Any

from controller.model.marks import MAX_MARKS, num, overlay
from controller.run.progress import browser_call_text, redaction_text, sign_in_text
from controller.model.steps import Step, steps
from controller.run.entries import as_entry
from controller.run.record import summarize
from controller.text import clean
from wire.actions import describe

SHORT, MEDIUM, LONG = 80, 500, 2000
"""Lengths (characters) values are cut to: names and codes, reasons and targets, free text and values."""

STATUSES = ("passed", "failed", "cancelled", "error", "unfinished")
"""The statuses the page has a style for; any other shows as ``unknown``."""


def text(value: Any, limit: int = MEDIUM) -> str | None:
    """A string (or other scalar) from the record, escaped and cut; None stays None."""
    return None if value is None else clean(value, limit)


def value_text(value: Any, limit: int = LONG) -> str:
    """Any JSON value from the record as JSON text (strings quoted, so ``"1"`` and ``1`` differ),
    escaped and cut."""
    try:
        shown = json.dumps(value, ensure_ascii=False, default=str)
    except (TypeError, ValueError, RecursionError):
        shown = repr(value)
    return clean(shown, limit)


def status_class(status: Any) -> str:
    """The CSS class of a status: one of :data:`STATUSES`, else ``unknown`` (never record text)."""
    return status if status in STATUSES else "unknown"


def shot_ref(data: dict[str, Any]) -> dict[str, Any]:
    """A screenshot entry as the page shows it: ``file`` (as recorded, escaped: to show, never to
    open), ``image_size`` (model px, ``(w, h)``, None unless both are positive), ``frame`` (x, y, w, h,
    screen px), ``screen_size`` (screen px), ``reencoded``, ``sha256``. ``src`` and ``missing`` are
    filled in by :mod:`controller.report.html`, which alone decides which file may be read."""
    size = data.get("image_size")
    ok = isinstance(size, (list, tuple)) and len(size) == 2 and all(
        isinstance(v, int) and not isinstance(v, bool) and 0 < v <= 100_000 for v in size)
    frame = data.get("frame")
    frame_ok = isinstance(frame, (list, tuple)) and len(frame) == 4 and all(
        isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= 100_000 for v in frame) and frame[2] > 0 \
        and frame[3] > 0
    return {"raw_file": data.get("file"), "file": text(data.get("file"), SHORT),
            "image_size": (size[0], size[1]) if ok else None,
            "frame_box": tuple(frame) if frame_ok else None,
            "frame": value_text(data.get("frame"), SHORT), "screen_size": value_text(data.get("screen_size"), SHORT),
            "reencoded": bool(data.get("reencoded")), "sha256": text(data.get("sha256"), SHORT),
            "src": None, "missing": None}


def _approval(d: dict[str, Any]) -> dict[str, Any]:
    return {"what": text(d.get("what"), SHORT), "decision": text(d.get("decision"), SHORT),
            "approved": d.get("decision") == "approved", "by": text(d.get("by"), SHORT),
            "codes": [text(c, SHORT) for c in (d.get("codes") or [])[:50]],
            "action": text(d.get("action")), "message": text(d.get("message")),
            "origin": text(d.get("origin")), "request_id": text(d.get("request_id"), SHORT),
            "latency_ms": d.get("latency_ms") if isinstance(d.get("latency_ms"), (int, float))
            and not isinstance(d.get("latency_ms"), bool) else None}


def _network(d: dict[str, Any]) -> dict[str, Any]:
    held = d.get("held_ms")
    return {"seq": text(d.get("seq"), SHORT), "origin": text(d.get("origin")), "decision": text(d.get("decision"), SHORT),
            "allowed": d.get("decision") == "allow", "reason": text(d.get("reason")), "via": text(d.get("via"), SHORT),
            "request_id": text(d.get("request_id"), SHORT),
            "held_ms": held if isinstance(held, (int, float)) and not isinstance(held, bool) else None}


_BASE64 = re.compile(r"[A-Za-z0-9+/]+={0,2}")


def _crops(u: dict[str, Any], shot: dict[str, Any] | None) -> dict[str, Any] | None:
    """For an unmet ``matches`` expectation (a replayed step that diverged): the recorded region (its
    ``png``, checked to be base64 of a PNG and at most 512 KiB) and where to cut the replayed one from
    (the screenshot the expectation was judged on, ``shot``: its ``raw_file``); the page shows both side
    by side (:mod:`controller.report.html` cuts the second). None for any other expectation."""
    exp = u.get("expectation") if isinstance(u.get("expectation"), dict) else {}
    png = exp.get("png")
    box = [exp.get(k) for k in ("x", "y", "w", "h")]
    if u.get("kind") != "matches" or not isinstance(png, str) or len(png) > 700_000 or not _BASE64.fullmatch(png) \
            or not png.startswith("iVBORw0KGgo") \
            or not all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= 100_000 for v in box) \
            or box[2] < 1 or box[3] < 1:
        return None
    return {"recorded": f"data:image/png;base64,{png}", "region": tuple(box),
            "shot_file": shot.get("raw_file") if shot else None, "replayed": None,
            "where": text(f"{box[2]}x{box[3]} at ({box[0]},{box[1]})", SHORT)}


def _expectation(d: dict[str, Any], shot: dict[str, Any] | None = None) -> dict[str, Any]:
    unmet = [u for u in (d.get("unmet") or []) if isinstance(u, dict)][:20]
    return {"turn": text(d.get("turn"), SHORT), "met": bool(d.get("met")), "waits": text(d.get("waits"), SHORT),
            "waited_s": d.get("waited_s") if isinstance(d.get("waited_s"), (int, float)) else None,
            "expected": [text(e) for e in (d.get("expected") or [])[:20]], "reason": text(d.get("reason")),
            "unmet": [{"kind": text(u.get("kind"), SHORT), "expected": text(u.get("expected")),
                       "observed": value_text(u.get("observed"), MEDIUM), "crops": _crops(u, shot)} for u in unmet]}


def _human(d: dict[str, Any]) -> dict[str, Any]:
    action = d.get("action")
    shown = describe(action, clean=clean) if isinstance(action, dict) else text(action)
    return {"by": text(d.get("by"), SHORT), "action": shown}


def _browser(d: dict[str, Any]) -> dict[str, Any]:
    return {"call_id": text(d.get("call_id"), SHORT), "member": text(d.get("member"), SHORT),
            "ok": d.get("ok") is True, "text": browser_call_text(d), "error": text(d.get("error")),
            "screenshot": text(d.get("screenshot"), SHORT)}


def browser_boxes(calls: list[dict[str, Any]], shot: dict[str, Any] | None) -> list[dict[str, str]]:
    """The boxes of the elements a step's browser calls acted on, in the px of the step's screenshot
    ``shot`` (:func:`shot_ref`): each call's ``target`` (viewport CSS px) placed at its ``viewport``
    (screen px; the agent's chromium runs at device scale 1, so one CSS px is one screen px), then into
    the image by the screenshot's ``frame`` (screen px) and ``image_size``. Calls without a target or a
    viewport, and boxes wholly outside the image, are not drawn. Each box: ``n`` (the call's number in the
    step), ``x``, ``y``, ``w``, ``h`` and ``label`` (the member), all formatted."""
    if not shot or not shot.get("image_size") or not shot.get("frame_box"):
        return []
    (iw, ih), (fx, fy, fw, fh) = shot["image_size"], shot["frame_box"]
    sx, sy = iw / fw, ih / fh
    boxes = []
    for n, d in enumerate(calls, 1):
        target, view = d.get("target"), d.get("viewport")
        try:
            x = (float(view["x"]) + float(target["x"]) - fx) * sx
            y = (float(view["y"]) + float(target["y"]) - fy) * sy
            w, h = float(target["width"]) * sx, float(target["height"]) * sy
        except (KeyError, TypeError, ValueError):
            continue
        if not all(math.isfinite(v) for v in (x, y, w, h)) or w <= 0 or h <= 0 or x >= iw or y >= ih \
                or x + w <= 0 or y + h <= 0:
            continue
        boxes.append({"n": str(n), "x": num(x), "y": num(y), "w": num(w), "h": num(h),
                      "label": f"{n} {text(d.get('member'), SHORT)}"})
    return boxes[:MAX_MARKS]


def _other(d: dict[str, Any]) -> dict[str, Any]:
    rest = {k: v for k, v in d.items() if k not in ("type", "ts")}
    return {"type": text(d.get("type"), SHORT), "fields": value_text(rest, MEDIUM)}


def _pending(check: Any) -> dict[str, Any]:
    check = check if isinstance(check, dict) else {"id": check}
    return {"id": text(check.get("id"), SHORT), "code": text(check.get("code"), SHORT),
            "message": text(check.get("message"))}


def _new_step(n: int, d: dict[str, Any], shot: dict[str, Any] | None) -> dict[str, Any]:
    usage = d.get("usage") if isinstance(d.get("usage"), dict) else {}
    said = d.get("text")
    return {"n": n, "ts": text(d.get("ts"), SHORT), "shot": shot, "calls": [],
            "response": {"id": text(d.get("response_id"), SHORT), "http_status": text(d.get("http_status"), SHORT),
                         "failed": isinstance(d.get("http_status"), int) and d["http_status"] >= 400,
                         "tokens": text(usage.get("total_tokens"), SHORT),
                         "error": value_text(d.get("error"), MEDIUM) if d.get("error") is not None else None},
            "text": text(said, LONG) if isinstance(said, str) else None,
            "failed": [], "approvals": [], "network": [], "expectations": [], "human": [], "other": [],
            "browser": [], "raw_browser": []}


def _call(d: dict[str, Any], first: int) -> dict[str, Any]:
    actions = d.get("actions") if isinstance(d.get("actions"), list) else []
    return {"call_id": text(d.get("call_id"), SHORT), "raw_id": d.get("call_id"), "form": text(d.get("form"), SHORT),
            "pending": [_pending(c) for c in (d.get("pending_checks") or [])[:20]],
            "raw_actions": [(first + i, a) for i, a in enumerate(actions)],
            "actions": [{"n": first + i, "text": describe(a, clean=clean)} for i, a in enumerate(actions[:500])],
            "more": max(len(actions) - 500, 0)}


def build_view(entries: list[Any], run_id: str) -> dict[str, Any]:
    """The report's view of ``entries`` (entry models, in record order; JSON objects are validated as
    entries, ValueError when one is not) of run ``run_id``; see the module docstring for its shape."""
    entries = [as_entry(e) for e in entries]
    summary = summarize(entries)
    started = next((e.as_json() for e in entries if e.type == "run_started"), {})
    finished = next((e.as_json() for e in reversed(entries) if e.type == "run_finished"), {})
    record_steps = steps(entries)
    refs = {id(s): shot_ref(s.as_json()) for step in record_steps for s in step.screenshots}  # in record order
    before: dict[str, list[Any]] = {"approvals": [], "network": [], "other": []}
    views: list[dict[str, Any]] = []
    for step in record_steps:
        if step.opening:
            _fill_before(before, step)
        else:
            views.append(_step_view(step, refs))
    final = finished.get("final_message")
    if views and isinstance(final, str) and not views[-1]["calls"] and views[-1]["text"] is None:
        views[-1]["text"] = text(final, LONG)
    shown = set()
    # a call none of whose actions reached the driver (denied, withdrawn, cancelled first) is listed
    # but not drawn: the picture shows only what was done
    ran = {a.call_id for step in record_steps for a in step.actions}
    for view in views:
        shot = view["shot"]
        shown.add(id(shot))
        for call in view["calls"]:
            call["not_run"] = bool(call["raw_actions"]) and call.pop("raw_id") not in ran
            if call["not_run"]:
                call["raw_actions"] = []
        actions = [a for c in view["calls"] for a in c.pop("raw_actions")]
        view["overlay"] = overlay(actions, shot["image_size"]) if shot and shot["image_size"] else None
        boxes = browser_boxes(view.pop("raw_browser"), shot)
        if view["overlay"] is not None:
            view["overlay"]["boxes"] = boxes
    checks = [e.as_json() for e in entries if e.type == "check"]
    network_logs = [e.as_json() for e in entries if e.type == "network_log"]
    video = next((e.as_json() for e in reversed(entries) if e.type == "video"), None)
    web = next((e.as_json() for e in reversed(entries) if e.type == "web_recording"), None)
    return {
        "header": _header(started, finished, summary, run_id),
        "video": _video(video) if video is not None else None,
        "web": _web(web) if web is not None else None,
        "before": before, "steps": views,
        "unshown": [s for s in refs.values() if id(s) not in shown],
        "checks": [_check(c) for c in checks],
        "verdict": {"status": text(summary["status"], SHORT), "class": status_class(summary["status"]),
                    "reason": text(summary["reason"], LONG), "final_message": text(final, LONG),
                    "network_log": [{"complete": bool(n.get("complete")), "decisions": text(n.get("decisions"), SHORT),
                                     "error": text(n.get("error"))} for n in network_logs]},
        "timings": [(text(k, SHORT), v) for k, v in (summary.get("timings") or {}).items()
                    if isinstance(v, (int, float))],
    }


def _video(d: dict[str, Any]) -> dict[str, Any]:
    """The run's ``video`` entry as the page shows it: the numbers as recorded (validated), strings escaped;
    ``raw_file`` (the file name as recorded) is for :mod:`controller.report.html` to check and drop."""
    size = d.get("size")
    return {"raw_file": d.get("file"), "file": text(d.get("file"), SHORT), "frames": d.get("frames"),
            "unchanged": d.get("unchanged"), "dropped": d.get("dropped"), "cut": d.get("cut"),
            "limit": text(d.get("limit"), SHORT), "fps": d.get("fps"), "duration_s": d.get("duration_s"),
            "size": f"{size[0]}\u00d7{size[1]}" if size else None, "width": size[0] if size else None,
            "height": size[1] if size else None, "bytes": d.get("bytes"), "error": text(d.get("error"))}


WEB_ORIGINS_SHOWN = 20
"""Most origins the page names for a web recording (the rest are counted)."""


def _web(d: dict[str, Any]) -> dict[str, Any]:
    """The run's ``web_recording`` entry as the page shows it: ``mode`` (``record`` or ``serve``), ``where``
    (its folder: ``dir`` recorded beside the record, or the ``source`` served), ``responses`` and ``bytes``
    (what the recording holds), ``served`` / ``missing`` (serve), ``skipped`` (``(reason, count)`` pairs),
    ``origins`` (the first :data:`WEB_ORIGINS_SHOWN`) and ``more_origins`` (how many more), ``complete``,
    ``error``; counts as recorded (validated), every string escaped."""
    origins = [o for o in d.get("origins") or [] if isinstance(o, str)]
    skipped = d.get("skipped") if isinstance(d.get("skipped"), dict) else {}
    return {"mode": text(d.get("mode"), SHORT), "where": text(d.get("dir") or d.get("source")),
            "responses": d.get("responses") or 0, "bytes": d.get("bytes") or 0,
            "served": d.get("served") or 0, "missing": d.get("missing") or 0,
            "skipped": [(text(k, SHORT), v) for k, v in sorted(skipped.items())],
            "origins": [text(o, SHORT) for o in origins[:WEB_ORIGINS_SHOWN]],
            "more_origins": max(0, len(origins) - WEB_ORIGINS_SHOWN),
            "complete": d.get("complete") is not False, "error": text(d.get("error"))}


def _fill_before(before: dict[str, list[Any]], opening: Step) -> None:
    """``before`` from the record's opening step: its approvals and network decisions; in ``other`` its
    other entries (a computer call, a person's action or a browser call before any model response, a
    sign-in, an entry type without a section of its own) in record order, then its failed driver calls
    and its expectations (a record in which the model never answered)."""
    later = []
    for entry in opening.entries:
        d = entry.as_json()
        if entry.type == "approval":
            before["approvals"].append(_approval(d))
        elif entry.type == "network":
            before["network"].append(_network(d))
        elif entry.type == "sign_in":
            before["other"].append({"type": "sign-in", "fields": sign_in_text(d)})
        elif entry.type == "redaction":
            before["other"].append({"type": "redaction", "fields": redaction_text(d)})
        elif entry.type in ("action", "expectation"):
            if entry.type == "expectation" or entry.error:
                later.append(_other(d))
        elif entry.type != "screenshot":
            before["other"].append(_other(d))
    before["other"].extend(later)


def _step_view(step: Step, refs: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """One step of the page (see the module docstring) from a step of the record; ``refs``: each
    screenshot entry's :func:`shot_ref` by the entry's identity. ``raw_browser`` (its browser calls as
    JSON) and the calls' ``raw_actions`` / ``raw_id`` are for :func:`build_view` to draw and drop."""
    shot = refs.get(id(step.shown)) if step.shown is not None else None
    view = _new_step(step.n, step.response.as_json(), shot)
    for entry, screen in step.screens():
        d = entry.as_json()
        kind = entry.type
        if kind == "computer_call":
            view["calls"].append(_call(d, 1 + sum(len(c["raw_actions"]) for c in view["calls"])))
        elif kind == "approval":
            view["approvals"].append(_approval(d))
        elif kind == "action":
            if entry.error:
                view["failed"].append({"action": text(d.get("action"), SHORT), "error": text(d.get("error"))})
        elif kind == "expectation":
            view["expectations"].append(_expectation(d, refs.get(id(screen)) if screen is not None else None))
        elif kind == "network":
            view["network"].append(_network(d))
        elif kind == "human_action":
            view["human"].append(_human(d))
        elif kind == "takeover":  # who had the desktop, between the person's actions
            view["human"].append({"by": text(d.get("by"), SHORT), "action": "took over the desktop (the model waits)"
                                  if d.get("control") == "human" else "handed the desktop back to the model"})
        elif kind == "browser_call":
            view["browser"].append(_browser(d))
            view["raw_browser"].append(d)
        elif kind == "sign_in":
            view["other"].append({"type": "sign-in", "fields": sign_in_text(d)})
        elif kind == "redaction":
            view["other"].append({"type": "redaction", "fields": redaction_text(d)})
        elif kind != "screenshot":
            view["other"].append(_other(d))
    return view


def _check(d: dict[str, Any]) -> dict[str, Any]:
    return {"kind": text(d.get("kind"), SHORT), "target": text(d.get("target")), "rule": text(d.get("rule"), LONG),
            "expected": value_text(d.get("expected")), "observed": value_text(d.get("observed")),
            "passed": d.get("passed") is True, "detail": text(d.get("detail"), LONG)}


def _header(started: dict[str, Any], finished: dict[str, Any], s: dict[str, Any], run_id: str) -> dict[str, Any]:
    task = started.get("task") if isinstance(started.get("task"), dict) else {}
    wall = s.get("wall_s")
    return {
        "task": text(task.get("name"), SHORT) or "(unnamed task)", "source": text(task.get("source")),
        "run_id": text(run_id, SHORT), "status": text(s["status"], SHORT), "class": status_class(s["status"]),
        "reason": text(s["reason"], LONG), "mode": text(started.get("mode"), SHORT),
        "runner": text(started.get("runner") or "sdk", SHORT),
        "model": text(started.get("model"), SHORT), "image": text(started.get("image"), SHORT),
        "started": text(started.get("ts"), SHORT), "finished": text(finished.get("ts"), SHORT),
        "wall_s": wall if isinstance(wall, (int, float)) else None,
        "counts": [("steps", s["steps"]), ("input actions", s["actions"]), ("failed actions", s["actions_failed"]),
                   ("screenshots", s["screenshots"]), ("approved", s["approvals_approved"]),
                   ("denied", s["approvals_denied"]), ("network allowed", s["network_allowed"]),
                   ("network denied", s["network_denied"]), ("browser calls", s["browser_calls"]),
                   ("checks passed", f"{s['checks_passed']}/{s['checks_total']}"),
                   ("tokens", s["usage"]["total_tokens"])],
    }
