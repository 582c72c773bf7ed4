"use strict";
/* The live screen of a run page: JPEG frames from the page's socket (console.js; /runs/{id}/live,
   controller.console.streams) shown in the <img>, the last action drawn over it in SCREEN px (an SVG
   whose viewBox is the screen size), and, while a person has control (state "human"), their clicks,
   wheel and keys sent as actions in screen px.

   Frames are asked for one at a time: {"frames": FPS} once the last one is shown, {"frames": 0} when
   the tab is hidden (Page Visibility API; asked again once it shows), none before the sandbox is up or
   after the run. A hidden or busy tab thus costs the guest no screenshot.

   window.DSScreen = {init(runId, send), attach(channel), showFrame(blob), frames(), setScreen([w, h]),
                      setState(state), showAction(info)}
   channel(message): sends one message on the page's socket (null while it is closed).
   info: an "action" event's data {by: "model"|"human", action: {...screen px...}, screen: [w, h]}; a call
   of the browser tools is the action {type: "browser_call", member, call_id, ok, box}, its box (the
   element it acted on, {x, y, width, height} screen px, or null) drawn as a rectangle.
   send(action) -> Promise: posts one action to /runs/{id}/input (console.js).
   Every text drawn is set with textContent. */
(function () {
  const SVG = "http://www.w3.org/2000/svg";
  /* Browser KeyboardEvent.key -> key names the guest accepts (guest/keys.py ALIASES). */
  const KEYS = {
    Enter: "ENTER", Backspace: "BACKSPACE", Tab: "TAB", Escape: "ESCAPE", Delete: "DELETE",
    Insert: "INSERT", Home: "HOME", End: "END", PageUp: "PAGEUP", PageDown: "PAGEDOWN",
    ArrowLeft: "LEFT", ArrowRight: "RIGHT", ArrowUp: "UP", ArrowDown: "DOWN", ContextMenu: "MENU",
    " ": "SPACE", Pause: "PAUSE", PrintScreen: "PRINT",
  };
  for (let n = 1; n <= 12; n++) KEYS["F" + n] = "F" + n;
  /* Keys that are only modifiers or say nothing: never sent alone. */
  const SILENT = new Set(["Control", "Shift", "Alt", "Meta", "AltGraph", "CapsLock", "NumLock", "ScrollLock",
    "OS", "Hyper", "Super", "Fn", "FnLock", "Dead", "Unidentified", "Process", "Compose"]);
  /* Wheel deltas are in px, lines or pages (deltaMode 0/1/2): px per unit. */
  const WHEEL_UNIT = [1, 40, 800];

  const FPS = 5;
  const s = { runId: null, send: null, w: 0, h: 0, state: "starting", streaming: false, last: null,
              box: null, img: null, overlay: null, queue: Promise.resolve(),
              channel: null, asked: false, url: null, shown: 0 };

  const live = () => s.state !== "starting" && s.state !== "finished";

  /* Ask for the next frame when the page can show it and has not asked already. */
  function ask() {
    if (!s.channel || s.asked || !live() || document.visibilityState !== "visible") return;
    s.asked = true;
    s.channel({ frames: FPS });
  }

  /* The page's socket opened (a function sending one message) or closed (null). */
  function attach(channel) {
    s.channel = channel;
    s.asked = false;
    ask();
  }

  /* One frame (a JPEG Blob) from the socket: shown, then the next one asked for. */
  function showFrame(blob) {
    s.asked = false;
    const url = URL.createObjectURL(blob);
    const done = () => {
      if (s.url && s.url !== url) URL.revokeObjectURL(s.url);
      s.url = url;
      s.shown += 1;
      ask();
    };
    s.img.addEventListener("load", done, { once: true });
    s.img.addEventListener("error", done, { once: true });
    s.img.src = url;
    if (!s.streaming) {
      s.streaming = true;
      if (s.state !== "human" && s.state !== "pausing") document.getElementById("screen-note").textContent = "";
    }
  }

  function visibility() {
    if (document.visibilityState === "visible") { ask(); return; }
    if (s.channel && s.asked) s.channel({ frames: 0 });
    s.asked = false;
  }

  function svg(tag, attrs, text) {
    const node = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
    if (text !== undefined) node.textContent = text;
    s.overlay.appendChild(node);
    return node;
  }

  const num = (v) => (typeof v === "number" && Number.isFinite(v) ? v : null);

  function setScreen(size) {
    if (!Array.isArray(size) || !(num(size[0]) > 0) || !(num(size[1]) > 0)) return;
    s.w = size[0];
    s.h = size[1];
    s.overlay.setAttribute("viewBox", `0 0 ${s.w} ${s.h}`);
    s.overlay.setAttribute("preserveAspectRatio", "none");
    redraw();
  }

  function setState(state) {
    s.state = state;
    s.box.classList.toggle("human", state === "human");
    const note = document.getElementById("screen-note");
    ask();
    if (state === "human") {
      note.textContent = "You have control: clicks, wheel and keys on the screen go to the desktop.";
      s.box.focus();
    } else if (state === "pausing") {
      note.textContent = "Taking over at the model's next step...";
    } else if (s.streaming) {
      note.textContent = "";
    }
  }

  function showAction(info) {
    if (!info || typeof info !== "object" || !info.action) return;
    if (Array.isArray(info.screen)) setScreen(info.screen);
    s.last = info;
    redraw();
  }

  function label(text) {
    const size = Math.max(14, Math.round(s.w / 60));
    const width = Math.ceil(text.length * size * 0.62) + size;
    svg("rect", { x: 8, y: 8, width, height: size * 1.6, rx: 4, class: "label-bg" });
    svg("text", { x: 8 + size / 2, y: 8 + size * 1.15, "font-size": size, class: "label" }, text);
  }

  function point(x, y, cls, r) {
    svg("circle", { cx: x, cy: y, r, class: cls });
    svg("line", { x1: x - 2 * r, y1: y, x2: x + 2 * r, y2: y, class: cls });
    svg("line", { x1: x, y1: y - 2 * r, x2: x, y2: y + 2 * r, class: cls });
  }

  function arrow(x, y, dx, dy, cls, len) {
    const norm = Math.hypot(dx, dy);
    if (!norm) return;
    const ux = dx / norm, uy = dy / norm, ex = x + ux * len, ey = y + uy * len, head = len / 4;
    svg("line", { x1: x, y1: y, x2: ex, y2: ey, class: cls });
    const px = -uy * head / 2, py = ux * head / 2;
    const bx = ex - ux * head, by = ey - uy * head;
    svg("polygon", { points: `${ex},${ey} ${bx + px},${by + py} ${bx - px},${by - py}`, class: "mark-fill" });
  }

  /* Draw the last action in screen px: click point, drag path, scroll arrow, typed length, keys. */
  function redraw() {
    while (s.overlay.firstChild) s.overlay.removeChild(s.overlay.firstChild);
    if (!s.last || !s.w) return;
    const a = s.last.action, by = s.last.by === "human" ? "you" : "model";
    const cls = "mark" + (s.last.by === "human" ? " human-mark" : "");
    const r = Math.max(8, s.w / 100), x = num(a.x), y = num(a.y);
    switch (a.type) {
      case "click": case "double_click": case "move":
        if (x === null || y === null) return;
        point(x, y, cls, r);
        if (a.type === "double_click") svg("circle", { cx: x, cy: y, r: r * 1.7, class: cls });
        label(`${by}: ${a.type.replace("_", " ")} (${x},${y})${a.button ? " " + a.button : ""}`);
        break;
      case "drag": {
        const pts = (Array.isArray(a.path) ? a.path : []).filter((p) => p && num(p.x) !== null && num(p.y) !== null);
        if (pts.length < 2) return;
        svg("polyline", { points: pts.map((p) => `${p.x},${p.y}`).join(" "), class: cls });
        const end = pts[pts.length - 1];
        point(end.x, end.y, cls, r);
        label(`${by}: drag to (${end.x},${end.y})`);
        break;
      }
      case "scroll":
        if (x === null || y === null) return;
        point(x, y, cls, r);
        arrow(x, y, num(a.scroll_x) || 0, num(a.scroll_y) || 0, cls, r * 8);
        label(`${by}: scroll (${num(a.scroll_x) || 0},${num(a.scroll_y) || 0}) at (${x},${y})`);
        break;
      case "type":
        label(`${by}: typed ${num(a.text_length) ?? "?"} chars`);
        break;
      case "keypress":
        label(`${by}: keys ${(Array.isArray(a.keys) ? a.keys : []).map(String).join("+")}`);
        break;
      case "browser_call": {
        const b = a.box && typeof a.box === "object" ? a.box : null;
        const bx = b ? num(b.x) : null, bw = b ? num(b.width) : null;
        const bt = b ? num(b.y) : null, bh = b ? num(b.height) : null;
        if (bx !== null && bt !== null && bw > 0 && bh > 0)
          svg("rect", { x: bx, y: bt, width: bw, height: bh, class: cls + " browser-box" });
        label(`${by}: browser ${String(a.member)}${a.ok === false ? " FAILED" : ""}`);
        break;
      }
      default:
        label(`${by}: ${String(a.type)}`);
    }
  }

  /* Client coordinates -> screen px (from the image's displayed size to the screen size). */
  function toScreen(ev) {
    const rect = s.img.getBoundingClientRect();
    if (!s.w || !s.h || rect.width <= 0 || rect.height <= 0) return null;
    const clamp = (v, hi) => Math.min(hi - 1, Math.max(0, v));
    return { x: clamp(Math.floor((ev.clientX - rect.left) * s.w / rect.width), s.w),
             y: clamp(Math.floor((ev.clientY - rect.top) * s.h / rect.height), s.h) };
  }

  /* Actions go out one after another, in the order the person made them. */
  function sendAction(action) {
    s.queue = s.queue.then(() => s.send(action)).catch(() => undefined);
  }

  function keyAction(ev) {
    const key = ev.key;
    if (typeof key !== "string" || SILENT.has(key)) return null;
    const mods = [];
    if (ev.ctrlKey) mods.push("CTRL");
    if (ev.altKey) mods.push("ALT");
    if (ev.metaKey) mods.push("SUPER");
    const printable = [...key].length === 1;
    if (printable && mods.length === 0) return { type: "type", text: key };
    const name = KEYS[key] || (printable ? key : null);
    if (!name) return null;
    if (ev.shiftKey) mods.push("SHIFT");
    return { type: "keypress", keys: [...mods, name] };
  }

  function init(runId, send) {
    s.runId = runId;
    s.send = send;
    s.box = document.getElementById("screen");
    s.img = document.getElementById("screen-img");
    s.overlay = document.getElementById("overlay");
    s.img.addEventListener("dragstart", (ev) => ev.preventDefault());
    s.img.addEventListener("click", (ev) => {
      if (s.state !== "human") return;
      const p = toScreen(ev);
      if (!p) return;
      ev.preventDefault();
      s.box.focus();
      sendAction({ type: "click", x: p.x, y: p.y, button: "left" });
    });
    s.img.addEventListener("contextmenu", (ev) => {
      if (s.state !== "human") return;
      const p = toScreen(ev);
      if (!p) return;
      ev.preventDefault();
      sendAction({ type: "click", x: p.x, y: p.y, button: "right" });
    });
    s.box.addEventListener("wheel", (ev) => {
      if (s.state !== "human") return;
      const p = toScreen(ev);
      if (!p) return;
      ev.preventDefault();
      const unit = WHEEL_UNIT[ev.deltaMode] || 1;
      const sx = Math.round(ev.deltaX * unit), sy = Math.round(ev.deltaY * unit);
      if (sx || sy) sendAction({ type: "scroll", x: p.x, y: p.y, scroll_x: sx, scroll_y: sy });
    }, { passive: false });
    s.box.addEventListener("keydown", (ev) => {
      if (s.state !== "human" || ev.isComposing) return;
      const action = keyAction(ev);
      if (!action) return;
      ev.preventDefault();
      sendAction(action);
    });
    window.addEventListener("resize", redraw);
    document.addEventListener("visibilitychange", visibility);
  }

  window.DSScreen = { init, attach, showFrame, frames: () => s.shown, setScreen, setState, showAction, keyAction };
})();
