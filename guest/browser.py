"""The agent's chromium: sign-in forms found, filled and submitted over the DevTools pipe.

:class:`BrowserHost` takes over the agent's ends of the pipes of the chromium the launch broker started
(:mod:`guest.launch`, channel apps) and serves three things (docs/ARCHITECTURE.md, contract 8):

* :meth:`BrowserHost.signin_page` -- the active tab's origin as the browser knows it (the main frame's
  ``securityOrigin`` from ``Page.getFrameTree``, never page text) and its sign-in form
  (:class:`wire.browser.SignInForm`), found by :data:`HELPERS_JS`;
* :meth:`BrowserHost.fill` -- put values into that form and submit it, only while the main frame's
  origin is the request's ``credential_origin`` (checked before every value) and only into a form that
  posts them to that origin (:func:`wire.browser.form_refusal`, checked before the first value and again
  in the same script run as the click, with the browser's own validation: ``unsafe_form``,
  ``cross_origin_form``, ``invalid``); a value is set on the field itself from the isolated world, passed
  as an argument of a call bound to the checked document (never through the keyboard focus, which a
  frame of another origin can take; never in a script's text, a log or an answer), into a field masked
  first (made a password field, whose browser style no page style outweighs, and
  ``-webkit-text-security``; both kept by a mutation observer while values are there: its characters
  never reach the X display every desktop-user process can read); a field the page rewrites is retried,
  then cleared; a form whose document is still there after the submit has the values cleared, one the
  submit left has them emptied as it is hidden (no value in the back/forward cache or restored on Back);
  a redirect of the submit's POST to another origin is refused by the agent's request guard
  (:class:`SubmitWatch`, ``guest.browser_tools``), ``cross_origin_redirect``;
* :meth:`BrowserHost.page_text` -- the text of a page opened in a background tab (the ``page`` checks).

Scripts run in an isolated world (``Page.createIsolatedWorld``), never in the page's own: the page
shares the DOM but not the scripts' globals or prototypes, so it cannot replace the functions they call
or the getters they read (``hasFocus``, ``visibilityState``), and every answer is a boolean or bounded text. Every command has a deadline and the
answers are size-capped (:mod:`guest.cdp`); the scanner reads at most :data:`MAX_INPUTS` inputs and
:data:`wire.browser.MAX_LABEL_CHARS` characters of a label, so a page of 10 000 inputs or 1 MB labels
costs bounded work. Forms in iframes are not looked at (a sign-in form must be the page's own).
"""

from __future__ import annotations

import json
import os
import threading
from typing import Any
from urllib.parse import urlsplit

from wire.browser import (MAX_DETAIL_CHARS, MAX_FIELDS, MAX_LABEL_CHARS, MAX_OPTIONS, SUBMIT_METHOD, FillRequest,
                          FillResult, SignInForm, SignInPage, form_refusal)

from .cdp import ChannelClosed, ChannelError, CommandTimeout, Pipe, wait_until

MAX_INPUTS = 2000
"""Most ``<input>`` elements the scanner looks at on one page."""
EVAL_TIMEOUT_S = 5.0
"""Deadline of one script run in a page (a page that blocks its event loop, e.g. with ``alert``, times out)."""
NAVIGATION_WAIT_S = 10.0
"""How long a fill waits after the submit for the page to load a new document."""
PAGE_LOAD_TIMEOUT_S = 20.0
"""How long :meth:`BrowserHost.page_text` waits for a page to load."""
MAX_PAGE_TEXT = 1024 * 1024
"""Most characters of a page's text :meth:`BrowserHost.page_text` returns."""
SHORT_TIMEOUT_S = 1.0
"""Deadline of a command polled in a loop (a page being swapped for the next may drop it)."""
FILL_ATTEMPTS = 3
"""Tries per field before a fill gives up with ``field_unstable``."""
CONSTRAINTS = {
    "valueMissing": "is required and empty",
    "typeMismatch": "is not of the field's type (an e-mail address, a URL)",
    "patternMismatch": "does not match the field's pattern",
    "tooLong": "is longer than the field's maxlength",
    "tooShort": "is shorter than the field's minlength",
    "rangeUnderflow": "is below the field's min",
    "rangeOverflow": "is above the field's max",
    "stepMismatch": "does not fit the field's step",
    "badInput": "is not one the field can take",
    "customError": "is refused by the page's own check",
}
"""The browser's validity constraints (``ValidityState``), in the order it reports them, and how an
``invalid`` outcome's detail words each for a field the fill wrote."""
WORLD = "desktop-sandbox"

FIELD_KIND_JS = r"""
function fieldKind(el, label) {
  const type = (el.getAttribute('type') || 'text').toLowerCase();
  if (type === 'password') return 'password';
  if (!['text', 'email', 'tel', 'number', 'search', ''].includes(type)) return null;
  const hint = (el.getAttribute('autocomplete') || '').toLowerCase().slice(0, 200);
  const words = (el.id + ' ' + (el.getAttribute('name') || '') + ' ' + hint + ' ' + label).toLowerCase().slice(0, 1000);
  if (/password|passcode/.test(words) || /current-password|new-password/.test(hint)) return 'password';
  if (type === 'email' || /\b(email|username)\b/.test(hint) || /mail/.test(words)) return 'email';
  if (hint.includes('one-time-code') || /code|otp|one.time|verification/.test(words)) return 'code';
  return null;
}
"""
"""The one rule of what a form field holds, as page script: ``fieldKind(el, label)`` is ``'password'``
(``type=password``; or its id, name, autocomplete hint or label says password or passcode, or the hint
is ``current-password`` / ``new-password``), ``'email'``, ``'code'`` (a one-time code: the hint
``one-time-code``, or code, otp, one time, verification in those words) or null. The sign-in scanner
finds its fields by it; the browser tools' reads never return the value of a ``password`` or ``code``
field (``guest.browser_tools``)."""

HELPERS_JS = r"""
const MAX_INPUTS = %(max_inputs)d, MAX_LABEL = %(max_label)d, MAX_FIELDS = %(max_fields)d, MAX_OPTIONS = %(max_options)d;
const TOKEN = /^[A-Za-z0-9_.:~-]{1,64}$/;
function boundedText(node, limit) {
  let out = '';
  const walker = document.createTreeWalker(node, NodeFilter.SHOW_TEXT);
  for (let n = walker.nextNode(); n && out.length < limit; n = walker.nextNode()) out += n.data.slice(0, limit);
  return out.slice(0, limit);
}
function clip(text) {
  return String(text == null ? '' : text).slice(0, 4 * MAX_LABEL).replace(/[\s\u0000]+/g, ' ').trim().slice(0, MAX_LABEL);
}
function labelOf(el) {
  if (el.labels && el.labels.length) return clip(boundedText(el.labels[0], 4 * MAX_LABEL));
  const aria = el.getAttribute('aria-label');
  if (aria) return clip(aria);
  const by = el.getAttribute('aria-labelledby');
  if (by) { const ref = document.getElementById(by.split(/\s+/)[0]); if (ref) return clip(boundedText(ref, 4 * MAX_LABEL)); }
  return clip(el.getAttribute('placeholder') || el.getAttribute('name') || el.id || '');
}
function shown(el) {
  if (!el.isConnected || el.disabled) return false;
  const r = el.getBoundingClientRect();
  if (r.width < 4 || r.height < 4) return false;
  return el.checkVisibility({opacityProperty: true, visibilityProperty: true, contentVisibilityAuto: true});
}
%(field_kind)sfunction inputs() {
  const all = document.getElementsByTagName('input'), out = [], used = new Set();
  for (let i = 0; i < all.length && i < MAX_INPUTS; i++) {
    const el = all[i];
    let id = TOKEN.test(el.id) ? el.id : TOKEN.test(el.getAttribute('name') || '') ? el.getAttribute('name') : 'field-' + i;
    if (used.has(id)) id = id.slice(0, 64) + '~' + i;
    used.add(id);
    out.push({el, id});
  }
  return {list: out, truncated: all.length > MAX_INPUTS};
}
function credentialFields() {
  const {list, truncated} = inputs(), found = [];
  for (const item of list) {
    if (!shown(item.el)) continue;
    const label = labelOf(item.el), kind = fieldKind(item.el, label);
    if (kind) found.push({...item, label, kind});
  }
  if (!found.length) return {fields: [], truncated};
  const primary = found.find(f => f.kind === 'password') || found[0];
  const form = primary.el.form;
  return {fields: found.filter(f => f.el.form === form).slice(0, MAX_FIELDS), truncated};
}
function methodOptions() {
  const forms = document.forms;
  for (let i = 0; i < forms.length && i < 50; i++) {
    const form = forms[i];
    if (!/sign.?in|log.?in|anmelden|connexion/i.test(boundedText(form, 5000) + ' ' + boundedText(document.querySelector('h1') || document.createElement('p'), 500))) continue;
    const radios = [], buttons = [];
    for (const el of form.querySelectorAll('input[type=radio]')) if (radios.length < 50) radios.push(el);
    for (const el of form.querySelectorAll('button[name][value], input[type=submit][name][value]')) if (buttons.length < 50) buttons.push(el);
    const groups = new Map();
    radios.forEach((el, k) => {
      const label = labelOf(el);
      if (!(shown(el) || (el.labels && el.labels.length && shown(el.labels[0])))) return;
      const name = el.getAttribute('name') || '';
      if (!groups.has(name)) groups.set(name, []);
      groups.get(name).push({el, label, id: TOKEN.test(el.value) ? el.value : 'option-' + k});
    });
    for (const group of groups.values()) if (group.length >= 2) return group.slice(0, MAX_OPTIONS);
    const shownButtons = buttons.filter(shown).map((el, k) => ({el, label: clip(el.innerText || el.value), id: TOKEN.test(el.value) ? el.value : 'option-' + k}));
    if (shownButtons.length >= 2) return shownButtons.slice(0, MAX_OPTIONS);
  }
  return [];
}
function scan() {
  const {fields, truncated} = credentialFields();
  if (fields.length) {
    const form = fields[0].el.form;
    return {fields: fields.map(f => ({id: f.id, label: f.label, kind: f.kind, required: !!f.el.required,
        type: f.kind === 'password' ? 'password' : (f.el.type === 'email' ? 'email' : 'text')})), options: [], truncated,
        ...destinationOf(form, form && submitterOf(form, null))};
  }
  const options = methodOptions(), form = options.length ? options[0].el.form : null;
  return {fields: [], options: options.map(o => ({id: o.id, label: o.label, field_ids: []})), truncated,
          ...destinationOf(form, form && submitterOf(form, null))};
}
const FORM = HTMLFormElement.prototype;
function formGet(form, name) { return Object.getOwnPropertyDescriptor(FORM, name).get.call(form); }
function submitterOf(form, chosen) {
  if (chosen && chosen.type !== 'radio') return chosen;
  // The form's own default button: its first submit button in tree order (one inside it may belong to
  // another form, form=, and would submit that one; one outside may belong to it), or none.
  const elements = formGet(form, 'elements');
  for (let i = 0; i < elements.length && i < MAX_INPUTS; i++) {
    const el = elements[i];
    if ((el instanceof HTMLButtonElement || el instanceof HTMLInputElement) && el.type === 'submit') return el;
  }
  return null;
}
function destinationOf(form, submitter) {
  if (!form) return {method: '', destination: ''};
  const method = submitter && submitter.hasAttribute('formmethod') ? submitter.formMethod : formGet(form, 'method');
  const action = submitter && submitter.hasAttribute('formaction') ? submitter.formAction : formGet(form, 'action');
  let destination = 'null';
  try {
    const url = new URL(String(action));
    if (url.protocol === 'http:' || url.protocol === 'https:') destination = url.origin;
  } catch (e) {}
  return {method: String(method).toLowerCase().slice(0, 20), destination: destination.slice(0, 2048)};
}
const CONSTRAINTS = %(constraints)s;
const VALUE = Object.getOwnPropertyDescriptor(HTMLInputElement.prototype, 'value');
const CONSTRAINED = ['pattern', 'minlength', 'maxlength', 'min', 'max', 'step', 'multiple', 'required'];
function probeOf(el, value) {
  // A detached plain input with the constraints and the type the field had before the fill made it a
  // password field (hide), holding value: what that type keeps of a value and what it says of it.
  const probe = document.createElement('input'), type = guard().types.get(el);
  for (const name of CONSTRAINED) { const v = el.getAttribute(name); if (v !== null) probe.setAttribute(name, v); }
  if (type) probe.setAttribute('type', type);
  VALUE.set.call(probe, value);
  return probe;
}
function validityOf(el) {
  if (!el.validity || !(el instanceof HTMLInputElement) || !guard().types.has(el)) return el.validity;
  const own = el.validity, probe = probeOf(el, VALUE.get.call(el)).validity, out = {valid: own.valid && probe.valid};
  for (const c of CONSTRAINTS) out[c] = own[c] || (c !== 'customError' && probe[c]);
  return out;
}
function typeOf(el) {
  const g = guard();
  return String((g.types.has(el) ? g.types.get(el) : el.getAttribute('type')) || 'text').toLowerCase();
}
function invalidField(form, submitter, written) {
  if (formGet(form, 'noValidate') || (submitter && submitter.formNoValidate)) return null;
  const mine = new Map(written.map(id => [findField(id), id]));
  const elements = formGet(form, 'elements');
  for (let i = 0; i < elements.length && i < MAX_INPUTS; i++) {
    const el = elements[i], validity = validityOf(el);
    if (!el.willValidate || !validity || validity.valid) continue;
    const constraint = CONSTRAINTS.find(c => validity[c]) || 'customError';
    if (mine.has(el)) return {field: mine.get(el), constraint, message: ''};
    return {field: labelOf(el) || el.tagName.toLowerCase(), constraint, message: clip(el.validationMessage)};
  }
  return null;
}
const MASK = '-webkit-text-security';
function guard() {
  if (globalThis.signInGuard) return globalThis.signInGuard;
  const g = globalThis.signInGuard = {masked: new Map(), types: new Map(), observer: null};
  // A document left with values in its fields (a submit that navigated) keeps none: not in the back/forward
  // cache, not in the form state the browser restores on Back. The form's data left with its request.
  addEventListener('pagehide', () => {
    const setter = Object.getOwnPropertyDescriptor(HTMLInputElement.prototype, 'value').set;
    for (const el of g.masked.keys()) setter.call(el, '');
    unmask();
  }, true);
  return g;
}
function applyMask(el) {
  if (el.style.getPropertyValue(MASK) !== 'disc' || el.style.getPropertyPriority(MASK) !== 'important')
    el.style.setProperty(MASK, 'disc', 'important');
}
function hide(el) {
  // A field the fill writes is a password field while it holds the value: the browser's own style draws
  // those masked (an important declaration of its own origin, which no style of the page's outweighs, not
  // even one from a shadow root the field is slotted into, whose important declarations win over inline ones).
  const g = guard();
  if (String(el.getAttribute('type')).toLowerCase() === 'password') return;
  if (!g.types.has(el)) g.types.set(el, el.getAttribute('type'));
  el.setAttribute('type', 'password');
}
function mask(el) {
  const g = guard();
  if (!g.masked.has(el)) g.masked.set(el, [el.style.getPropertyValue(MASK), el.style.getPropertyPriority(MASK)]);
  applyMask(el);
  if (g.observer) return;
  g.observer = new MutationObserver(records => {
    for (const record of records) {
      if (record.type === 'attributes') {
        if (record.attributeName === 'type') { if (g.types.has(record.target)) hide(record.target); }
        else if (g.masked.has(record.target)) applyMask(record.target);
        continue;
      }
      for (const node of record.addedNodes) {
        if (node.nodeType !== Node.ELEMENT_NODE) continue;
        const found = node instanceof HTMLInputElement ? [node] : node.getElementsByTagName('input');
        for (let i = 0; i < found.length && i < MAX_INPUTS; i++) mask(found[i]);
      }
    }
  });
  g.observer.observe(document, {subtree: true, childList: true, attributes: true, attributeFilter: ['style', 'type']});
}
function unmask() {
  const g = guard();
  for (const [el, [value, priority]] of [...g.masked]) {
    if (el.isConnected && el.value !== '') continue;
    g.masked.delete(el);
    if (value) el.style.setProperty(MASK, value, priority); else el.style.removeProperty(MASK);
  }
  for (const [el, type] of [...g.types]) {
    if (el.isConnected && el.value !== '') continue;
    g.types.delete(el);
    if (type === null) el.removeAttribute('type'); else el.setAttribute('type', type);
  }
  if (!g.masked.size && !g.types.size && g.observer) { g.observer.disconnect(); g.observer = null; }
}
function findField(id) { const f = credentialFields().fields.find(f => f.id === id); return f ? f.el : null; }
function findOption(id) { const o = methodOptions().find(o => o.id === id); return o ? o.el : null; }
function clear(el) {
  if (!el || el.value === '') return;
  el.value = '';
  el.dispatchEvent(new Event('input', {bubbles: true}));
  el.dispatchEvent(new Event('change', {bubbles: true}));
}
""" % {"max_inputs": MAX_INPUTS, "max_label": MAX_LABEL_CHARS, "max_fields": MAX_FIELDS, "max_options": MAX_OPTIONS,
       "field_kind": FIELD_KIND_JS, "constraints": json.dumps(list(CONSTRAINTS))}


SET_VALUE_JS = "function (id, value) {" + HELPERS_JS + """
  const el = findField(id);
  if (!el) return 'gone';
  mask(el);
  hide(el);
  el.focus();
  VALUE.set.call(el, VALUE.get.call(probeOf(el, value)));
  el.dispatchEvent(new Event('input', {bubbles: true}));
  el.dispatchEvent(new Event('change', {bubbles: true}));
  const now = findField(id);
  if (!now) return 'unstable';
  mask(now);
  hide(now);
  const max = now.maxLength > 0 ? Math.min(now.maxLength, value.length) : value.length;
  return now.value.length === max || (typeOf(now) === 'email' && now.value.length > 0) ? 'set' : 'unstable';
}"""
"""The fill of one field (:meth:`BrowserHost._type_into`), called with ``(field id, value)``: the field
is masked and made a password field before the value goes in (:data:`HELPERS_JS` ``mask`` and ``hide``),
and takes what its own type would keep of the value (an e-mail field trims it; ``probeOf``)."""

SUBMIT_JS = "function (want, anchor, option, written) {" + HELPERS_JS + """
  const field = anchor !== null ? findField(anchor) : null;
  const chosen = option !== null ? findOption(option) : null;
  if (chosen && chosen.type !== 'radio' && !written.length) { chosen.click(); return {submitted: true}; }
  const form = (field || chosen || {}).form;
  if (!form) return written.length ? {submitted: false, method: '', destination: ''} : {submitted: false};
  const submitter = submitterOf(form, chosen);
  const to = destinationOf(form, submitter);
  if (written.length) {
    if (to.method !== %(method)s || to.destination !== want) return {submitted: false, ...to};
    const invalid = invalidField(form, submitter, written);
    if (invalid) return {submitted: false, ...to, invalid};
  }
  if (submitter) submitter.click(); else FORM.requestSubmit.call(form);
  return {submitted: true, ...to};
}""" % {"method": json.dumps(SUBMIT_METHOD)}
"""The submit (:meth:`BrowserHost._submit`), called with ``(credential origin, the first written field's
id or null, the chosen option's id or null, the written field ids)``. When values were written, it
checks again, in the same run as the click (no page script runs between check and click; the page's
own click and submit handlers run after, and its script can read the values anyway), what
:func:`wire.browser.form_refusal` checked before the first value -- the method is post, the destination
the credential origin -- and that the browser's own validation would let the form go (``invalid``:
the first field that fails, by the written field's id and the constraint's name, never the browser's
message for it, which may quote the value; for another field its label and message). Answers
``{submitted, method?, destination?, invalid?}``."""


class BrowserError(Exception):
    """A request the browser cannot serve: HTTP ``status``, error ``code`` and message."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


def _origin_of(url: str) -> str:
    try:
        parts = urlsplit(url)
        return f"{parts.scheme}://{parts.netloc}" if parts.scheme and parts.netloc else "null"
    except ValueError:
        return "null"


class SubmitWatch:
    """A sign-in's submit (contract 8), for the agent's request guard (``guest.browser_tools``): the POST
    the submit makes goes to ``origin`` (the credential origin) only; a redirect hop of it that would
    send its body on to another origin (307, 308) is refused there and that origin noted in
    ``refused``."""

    def __init__(self, origin: str) -> None:
        self.origin = origin
        self.refused: list[str] = []

    def note(self, url: str) -> None:
        """Note the refused hop to ``url`` (chromium's canonical URL) by its origin: ``scheme://host[:port]``,
        without user info; ``null`` when it has no host."""
        try:
            parts = urlsplit(url)
            host, port = parts.hostname or "", parts.port
        except ValueError:
            parts, host, port = None, "", None
        shown = "null"
        if parts is not None and host:
            shown = (f"{parts.scheme}://" + (f"[{host}]" if ":" in host else host)
                     + (f":{port}" if port is not None else ""))
        if len(self.refused) < 8:
            self.refused.append(shown[:2048])


class BrowserHost:
    """The agent's side of its chromium (module docstring). One channel at a time; thread-safe (one
    request at a time reaches the browser: a sign-in fill must not interleave with a scan)."""

    def __init__(self) -> None:
        self._pipe: Pipe | None = None
        self._pid: int | None = None
        self._sessions: dict[str, str] = {}
        self._state = threading.Lock()
        self._busy = threading.Lock()
        self._channel_callbacks: list[Any] = []
        self._watch: SubmitWatch | None = None

    def on_channel(self, callback: Any) -> None:
        """Call ``callback(pipe)`` for each channel taken from now on (after it is in place; outside the
        host's locks). The browser tools use it to set up a new chromium at once."""
        with self._state:
            self._channel_callbacks.append(callback)

    # -- the channel ---------------------------------------------------------------------------------
    def take_channel(self, app: str, pid: int, write_fd: int, read_fd: int) -> None:
        """``Launcher`` callback: use the pipes of a started channel app. A second chromium started while
        one is served hands its window to the first (Chromium's one instance per profile) and exits, so
        its pipes are closed here and the first stays."""
        with self._state:
            if self._pipe is not None and self._pipe.closed is None:
                for fd in (write_fd, read_fd):
                    try:
                        os.close(fd)
                    except OSError:
                        pass
                return
            old, self._pipe, self._pid = self._pipe, Pipe(write_fd, read_fd), pid
            self._sessions = {}
            self._pipe.add_listener(self._on_event)
            pipe, callbacks = self._pipe, list(self._channel_callbacks)
        if old is not None:
            old.close()
        for callback in callbacks:
            callback(pipe)

    def _on_event(self, method: str, params: dict[str, Any], _session: str | None) -> None:
        if method == "Target.detachedFromTarget":
            with self._state:
                for target, session in list(self._sessions.items()):
                    if session == params.get("sessionId"):
                        del self._sessions[target]

    def submit_watch(self) -> SubmitWatch | None:
        """The sign-in submit in progress, if any: the request guard follows the POSTs to its origin
        made meanwhile through their redirects."""
        with self._state:
            return self._watch

    def status(self) -> dict[str, Any]:
        """``{"running": bool, "pid": int | None}`` of the served chromium."""
        with self._state:
            pipe, pid = self._pipe, self._pid
        return {"running": pipe is not None and pipe.closed is None, "pid": pid if pipe else None}

    def _channel(self) -> Pipe:
        with self._state:
            pipe = self._pipe
        if pipe is None or pipe.closed is not None:
            raise BrowserError(409, "no_browser", "the agent's chromium is not running (launch the app \"chromium\")")
        return pipe

    def close(self) -> None:
        """Close the channel (the browser, left without its pipe, exits)."""
        with self._state:
            pipe, self._pipe = self._pipe, None
        if pipe is not None:
            pipe.close()

    # -- pages ---------------------------------------------------------------------------------------
    def _attach(self, pipe: Pipe, target_id: str) -> str:
        with self._state:
            session = self._sessions.get(target_id)
        if session is None:
            session = str(pipe.call("Target.attachToTarget", {"targetId": target_id, "flatten": True})["sessionId"])
            with self._state:
                self._sessions[target_id] = session
        return session

    def _active_page(self, pipe: Pipe) -> str:
        """The session of the tab the person sees: the visible page (the focused one among several)."""
        targets = pipe.call("Target.getTargets").get("targetInfos", [])
        pages = [t for t in targets if isinstance(t, dict) and t.get("type") == "page"
                 and not str(t.get("url", "")).startswith(("chrome:", "devtools:", "chrome-untrusted:"))]
        if not pages:
            raise BrowserError(409, "no_page", "the agent's chromium shows no page")
        visible: list[tuple[bool, bool, str]] = []
        problems: list[str] = []
        for target in pages[:20]:
            try:
                session = self._attach(pipe, str(target["targetId"]))
                state = self._evaluate(pipe, session, "[document.visibilityState === 'visible', "
                                       "document.hasFocus() === true]", timeout=2.0)
            except ChannelClosed:
                raise
            except (ChannelError, KeyError, BrowserError) as exc:
                problems.append(f"{type(exc).__name__}: {str(exc)[:100]}")
                continue
            if isinstance(state, list) and len(state) == 2:
                visible.append((state[0] is True, state[1] is True, session))
        if not visible:
            raise BrowserError(409, "no_page", "no tab of the agent's chromium answers"
                               + (f" ({'; '.join(problems[:3])})" if problems else ""))
        # Visible and focused first; a window the X server shows may still report "hidden" while
        # unfocused, so the order of the browser's own list decides among the rest (its newest tab first).
        visible.sort(key=lambda item: (not item[0], not item[1]))
        return visible[0][2]

    def _frame(self, pipe: Pipe, session: str, timeout: float = EVAL_TIMEOUT_S) -> dict[str, Any]:
        frame = pipe.call("Page.getFrameTree", session_id=session, timeout=timeout).get("frameTree", {}).get("frame", {})
        return frame if isinstance(frame, dict) else {}

    def _evaluate(self, pipe: Pipe, session: str, expression: str, *, timeout: float = EVAL_TIMEOUT_S,
                  frame: dict[str, Any] | None = None) -> Any:
        """Run ``expression`` in this agent's isolated world of the main frame (``frame`` when the caller
        has just read it) and return its value. Never in the page's own world: there the page defines
        what the DOM's getters answer, and how large."""
        params: dict[str, Any] = {"expression": expression, "returnByValue": True, "awaitPromise": False,
                                  "timeout": int(timeout * 1000),
                                  "contextId": self._world(pipe, session, frame or self._frame(pipe, session))}
        answer = pipe.call("Runtime.evaluate", params, session_id=session, timeout=timeout + 1.0)
        if "exceptionDetails" in answer:
            raise BrowserError(502, "page_script_failed", "a script in the page failed")
        return answer.get("result", {}).get("value")

    @staticmethod
    def _world(pipe: Pipe, session: str, frame: dict[str, Any]) -> Any:
        """This agent's isolated world in ``frame``'s document: its execution context id."""
        world = pipe.call("Page.createIsolatedWorld", {"frameId": frame.get("id", ""), "worldName": WORLD,
                                                       "grantUniveralAccess": False}, session_id=session)
        return world.get("executionContextId")

    def _run(self, pipe: Pipe, session: str, body: str, frame: dict[str, Any] | None = None) -> Any:
        """Run ``body`` (statements ending in ``return``) after :data:`HELPERS_JS` in the isolated world."""
        return self._evaluate(pipe, session, "(() => {" + HELPERS_JS + body + "})()", frame=frame)

    # -- sign-in -------------------------------------------------------------------------------------
    def signin_page(self) -> SignInPage:
        """The active tab's origin, URL, title and sign-in form (None when it shows none).

        Raises BrowserError (409 ``no_browser`` / ``no_page``, 504 ``browser_timeout``, 502 ``channel_closed``).
        """
        with self._busy:
            pipe = self._channel()
            try:
                session = self._active_page(pipe)
                frame = self._frame(pipe, session)
                found = self._run(pipe, session, "return [scan(), document.title.slice(0, 500)];", frame)
            except ChannelError as exc:
                raise _as_browser_error(exc) from None
        form = None
        scanned, title = (found if isinstance(found, list) and len(found) == 2 else ({}, ""))
        origin = str(frame.get("securityOrigin") or _origin_of(str(frame.get("url", ""))))
        if not origin.startswith(("http://", "https://")):
            scanned = {}  # an opaque origin (about:blank, data:, a document still committing) takes no credential
        if isinstance(scanned, dict) and (scanned.get("fields") or scanned.get("options")):
            form = SignInForm.model_validate({"fields": scanned.get("fields", []), "options": scanned.get("options", []),
                                              "method": str(scanned.get("method", ""))[:20],
                                              "destination": str(scanned.get("destination", ""))[:2048]})
        return SignInPage(origin=origin, url=str(frame.get("url", ""))[:2048], title=str(title or "")[:500], form=form)

    def fill(self, request: FillRequest) -> FillResult:
        """Choose the option, type the values and submit the active tab's sign-in form (module docstring).

        Raises BrowserError as :meth:`signin_page`; every other end is a :class:`FillResult` outcome.
        """
        with self._busy:
            pipe = self._channel()
            try:
                return self._fill(pipe, request)
            except ChannelError as exc:
                raise _as_browser_error(exc) from None

    def _origin(self, pipe: Pipe, session: str) -> str:
        frame = self._frame(pipe, session)
        return str(frame.get("securityOrigin") or _origin_of(str(frame.get("url", ""))))

    def _fill(self, pipe: Pipe, request: FillRequest) -> FillResult:
        session = self._active_page(pipe)
        want = request.credential_origin

        def loaded() -> bool:
            try:
                return self._evaluate(pipe, session, "document.readyState === 'complete'",
                                      timeout=SHORT_TIMEOUT_S) is True
            except (ChannelError, BrowserError) as exc:
                if isinstance(exc, ChannelClosed):
                    raise
                return False
        wait_until(loaded, NAVIGATION_WAIT_S)  # a form submitted while its page still loads may go nowhere
        if self._origin(pipe, session) != want:
            return FillResult(outcome="origin_changed", origin=self._origin(pipe, session))
        scanned = self._run(pipe, session, "return scan();")
        field_ids = {f.get("id") for f in (scanned or {}).get("fields", [])}
        option_ids = {o.get("id") for o in (scanned or {}).get("options", [])}
        if not field_ids and not option_ids:
            return FillResult(outcome="no_form", origin=want)
        if (request.selected_option is not None and request.selected_option not in option_ids
                and option_ids) or any(f.field_id not in field_ids for f in request.fields):
            return FillResult(outcome="form_changed", origin=want)
        if request.fields:  # where the values would go, before the first one is typed
            to = self._run(pipe, session, f"""
                const field = findField({json.dumps(request.fields[0].field_id)});
                const chosen = {json.dumps(request.selected_option)} !== null ? findOption({json.dumps(request.selected_option)}) : null;
                return field ? destinationOf(field.form, field.form && submitterOf(field.form, chosen)) : null;""")
            if not isinstance(to, dict):
                return FillResult(outcome="form_changed", origin=want)
            destination = str(to.get("destination", ""))[:2048]
            refusal = form_refusal(want, str(to.get("method", ""))[:20], destination)
            if refusal is not None:
                return FillResult(outcome=refusal[0], origin=want, destination=destination, detail=refusal[1])
        loader = self._frame(pipe, session).get("loaderId")
        typed: list[str] = []
        if request.selected_option is not None and option_ids:
            chosen = self._run(pipe, session, f"const el = findOption({json.dumps(request.selected_option)});"
                                              "if (!el) return false; if (el.type === 'radio') el.click(); return true;")
            if not chosen:
                return FillResult(outcome="form_changed", origin=want)
        for item in request.fields:
            outcome = self._type_into(pipe, session, want, item.field_id, item.value)
            if outcome != "ok":
                self._clear(pipe, session, typed + [item.field_id])
                return FillResult(outcome=outcome, origin=self._origin(pipe, session))
            typed.append(item.field_id)
        if self._origin(pipe, session) != want:
            self._clear(pipe, session, typed)
            return FillResult(outcome="origin_changed", origin=self._origin(pipe, session))
        watch = SubmitWatch(want)
        with self._state:
            self._watch = watch
        try:
            result = self._send(pipe, session, want, request.selected_option, typed, loader)
        finally:
            with self._state:
                self._watch = None
        if watch.refused and result.outcome == "submitted":
            return FillResult(outcome="cross_origin_redirect", navigated=result.navigated, origin=result.origin,
                              destination=watch.refused[0],
                              detail=(f"the site answered the submit with a redirect to {watch.refused[0][:120]} that "
                                      "would send the values there again: refused before they left")[:MAX_DETAIL_CHARS])
        return result

    def _send(self, pipe: Pipe, session: str, want: str, option: str | None, typed: list[str],
              loader: Any) -> FillResult:
        """Submit the checked form (:meth:`_submit`) and wait for the new document (the document of
        ``loader`` left): the fill's outcome, ``submitted`` or why not."""
        sent = self._submit(pipe, session, want, option, typed)
        destination = str(sent.get("destination", ""))[:2048]
        if not sent.get("submitted"):
            self._clear(pipe, session, typed)
            if not sent:  # the checked document is gone, or the page broke the script
                now = self._origin(pipe, session)
                return FillResult(outcome="origin_changed" if now != want else "form_changed", origin=now)
            invalid = sent.get("invalid")
            refusal = (form_refusal(want, str(sent.get("method", ""))[:20], destination) if typed else None) \
                or (("invalid", _invalid_detail(invalid)) if isinstance(invalid, dict) else None)
            if refusal is None:  # a chosen option with no form around it: nothing to submit
                return FillResult(outcome="no_form", origin=want)
            return FillResult(outcome=refusal[0], origin=want, destination=destination, detail=refusal[1])

        def moved() -> bool:
            # A new document only (a new loaderId): pushState or a hash change keep the document, and the
            # typed values with it. The page is asked with a short deadline: a command sent while its
            # document is being swapped for the next (a new renderer process) may go unanswered.
            try:
                return self._frame(pipe, session, timeout=SHORT_TIMEOUT_S).get("loaderId") != loader
            except ChannelError:
                return False
        def parsed() -> bool:
            # the new document's form is there to read once it is parsed: the next sign-in step (a
            # second form) is then seen by whoever asks for the page right after the fill
            try:
                state = self._evaluate(pipe, session, "document.readyState", timeout=SHORT_TIMEOUT_S,
                                       frame=self._frame(pipe, session, timeout=SHORT_TIMEOUT_S))
            except (ChannelError, BrowserError):
                return False
            return state in ("interactive", "complete")

        navigated = bool(wait_until(moved, NAVIGATION_WAIT_S))
        if not navigated:
            self._clear(pipe, session, typed)
        else:
            wait_until(parsed, NAVIGATION_WAIT_S)  # a page that never finishes parsing: read as it is
        try:
            after = str(self._frame(pipe, session, timeout=SHORT_TIMEOUT_S).get("securityOrigin") or "null")
        except ChannelError:
            after = "null"
        return FillResult(outcome="submitted", navigated=navigated, origin=after, destination=destination)

    def _submit(self, pipe: Pipe, session: str, want: str, option: str | None, typed: list[str]) -> dict[str, Any]:
        """Check and submit the form (:data:`SUBMIT_JS`, in the isolated world of the checked document):
        ``{submitted, method?, destination?, invalid?}``; ``{}`` when the document is gone."""
        frame = self._frame(pipe, session)
        if str(frame.get("securityOrigin") or "") != want:
            return {}
        answer = pipe.call("Runtime.callFunctionOn", {
            "functionDeclaration": SUBMIT_JS, "executionContextId": self._world(pipe, session, frame),
            "returnByValue": True, "arguments": [{"value": want}, {"value": typed[0] if typed else None},
                                                 {"value": option}, {"value": typed}]},
            session_id=session, timeout=EVAL_TIMEOUT_S + 1.0)
        value = answer.get("result", {}).get("value") if "exceptionDetails" not in answer else None
        return value if isinstance(value, dict) else {}

    def _type_into(self, pipe: Pipe, session: str, origin: str, field_id: str, value: str) -> str:
        """Put ``value`` into field ``field_id`` of the main frame's document: ``ok``, ``origin_changed``,
        ``form_changed`` or ``field_unstable``.

        The value is set on the element itself (the input's own value setter, from this agent's isolated
        world, then ``input`` and ``change`` events), passed as an argument of a call bound to that
        document's context: never through the focus, which a frame of another origin could take between a
        focus check and typed input, and never into a document that replaced this one (the call fails
        with its context). A field the page rewrites at once is retried, then cleared."""
        for _attempt in range(FILL_ATTEMPTS):
            frame = self._frame(pipe, session)
            if str(frame.get("securityOrigin") or "") != origin:
                return "origin_changed"
            context = self._world(pipe, session, frame)
            answer = pipe.call("Runtime.callFunctionOn", {
                "functionDeclaration": SET_VALUE_JS, "executionContextId": context, "returnByValue": True,
                "arguments": [{"value": field_id}, {"value": value}]}, session_id=session, timeout=EVAL_TIMEOUT_S + 1.0)
            if "exceptionDetails" in answer:
                return "field_unstable"
            result = answer.get("result", {}).get("value")
            if result == "gone":
                return "form_changed"
            if result == "set":
                return "ok"
            self._clear(pipe, session, [field_id])
        return "field_unstable"

    def _clear(self, pipe: Pipe, session: str, field_ids: list[str]) -> None:
        """Empty the given fields if they are still on the page (best effort: the page may be gone)."""
        if not field_ids:
            return
        try:
            self._run(pipe, session, f"for (const id of {json.dumps(field_ids)}) clear(findField(id)); unmask(); return true;")
        except (ChannelError, BrowserError):
            pass

    # -- checks --------------------------------------------------------------------------------------
    def page_text(self, url: str) -> dict[str, Any]:
        """Open ``url`` in a background tab, wait for it to load, return ``{"origin", "url", "text",
        "truncated"}`` (text: the body's ``innerText``, at most :data:`MAX_PAGE_TEXT` characters) and
        close the tab. Raises BrowserError (as :meth:`signin_page`; 504 ``browser_timeout`` when the page
        does not finish loading in :data:`PAGE_LOAD_TIMEOUT_S`)."""
        with self._busy:
            pipe = self._channel()
            target = None
            try:
                target = str(pipe.call("Target.createTarget", {"url": url, "background": True})["targetId"])
                session = self._attach(pipe, target)

                def loaded() -> bool:
                    try:
                        if str(self._frame(pipe, session).get("url", "")) in ("", "about:blank"):
                            return False  # the tab's first, empty document: the page is not there yet
                        return self._evaluate(pipe, session, "document.readyState === 'complete'", timeout=2.0) is True
                    except (ChannelError, BrowserError) as exc:
                        if isinstance(exc, ChannelClosed):
                            raise
                        return False
                if not wait_until(loaded, PAGE_LOAD_TIMEOUT_S, interval=0.1):
                    raise BrowserError(504, "browser_timeout", f"the page did not load within {PAGE_LOAD_TIMEOUT_S:g} s")
                frame = self._frame(pipe, session)
                text = self._evaluate(pipe, session, f"document.body ? document.body.innerText.slice(0, {MAX_PAGE_TEXT + 1}) : ''")
            except ChannelError as exc:
                raise _as_browser_error(exc) from None
            finally:
                if target is not None:
                    try:
                        pipe.call("Target.closeTarget", {"targetId": target}, timeout=3.0)
                    except ChannelError:
                        pass
        text = str(text or "")
        return {"origin": str(frame.get("securityOrigin") or _origin_of(str(frame.get("url", "")))),
                "url": str(frame.get("url", ""))[:2048], "text": text[:MAX_PAGE_TEXT],
                "truncated": len(text) > MAX_PAGE_TEXT}


def _invalid_detail(invalid: dict[str, Any]) -> str:
    """An ``invalid`` outcome's detail from :data:`SUBMIT_JS`'s ``invalid``: ``field ID: <the constraint
    in words>`` for a written field, ``field LABEL: <the browser's message>`` for another (page text,
    cut; the caller escapes it)."""
    constraint = str(invalid.get("constraint", ""))
    message = str(invalid.get("message") or "")[:MAX_LABEL_CHARS] or CONSTRAINTS.get(constraint, "is invalid")
    text = (f"the browser's validation stops the submit: field {str(invalid.get('field', ''))[:MAX_LABEL_CHARS]}: "
            f"{message}" + (f" ({constraint})" if constraint in CONSTRAINTS else ""))
    return text[:MAX_DETAIL_CHARS]


def _as_browser_error(exc: ChannelError) -> BrowserError:
    if isinstance(exc, CommandTimeout):
        return BrowserError(504, "browser_timeout", str(exc))
    if isinstance(exc, ChannelClosed):
        return BrowserError(502, "channel_closed", str(exc))
    return BrowserError(502, "browser_error", str(exc))

