"""The agent's chromium as the openai SDK's ``BrowserToolset`` driver (docs/ARCHITECTURE.md, contract 9).

:class:`BrowserTools` serves ``GET /v1/browser/state`` (:meth:`BrowserTools.state`) and
``POST /v1/browser/call`` (:meth:`BrowserTools.call`) over the DevTools pipe that
:class:`guest.browser.BrowserHost` holds (the same channel and sessions as the sign-in; never a TCP
port). Shapes, members, limits and refusal codes are :mod:`wire.browser_tools`.

Tabs are the agent's own tokens (``tab-1``, ``tab-2``, ...: never chromium's target ids), in the order
the agent first saw them; the active one is the tab the agent last brought to the front (a tab a page
opens comes to the front, as chromium shows it). The observation records what happened to the tabs:
``tab_opened``, ``tab_closed``, ``tab_switched``, ``navigation`` (a new document in a main frame),
``dialog_dismissed`` (every JavaScript dialog is answered at once: alert, confirm and prompt dismissed,
beforeunload answered "leave", so a navigation the model asked for goes through), ``download``
(downloads are denied, ``blocked``), ``navigation_refused`` (``unsupported``: a URL that is not http(s)
or about:blank), at most :data:`wire.browser_tools.MAX_CHANGES` retained.

Pages are hostile. Every script runs in this agent's isolated world (:data:`WORLD`), one per document,
its execution context cached per (tab, frame, loader): the page shares the DOM but not the world's
globals or prototypes, so it cannot see or forge the refs, which live in that world's ``Map`` (nothing
is written into the page), nor replace the functions and getters the scripts use. A read visits at most
:data:`wire.browser_tools.MAX_WORK_NODES` nodes and answers bounded text (a 50 MB page costs the same
as a small one); same-origin iframes and open shadow roots are read, other frames are omitted
(``frame_limit``). Every DevTools command has a deadline; a page that blocks its event loop makes
reads and element actions time out (504 ``browser_timeout``), never the agent.

Every request chromium makes (any tab, frame or worker; each hop of a redirect) waits for the agent's
answer (:meth:`BrowserTools._guard`): the URL rule (:class:`wire.browser_tools.GuestUrlRule`, ``PUT
/v1/browser/rule``, with the origins chromium was launched with) refuses guest-local origins it does not
name, the agent's port and the gateway; a refused document gets :data:`REFUSAL_PAGE`, anything else
refused fails in chromium.

Input: ``click``, ``hover``, ``type``, ``key``, ``scroll`` are trusted events sent to the tab through
CDP ``Input``; a ref's mouse input and typed text reach that element or nothing (the input gate, :data:`GATE_FN_JS`,
:meth:`BrowserTools._gated`); ``select_option`` sets the options from the isolated world and fires ``input`` and
``change``; ``click_at``, ``hover_at``, ``drag_path``, ``hold_keys`` go through the agent's X input
(:class:`guest.actions.Executor`, the computer actions' input lock), viewport CSS px mapped to screen
px by :meth:`BrowserTools.viewport_on_screen`.

Over 400 lines: the page-side script, the tab and observation bookkeeping and one handler per member
belong together (one home of how the agent drives its browser for the model).
"""

from __future__ import annotations

import base64
import html
import json
import logging
import queue
import re
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable
from urllib.parse import urlsplit

from wire import browser_tools as W
from wire.browser_tools import BrowserCall, BrowserCallResult
from Xlib import XK

from . import keys as keynames
from .browser import FIELD_KIND_JS, BrowserError, BrowserHost, _as_browser_error
from .cdp import ChannelClosed, ChannelError, CommandFailed, CommandTimeout, Pipe, wait_until
from .chromium_policy import ProxyRoutes
from .launch import LaunchError

WORLD = "desktop-sandbox-tools"
"""Name of this agent's isolated world in each document."""
SCRIPT_TIMEOUT_S = 5.0
"""Deadline of one script in a page."""
SHORT_TIMEOUT_S = 1.0
"""Deadline of a command polled in a loop or only informative (the viewport's place)."""
BUSY_WAIT_S = 30.0
"""How long a call waits for the browser while another request (a sign-in fill) uses it (409 ``busy``)."""
PAINT_WAIT_S = 2.0
"""How long an X input member waits for a new document's first contentful paint before it sends input."""
CLICK_SPACING_S = 0.02
"""Time between the X clicks of one ``click_at`` with ``click_count`` > 1 (well inside a double-click
interval, never within one X timestamp)."""
MAX_PENDING_EVENTS = 1000
"""Most page events (dialogs, new tabs) waiting to be handled; more are dropped."""
GUARD_WAIT_S = 30.0
"""How long a call waits for a new browser's request guard (its ``Fetch.enable``) before it fails."""
SETUP_WAIT_S = 300.0
"""How long the set-up of a new browser's channel is tried again while the browser is too busy to
answer (a browser starting on a loaded or emulated machine); it then waits for the next call."""
STARTUP_OPEN_GRACE_S = 10.0
"""How long after its set-up a new browser may take to show the addresses it was launched with before
the agent opens the first of them itself (:meth:`BrowserTools._open_launched`)."""
MAX_FOLLOWED_SUBMITS = 64
"""Most sign-in submit requests whose redirect hops the guard follows at once (the oldest are let go)."""
REFUSAL_PAGE = ("<!doctype html><html><head><meta charset=utf-8><title>Refused</title></head><body>"
                "<h1>Refused</h1><p>The sandbox did not load this address: {reason}.</p><p>{url}</p></body></html>")
"""What a tab or frame shows instead of a document the URL rule refuses (``reason``: a
``wire.browser_tools.REFUSED_*`` reason, ``url``: the refused URL as :func:`shown_url` writes it; both
HTML-escaped)."""
SHOWN_URL_CHARS = 300
"""Most characters of a refused URL the refusal page shows."""

_log = logging.getLogger(__name__)

_REF = re.compile(r"^d([0-9]{1,9})e([0-9]{1,9})$")
_SURROGATE = re.compile("[\ud800-\udfff]")


def _text(value: Any) -> str:
    """A string from the browser as text: lone surrogates (a JS string may hold them) replaced."""
    return _SURROGATE.sub("\ufffd", value) if isinstance(value, str) else ""


def shown_url(url: str) -> str:
    """``url`` as the refusal page shows it: at most :data:`SHOWN_URL_CHARS` characters (``...`` after a
    cut), a backslash and every character but printable ASCII escaped as Python writes them (``\\\\``,
    ``\\xNN``, ``\\uNNNN``)."""
    cut = url[:SHOWN_URL_CHARS]
    text = "".join(c if " " < c < "\x7f" and c != "\\" else ascii(c)[1:-1] for c in cut)
    return text + ("..." if len(url) > SHOWN_URL_CHARS else "")


def _same_origin(url: str, origin: str) -> bool:
    """Whether ``url`` is on ``origin`` (:func:`wire.browser_tools.origin_key`; unreadable: no)."""
    try:
        key = W.origin_key(url)
        return key is not None and key == W.origin_key(origin)
    except ValueError:
        return False


def refuse(code: str, message: str) -> BrowserError:
    """A 422 refusal (``code`` one of :data:`wire.browser_tools.REFUSAL_CODES`); ``message`` must hold
    no page text."""
    assert code in W.REFUSAL_CODES, code
    return BrowserError(422, code, message)


def navigable(url: str) -> bool:
    """True for the URLs the agent loads: ``about:blank`` and http(s) URLs with a host, no whitespace
    or control characters."""
    if url == "about:blank":
        return True
    if re.search(r"[\x00-\x20\x7f]", url) or _SURROGATE.search(url):
        return False
    try:
        parts = urlsplit(url)
    except ValueError:
        return False
    return parts.scheme in ("http", "https") and bool(parts.hostname)


# -- the input gate (runs in the isolated world only) ------------------------------------------------
GATE_FN_JS = r"""function dsGate(win) {
  let G;
  try { G = win.__dsGate; } catch (e) { return null; }
  if (G) return G;
  G = {armed: null};
  Object.defineProperty(win, '__dsGate', {value: G});
  const gate = (e) => {
    if (!e.isTrusted) return;
    let a = null;
    try { const top = win.top.__dsGate; a = top ? top.armed : null; } catch (x) { a = null; }
    a = a || G.armed;
    if (!a || Date.now() > a.until) return;
    if (!a.typing && (e.type === 'beforeinput' || e.type.startsWith('key'))) return;
    const path = e.composedPath();
    for (const n of a.allowed) if (path.includes(n)) { if (a.got.length < 64) a.got.push(e.type); return; }
    if (e.type.endsWith('over') || e.type.endsWith('move')) for (const n of a.frames) if (path.includes(n)) return;
    e.stopImmediatePropagation();
    e.preventDefault();
    if (a.diverted.length < 64) a.diverted.push(e.type);
  };
  for (const t of %(types)s) win.addEventListener(t, gate, {capture: true});
  return G;
}""" % {"types": json.dumps(["pointerover", "pointerdown", "pointermove", "pointerup", "mouseover", "mousedown",
                              "mousemove", "mouseup", "click", "dblclick", "auxclick", "contextmenu",
                              "keydown", "keypress", "beforeinput"])}
"""The input gate of one window of this agent's isolated world (``dsGate(win)``: installed once, returns
its state). While the tab's top window's gate is armed (``armed``: the named element and its labels in
``allowed``, a ``Date.now()`` deadline in ``until``), every trusted pointer or mouse event that would
reach anything else is stopped and its default prevented in the capture phase at the window, before
any listener of the page, and noted in ``diverted``; those that reach the element are noted in ``got``.
Armed for typing (``typing``), it gates key events and ``beforeinput`` the same way (text the page would
have go to another element than the one named is not inserted there); otherwise it lets them be.
A same-origin frame's gate reads the top window's; enter and leave events are not gated (they name the
element's ancestors and activate nothing), nor are over and move events on the frames the element is in
(``frames``: the pointer passes over them to reach it)."""
GATE_JS = "(" + GATE_FN_JS + ")(window);"
"""Registered for every new document of every tab (``Page.addScriptToEvaluateOnNewDocument`` in
:data:`WORLD`), so the gate's listeners come before any of the page's own."""
HOVER_EVENTS = frozenset({"pointerover", "pointermove", "mouseover", "mousemove"})
"""The gated events that activate nothing. Chromium sends them by itself too, for the resting pointer,
when a scroll or the page moves things under it: a click fails on another element's press, release or
click only, a hover when its move reached another element and not the one named."""
ADOPT_TIMEOUT_S = 30.0
"""How long a new tab's set-up (:meth:`BrowserTools._enable`) may take: the tab waits for it (a busy host can
take seconds to start its renderer); then the tab is closed rather than run without its input gate."""
ARM_S = 20.0
"""How long an armed gate holds at most (the input commands' deadlines, with room): past it the gate
lets everything through again, should the agent never disarm it."""


# -- the page-side script (runs in the isolated world only) ------------------------------------------
PAGE_JS = r"""function (op, arg) {
const L = %(limits)s;
const S = globalThis.__dsTools || (globalThis.__dsTools = {refs: new Map(), ids: new WeakMap(), next: 1});
const BLOCK = /^(address|article|aside|blockquote|br|dd|details|dialog|div|dl|dt|fieldset|figcaption|figure|footer|form|h[1-6]|header|hr|li|main|nav|ol|p|pre|section|summary|table|tr|ul)$/;
const SKIP = /^(script|style|noscript|template|head|title|meta|link)$/;
const ROLES = {button: 'button', link: 'button', menuitem: 'button', tab: 'button', option: null, textbox: 'textbox',
  searchbox: 'textbox', combobox: 'combobox', checkbox: 'checkbox', switch: 'checkbox', radio: 'radio', slider: 'slider',
  listbox: 'listbox'};
function squash(s, n) { return String(s == null ? '' : s).slice(0, 4 * n).replace(/\s+/g, ' ').trim().slice(0, n); }
function bounded(node, n) {
  let out = '', seen = 0;
  const w = node.ownerDocument.createTreeWalker(node, NodeFilter.SHOW_TEXT);
  for (let t = w.nextNode(); t && out.length < 4 * n && seen < 200; t = w.nextNode(), seen++)
    if (!t.parentElement || !t.parentElement.closest('select, textarea, script, style')) out += t.data.slice(0, 4 * n) + ' ';
  return squash(out, n);
}
function roleOf(el) {
  const tag = el.localName, aria = (el.getAttribute('role') || '').trim().toLowerCase().split(/\s+/)[0];
  if (tag === 'input') {
    const t = (el.getAttribute('type') || 'text').toLowerCase();
    if (t === 'hidden') return null;
    if (['button', 'submit', 'reset', 'image'].includes(t)) return 'button';
    if (t === 'checkbox') return 'checkbox';
    if (t === 'radio') return 'radio';
    if (t === 'range') return 'slider';
    if (t === 'file' || t === 'color') return '?';
    return 'textbox';
  }
  if (tag === 'textarea') return 'textbox';
  if (tag === 'select') return el.multiple || el.size > 1 ? 'listbox' : 'combobox';
  if (tag === 'button' || tag === 'summary') return 'button';
  if (tag === 'a' && el.hasAttribute('href')) return 'button';
  if (aria && aria in ROLES) return ROLES[aria];
  if (el.isContentEditable && !(el.parentElement && el.parentElement.isContentEditable)) return 'textbox';
  return null;
}
function labelOf(el, role) {
  const by = el.getAttribute('aria-labelledby');
  if (by) {
    const root = el.getRootNode(), parts = [];
    for (const id of by.split(/\s+/).slice(0, 8)) { const r = root.getElementById ? root.getElementById(id) : null; if (r) parts.push(bounded(r, L.label)); }
    const s = squash(parts.join(' '), L.label); if (s) return s;
  }
  const aria = squash(el.getAttribute('aria-label'), L.label); if (aria) return aria;
  if (el.labels && el.labels.length) { const s = bounded(el.labels[0], L.label); if (s) return s; }
  if (el.localName === 'input' && ['button', 'submit', 'reset'].includes(el.type)) { const s = squash(el.value, L.label); if (s) return s; }
  if (el.localName === 'input' && el.type === 'image') { const s = squash(el.alt, L.label); if (s) return s; }
  if (role === 'button' && el.localName !== 'input') { const s = bounded(el, L.label); if (s) return s; }
  for (const a of ['placeholder', 'title', 'alt', 'name']) { const s = squash(el.getAttribute(a), L.label); if (s) return s; }
  if (role === 'textbox' && el.isContentEditable) { const s = bounded(el, L.label); if (s) return s; }
  return '';
}
%(field_kind)s
%(gate)s
function privateField(el, label) {
  const kind = fieldKind(el, label || '');
  if (kind === 'password' || kind === 'code') return true;
  const ac = (el.getAttribute('autocomplete') || '').toLowerCase().slice(0, 200).split(/\s+/);
  return ac.some(t => t.startsWith('cc-') || t === 'one-time-code');  // an e-mail field may carry the hint
}
function refOf(el) {
  let ref = S.ids.get(el);
  if (!ref) { ref = arg.prefix + 'e' + (S.next++); S.ids.set(el, ref); S.refs.set(ref, el); }
  return ref;
}
function shown(el) {
  return el.checkVisibility({opacityProperty: false, visibilityProperty: true, contentVisibilityAuto: true});
}
function frameOffset(win) {
  let x = 0, y = 0;
  for (let i = 0; i < 20 && win !== window && win.frameElement; i++) {
    const fe = win.frameElement, r = fe.getBoundingClientRect(), cs = fe.ownerDocument.defaultView.getComputedStyle(fe);
    x += r.left + fe.clientLeft + parseFloat(cs.paddingLeft || '0');
    y += r.top + fe.clientTop + parseFloat(cs.paddingTop || '0');
    win = fe.ownerDocument.defaultView;
  }
  return [x, y];
}
function read(mode, query) {
  const om = new Set(), els = [], wantText = mode !== 'interactive';
  let text = '', work = 0, options = 0;
  const stack = [{next: document.documentElement}];
  const push = (node) => { if (node) stack.push({next: node}); };
  while (stack.length) {
    const top = stack[stack.length - 1], n = top.next;
    if (!n) { stack.pop(); continue; }
    top.next = n.nextSibling;
    if (++work > L.work) { om.add('work_limit'); break; }
    if (n.nodeType === 3) {
      if (wantText && text.length < L.text) text += n.data.slice(0, 2 * L.text).replace(/\s+/g, ' ');
      else if (wantText) om.add('text_limit');
      continue;
    }
    if (n.nodeType !== 1) continue;
    const tag = n.localName;
    if (SKIP.test(tag)) continue;
    if (tag !== 'html' && tag !== 'body' && !shown(n)) continue;
    if (wantText && BLOCK.test(tag) && text && !text.endsWith('\n')) text += '\n';
    const role = roleOf(n);
    if (role === '?') om.add('unsupported_control');
    else if (role) {
      let label = labelOf(n, role);
      const item = {role, label: label || ('unlabelled ' + role)};
      if (!query || item.label.toLowerCase().includes(query)) {
        if (els.length >= L.elements) om.add('target_limit');
        else {
          if (role === 'textbox' || role === 'slider') {
            if (privateField(n, label)) om.add('private');
            else if ('value' in n && typeof n.value === 'string') item.value = n.value.slice(0, 4 * L.value + 1);
            else if (n.isContentEditable) item.value = bounded(n, L.value + 1);
          } else if (role === 'checkbox' || role === 'radio') {
            item.checked = 'checked' in n && n.localName === 'input' ? !!n.checked : n.getAttribute('aria-checked') === 'true';
          } else if ((role === 'combobox' || role === 'listbox') && n.localName === 'select') {
            item.options = [];
            for (let i = 0; i < n.options.length; i++) {
              if (item.options.length >= L.options || options >= L.reportOptions) { om.add('report_limit'); break; }
              const o = n.options[i], ol = squash(o.label || o.text, L.label) || squash(o.value, L.label) || 'unlabelled option';
              const opt = {label: ol, value: o.value.slice(0, 4 * L.value + 1)};
              if (role === 'listbox') opt.selected = !!o.selected;
              item.options.push(opt); options++;
            }
            if (role === 'combobox' && n.selectedIndex >= 0) item.value = n.value.slice(0, 4 * L.value + 1);
          }
          item.ref = refOf(n);
          els.push(item);
        }
      }
    }
    if (tag === 'iframe' || tag === 'frame') {
      let doc = null;
      try { doc = n.contentDocument; } catch (e) { doc = null; }
      if (doc && doc.documentElement) push(doc.documentElement); else om.add('frame_limit');
      continue;
    }
    if (tag === 'select' || tag === 'textarea') continue;
    push(n.firstChild);
    if (n.shadowRoot) push(n.shadowRoot.firstChild);
  }
  if (text.length > L.text) { text = text.slice(0, L.text); om.add('text_limit'); }
  return {text: wantText ? text : '', elements: els, omitted: [...om]};
}
function visibleText() { return read('all', null).text; }
function within(node, el) {
  for (let i = 0; node && i < 10000; i++) { if (node === el) return true; node = node.parentNode || node.host || null; }
  return false;
}
function hitAt(x, y) {
  let doc = document, ox = 0, oy = 0, hit = null;
  for (let depth = 0; depth < 10; depth++) {
    let h = doc.elementFromPoint(x - ox, y - oy);
    if (!h) return hit;
    for (let i = 0; i < 20 && h.shadowRoot; i++) { const inner = h.shadowRoot.elementFromPoint(x - ox, y - oy); if (!inner || inner === h) break; h = inner; }
    hit = h;
    if ((h.localName === 'iframe' || h.localName === 'frame')) {
      let inner = null; try { inner = h.contentDocument; } catch (e) { inner = null; }
      if (!inner) return hit;
      const [fx, fy] = frameOffset(inner.defaultView); ox = fx; oy = fy; doc = inner; continue;
    }
    return hit;
  }
  return hit;
}
function element(ref) {
  const el = S.refs.get(ref);
  if (!el) return {status: 'stale'};
  if (!el.isConnected) { S.refs.delete(ref); return {status: 'gone'}; }
  return {el};
}
function box(el) {
  const r = el.getBoundingClientRect(), [ox, oy] = frameOffset(el.ownerDocument.defaultView);
  return {x: r.left + ox, y: r.top + oy, width: r.width, height: r.height};
}
function prepare(ref, need) {
  const found = element(ref);
  if (!found.el) return found;
  const el = found.el, role = roleOf(el);
  if (need === 'textbox' && role !== 'textbox') return {status: 'kind', role};
  if (need === 'textbox' && !(el.isContentEditable || (('readOnly' in el) && !el.readOnly && !el.disabled
      && (el.localName === 'textarea' || el.localName === 'input')))) return {status: 'readonly', role};
  if (need === 'select' && el.localName !== 'select') return {status: 'kind', role};
  if (need === 'check' && role !== 'checkbox' && role !== 'radio') return {status: 'kind', role};
  el.scrollIntoView({block: 'center', inline: 'center', behavior: 'instant'});
  const b = box(el);
  if (!shown(el) || b.width <= 0 || b.height <= 0) return {status: 'hidden', box: b};
  if (need !== 'any' && (el.matches(':disabled') || el.getAttribute('aria-disabled') === 'true')) return {status: 'disabled', box: b};
  if (need !== 'any' && need !== 'hover') {
    const cx = b.x + b.width / 2, cy = b.y + b.height / 2;
    if (cx < 0 || cy < 0 || cx >= innerWidth || cy >= innerHeight) return {status: 'outside', box: b};
    const hit = hitAt(cx, cy);
    const ok = hit && (within(hit, el) || (el.labels && [...el.labels].some(l => within(hit, l))));
    if (!ok) return {status: 'covered', box: b};
  }
  return {status: 'ok', box: b, role, checked: 'checked' in el ? !!el.checked : el.getAttribute('aria-checked') === 'true'};
}
switch (op) {
  case 'read': return read(arg.mode, arg.query);
  case 'text': return visibleText();
  case 'prepare': return prepare(arg.ref, arg.need);
  case 'arm': {
    const p = prepare(arg.ref, arg.need);
    if (p.status !== 'ok') return p;
    const el = S.refs.get(arg.ref), G = dsGate(window);
    dsGate(el.ownerDocument.defaultView);
    const allowed = [el], frames = [];
    if (arg.need !== 'hover' && arg.need !== 'textbox' && el.labels) for (const l of el.labels) allowed.push(l);
    for (let w = el.ownerDocument.defaultView, i = 0; i < 20 && w !== window && w.frameElement; i++) {
      frames.push(w.frameElement);
      w = w.frameElement.ownerDocument.defaultView;
    }
    G.armed = {allowed, frames, typing: arg.need === 'textbox', got: [], diverted: [], until: Date.now() + arg.ms};
    return p;
  }
  case 'disarm': {
    const G = dsGate(window), a = G.armed;
    G.armed = null;
    return a ? {got: [...new Set(a.got)], diverted: [...new Set(a.diverted)]} : null;
  }
  case 'focus': {
    const found = element(arg.ref); if (!found.el) return found.status;
    const el = found.el; el.focus();
    let active = document.activeElement;
    for (let i = 0; i < 20 && active; i++) {
      if (active === el) break;
      if (active.shadowRoot && active.shadowRoot.activeElement) active = active.shadowRoot.activeElement;
      else if ((active.localName === 'iframe' || active.localName === 'frame') && active.contentDocument) active = active.contentDocument.activeElement;
      else break;
    }
    if (active !== el) return 'unfocused';
    if (typeof el.select === 'function') el.select(); else el.ownerDocument.execCommand('selectAll');
    return 'ok';
  }
  case 'checked': { const found = element(arg.ref); if (!found.el) return null; const el = found.el;
    return 'checked' in el && el.localName === 'input' ? !!el.checked : el.getAttribute('aria-checked') === 'true'; }
  case 'select': {
    const found = element(arg.ref); if (!found.el) return found.status;
    const el = found.el, want = arg.values, picked = new Set();
    for (const v of want) {
      let hit = -1;
      for (let i = 0; i < el.options.length && i < 10000; i++) if (el.options[i].value === v) { hit = i; break; }
      if (hit < 0) for (let i = 0; i < el.options.length && i < 10000; i++) if (squash(el.options[i].label || el.options[i].text, 4 * L.label) === squash(v, 4 * L.label)) { hit = i; break; }
      if (hit < 0 || el.options[hit].disabled) return 'missing';
      picked.add(hit);
    }
    if (!el.multiple && picked.size > 1) return 'single';
    for (let i = 0; i < el.options.length && i < 10000; i++) el.options[i].selected = picked.has(i);
    el.dispatchEvent(new Event('input', {bubbles: true}));
    el.dispatchEvent(new Event('change', {bubbles: true}));
    return 'ok';
  }
  case 'metrics': return [outerWidth, outerHeight, innerWidth, innerHeight, devicePixelRatio, document.readyState];
  case 'ready': return document.readyState;
  case 'visible': return document.visibilityState === 'visible';
  case 'focused': return document.hasFocus() === true;
  case 'digest': { const found = element(arg.ref); if (!found.el) return null; const el = found.el;
    const v = String(el.isContentEditable ? el.textContent : ('value' in el ? el.value : '')).slice(0, 1 << 20);
    let h = 0; for (let i = 0; i < v.length; i++) h = (Math.imul(h, 31) + v.charCodeAt(i)) | 0;
    return v.length + ':' + h; }
  case 'painted': return performance.getEntriesByType('paint').some(e => e.name === 'first-contentful-paint');
}
return null;
}""" % {"field_kind": FIELD_KIND_JS, "gate": GATE_FN_JS, "limits": json.dumps({"work": W.MAX_WORK_NODES, "text": W.MAX_READ_TEXT, "elements": W.MAX_READ_ELEMENTS,
                              "label": W.MAX_LABEL_BYTES, "value": W.MAX_VALUE_BYTES, "options": W.MAX_OPTIONS,
                              "reportOptions": W.MAX_REPORT_OPTIONS})}
"""The one script the agent runs in pages, called as ``(op, arg)`` in its isolated world."""

# -- keys for CDP Input.dispatchKeyEvent -------------------------------------------------------------
_MODIFIER_BITS = {"Alt": 1, "Control": 2, "Meta": 4, "Shift": 8}
_NAMED_KEYS: dict[str, tuple[str, str, int, str]] = {
    # name -> (key, code, windowsVirtualKeyCode, text)
    "enter": ("Enter", "Enter", 13, "\r"), "tab": ("Tab", "Tab", 9, ""), "escape": ("Escape", "Escape", 27, ""),
    "backspace": ("Backspace", "Backspace", 8, ""), "delete": ("Delete", "Delete", 46, ""),
    "insert": ("Insert", "Insert", 45, ""), "home": ("Home", "Home", 36, ""), "end": ("End", "End", 35, ""),
    "pageup": ("PageUp", "PageUp", 33, ""), "pagedown": ("PageDown", "PageDown", 34, ""),
    "arrowup": ("ArrowUp", "ArrowUp", 38, ""), "arrowdown": ("ArrowDown", "ArrowDown", 40, ""),
    "arrowleft": ("ArrowLeft", "ArrowLeft", 37, ""), "arrowright": ("ArrowRight", "ArrowRight", 39, ""),
    "space": (" ", "Space", 32, " "), "control": ("Control", "ControlLeft", 17, ""),
    "shift": ("Shift", "ShiftLeft", 16, ""), "alt": ("Alt", "AltLeft", 18, ""), "meta": ("Meta", "MetaLeft", 91, ""),
    **{f"f{n}": (f"F{n}", f"F{n}", 111 + n, "") for n in range(1, 13)},
}
_KEY_ALIASES = {"return": "enter", "esc": "escape", "del": "delete", "ctrl": "control", "cmd": "meta",
                "command": "meta", "super": "meta", "win": "meta", "option": "alt", "up": "arrowup",
                "down": "arrowdown", "left": "arrowleft", "right": "arrowright", "pgup": "pageup",
                "pgdn": "pagedown", " ": "space"}


_EDITING_WITH_CONTROL = frozenset({"a", "c", "x", "v", "z", "y", "Backspace", "Delete", "ArrowLeft", "ArrowRight",
                                   "ArrowUp", "ArrowDown", "Home", "End", "Enter"})
_EDITING_WITH_CONTROL_SHIFT = frozenset({"z", "v", "ArrowLeft", "ArrowRight", "ArrowUp", "ArrowDown", "Home", "End"})


def _digest(value: str) -> str:
    """The page script's ``digest`` of a field's ``value``: its length in UTF-16 code units, ``:``, and
    a 32-bit signed multiplicative hash of those units (as JavaScript's ``Math.imul(h, 31) + unit``)."""
    units = value.encode("utf-16-le")
    h = 0
    for i in range(0, len(units), 2):
        h = (h * 31 + int.from_bytes(units[i:i + 2], "little")) & 0xFFFFFFFF
    if h >= 1 << 31:
        h -= 1 << 32
    return f"{len(units) // 2}:{h}"


def chord_problem(keys: list[tuple[str, str, int, str]]) -> str | None:
    """Why chord ``keys`` (:func:`cdp_key` tuples) is refused, or None. Chromium takes key events sent
    over DevTools as typed ones, its own shortcuts too (Ctrl+T, Ctrl+W, Ctrl+H, Ctrl+U, F12, Alt+Home...:
    new windows, chrome:// and view-source pages, the home page, quitting), none of which the driver's
    URL policy sees. So a chord is the page's only when it holds no Alt or Meta, no function key, no
    Escape with a modifier (Shift+Escape: the task manager), and, with Control, is one editing shortcut
    (select all, copy, cut, paste, undo, redo, word moves and deletes, Ctrl+Enter); with Control and
    Shift, redo, paste as text or a selecting move."""
    held = {key for key, _code, _vk, _text in keys} & set(_MODIFIER_BITS)
    others = [key for key, _code, _vk, _text in keys if key not in _MODIFIER_BITS]
    if held & {"Alt", "Meta"}:
        return "a chord with Alt or Meta is a shortcut of the browser itself"
    if any(re.fullmatch(r"F[0-9]+", key) for key in others):
        return "function keys are shortcuts of the browser itself (F6, F11, F12...)"
    if "Escape" in others and held:
        return "Escape with a modifier is a shortcut of the browser itself (Shift+Escape: its task manager)"
    if "Control" not in held:
        return None
    allowed = _EDITING_WITH_CONTROL_SHIFT if "Shift" in held else _EDITING_WITH_CONTROL
    lowered = [key.lower() if len(key) == 1 else key for key in others]
    if len(lowered) == 1 and lowered[0] in allowed:
        return None
    return (f"with {'Control+Shift' if 'Shift' in held else 'Control'} only an editing shortcut is the page's "
            f"(one of {', '.join(sorted(allowed))}); the others are the browser's own (new tab, close, "
            "history, view source...)")


def cdp_key(name: str) -> tuple[str, str, int, str]:
    """``(key, code, windowsVirtualKeyCode, text)`` of a key name for ``Input.dispatchKeyEvent``: a
    DOM key name (``Enter``, ``ArrowLeft``, ``Control``, ``F5``; case-insensitive, with common
    aliases ``ctrl``, ``esc``, ``cmd``...) or one character. Raises ValueError for anything else."""
    lowered = name.lower()
    lowered = _KEY_ALIASES.get(lowered, lowered)
    if lowered in _NAMED_KEYS:
        return _NAMED_KEYS[lowered]
    if len(name) == 1 and name.isprintable():
        upper = name.upper()
        if "a" <= name.lower() <= "z":
            return name, f"Key{upper}", ord(upper), name
        if "0" <= name <= "9":
            return name, f"Digit{name}", ord(name), name
        return name, "", 0, name
    raise ValueError(f"unknown key {name[:64]!r}: use a DOM key name (Enter, Tab, ArrowLeft, Control, F5, ...) "
                     "or one character")


# -- state ---------------------------------------------------------------------------------------------
@dataclass
class _Tab:
    number: int
    target: str
    title: str = ""
    url: str = "about:blank"

    @property
    def id(self) -> str:
        return f"tab-{self.number}"


@dataclass
class _Doc:
    token: int
    target: str
    loader: str


@dataclass
class _Channel:
    """What the agent keeps of one chromium channel (a new one starts afresh)."""

    pipe: Pipe
    tabs: dict[str, _Tab] = field(default_factory=dict)
    order: list[str] = field(default_factory=list)
    active: str | None = None
    recent: list[str] = field(default_factory=list)
    next_tab: int = 1
    changes: deque = field(default_factory=lambda: deque(maxlen=W.MAX_CHANGES))
    dropped: int = 0
    sequence: int = 0
    enabled: set[str] = field(default_factory=set)
    worlds: dict[tuple[str, str, str], int] = field(default_factory=dict)
    docs: dict[int, _Doc] = field(default_factory=dict)
    doc_of: dict[tuple[str, str], int] = field(default_factory=dict)
    next_doc: int = 1
    closing: set[str] = field(default_factory=set)
    jobs: "queue.Queue[Callable[[], None]]" = field(default_factory=lambda: queue.Queue(MAX_PENDING_EVENTS))
    ready: threading.Event = field(default_factory=threading.Event)
    paused: "queue.SimpleQueue[dict[str, Any]]" = field(default_factory=queue.SimpleQueue)
    attached: "queue.SimpleQueue[dict[str, Any]]" = field(default_factory=queue.SimpleQueue)
    guarded: threading.Event = field(default_factory=threading.Event)
    submits: dict[str, Any] = field(default_factory=dict)


BROWSER_SHORTCUT_KEYSYMS: frozenset[int] = frozenset(
    (keynames.MODIFIER_KEYSYMS - {XK.string_to_keysym("Shift_L"), XK.string_to_keysym("Shift_R")})
    | {XK.string_to_keysym(f"F{n}") for n in range(1, 36)} | {XK.string_to_keysym("Menu")})
"""Keys ``hold_keys`` refuses: every modifier but Shift, F1-F35 and Menu. Held through the X input they
reach chromium's own window, whose shortcuts (Ctrl+L, Alt+D, F6 to the address bar, Ctrl+T...) would
let the model open what the driver's URL policy refuses."""


class BrowserTools:
    """The browser tools of the agent's chromium (module docstring). ``host``: the channel's owner;
    ``executor``: the X input for :data:`wire.browser_tools.XTEST_MEMBERS` (None: those members answer
    409 ``no_display``); ``load_timeout``: seconds ``navigate``/``new_tab`` wait for a load. Thread-safe:
    one call at a time reaches the browser (the sign-in's lock), ``state`` reads the agent's tables."""

    def __init__(self, host: BrowserHost, executor: Any = None, *, load_timeout: float = W.LOAD_TIMEOUT_S,
                 routes: ProxyRoutes | None = None) -> None:
        """``routes``: where chromium's direct routes are written as it is launched (:meth:`launching`);
        None: the file ``$AGENT_BROWSER_POLICY`` names, or none."""
        self.host, self.executor, self.load_timeout = host, executor, load_timeout
        self.routes = routes if routes is not None else ProxyRoutes.from_env()
        self._lock = threading.RLock()
        self._setup = threading.Lock()
        self._enabling = threading.Lock()
        self._ch: _Channel | None = None
        self._rule = W.GuestUrlRule()
        self._launched: tuple[str, ...] = ()
        self._to_open: list[str] = []
        host.on_channel(self._new_channel)

    # -- the URL rule ----------------------------------------------------------------------------------
    def set_rule(self, rule: W.GuestUrlRule) -> None:
        """``PUT /v1/browser/rule``: judge chromium's requests by ``rule`` from now on (with the origins
        chromium was launched with); tabs showing a page it refuses load it again (and so get the
        refusal page)."""
        with self._lock:
            self._rule = rule
            ch = self._ch
        if ch is not None and ch.guarded.is_set():
            self._job(ch, lambda: self._sweep(ch))

    def launching(self, args: list[str]) -> None:
        """The arguments chromium is about to be launched with: the guest-local http(s) origins among
        them may be loaded (contract 9: a loopback origin the task's launch opens). With :attr:`routes`,
        chromium's direct routes are written for the rule's local origins and these
        (:mod:`guest.chromium_policy`). Raises LaunchError (400 ``launch_failed``) when they cannot be:
        chromium is then not started."""
        found, addresses = [], []
        for arg in args:
            try:
                parts = urlsplit(arg)
                if parts.scheme.lower() in ("http", "https") and parts.hostname:
                    addresses.append(arg)
                origin = f"{parts.scheme.lower()}://{parts.netloc.rsplit('@', 1)[-1]}"
                if parts.scheme.lower() in ("http", "https") and parts.hostname and W.guest_local(parts.hostname):
                    W.GuestUrlRule(local_origins=[origin])
                    found.append(origin)
            except ValueError:
                continue
        with self._lock:
            self._launched = tuple(dict.fromkeys((*self._launched, *found)))[:W.MAX_RULE_ENTRIES]
            self._to_open = addresses[:W.MAX_TABS]
            direct = self._rule.direct_hosts(self._launched)
        if self.routes is not None:
            try:
                self.routes.write(direct)
            except OSError as exc:
                raise LaunchError(400, "launch_failed", "cannot start the agent's chromium: its proxy routes "
                                  f"cannot be written ({exc.strerror or exc})"[:400]) from None

    def refusal(self, url: str) -> str | None:
        """Why the rule refuses ``url`` (a ``wire.browser_tools.REFUSED_*`` reason), or None."""
        with self._lock:
            rule, launched = self._rule, self._launched
        return rule.refusal(url, launched)

    # -- the channel -----------------------------------------------------------------------------------
    def _new_channel(self, pipe: Pipe) -> None:
        """``BrowserHost`` callback for a new channel: its request guard at once (a thread of its own:
        every request chromium makes waits for the guard's answer, :meth:`_guard`), then the rest of the
        set-up on another thread (the launch request that handed the pipe over must not wait for the
        browser), tried again while the browser is too busy to answer (at most :data:`SETUP_WAIT_S`),
        then the addresses it was launched with made sure of (:meth:`_open_launched`)."""
        self._state_of(pipe)
        with self._lock:
            addresses, self._to_open = self._to_open, []
        threading.Thread(target=self._set_up, args=(pipe, addresses), name="browser-tools-setup", daemon=True).start()

    def _set_up(self, pipe: Pipe, addresses: list[str]) -> None:
        ready: list[_Channel] = []

        def attempt() -> bool:
            if pipe.closed is not None:
                return True
            try:
                ready.append(self._ensure(pipe))
                return True
            except (ChannelError, BrowserError):
                return False  # a busy browser (its answers late) or one still without a page: once more
        wait_until(attempt, SETUP_WAIT_S, interval=0.5)
        if ready and addresses:
            try:
                self._open_launched(ready[0], addresses)
            except ChannelClosed:
                pass  # the browser went
            except (ChannelError, BrowserError) as exc:
                _log.warning("the addresses the agent's chromium was launched with could not be opened (%s)",
                             str(exc)[:200])
            except Exception as exc:  # noqa: BLE001 - the thread ends said, never with an address in a traceback
                _log.warning("the addresses the agent's chromium was launched with could not be opened (%s)",
                             type(exc).__name__)

    def _open_launched(self, ch: _Channel, addresses: list[str]) -> None:
        """Make sure a browser launched with ``addresses`` (http(s) URLs) shows something: a browser
        starting while the machine is loaded may leave its first tab blank (``about:blank``, no load
        under way) instead of opening them. When, :data:`STARTUP_OPEN_GRACE_S` after its set-up, no
        page shows a document of its own, the first address is opened in the blank tab (a new tab when
        there is none) as ``navigate`` opens it: under the URL rule and the input gate, one user of the
        browser at a time, waiting for its load at most the load timeout; each other one (at most
        :data:`wire.browser_tools.MAX_TABS` in all) in a background tab, not waited for. Addresses the
        agent does not load (:func:`navigable`; over ``MAX_URL_CHARS``) are left out."""
        def shows_a_document() -> bool:
            try:
                return any(t.get("url") and not str(t["url"]).startswith(("about:", "chrome:", "chrome-untrusted:"))
                           for t in self._targets(ch.pipe))
            except ChannelClosed:
                raise
            except ChannelError:
                return False  # a busy browser: asked again

        if wait_until(shows_a_document, STARTUP_OPEN_GRACE_S, interval=0.2):
            return
        if not self.host._busy.acquire(timeout=BUSY_WAIT_S):
            raise BrowserError(409, "busy", f"the browser stayed busy for {BUSY_WAIT_S:g} s")
        try:
            if shows_a_document():  # a call came first and opened something
                return
            _log.warning("the agent's chromium opened none of the %d address(es) it was launched with: the "
                         "agent opens them", len(addresses))
            blank = next((t for t in self._targets(ch.pipe) if t.get("url") in ("", "about:blank")), None)
            with self._lock:
                tab = self._add_tab(ch, blank, record=False) if blank is not None else None
            usable = [a for a in addresses if navigable(a) and len(a) <= W.MAX_URL_CHARS]
            if tab is None and usable:
                target = str(ch.pipe.call("Target.createTarget", {"url": "about:blank"},
                                          timeout=SCRIPT_TIMEOUT_S)["targetId"])
                with self._lock:
                    tab = self._add_tab(ch, {"targetId": target, "url": "about:blank"}, record=True)
            if tab is not None and usable:
                self._load(ch, tab, usable.pop(0))
            for address in usable:  # in the background: the first stays in front, nothing waits for these
                ch.pipe.call("Target.createTarget", {"url": address, "background": True}, timeout=SCRIPT_TIMEOUT_S)
        finally:
            self.host._busy.release()

    def _state_of(self, pipe: Pipe) -> _Channel:
        """The state of ``pipe``'s channel, made (with its event listener, its worker and its request
        guard) the first time; a new channel replaces the old one's state."""
        with self._lock:
            ch = self._ch
            if ch is None or ch.pipe is not pipe:
                ch = self._ch = _Channel(pipe)
                pipe.add_listener(lambda m, p, s, ch=ch: self._on_event(ch, m, p, s))
                threading.Thread(target=self._work, args=(ch,), name="browser-tools-events", daemon=True).start()
                threading.Thread(target=self._guard, args=(ch,), name="browser-tools-guard", daemon=True).start()
                threading.Thread(target=self._adopt, args=(ch,), name="browser-tools-attach", daemon=True).start()
            return ch

    def _ensure(self, pipe: Pipe) -> _Channel:
        """The state of ``pipe``'s channel, set up the first time: target discovery, downloads denied,
        every page attached with its Page events on."""
        with self._setup:
            ch = self._state_of(pipe)
            if ch.ready.is_set():
                return ch
            if not ch.guarded.wait(GUARD_WAIT_S):
                raise BrowserError(502, "browser_error", "the browser's requests are not guarded yet "
                                                         "(its DevTools Fetch interception is not on)")
            pipe.call("Target.setDiscoverTargets", {"discover": True}, timeout=SCRIPT_TIMEOUT_S)
            try:
                pipe.call("Browser.setDownloadBehavior", {"behavior": "deny", "eventsEnabled": True},
                          timeout=SCRIPT_TIMEOUT_S)
            except ChannelError:
                pass
            infos = self._targets(pipe)
            first = None
            try:
                session = self.host._active_page(pipe)
                with self.host._state:
                    first = next((t for t, s in self.host._sessions.items() if s == session), None)
            except BrowserError:
                pass
            with self._lock:
                for info in infos:
                    self._add_tab(ch, info, record=False)
                if first in ch.tabs and ch.active is None:
                    self._set_active(ch, first, record=False)
                elif ch.active is None and ch.order:
                    self._set_active(ch, ch.order[0], record=False)
            for info in infos:
                self._enable(ch, str(info["targetId"]))
            ch.ready.set()
            return ch

    def _channel(self) -> _Channel:
        try:
            return self._ensure(self.host._channel())
        except ChannelError as exc:
            raise _as_browser_error(exc) from None

    def _work(self, ch: _Channel) -> None:
        """Handle page events that need commands (dialogs, new tabs), one after another, off the
        channel's reader thread (a listener must not wait for an answer)."""
        while ch.pipe.closed is None:
            try:
                job = ch.jobs.get(timeout=1.0)
            except queue.Empty:
                continue
            try:
                job()
            except (ChannelError, BrowserError, KeyError):
                pass

    def _job(self, ch: _Channel, job: Callable[[], None]) -> None:
        try:
            ch.jobs.put_nowait(job)
        except queue.Full:
            pass

    @staticmethod
    def _targets(pipe: Pipe) -> list[dict[str, Any]]:
        infos = pipe.call("Target.getTargets", timeout=SCRIPT_TIMEOUT_S).get("targetInfos", [])
        return [t for t in infos if isinstance(t, dict) and t.get("type") == "page" and not t.get("subtype")
                and isinstance(t.get("targetId"), str) and not str(t.get("url", "")).startswith("devtools:")]

    def _enable(self, ch: _Channel, target: str, *, resume: str | None = None,
                timeout: float = SCRIPT_TIMEOUT_S) -> None:
        """Attach to a page, turn its Page events on (dialogs, navigations) and register the input gate
        for its new documents (:data:`GATE_JS`), once per target. With ``resume`` (the session of a tab
        waiting for the agent before its first document, whose renderer answers nothing until it runs;
        the session chromium attached it with, the one that may let it run) the commands are
        sent, then ``Runtime.runIfWaitingForDebugger``, and only then are their answers read: the browser
        handles one session's commands in order, so the gate is registered before the tab's first
        document runs. Each answer is waited for at most ``timeout`` s. Raises ChannelError
        (CommandTimeout: a busy browser) or BrowserError."""
        with self._enabling:
            session = resume or self.host._attach(ch.pipe, target)
            sent = []
            if target not in ch.enabled:
                sent += [ch.pipe.send("Page.enable", session_id=session),
                         ch.pipe.send("Page.addScriptToEvaluateOnNewDocument",
                                      {"source": GATE_JS, "worldName": WORLD, "runImmediately": True},
                                      session_id=session)]
            if resume:
                sent.append(ch.pipe.send("Runtime.runIfWaitingForDebugger", session_id=session))
            failure: ChannelError | None = None
            for pending in sent:  # every answer read, so none is left waiting
                try:
                    pending.result(timeout)
                except ChannelError as exc:
                    failure = failure or exc
            if failure is not None:
                raise failure
            ch.enabled.add(target)

    # -- the request guard (contract 9) ----------------------------------------------------------------------
    def _guard(self, ch: _Channel) -> None:
        """Judge every request chromium makes, browser-wide (every tab, frame and worker, each hop of a
        redirect; DevTools ``Fetch`` interception on the browser's own session), by :meth:`refusal`: a
        refused document (a navigation, a frame) gets the refusal page (:meth:`_refuse`), any other
        refused request fails (``BlockedByClient``) before it leaves chromium; the rest continue. A
        browser that refuses the interception is closed: it never runs unguarded."""
        while ch.pipe.closed is None:
            try:
                ch.pipe.call("Fetch.enable", {"patterns": [{"urlPattern": "*", "requestStage": "Request"}]},
                             timeout=SCRIPT_TIMEOUT_S)
                break
            except CommandTimeout:
                continue  # a browser still starting: its answer comes once it reads the pipe
            except ChannelClosed:
                return
            except ChannelError as exc:
                _log.error("closing the agent's chromium: its requests cannot be guarded (%s)", str(exc)[:200])
                ch.pipe.close()
                return
        # every new tab waits for the agent before its first document: its gate comes first (_adopt)
        while ch.pipe.closed is None:
            try:
                ch.pipe.call("Target.setAutoAttach", {
                    "autoAttach": True, "waitForDebuggerOnStart": True, "flatten": True,
                    "filter": [{"type": "page", "exclude": False}, {"exclude": True}]}, timeout=SCRIPT_TIMEOUT_S)
                break
            except CommandTimeout:
                continue  # a busy browser: its answer comes once it reads the pipe
            except ChannelClosed:
                return
            except ChannelError as exc:
                _log.error("closing the agent's chromium: its new tabs cannot be held for the input gate (%s)",
                           str(exc)[:200])
                ch.pipe.close()
                return
        ch.guarded.set()
        self._job(ch, lambda: self._sweep(ch))
        while ch.pipe.closed is None:
            try:
                params = ch.paused.get(timeout=1.0)
            except queue.Empty:
                continue
            try:
                self._decide(ch, params)
            except ChannelClosed:
                return
            except (ChannelError, BrowserError):
                pass  # the request went meanwhile (a closed tab, a stopped load)

    def _adopt(self, ch: _Channel) -> None:
        """Take each tab chromium attaches the agent to as it opens (``Target.setAutoAttach``, waiting for
        the agent): its session becomes the agent's session of that tab, its Page events and input gate
        are set up (:meth:`_enable`, within :data:`ADOPT_TIMEOUT_S`), then it runs. A tab whose gate could not be set up is closed, never run without it."""
        while ch.pipe.closed is None:
            try:
                params = ch.attached.get(timeout=1.0)
            except queue.Empty:
                continue
            session = str(params.get("sessionId", ""))
            info = params.get("targetInfo") if isinstance(params.get("targetInfo"), dict) else {}
            target = str(info.get("targetId", ""))
            waiting = bool(params.get("waitingForDebugger"))
            if info.get("type") != "page" or not target:
                if waiting:
                    self._resume(ch, session)
                continue
            with self.host._state:
                if waiting:  # the one session that answers while the tab waits
                    self.host._sessions[target] = session
                else:
                    self.host._sessions.setdefault(target, session)
            try:
                self._enable(ch, target, resume=session if waiting else None,
                             timeout=ADOPT_TIMEOUT_S if waiting else SCRIPT_TIMEOUT_S)
            except ChannelClosed:
                return
            except (ChannelError, BrowserError) as exc:
                if waiting:
                    _log.warning("closing a new tab: its input gate could not be set up (%s)", str(exc)[:200])
                    self._close_target(ch, target)
                # a tab already running is set up again where it is next used

    def _resume(self, ch: _Channel, session: str) -> None:
        try:
            ch.pipe.call("Runtime.runIfWaitingForDebugger", session_id=session, timeout=SCRIPT_TIMEOUT_S)
        except ChannelError:
            pass

    def _close_target(self, ch: _Channel, target: str) -> None:
        try:
            ch.pipe.call("Target.closeTarget", {"targetId": target}, timeout=SCRIPT_TIMEOUT_S)
        except ChannelError:
            pass

    def _decide(self, ch: _Channel, params: dict[str, Any]) -> None:
        """Answer one ``Fetch.requestPaused``."""
        request = params.get("request") if isinstance(params.get("request"), dict) else {}
        ident, url = str(params.get("requestId", "")), _text(request.get("url"))
        document = params.get("resourceType") == "Document"
        frame = str(params.get("frameId", ""))
        why = self._signin_refusal(ch, params, request, url) or self.refusal(url)
        if why is None:
            ch.pipe.call("Fetch.continueRequest", {"requestId": ident}, timeout=SCRIPT_TIMEOUT_S)
        elif document:
            self._refuse(ch, ident, url, why)
            with self._lock:
                tab = ch.tabs.get(frame)
                if tab is not None:
                    self._record(ch, "navigation_refused", tab.id, reason="policy")
        else:
            ch.pipe.call("Fetch.failRequest", {"requestId": ident, "errorReason": "BlockedByClient"},
                         timeout=SCRIPT_TIMEOUT_S)

    def _signin_refusal(self, ch: _Channel, params: dict[str, Any], request: dict[str, Any], url: str) -> str | None:
        """The sign-in's submit (contract 8): a POST to the credential origin made while a fill submits
        (:meth:`guest.browser.BrowserHost.submit_watch`) is followed through its redirect hops (each hop is
        paused again, naming the one before: ``redirectedRequestId``); a hop that would send its body on
        to another origin (307, 308) is refused (:data:`wire.browser_tools.REFUSED_SIGNIN_REDIRECT`) and
        its origin noted in the fill's watch. A hop that made it a GET (301, 302, 303) carries no body: it
        is followed no further."""
        ident, previous = str(params.get("requestId", "")), params.get("redirectedRequestId")
        post = str(request.get("method", "")).upper() == "POST"
        current = self.host.submit_watch() if previous is None and post else None
        with self._lock:
            watch = ch.submits.pop(previous, None) if isinstance(previous, str) else None
            if watch is None:
                if current is None or not _same_origin(url, current.origin):
                    return None
                watch = current
            elif not post:
                return None
            elif not _same_origin(url, watch.origin):
                watch.note(url)
                return W.REFUSED_SIGNIN_REDIRECT
            ch.submits[ident] = watch
            while len(ch.submits) > MAX_FOLLOWED_SUBMITS:
                ch.submits.pop(next(iter(ch.submits)))
        return None

    def _refuse(self, ch: _Channel, ident: str, url: str, why: str) -> None:
        """Answer a refused document request with :data:`REFUSAL_PAGE` (403; a sandboxed document with
        no script and an opaque origin): the tab shows why, escaped, never the refused page."""
        body = REFUSAL_PAGE.format(reason=html.escape(why), url=html.escape(shown_url(url)))
        headers = [{"name": "Content-Type", "value": "text/html; charset=utf-8"},
                   {"name": "Content-Security-Policy", "value": "sandbox; default-src 'none'"},
                   {"name": "Cache-Control", "value": "no-store"}]
        ch.pipe.call("Fetch.fulfillRequest", {"requestId": ident, "responseCode": 403, "responseHeaders": headers,
                                              "body": base64.b64encode(body.encode()).decode()},
                     timeout=SCRIPT_TIMEOUT_S)

    def _sweep(self, ch: _Channel) -> None:
        """Load again every tab that shows a URL the rule refuses (a page loaded before the guard was
        on, or before a narrower rule): it then shows the refusal page."""
        for info in self._targets(ch.pipe):
            url = str(info.get("url", ""))
            if url and self.refusal(url) is not None:
                session = self.host._attach(ch.pipe, str(info["targetId"]))
                ch.pipe.call("Page.navigate", {"url": url}, session_id=session, timeout=self.load_timeout)

    # -- events (reader thread: no commands here) ------------------------------------------------------------
    def _record(self, ch: _Channel, change: str, tab: str | None, **extra: Any) -> None:
        """Append a change of type ``change`` for tab id ``tab`` (the oldest dropped past the cap)."""
        if len(ch.changes) == ch.changes.maxlen:
            ch.dropped += 1
        ch.sequence += 1
        ch.changes.append(W.Change(type=change, sequence=ch.sequence, tab_id=tab, **extra))

    def _add_tab(self, ch: _Channel, info: dict[str, Any], *, record: bool) -> _Tab | None:
        target = str(info.get("targetId"))
        tab = ch.tabs.get(target)
        if tab is None:
            if target in ch.closing:
                return None
            tab = ch.tabs[target] = _Tab(ch.next_tab, target)
            ch.next_tab += 1
            ch.order.append(target)
            if record:
                self._record(ch, "tab_opened", tab.id)
        tab.title, tab.url = _text(info.get("title"))[:4 * W.MAX_TITLE_BYTES], _text(info.get("url"))[:W.MAX_URL_CHARS + 1]
        return tab

    def _drop_tab(self, ch: _Channel, target: str) -> None:
        tab = ch.tabs.pop(target, None)
        if tab is None:
            return
        ch.order.remove(target)
        ch.enabled.discard(target)
        ch.recent = [t for t in ch.recent if t != target]
        for key in [k for k in ch.worlds if k[0] == target]:
            del ch.worlds[key]
        self._record(ch, "tab_closed", tab.id)
        if ch.active == target:
            ch.active = None
            following = ch.recent[-1] if ch.recent else (ch.order[-1] if ch.order else None)
            if following is not None:
                self._set_active(ch, following, record=True)

    def _set_active(self, ch: _Channel, target: str, *, record: bool) -> None:
        if ch.active == target:
            return
        ch.active = target
        ch.recent = [t for t in ch.recent if t != target][-50:] + [target]
        if record:
            self._record(ch, "tab_switched", ch.tabs[target].id)

    def _on_event(self, ch: _Channel, method: str, params: dict[str, Any], session: str | None) -> None:
        with self._lock:
            if self._ch is not ch:
                return
            if method == "Target.targetCreated" or method == "Target.targetInfoChanged":
                info = params.get("targetInfo")
                if not isinstance(info, dict) or info.get("type") != "page" or info.get("subtype"):
                    return
                if str(info.get("url", "")).startswith("devtools:"):
                    return
                known = str(info.get("targetId")) in ch.tabs
                tab = self._add_tab(ch, info, record=ch.ready.is_set())
                if tab is not None and not known:
                    if info.get("openerId") and ch.ready.is_set():
                        self._set_active(ch, tab.target, record=False)
                    self._job(ch, lambda t=tab.target: self._enable(ch, t))
            elif method == "Target.targetDestroyed":
                self._drop_tab(ch, str(params.get("targetId")))
            elif method == "Page.javascriptDialogOpening" and session is not None:
                target = self._target_of(session)
                kind = str(params.get("type"))
                kind = kind if kind in ("alert", "confirm", "prompt", "beforeunload") else "other"
                if target in ch.tabs:
                    self._record(ch, "dialog_dismissed", ch.tabs[target].id, kind=kind)
                self._job(ch, lambda s=session, k=kind: ch.pipe.call(
                    "Page.handleJavaScriptDialog", {"accept": k == "beforeunload"}, session_id=s,
                    timeout=SCRIPT_TIMEOUT_S))
            elif method == "Page.frameNavigated" and session is not None:
                frame = params.get("frame")
                if isinstance(frame, dict) and not frame.get("parentId") and params.get("type", "Navigation") == "Navigation":
                    target = self._target_of(session)
                    if target in ch.tabs:
                        self._record(ch, "navigation", ch.tabs[target].id)
            elif method == "Fetch.requestPaused" and session is None:
                ch.paused.put(params)
            elif method == "Target.attachedToTarget" and session is None:
                ch.attached.put(params)
            elif method == "Browser.downloadWillBegin":
                frame = str(params.get("frameId", ""))
                tab = ch.tabs.get(frame)
                if tab is None:
                    tab = ch.tabs.get(ch.active or "")
                self._record(ch, "download", tab.id if tab else None, status="blocked")

    def _target_of(self, session: str) -> str | None:
        with self.host._state:
            return next((t for t, s in self.host._sessions.items() if s == session), None)

    # -- state -------------------------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        """``GET /v1/browser/state``: :class:`wire.browser_tools.BrowserStateV1` as JSON (tabs synced
        with the browser's own list first). Raises BrowserError 409 ``no_browser``, 504, 502."""
        ch = self._channel()
        try:
            infos = self._targets(ch.pipe)
        except ChannelError as exc:
            raise _as_browser_error(exc) from None
        with self._lock:
            seen = set()
            for info in infos:
                seen.add(str(info["targetId"]))
                if str(info["targetId"]) not in ch.tabs:
                    self._job(ch, lambda t=str(info["targetId"]): self._enable(ch, t))
                self._add_tab(ch, info, record=True)
            for target in [t for t in ch.tabs if t not in seen]:
                self._drop_tab(ch, target)
            if ch.active not in ch.tabs and ch.order:
                self._set_active(ch, ch.order[-1], record=True)
            shown = ch.order[:W.MAX_TABS]
            if ch.active is not None and ch.active not in shown:
                shown = shown[:W.MAX_TABS - 1] + [ch.active]
            truncated = False
            tabs = []
            for target in shown:
                tab = ch.tabs[target]
                title = W.cut_utf8(tab.title, W.MAX_TITLE_BYTES)
                truncated |= title != tab.title
                tabs.append(W.Tab(id=tab.id, title=title, url=W.reportable_url(tab.url), active=target == ch.active))
            observation = W.Observation(sequence=ch.sequence, dropped_changes=ch.dropped,
                                        title_truncated=truncated, changes=list(ch.changes))
        return W.BrowserStateV1(tabs=tabs, observation=observation).wire()

    # -- calls -------------------------------------------------------------------------------------------
    def call(self, request: BrowserCall) -> BrowserCallResult:
        """``POST /v1/browser/call``: run one member. Raises BrowserError: 422 refusals
        (:data:`wire.browser_tools.REFUSAL_CODES`), 400 ``invalid_request`` (an unknown key name),
        409 ``no_browser`` / ``no_page`` / ``busy`` / ``no_display``, 504 ``browser_timeout``, 502
        ``channel_closed`` / ``browser_error``; ActionError from the X input."""
        if not self.host._busy.acquire(timeout=BUSY_WAIT_S):
            raise BrowserError(409, "busy", f"the browser stayed busy for {BUSY_WAIT_S:g} s")
        try:
            ch = self._channel()
            try:
                return getattr(self, "_do_" + request.member)(ch, request.args)
            except ChannelError as exc:
                raise _as_browser_error(exc) from None
        finally:
            self.host._busy.release()

    def _tab(self, ch: _Channel, tab_id: str | None) -> _Tab:
        with self._lock:
            if tab_id is None:
                if ch.active is None:
                    raise BrowserError(409, "no_page", "the agent's chromium shows no tab")
                return ch.tabs[ch.active]
            for tab in ch.tabs.values():
                if tab.id == tab_id:
                    return tab
        raise refuse("unknown_tab", f"no tab {tab_id[:40]!r}; the state lists the tabs")

    def _session(self, ch: _Channel, tab: _Tab) -> str:
        self._enable(ch, tab.target)
        return self.host._attach(ch.pipe, tab.target)

    def _main_frame(self, ch: _Channel, session: str, timeout: float = SCRIPT_TIMEOUT_S) -> dict[str, Any]:
        frame = ch.pipe.call("Page.getFrameTree", session_id=session, timeout=timeout).get("frameTree", {}).get("frame", {})
        return frame if isinstance(frame, dict) else {}

    def _script(self, ch: _Channel, tab: _Tab, op: str, arg: dict[str, Any], *, timeout: float = SCRIPT_TIMEOUT_S,
                loader: str | None = None) -> Any:
        """Run :data:`PAGE_JS` ``(op, arg)`` in this agent's world of the tab's current document (only
        that of ``loader`` when given: else ``stale_ref``). Adds ``arg["prefix"]``, the document's ref prefix."""
        session = self._session(ch, tab)
        for _attempt in range(2):
            frame = self._main_frame(ch, session, timeout)
            frame_id, current = str(frame.get("id", "")), str(frame.get("loaderId", ""))
            if loader is not None and current != loader:
                raise refuse("stale_ref", "the ref belongs to a document this tab no longer shows; read the page again")
            key = (tab.target, frame_id, current)
            with self._lock:
                context = ch.worlds.get(key)
                token = ch.doc_of.get((tab.target, current))
                if token is None:
                    token = ch.doc_of[(tab.target, current)] = ch.next_doc
                    ch.docs[token] = _Doc(token, tab.target, current)
                    ch.next_doc += 1
            if context is None:
                context = int(ch.pipe.call("Page.createIsolatedWorld", {"frameId": frame_id, "worldName": WORLD,
                                                                         "grantUniveralAccess": False},
                                           session_id=session, timeout=timeout)["executionContextId"])
                with self._lock:
                    ch.worlds[key] = context
            try:
                answer = ch.pipe.call("Runtime.callFunctionOn", {
                    "functionDeclaration": PAGE_JS, "executionContextId": context, "returnByValue": True,
                    "arguments": [{"value": op}, {"value": {**arg, "prefix": f"d{token}"}}]},
                    session_id=session, timeout=timeout)
            except CommandFailed:
                with self._lock:
                    ch.worlds.pop(key, None)  # the document went between the frame tree and the call
                continue
            if "exceptionDetails" in answer:
                raise BrowserError(502, "page_script_failed", "the agent's script failed in the page")
            return answer.get("result", {}).get("value")
        raise refuse("stale_ref", "the page changed its document while it was read; read the page again")

    def _result(self, ch: _Channel, tab: _Tab | None, result: Any = None, target: dict[str, Any] | None = None) -> BrowserCallResult:
        return BrowserCallResult(result=result, target=W.Box(**target) if target else None,
                                 viewport=self._viewport_box(ch, tab) if tab is not None else None)

    # -- viewport ------------------------------------------------------------------------------------------
    def viewport_on_screen(self, ch: _Channel, tab: _Tab) -> tuple[float, float, float, int, int]:
        """Where the tab's viewport is on the screen: ``(left, top, scale, css_width, css_height)``:
        screen px of its top left corner, screen px per CSS px, and its size in CSS px. From the
        browser's own window bounds (``Browser.getWindowForTarget``) and the window's outer and inner
        sizes read in the isolated world (the frame is the difference: borders even on both sides,
        the tab strip and toolbar above). Raises ChannelError, BrowserError."""
        bounds = ch.pipe.call("Browser.getWindowForTarget", {"targetId": tab.target}, timeout=SHORT_TIMEOUT_S)["bounds"]
        metrics = self._script(ch, tab, "metrics", {}, timeout=SHORT_TIMEOUT_S)
        if not (isinstance(metrics, list) and len(metrics) >= 5 and all(isinstance(v, (int, float)) for v in metrics[:5])):
            raise BrowserError(502, "browser_error", "the page's window metrics are unreadable")
        outer_w, outer_h, inner_w, inner_h, scale = metrics[:5]
        scale = float(scale) if scale > 0 else 1.0
        border = max(0.0, (outer_w - inner_w * scale) / 2)
        left = float(bounds.get("left", 0)) + border
        top = float(bounds.get("top", 0)) + max(0.0, outer_h - inner_h * scale - border)
        return left, top, scale, int(inner_w), int(inner_h)

    def _viewport_box(self, ch: _Channel, tab: _Tab) -> W.ScreenBox | None:
        try:
            left, top, scale, width, height = self.viewport_on_screen(ch, tab)
        except (ChannelError, BrowserError, KeyError, TypeError, ValueError):
            return None
        return W.ScreenBox(x=round(left), y=round(top), width=round(width * scale), height=round(height * scale))

    # -- reads ---------------------------------------------------------------------------------------------
    def _read(self, ch: _Channel, tab: _Tab, mode: str, query: str | None) -> W.ReadReport:
        raw = self._script(ch, tab, "read", {"mode": mode, "query": query})
        if not isinstance(raw, dict):
            raise BrowserError(502, "browser_error", "the read answered nothing")
        omitted = [o for o in raw.get("omitted", []) if o in W.Omission.__args__]  # type: ignore[attr-defined]
        elements = []
        for item in raw.get("elements", [])[:W.MAX_READ_ELEMENTS]:
            if not isinstance(item, dict) or item.get("role") not in W.ReadRole.__args__:  # type: ignore[attr-defined]
                continue
            label = _text(item.get("label")) or "unlabelled"
            if W.utf8_len(label) > W.MAX_LABEL_BYTES:
                label = W.cut_utf8(label, W.MAX_LABEL_BYTES)
                omitted.append("name_limit")
            element: dict[str, Any] = {"ref": _text(item.get("ref")), "role": item["role"], "label": label}
            if isinstance(item.get("value"), str):
                value = _text(item["value"])
                if W.utf8_len(value) > W.MAX_VALUE_BYTES:
                    omitted.append("value")
                else:
                    element["value"] = value
            if item["role"] in ("checkbox", "radio") and isinstance(item.get("checked"), bool):
                element["checked"] = item["checked"]
            if isinstance(item.get("options"), list):
                options = []
                for option in item["options"][:W.MAX_OPTIONS]:
                    if not isinstance(option, dict):
                        continue
                    olabel, ovalue = _text(option.get("label")) or "unlabelled option", _text(option.get("value"))
                    if W.utf8_len(olabel) > W.MAX_LABEL_BYTES:
                        olabel = W.cut_utf8(olabel, W.MAX_LABEL_BYTES)
                        omitted.append("name_limit")
                    if W.utf8_len(ovalue) > W.MAX_VALUE_BYTES:
                        omitted.append("value")
                        continue
                    entry: dict[str, Any] = {"label": olabel, "value": ovalue}
                    if item["role"] == "listbox" and isinstance(option.get("selected"), bool):
                        entry["selected"] = option["selected"]
                    options.append(entry)
                element["options"] = options
            elements.append(element)
        text = _text(raw.get("text"))
        if len(text) > W.MAX_READ_TEXT:
            text = text[:W.MAX_READ_TEXT]
            omitted.append("text_limit")
        return W.ReadReport(text=text, elements=elements, omitted=list(dict.fromkeys(omitted)))

    def _do_read_page(self, ch: _Channel, args: W.ReadPageArgs) -> BrowserCallResult:
        tab = self._tab(ch, args.tab_id)
        return self._result(ch, tab, self._read(ch, tab, args.filter, None))

    def _do_get_page_text(self, ch: _Channel, args: W.GetPageTextArgs) -> BrowserCallResult:
        tab = self._tab(ch, args.tab_id)
        report = self._read(ch, tab, "all", None)
        omitted = [o for o in report.omitted if o in ("text_limit", "work_limit", "frame_limit")]
        return self._result(ch, tab, W.ReadReport(text=report.text, elements=[], omitted=omitted))

    def _do_find(self, ch: _Channel, args: W.FindArgs) -> BrowserCallResult:
        tab = self._tab(ch, args.tab_id)
        query = W.normalise_space(args.query).lower()
        report = self._read(ch, tab, "all", query)
        lines = [line.strip() for line in report.text.split("\n") if query in " ".join(line.split()).lower()]
        return self._result(ch, tab, W.ReadReport(text="\n".join(lines)[:W.MAX_READ_TEXT], elements=report.elements,
                                                  omitted=report.omitted))

    def _do_wait_for(self, ch: _Channel, args: W.WaitForArgs) -> BrowserCallResult:
        tab = self._tab(ch, args.tab_id)
        want = W.normalise_space(args.text)

        def there() -> bool:
            try:
                text = self._script(ch, tab, "text", {}, timeout=SHORT_TIMEOUT_S)
            except ChannelClosed:
                raise
            except (ChannelError, BrowserError):
                return False
            return isinstance(text, str) and want in W.normalise_space(text)
        if not wait_until(there, args.timeout_ms / 1000, interval=0.1):
            raise refuse("wait_timeout", f"the text did not appear within {args.timeout_ms} ms")
        return self._result(ch, tab)

    # -- element actions -------------------------------------------------------------------------------------
    def _element(self, ch: _Channel, tab: _Tab, ref: str, need: str, *,
                 arm: bool = False) -> tuple[dict[str, Any], str]:
        """Check ``ref`` is this tab's current document's and its element can take ``need`` (``any``,
        ``hover``, ``click``, ``textbox``, ``select``, ``check``), scrolled into view; returns the
        prepare answer (``box`` in viewport CSS px) and the document's loader id. ``arm``: in the same
        script, arm the tab's input gate for the element (:meth:`_gated`)."""
        match = _REF.match(ref)
        with self._lock:
            doc = ch.docs.get(int(match[1])) if match else None
        if doc is None:
            raise refuse("stale_ref", "unknown ref; use a ref from the latest read_page or find")
        if doc.target != tab.target:
            raise refuse("stale_ref", "the ref belongs to another tab")
        answer = self._script(ch, tab, "arm" if arm else "prepare", {"ref": ref, "need": need, "ms": int(ARM_S * 1000)},
                              loader=doc.loader)
        status = answer.get("status") if isinstance(answer, dict) else None
        messages = {
            "stale": ("stale_ref", "unknown ref; use a ref from the latest read_page or find"),
            "gone": ("stale_ref", "the element is no longer on the page; read the page again"),
            "kind": ("not_actionable", f"the element is not what {need} needs"),
            "hidden": ("not_actionable", "the element is not visible"),
            "disabled": ("not_actionable", "the element is disabled"),
            "readonly": ("not_actionable", "the element takes no typed text (read-only, or not editable)"),
            "outside": ("not_actionable", "the element cannot be scrolled into the viewport"),
            "covered": ("not_actionable", "another element covers the element's centre"),
        }
        if status != "ok":
            code, message = messages.get(str(status), ("not_actionable", "the element cannot be acted on"))
            raise refuse(code, message)
        box = answer.get("box")
        if not isinstance(box, dict) or not all(isinstance(box.get(k), (int, float)) for k in ("x", "y", "width", "height")):
            raise BrowserError(502, "browser_error", "the element's box is unreadable")
        answer["box"] = {k: float(box[k]) for k in ("x", "y", "width", "height")}
        return answer, doc.loader

    @staticmethod
    def _centre(box: dict[str, float]) -> tuple[float, float]:
        return box["x"] + box["width"] / 2, box["y"] + box["height"] / 2

    def _mouse(self, ch: _Channel, tab: _Tab, kind: str, x: float, y: float, **extra: Any) -> None:
        """One mouse event in ``tab`` (viewport CSS px). Raises BrowserError 422 ``not_actionable`` for a
        tab not in front: chromium never delivers mouse input to a hidden tab (the command would only
        time out)."""
        with self._lock:
            behind = ch.active != tab.target
        if behind:
            raise BrowserError(422, "not_actionable", f"{tab.id} is not the tab in front, and a hidden tab takes "
                                                      "no mouse input: switch_tab to it first")
        ch.pipe.call("Input.dispatchMouseEvent", {"type": kind, "x": x, "y": y, **extra},
                     session_id=self._session(ch, tab), timeout=SCRIPT_TIMEOUT_S)

    def _click(self, ch: _Channel, tab: _Tab, x: float, y: float) -> None:
        self._mouse(ch, tab, "mouseMoved", x, y, button="none")
        self._mouse(ch, tab, "mousePressed", x, y, button="left", buttons=1, clickCount=1)
        self._mouse(ch, tab, "mouseReleased", x, y, button="left", buttons=0, clickCount=1)

    def _gated(self, ch: _Channel, tab: _Tab, ref: str, need: str,
               send: Callable[[float, float], None]) -> dict[str, Any]:
        """Send mouse input at the centre of element ``ref`` (``send(x, y)``, viewport CSS px) that only
        that element (or, for a click, one of its labels) may receive: the element is checked and the
        tab's input gate armed for it in one script (:data:`GATE_FN_JS`), so an element the page puts
        under the point in between (a timer, a handler of the input's own events) gets none of it: its
        events are stopped before any listener of the page, their defaults prevented (no click handler,
        no link, no submit). Returns the prepare answer. Raises 422 ``not_actionable`` when the gate
        stopped anything, or a click never reached the element."""
        answer, loader = self._element(ch, tab, ref, need, arm=True)

        def disarm() -> Any:
            try:
                return self._script(ch, tab, "disarm", {}, loader=loader)
            except BrowserError as exc:
                if exc.code != "stale_ref":
                    raise
                return "left"  # the input took the tab to a new document (a link, a submit)
        try:
            send(*self._centre(answer["box"]))
        except BaseException:
            try:
                disarm()
            except (ChannelError, BrowserError):
                pass  # the gate's own deadline ends it
            raise
        outcome = disarm()
        if outcome == "left":
            return answer
        got = set(outcome.get("got", [])) if isinstance(outcome, dict) else set()
        diverted = set(outcome.get("diverted", [])) if isinstance(outcome, dict) else set()
        if need == "hover" and got & HOVER_EVENTS:
            diverted = set()  # the move reached the element; anything after it is the page's own doing
        elif need != "hover":
            diverted -= HOVER_EVENTS  # chromium's own moves of a resting pointer (after a scroll): stopped, harmless
        if diverted and got & {"pointerdown", "mousedown"}:
            raise refuse("not_actionable", "the element took the press, then the page put another element under "
                                           "the point; that element's events were stopped (no click): read the "
                                           "page again")
        if diverted:
            raise refuse("not_actionable", "the page put another element under the point before the input "
                                           "reached the element; that element's events were stopped (nothing "
                                           "was activated): read the page again")
        if need != "hover" and "click" not in got:
            raise refuse("not_actionable", "the click did not reach the element (the page moved it, or "
                                           "something outside the page's own document took the input): "
                                           "read the page again")
        return answer

    def _do_click(self, ch: _Channel, args: W.ClickArgs) -> BrowserCallResult:
        tab = self._tab(ch, args.tab_id)
        answer = self._gated(ch, tab, args.target, "click", lambda x, y: self._click(ch, tab, x, y))
        return self._result(ch, tab, target=answer["box"])

    def _do_hover(self, ch: _Channel, args: W.HoverArgs) -> BrowserCallResult:
        tab = self._tab(ch, args.tab_id)
        answer = self._gated(ch, tab, args.target, "hover",
                             lambda x, y: self._mouse(ch, tab, "mouseMoved", x, y, button="none"))
        return self._result(ch, tab, target=answer["box"])

    def _do_scroll_to(self, ch: _Channel, args: W.ScrollToArgs) -> BrowserCallResult:
        tab = self._tab(ch, args.tab_id)
        answer, _ = self._element(ch, tab, args.target, "any")
        return self._result(ch, tab, target=answer["box"])

    def _do_set_checked(self, ch: _Channel, args: W.SetCheckedArgs) -> BrowserCallResult:
        tab = self._tab(ch, args.tab_id)
        answer, loader = self._element(ch, tab, args.target, "check")
        if answer.get("checked") is not args.checked:
            if answer.get("role") == "radio" and not args.checked:
                raise refuse("not_actionable", "a radio button is unchecked by checking another of its group")
            self._gated(ch, tab, args.target, "check", lambda x, y: self._click(ch, tab, x, y))
            now = self._script(ch, tab, "checked", {"ref": args.target}, loader=loader)
            if now is not args.checked:
                raise refuse("not_actionable", "the page did not change the element's state")
        return self._result(ch, tab, target=answer["box"])

    def _do_select_option(self, ch: _Channel, args: W.SelectOptionArgs) -> BrowserCallResult:
        tab = self._tab(ch, args.tab_id)
        answer, loader = self._element(ch, tab, args.target, "select")
        outcome = self._script(ch, tab, "select", {"ref": args.target, "values": list(args.values)}, loader=loader)
        if outcome == "missing":
            raise refuse("not_actionable", "a value matches no enabled option's value or label")
        if outcome == "single":
            raise refuse("not_actionable", "the control takes one value")
        if outcome != "ok":
            raise refuse("stale_ref", "the element is no longer on the page; read the page again")
        return self._result(ch, tab, target=answer["box"])

    def _do_type(self, ch: _Channel, args: W.TypeArgs) -> BrowserCallResult:
        tab = self._tab(ch, args.tab_id)
        session = self._session(ch, tab)
        box = None
        if args.target is None:
            if args.text:
                ch.pipe.call("Input.insertText", {"text": args.text}, session_id=session, timeout=SCRIPT_TIMEOUT_S)
            return self._result(ch, tab)
        # The input gate armed for typing: text (or the Backspace) that the page would have go to another
        # element than the one named (it moves the focus between the agent's focus and the text) is stopped.
        answer, loader = self._element(ch, tab, args.target, "textbox", arm=True)
        box = answer["box"]
        try:
            focused = self._script(ch, tab, "focus", {"ref": args.target}, loader=loader)
            if focused != "ok":
                raise refuse("not_actionable", "the element did not take the focus")
            before = self._script(ch, tab, "digest", {"ref": args.target}, loader=loader)
            if args.text:
                ch.pipe.call("Input.insertText", {"text": args.text}, session_id=session, timeout=SCRIPT_TIMEOUT_S)
            else:
                self._keys(ch, tab, ["Backspace"])
        except BaseException:
            try:
                self._script(ch, tab, "disarm", {}, loader=loader)
            except (ChannelError, BrowserError):
                pass  # the gate's own deadline ends it
            raise
        try:
            outcome = self._script(ch, tab, "disarm", {}, loader=loader)
        except BrowserError as exc:
            if exc.code != "stale_ref":
                raise
            outcome = None  # the text took the tab to a new document (a submit on input)
        if isinstance(outcome, dict) and set(outcome.get("diverted", [])) & {"beforeinput", "keydown", "keypress"}:
            raise refuse("not_actionable", "the page moved the keyboard focus to another element before the text "
                                           "arrived; nothing was typed there (its input was stopped): read the page again")
        if args.text:
            # a field that filters what is typed (a number field given letters) keeps its value: say so
            # rather than answer as if the text were in it (the value itself is never read out: a digest)
            try:
                after = self._script(ch, tab, "digest", {"ref": args.target}, loader=loader, timeout=SHORT_TIMEOUT_S)
            except BrowserError:
                after = None  # the page moved on (a submit on input): nothing to compare
            if after is not None and after == before and before != _digest(args.text):
                raise refuse("not_actionable", "the element did not take the text (its value is unchanged: a field "
                                               "that filters what is typed, such as a number field)")
        return self._result(ch, tab, target=box)

    def _keys(self, ch: _Channel, tab: _Tab, names: list[str]) -> None:
        try:
            keys = [cdp_key(name) for name in names]
        except ValueError as exc:
            raise BrowserError(400, "invalid_request", str(exc)) from None
        problem = chord_problem(keys)
        if problem:
            raise BrowserError(422, "not_actionable", f"key {'+'.join(k for k, *_ in keys)[:120]!r} is refused: {problem}")
        session = self._session(ch, tab)
        modifiers = 0
        for key, code, vk, text in keys:
            modifiers |= _MODIFIER_BITS.get(key, 0)
        pressed = 0
        for key, code, vk, text in keys:
            pressed |= _MODIFIER_BITS.get(key, 0)
            typing = bool(text) and not (modifiers & 0b111)
            if typing and pressed & 8 and len(text) == 1:
                text = text.upper()
            event: dict[str, Any] = {"type": "keyDown" if typing else "rawKeyDown", "key": key, "code": code,
                                     "windowsVirtualKeyCode": vk, "nativeVirtualKeyCode": vk, "modifiers": pressed}
            if typing:
                event.update(text=text, unmodifiedText=text)
            ch.pipe.call("Input.dispatchKeyEvent", event, session_id=session, timeout=SCRIPT_TIMEOUT_S)
        for key, code, vk, text in reversed(keys):
            ch.pipe.call("Input.dispatchKeyEvent", {"type": "keyUp", "key": key, "code": code, "windowsVirtualKeyCode": vk,
                                                    "nativeVirtualKeyCode": vk, "modifiers": pressed},
                         session_id=session, timeout=SCRIPT_TIMEOUT_S)
            pressed &= ~_MODIFIER_BITS.get(key, 0)

    def _do_key(self, ch: _Channel, args: W.KeyArgs) -> BrowserCallResult:
        tab = self._tab(ch, args.tab_id)
        self._keys(ch, tab, list(args.keys))
        return self._result(ch, tab)

    def _do_scroll(self, ch: _Channel, args: W.ScrollArgs) -> BrowserCallResult:
        tab = self._tab(ch, args.tab_id)
        metrics = self._script(ch, tab, "metrics", {})
        width, height = (metrics[2], metrics[3]) if isinstance(metrics, list) and len(metrics) >= 4 else (2, 2)
        amount = float(min(args.amount, W.MAX_SCROLL_PX))
        dx = {"left": -amount, "right": amount}.get(args.direction, 0.0)
        dy = {"up": -amount, "down": amount}.get(args.direction, 0.0)
        if amount:
            self._mouse(ch, tab, "mouseWheel", max(0, width // 2), max(0, height // 2), deltaX=dx, deltaY=dy)
        return self._result(ch, tab)

    # -- images ------------------------------------------------------------------------------------------
    def _capture(self, ch: _Channel, tab: _Tab, clip: dict[str, float] | None = None) -> W.InputImage:
        params: dict[str, Any] = {"format": "png", "fromSurface": True}
        if clip is not None:
            params["clip"] = clip
        session = self._session(ch, tab)
        data = str(ch.pipe.call("Page.captureScreenshot", params, session_id=session, timeout=SCRIPT_TIMEOUT_S * 2).get("data", ""))
        mime = "png"
        if len(data) * 3 // 4 > W.MAX_IMAGE_BYTES:
            params.update(format="jpeg", quality=80)
            data = str(ch.pipe.call("Page.captureScreenshot", params, session_id=session, timeout=SCRIPT_TIMEOUT_S * 2).get("data", ""))
            mime = "jpeg"
        try:
            size = len(base64.b64decode(data, validate=True))
        except ValueError:
            raise BrowserError(502, "browser_error", "the browser's image is not base64") from None
        if not data or size > W.MAX_IMAGE_BYTES:
            raise BrowserError(502, "browser_error", f"the image is empty or larger than {W.MAX_IMAGE_BYTES} bytes")
        return W.InputImage(image_url=f"data:image/{mime};base64,{data}")

    def _do_screenshot(self, ch: _Channel, args: W.ScreenshotArgs) -> BrowserCallResult:
        tab = self._tab(ch, args.tab_id)
        return self._result(ch, tab, self._capture(ch, tab))

    def _do_zoom(self, ch: _Channel, args: W.ZoomArgs) -> BrowserCallResult:
        tab = self._tab(ch, args.tab_id)
        metrics = self._script(ch, tab, "metrics", {})
        width, height = (int(metrics[2]), int(metrics[3])) if isinstance(metrics, list) and len(metrics) >= 4 else (0, 0)
        left, top, right, bottom = args.region
        right, bottom = min(right, width), min(bottom, height)
        if left >= right or top >= bottom:
            raise refuse("not_actionable", f"the region lies outside the {width}x{height} viewport")
        w, h = right - left, bottom - top
        scale = max(1.0, min(4.0, 1280 / w, 800 / h))
        # Page.captureScreenshot's clip is in CSS px of the document: the region (viewport CSS px) is
        # moved by the visual viewport's offset in the page.
        layout = ch.pipe.call("Page.getLayoutMetrics", session_id=self._session(ch, tab), timeout=SCRIPT_TIMEOUT_S)
        viewport = layout.get("cssVisualViewport") or {}
        page_x, page_y = float(viewport.get("pageX", 0)), float(viewport.get("pageY", 0))
        image = self._capture(ch, tab, {"x": left + page_x, "y": top + page_y, "width": w, "height": h, "scale": scale})
        return self._result(ch, tab, image, target={"x": left, "y": top, "width": w, "height": h})

    # -- tabs and navigation -----------------------------------------------------------------------------
    def _refuse_url(self, ch: _Channel, tab: _Tab | None, url: str) -> None:
        if not navigable(url):
            with self._lock:
                self._record(ch, "navigation_refused", tab.id if tab else None, reason="unsupported")
            raise refuse("unsupported_url", "only http(s) URLs and about:blank are opened")

    def _load(self, ch: _Channel, tab: _Tab, url: str) -> str | None:
        """Navigate ``tab`` to ``url`` and wait until its new document has loaded, ``load_timeout`` in
        all (a server slow to answer leaves that much less for the load: the driver's deadline holds);
        a page that keeps loading past it is left loading. Returns None, or the browser's error text
        when the navigation failed (its error page is then shown)."""
        session = self._session(ch, tab)
        deadline = time.monotonic() + self.load_timeout
        answer = ch.pipe.call("Page.navigate", {"url": url}, session_id=session, timeout=self.load_timeout)
        if answer.get("errorText"):
            return "navigation failed: " + _text(answer["errorText"])[:200]
        loader = answer.get("loaderId")
        if not loader:
            return None  # the same document (a fragment)

        def loaded() -> bool:
            try:
                return self._script(ch, tab, "ready", {}, timeout=SHORT_TIMEOUT_S, loader=str(loader)) == "complete"
            except ChannelClosed:
                raise
            except (ChannelError, BrowserError):
                return False
        wait_until(loaded, max(0.0, deadline - time.monotonic()), interval=0.1)
        return None

    def _do_navigate(self, ch: _Channel, args: W.NavigateArgs) -> BrowserCallResult:
        tab = self._tab(ch, args.tab_id)
        self._refuse_url(ch, tab, args.url)
        return self._result(ch, tab, self._load(ch, tab, args.url))

    def _activate(self, ch: _Channel, tab: _Tab) -> None:
        ch.pipe.call("Target.activateTarget", {"targetId": tab.target}, timeout=SCRIPT_TIMEOUT_S)
        with self._lock:
            self._set_active(ch, tab.target, record=True)

    def _do_new_tab(self, ch: _Channel, args: W.NewTabArgs) -> BrowserCallResult:
        if args.url is not None:
            self._refuse_url(ch, None, args.url)
        with self._lock:
            if len(ch.tabs) >= W.MAX_TABS:
                raise refuse("too_many_tabs", f"at most {W.MAX_TABS} tabs; close one first")
        target = str(ch.pipe.call("Target.createTarget", {"url": "about:blank"}, timeout=SCRIPT_TIMEOUT_S)["targetId"])
        with self._lock:
            tab = self._add_tab(ch, {"targetId": target, "url": "about:blank"}, record=True)
        if tab is None:
            raise BrowserError(502, "browser_error", "the new tab closed at once")
        self._activate(ch, tab)
        message = self._load(ch, tab, args.url) if args.url not in (None, "about:blank") else None
        return self._result(ch, tab, message)

    def _do_switch_tab(self, ch: _Channel, args: W.SwitchTabArgs) -> BrowserCallResult:
        tab = self._tab(ch, args.tab_id)
        self._activate(ch, tab)
        return self._result(ch, tab)

    def _do_close_tab(self, ch: _Channel, args: W.CloseTabArgs) -> BrowserCallResult:
        tab = self._tab(ch, args.tab_id)
        with self._lock:
            if len(ch.tabs) <= 1:
                raise refuse("not_actionable", "the last tab is not closed; navigate it instead")
        ch.pipe.call("Target.closeTarget", {"targetId": tab.target}, timeout=SCRIPT_TIMEOUT_S)
        with self._lock:
            ch.closing.add(tab.target)
            self._drop_tab(ch, tab.target)
            following = ch.tabs.get(ch.active or "")
        if following is not None:
            try:
                ch.pipe.call("Target.activateTarget", {"targetId": following.target}, timeout=SCRIPT_TIMEOUT_S)
            except ChannelError:
                pass
        return self._result(ch, None)

    # -- X input -------------------------------------------------------------------------------------------
    def _screen_points(self, ch: _Channel, tab: _Tab, points: list[tuple[int, int]]) -> list[tuple[int, int]]:
        """Viewport CSS px -> screen px for the X input, once the tab is the one in front."""
        if self.executor is None:
            raise BrowserError(409, "no_display", "the agent has no X display for this member")
        with self._lock:
            if ch.active != tab.target:
                raise refuse("not_actionable", "the tab is not in front; switch_tab to it first")
        if self._script(ch, tab, "visible", {}) is not True:
            # Brought to the front only when chromium does not show it: activating a shown tab makes
            # chromium re-activate its window, and an X click sent meanwhile is lost.
            ch.pipe.call("Target.activateTarget", {"targetId": tab.target}, timeout=SCRIPT_TIMEOUT_S)
            if not wait_until(lambda: self._script(ch, tab, "visible", {}, timeout=SHORT_TIMEOUT_S) is True,
                              SCRIPT_TIMEOUT_S, interval=0.05):
                raise refuse("not_actionable", "chromium does not show the tab")
        # Chromium drops input to a new document until it has painted content (paint holding, up to
        # its own timeout for a page that paints none): wait for the first contentful paint, bounded.
        wait_until(lambda: self._script(ch, tab, "painted", {}, timeout=SHORT_TIMEOUT_S) is True, PAINT_WAIT_S,
                   interval=0.05)
        left, top, scale, width, height = self.viewport_on_screen(ch, tab)
        out = []
        for x, y in points:
            if not (0 <= x < width and 0 <= y < height):
                raise refuse("not_actionable", f"({x}, {y}) is outside the {width}x{height} viewport")
            out.append((int(left + x * scale), int(top + y * scale)))
        return out

    def _x_actions(self, actions: list[dict[str, Any]]) -> None:
        from .actions import ActionError

        try:
            self.executor.execute(actions)
        except ActionError as exc:
            if exc.code == "out_of_bounds":
                raise refuse("not_actionable", "the point is outside the screen (the window is not fully on it)") from None
            raise

    def _do_click_at(self, ch: _Channel, args: W.ClickAtArgs) -> BrowserCallResult:
        tab = self._tab(ch, args.tab_id)
        [(x, y)] = self._screen_points(ch, tab, [(args.x, args.y)])
        action: dict[str, Any] = {"type": "click", "x": x, "y": y,
                                  "button": {"left": "left", "right": "right", "middle": "wheel"}[args.button]}
        if args.keys:
            action["keys"] = list(args.keys)
        for index in range(args.click_count):
            if index:
                # Chromium counts a click as the next of a multi-click only when its X timestamp (ms)
                # differs from the last one's: the clicks of one call are this far apart.
                time.sleep(CLICK_SPACING_S)
            self._x_actions([action])
        return self._result(ch, tab, target={"x": args.x, "y": args.y, "width": 0, "height": 0})

    def _do_hover_at(self, ch: _Channel, args: W.HoverAtArgs) -> BrowserCallResult:
        tab = self._tab(ch, args.tab_id)
        [(x, y)] = self._screen_points(ch, tab, [(args.x, args.y)])
        self._x_actions([{"type": "move", "x": x, "y": y}])
        return self._result(ch, tab, target={"x": args.x, "y": args.y, "width": 0, "height": 0})

    def _do_drag_path(self, ch: _Channel, args: W.DragPathArgs) -> BrowserCallResult:
        tab = self._tab(ch, args.tab_id)
        points = self._screen_points(ch, tab, [(p.x, p.y) for p in args.path])
        action: dict[str, Any] = {"type": "drag", "path": [{"x": x, "y": y} for x, y in points]}
        if args.keys:
            action["keys"] = list(args.keys)
        self._x_actions([action])
        return self._result(ch, tab)

    def _do_hold_keys(self, ch: _Channel, args: W.HoldKeysArgs) -> BrowserCallResult:
        tab = self._tab(ch, args.tab_id)
        self._screen_points(ch, tab, [])
        keysyms = []
        for name in args.keys:
            try:
                keysym = keynames.resolve(name)
            except keynames.UnknownKey as exc:
                raise BrowserError(400, "invalid_request", str(exc)) from None
            if keynames.is_server_control(keysym):
                raise BrowserError(400, "invalid_request", f"key {name[:64]!r} commands the X server and is refused")
            if keysym in BROWSER_SHORTCUT_KEYSYMS:
                # held through the X input, these reach chromium's own shortcuts (Ctrl+L, Alt+D, F6: the
                # address bar) and so a navigation the driver's URL policy never saw
                raise BrowserError(422, "not_actionable", f"hold_keys holds keys for the page only: {name[:64]!r} "
                                                          "is a modifier or function key the browser itself takes")
            keysyms.append(keysym)
        if self._script(ch, tab, "focused", {}, timeout=SHORT_TIMEOUT_S) is not True:
            # the X input goes where the X focus is: with the page unfocused, chromium's own window
            # (its address bar after Tab left the page) or another window would take the keys
            raise BrowserError(422, "not_actionable", "hold_keys needs the page to have the keyboard focus, and "
                                                      "it has not (the browser's own bar or another window has it): "
                                                      "click in the page first")
        self.executor.hold_keys(keysyms, args.duration_ms / 1000)
        return self._result(ch, tab)
