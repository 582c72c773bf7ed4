"use strict";
/* A live run's page: the page's one socket (a WebSocket on /runs/{id}/live: the run's events, and the
   live screen's frames for screen.js; see "the socket" below), the approval cards (safety
   checks and actions: Approve / Deny; origin requests of the gateway: the origin, its reason, a
   countdown to the gateway's deadline, Approve / Deny / Cancel; focus on Deny), the
   step/action log (computer actions, and each browser call as its one line), model messages, usage and
   network decisions, and the Take over / Resume / Cancel
   run buttons; sign-in requests (browser_authentication) get a card of their own (see "sign-in
   requests" below). Every text from the run is set with textContent (never innerHTML). POSTs carry the
   page's CSRF token (<meta name="csrf-token">). An answer is sent once, on a click; after a failed
   POST the approvals snapshot is fetched again (every (re)connection of the socket starts with one). */
(function () {
  const runId = document.body.dataset.runId;
  const base = document.querySelector('meta[name="console-base"]').content + "/runs/" + encodeURIComponent(runId);
  const csrf = document.querySelector('meta[name="csrf-token"]').content;
  const $ = (id) => document.getElementById(id);
  const SHOT = /^shot-[0-9]{4}\.(png|jpg)$/;
  const MAX_LINES = 2000;

  let approvalsVersion = -1;
  const cards = new Map(); /* request id -> {el, error, buttons, left, received} */
  const usage = { input: 0, output: 0, total: 0, responses: 0, missing: 0 };
  let lastText = null; /* the last response's words (the run's final message repeats them) */

  function node(tag, text, cls) {
    const el = document.createElement(tag);
    if (text !== undefined && text !== null) el.textContent = String(text);
    if (cls) el.className = cls;
    return el;
  }

  function send(path, payload) {
    return fetch(base + path, {
      method: "POST", credentials: "same-origin", cache: "no-store",
      headers: { "Content-Type": "application/json", "X-CSRF-Token": csrf },
      body: JSON.stringify(payload === undefined ? {} : payload),
    });
  }

  async function post(path, payload) {
    return reply(await send(path, payload));
  }

  /* A POST's answer as JSON; an Error "code: message" (or "HTTP status") when it was refused. */
  async function reply(resp) {
    let data = null;
    try { data = await resp.json(); } catch (e) { data = null; }
    if (!resp.ok) {
      const err = data && data.error ? `${data.error.code}: ${data.error.message}` : `HTTP ${resp.status}`;
      throw new Error(err);
    }
    return data;
  }

  /* ---- approvals ------------------------------------------------------------------------- */
  function applySnapshot(snap) {
    if (!snap || typeof snap.version !== "number" || !Array.isArray(snap.pending)) return;
    if (snap.version < approvalsVersion) return; /* an older snapshot replayed: already superseded */
    approvalsVersion = snap.version;
    const pending = new Map(snap.pending.map((r) => [r.id, r]));
    for (const id of [...cards.keys()]) if (!pending.has(id)) removeCard(id);
    for (const r of snap.pending) {
      const card = cards.get(r.id);
      if (card) { card.left = r.seconds_left; card.received = Date.now(); } else addCard(r);
    }
    tick();
  }

  function removeCard(id) {
    const card = cards.get(id);
    if (!card) return;
    if (card.signin) wipeInputs(card);
    card.el.remove();
    cards.delete(id);
    $("no-approvals").hidden = cards.size > 0;
  }

  /* A request says what its kind is called (label) and what it takes (answers: the server's table of
     request kinds, controller/model/requests.py): one button per answer, in that order; a request
     answered with submit / cancel is a sign-in form; one about an origin (origin set) shows it. */
  const BUTTONS = { approve: "Approve", deny: "Deny", cancel: "Cancel" };

  function addCard(r) {
    const answers = Array.isArray(r.answers) ? r.answers.filter((a) => Object.hasOwn(BUTTONS, a) || a === "submit") : [];
    if (answers.includes("submit")) { addSignInCard(r); return; }
    const origin = typeof r.origin === "string";
    const el = node("div", null, origin ? "card origin" : "card");
    el.dataset.requestId = r.id;
    el.dataset.kind = r.kind;
    el.setAttribute("role", "group");
    el.appendChild(node("div", typeof r.label === "string" && r.label ? r.label : "question", "kind"));
    if (origin) {
      /* the gateway holds the guest's connection to this origin until an answer (or its deadline) */
      el.appendChild(node("p", "The guest asks to connect to", "question"));
      el.appendChild(node("code", r.origin, "origin"));
      if (r.origin_reason) el.appendChild(node("p", r.origin_reason, "reason"));
      el.appendChild(node("div", "Approve lets its connections through for this sandbox; Deny refuses them " +
        "(and later ones); Cancel refuses the held ones only (a later attempt asks again).", "note"));
    } else el.appendChild(node("p", r.question, "question"));
    if (Array.isArray(r.checks) && r.checks.length) {
      const list = node("ul", null, "checks");
      for (const c of r.checks) {
        const li = node("li");
        li.appendChild(node("span", c.code, "code"));
        li.appendChild(document.createTextNode(" " + (c.message || "")));
        list.appendChild(li);
      }
      el.appendChild(list);
    }
    if (Array.isArray(r.actions) && r.actions.length) {
      el.appendChild(node("div", "the call's actions:", "note"));
      const list = node("ul", null, "actions");
      for (const a of r.actions) list.appendChild(node("li", a));
      el.appendChild(list);
    }
    addShot(el, r);
    const countdown = node("div", "", "countdown");
    el.appendChild(countdown);
    const error = node("p", "", "error");
    const row = node("div", null, "buttons");
    const buttons = answers.map((a) => {
      const b = node("button", BUTTONS[a], a);
      b.type = "button";
      b.addEventListener("click", () => answer(r.id, a, card));
      return b;
    });
    row.append(...buttons);
    const deny = buttons[answers.indexOf("deny")];
    el.append(row, error);
    const card = { el, error, buttons, left: r.seconds_left, received: Date.now(), countdown, origin };
    cards.set(r.id, card);
    $("cards").appendChild(el);
    $("no-approvals").hidden = true;
    /* the safe answer is the default one, unless the person is typing into a sign-in card: a key
       meant for a value must not land on another card's button */
    if (deny && !inSignIn(document.activeElement)) deny.focus();
  }

  function addShot(el, r) {
    if (typeof r.screenshot === "string" && SHOT.test(r.screenshot)) {
      const img = node("img");
      img.src = `${base}/shots/${r.screenshot}`;
      img.alt = "the screen when the model asked";
      el.appendChild(img);
    }
  }

  /* ---- sign-in requests ------------------------------------------------------------------- */
  /* The agent's browser shows a sign-in form on credential_origin. Its card: "Sign in", that origin
     large (the person must check it), the reason, then either the sign-in methods (radio buttons: one
     must be chosen, and only its fields are shown) or every field; Submit and Cancel. Values are
     credentials: each is typed into a masked input (type=password, autocomplete=off, whatever the
     field's type), in no <form> (nothing for the browser to submit or restore). Submit reads them
     straight into the request body (sendSignIn), and every input is cleared and removed before the
     POST is even answered: no value stays in the page, in a variable, in storage or in the URL. A
     refusal shows its message and new, empty inputs; a request decided elsewhere removes the card. */
  let serial = 0; /* makes the inputs' and radio groups' ids unique in the page */

  function inSignIn(el) {
    return !!(el && el.closest && el.closest(".card.signin"));
  }

  function addSignInCard(r) {
    const el = node("div", null, "card signin");
    el.dataset.requestId = r.id;
    el.dataset.kind = r.kind;
    el.setAttribute("role", "group");
    el.setAttribute("aria-label", "Sign in");
    el.appendChild(node("h3", "Sign in", "signin-title"));
    el.appendChild(node("div", "Credential origin", "origin-label"));
    el.appendChild(node("code", r.credential_origin, "credential-origin"));
    el.appendChild(node("div", "Check this origin: the values you give are typed into its page only.", "note"));
    if (r.question) el.appendChild(node("p", r.question, "reason"));
    addShot(el, r);
    const card = {
      id: r.id, el, signin: true, busy: false, left: r.seconds_left, received: Date.now(),
      fields: Array.isArray(r.fields) ? r.fields : [], options: Array.isArray(r.options) ? r.options : [],
      methods: null, inputs: node("div", null, "signin-inputs"),
    };
    if (card.options.length) {
      card.methods = node("fieldset", null, "methods");
      card.methods.appendChild(node("legend", "Sign-in method (choose one)"));
      const group = "signin-method-" + (++serial);
      for (const o of card.options) {
        const label = node("label", null, "method");
        const radio = node("input");
        radio.type = "radio";
        radio.name = group;
        radio.value = o.id;
        radio.required = true;
        radio.addEventListener("change", () => showInputs(card));
        label.append(radio, document.createTextNode(" " + (o.label || o.id)));
        card.methods.appendChild(label);
      }
      el.appendChild(card.methods);
    }
    el.appendChild(card.inputs);
    card.countdown = node("div", "", "countdown");
    card.error = node("p", "", "error");
    card.error.setAttribute("role", "alert");
    const row = node("div", null, "buttons");
    const submit = node("button", "Submit", "approve");
    const cancel = node("button", "Cancel", "deny");
    card.buttons = [submit, cancel];
    card.buttons.forEach((b) => { b.type = "button"; });
    row.append(submit, cancel);
    el.append(card.countdown, row, card.error);
    submit.addEventListener("click", () => submitSignIn(card));
    cancel.addEventListener("click", () => answerSignIn(card, "cancel", null));
    showInputs(card);
    cards.set(r.id, card);
    $("cards").appendChild(el);
    $("no-approvals").hidden = true;
  }

  function chosenOption(card) {
    const radio = card.methods ? card.methods.querySelector("input[type=radio]:checked") : null;
    return radio ? radio.value : null;
  }

  /* The value inputs, new and empty: the chosen method's fields (none before a method is chosen),
     or every field of a request without methods. */
  function showInputs(card) {
    wipeInputs(card);
    let ids;
    if (card.options.length) {
      const chosen = card.options.find((o) => o.id === chosenOption(card));
      ids = chosen && Array.isArray(chosen.field_ids) ? chosen.field_ids : [];
      if (chosen && !ids.length) card.inputs.appendChild(node("div", "This method takes no value.", "note"));
    } else ids = card.fields.map((f) => f.id);
    for (const id of ids) {
      const f = card.fields.find((x) => x.id === id) || { id, label: id, required: false };
      const input = node("input");
      input.type = "password"; /* every value is masked, an e-mail address too */
      input.setAttribute("autocomplete", "off");
      input.spellcheck = false;
      input.required = !!f.required;
      input.dataset.fieldId = f.id;
      input.id = "signin-value-" + (++serial);
      input.addEventListener("keydown", (ev) => {
        if (ev.key === "Enter") { ev.preventDefault(); submitSignIn(card); }
      });
      const label = node("label", null, "signin-field");
      label.htmlFor = input.id;
      label.appendChild(node("span", f.label || f.id, "label"));
      if (f.required) label.appendChild(node("span", " (required)", "required"));
      const row = node("div", null, "signin-value");
      row.append(label, input);
      card.inputs.appendChild(row);
    }
  }

  /* Clear every value input of the card and take it out of the page. */
  function wipeInputs(card) {
    for (const input of card.inputs.querySelectorAll("input")) input.value = "";
    card.inputs.replaceChildren();
  }

  function submitSignIn(card) {
    if (card.busy) return;
    card.error.textContent = "";
    const option = chosenOption(card);
    if (card.options.length && option === null) { card.error.textContent = "Choose a sign-in method."; return; }
    const missing = [...card.inputs.querySelectorAll("input")].find((i) => i.required && i.value === "");
    if (missing) { card.error.textContent = "Fill in every required field."; missing.focus(); return; }
    answerSignIn(card, "submit", option);
  }

  /* POST the answer; the values go from the inputs into the body handed to fetch, and the inputs are
     wiped before this returns: nothing of a value outlives this call in the page's script. */
  function sendSignIn(card, action, option) {
    const body = { action };
    if (action === "submit") {
      body.fields = [...card.inputs.querySelectorAll("input")].filter((i) => i.value !== "")
        .map((i) => ({ field_id: i.dataset.fieldId, value: i.value }));
      if (option !== null) body.selected_option = option;
    }
    try {
      return send("/approvals/" + encodeURIComponent(card.id), body);
    } finally {
      body.fields = null;
      wipeInputs(card);
    }
  }

  async function answerSignIn(card, action, option) {
    if (card.busy) return;
    card.busy = true;
    card.buttons.forEach((b) => { b.disabled = true; });
    if (card.methods) card.methods.disabled = true;
    card.error.textContent = "";
    try {
      const decided = await reply(await sendSignIn(card, action, option));
      if (decided && decided.state !== "pending") { removeCard(card.id); return; }
    } catch (e) {
      card.error.textContent = e.message;
      await refetchApprovals();
    }
    if (!cards.has(card.id)) return;
    card.busy = false;
    card.buttons.forEach((b) => { b.disabled = false; });
    if (card.methods) card.methods.disabled = false;
    showInputs(card); /* try again: new, empty inputs */
  }

  async function answer(id, value, card) {
    card.buttons.forEach((b) => { b.disabled = true; });
    card.error.textContent = "";
    try {
      const decided = await post("/approvals/" + encodeURIComponent(id), { answer: value });
      if (decided && decided.state !== "pending") removeCard(id);
    } catch (e) {
      card.error.textContent = e.message;
      await refetchApprovals();
      if (cards.has(id)) card.buttons.forEach((b) => { b.disabled = false; });
    }
  }

  async function refetchApprovals() {
    try {
      const resp = await fetch(base + "/approvals", { credentials: "same-origin", cache: "no-store" });
      if (resp.ok) applySnapshot(await resp.json());
    } catch (e) { /* the stream's reconnection fetches it again */ }
  }

  function tick() {
    for (const card of cards.values()) {
      if (typeof card.left !== "number") { card.countdown.textContent = ""; continue; }
      const left = Math.max(0, Math.ceil(card.left - (Date.now() - card.received) / 1000));
      if (card.signin) card.countdown.textContent = left > 0 ? `refused automatically in ${left} s` : "refusing (no answer in time)";
      else if (card.origin) card.countdown.textContent = left > 0 ? `the gateway refuses it in ${left} s` : "refusing (no answer in time)";
      else card.countdown.textContent = left > 0 ? `denied automatically in ${left} s` : "denying (no answer in time)";
    }
  }

  /* ---- state and controls ---------------------------------------------------------------- */
  /* The run's event number the shown state is as of. A control POST answers with the state when it
     was handled (describe(): state and last_seq together), which may be older than a `control` event
     the stream already brought (Resume answers "human" while the loop is waking up, and its "running"
     event can arrive first): a state is shown only if it is not older than the one on the page. */
  let stateSeq = -1;

  function applyState(next, screen, seq) {
    if (typeof next !== "string") return;
    if (typeof seq === "number") {
      if (seq < stateSeq) return;
      stateSeq = seq;
    }
    const el = $("state");
    el.textContent = next;
    el.className = "state state-" + next.replace(/[^a-z]/g, "");
    $("takeover").disabled = next !== "running";
    $("resume").disabled = !(next === "pausing" || next === "human");
    $("cancel").disabled = next === "finished" || next === "starting";
    if (screen) window.DSScreen.setScreen(screen);
    window.DSScreen.setState(next);
  }

  async function control(path) {
    $("control-error").textContent = "";
    try {
      const data = await post(path, {});
      if (data && data.state) applyState(data.state.state, data.state.screen, data.state.last_seq);
    } catch (e) {
      $("control-error").textContent = e.message;
    }
  }

  async function sendInput(action) {
    try {
      await post("/input", action);
    } catch (e) {
      $("control-error").textContent = e.message;
    }
  }

  /* ---- the log ---------------------------------------------------------------------------- */
  function line(listId, ts, text, cls) {
    const list = $(listId);
    const li = node("li", null, cls);
    if (typeof ts === "string") li.appendChild(node("span", ts.slice(11, 19), "ts"));
    li.appendChild(document.createTextNode(text));
    list.appendChild(li);
    while (list.childElementCount > MAX_LINES) list.removeChild(list.firstElementChild);
    list.scrollTop = list.scrollHeight;
    return li;
  }

  const short = (v, n) => { const t = typeof v === "string" ? v : JSON.stringify(v); return t.length > n ? t.slice(0, n - 3) + "..." : t; };

  function showUsage() {
    let text = `usage: ${usage.total} tokens (in ${usage.input}, out ${usage.output}) over ${usage.responses} responses`;
    if (usage.missing) text += `, ${usage.missing} without usage`;
    $("usage").textContent = text;
  }

  /* One record entry into the page; text: the event's one line for the entry, when it has one. */
  function addEntry(e, text) {
    if (!e || typeof e !== "object") return;
    const ts = e.ts;
    switch (e.type) {
      case "run_started":
        line("log", ts, `run started: task ${e.task && e.task.name} (${e.mode || "?"}${e.model ? ", " + e.model : ""})`);
        break;
      case "model_response":
        usage.responses += 1;
        if (e.usage) {
          usage.input += e.usage.input_tokens || 0;
          usage.output += e.usage.output_tokens || 0;
          usage.total += e.usage.total_tokens || 0;
        } else usage.missing += 1;
        showUsage();
        line("messages", ts, `step ${usage.responses}: response${e.http_status ? " (HTTP " + e.http_status + ")" : ""}${e.error ? " error " + short(e.error, 200) : ""}`, e.error ? "bad" : "");
        if (e.text) { line("messages", ts, `model: ${short(e.text, 2000)}`); lastText = e.text; }
        break;
      case "computer_call": {
        const n = Array.isArray(e.actions) ? e.actions.length : 0;
        const checks = Array.isArray(e.pending_checks) && e.pending_checks.length ? `, ${e.pending_checks.length} safety check(s)` : "";
        line("log", ts, `computer_call ${e.call_id || ""}: ${n} action(s)${checks}`);
        break;
      }
      case "action":
        line("log", ts, `  ${e.action || "?"}${typeof e.duration_ms === "number" ? " " + Math.round(e.duration_ms) + " ms" : ""}${e.error ? " FAILED: " + e.error : ""}`, e.error ? "bad" : "");
        break;
      case "browser_call":
        /* the record event's one line (controller.run.progress.browser_call_text: typed text as its length) */
        line("log", ts, `  ${typeof text === "string" ? text : "browser " + e.member + (e.ok ? ": ok" : ": FAILED")}`,
             e.ok ? "" : "bad");
        break;
      case "human_action":
        line("log", ts, `  person${e.by ? " (" + e.by + ")" : ""}: ${short(e.action, 200)}`, "human");
        break;
      case "takeover":
        line("log", ts, e.control === "human" ? "a person took over the desktop; the model waits"
                                              : "the desktop is handed back to the model", "human");
        break;
      case "screenshot": {
        const li = line("log", ts, "  screenshot ");
        if (typeof e.file === "string" && SHOT.test(e.file)) {
          const a = node("a", e.file);
          a.href = `${base}/shots/${e.file}`;
          a.target = "_blank";
          a.rel = "noopener";
          li.appendChild(a);
        }
        break;
      }
      case "approval":
        if (e.what === "origin_access")
          line("network", ts, `origin request ${e.origin || "?"}: ${e.decision} by ${e.by}` +
            (e.decision === "approved" ? " (the page may still fail to load: see the connection below)" : ""),
            e.decision === "approved" ? "good" : "bad");
        else if (e.what === "opt-in" && e.origin)
          line("network", ts, `opt-in: origin requests for ${e.origin} are approved unattended (--approve-origin)`);
        else
          line("log", ts, `approval (${e.what}): ${e.decision} by ${e.by}${e.codes && e.codes.length ? " [" + e.codes.join(", ") + "]" : ""}`, e.decision === "approved" ? "good" : "bad");
        break;
      case "network":
        line("network", ts, `${e.decision} ${e.origin}${e.reason ? " (" + e.reason + ")" : ""}` +
          (typeof e.held_ms === "number" ? ` after ${Math.round(e.held_ms)} ms held` : ""), e.decision === "allow" ? "good" : "bad");
        break;
      case "network_log":
        line("network", ts, `decision log ${e.complete ? "complete" : "INCOMPLETE"}: ${e.decisions} decision(s)`, e.complete ? "" : "bad");
        break;
      case "check":
        line("log", ts, `check ${e.passed ? "pass" : "FAIL"} ${e.kind || ""} ${e.target || ""}`, e.passed ? "good" : "bad");
        break;
      case "expectation":
        line("log", ts, `screen expectation turn ${e.turn}: ${e.met ? "met" : "unmet"}${e.reason ? " (" + e.reason + ")" : ""}`, e.met ? "" : "bad");
        break;
      case "run_finished":
        line("log", ts, `run finished: ${e.status}${e.reason ? " (" + e.reason + ")" : ""}`, e.status === "passed" ? "good" : "bad");
        // the final message is the last response's text, already shown with that response
        if (e.final_message && e.final_message !== lastText) line("messages", ts, `model: ${e.final_message}`);
        break;
      default:
        if (typeof e.type === "string" && e.type.includes("message")) line("messages", ts, short(e.text || e.message || e, 500));
        else line("log", ts, `${e.type}: ${short(e, 300)}`);
    }
  }

  /* ---- the end of the run ----------------------------------------------------------------- */
  /* The finished run's page is its report: reload into it while the console goes on serving (run-task on
     a terminal keeps it until Enter, `desktop-sandbox console` and tests until stopped). run-task without
     a terminal stops its console as the run ends: a reload would land on the browser's "can't be reached"
     page, so the page stays and says how the run ended and where its report is. Its listener closes
     within a moment of the run's end (uvicorn's 0.1 s tick), so the console must still answer after
     ENDED_RECHECK_MS before the page reloads. */
  const ENDED_RECHECK_MS = 1500;

  async function answers() {
    try {
      const resp = await fetch(base + "/state", { credentials: "same-origin", cache: "no-store" });
      return resp.ok;
    } catch (e) { return false; }
  }

  async function ended(status) {
    $("conn").textContent = "finished";
    for (const id of [...cards.keys()]) removeCard(id);
    applyState("finished", null, Number.MAX_SAFE_INTEGER);
    if (status) $("state").textContent = "finished: " + status;
    const note = $("ended");
    note.textContent = `The run ended${status ? ": " + status : ""}.`;
    note.hidden = false;
    if (await answers()) {
      await new Promise((resolve) => setTimeout(resolve, ENDED_RECHECK_MS));
      if (await answers()) { window.location.reload(); return; }
    }
    $("conn").textContent = "console stopped";
    note.textContent += " This console stopped with the run, so it cannot show the report here: " +
      `see it with "desktop-sandbox report runs/${runId} --html" (or your --runs-dir), ` +
      `or browse runs with "desktop-sandbox console".`;
  }

  /* ---- the socket ------------------------------------------------------------------------- */
  /* One WebSocket per page (controller.console.streams): text messages are the run's events, {event,
     id, data}, in order (the approvals snapshot and the state first, then every numbered event, then
     "end"); binary ones are frames of the live screen, each asked for by screen.js. A browser keeps
     only a handful of HTTP connections per host and a WebSocket is not one of them: any number of tabs
     leaves room for the POSTs that answer approvals. Closed before the run's end (the console restarted,
     the network), it reconnects after RECONNECT_MS from the last event number it saw. */
  const RECONNECT_MS = 2000;
  let lastSeq = 0;
  let over = false;

  function parse(text) { try { return JSON.parse(text); } catch (e) { return null; } }

  const EVENTS = {
    approvals: (d) => applySnapshot(d.snapshot),
    state: (d) => {
      applyState(d.state, d.screen, d.last_seq);
      if (d.last_action) window.DSScreen.showAction(d.last_action);
    },
    control: (d) => applyState(d.state, null, d.seq),
    action: (d) => window.DSScreen.showAction(d),
    record: (d) => addEntry(d.entry, d.text),
    error: (d) => { $("control-error").textContent = `${d.code}: ${d.message}`; },
  };

  function connect() {
    const url = new URL(`${base}/live?after=${lastSeq}`, location.href);
    url.protocol = location.protocol === "https:" ? "wss:" : "ws:";
    const ws = new WebSocket(url.href);
    ws.binaryType = "blob";
    ws.addEventListener("open", () => {
      $("conn").textContent = "live";
      window.DSScreen.attach((message) => { if (ws.readyState === WebSocket.OPEN) ws.send(JSON.stringify(message)); });
    });
    ws.addEventListener("message", (ev) => {
      if (typeof ev.data !== "string") { window.DSScreen.showFrame(ev.data); return; }
      const m = parse(ev.data);
      if (!m || typeof m.event !== "string" || !m.data || typeof m.data !== "object") return;
      if (typeof m.id === "number" && m.id > lastSeq) lastSeq = m.id;
      if (m.event === "end") {
        over = true;
        ws.close();
        ended(typeof m.data.status === "string" ? m.data.status : null);
      } else if (Object.prototype.hasOwnProperty.call(EVENTS, m.event)) EVENTS[m.event](m.data);
    });
    ws.addEventListener("close", () => {
      window.DSScreen.attach(null);
      if (over) return;
      $("conn").textContent = "reconnecting";
      setTimeout(connect, RECONNECT_MS);
    });
  }

  $("takeover").addEventListener("click", () => control("/takeover"));
  $("resume").addEventListener("click", () => control("/resume"));
  $("cancel").addEventListener("click", () => {
    if (window.confirm("Cancel this run? The model stops and pending approvals are withdrawn.")) control("/cancel");
  });
  window.DSScreen.init(runId, sendInput);
  setInterval(tick, 1000); /* the cards' countdown display */
  connect();
})();
