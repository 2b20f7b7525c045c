// The operator console: pages over the gateway's control API (`/v1/*`), nothing else.
// Plain JavaScript embedded in the binary: no build step, no CDN (the machine may be offline).
// Every value from the gateway is put on the page as text (textContent), never as markup.
"use strict";

const TOKEN_KEY = "clawgate.console.token";
const PAGES = ["overview", "outbox", "inbox", "sessions", "leases"];
const STATUSES = ["pending", "sending", "committing", "sent", "failed", "unknown_after_send", "cancelled"];
const SVG_NS = "http://www.w3.org/2000/svg";
/** Bar labels that fit under a bar of the outcome histogram. */
const SHORT = { committing: "commit", unknown_after_send: "unknown", cancelled: "cancel" };

const $ = (id) => document.getElementById(id);

/** An answer of the control API that was not a success: its status and its `error`. */
class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

function token() {
  return sessionStorage.getItem(TOKEN_KEY);
}

async function api(path, method = "GET") {
  const current = token();
  if (!current) {
    showLogin();
    throw new ApiError(401, "no control token given yet");
  }
  let response;
  try {
    response = await fetch(path, {
      method,
      headers: { Authorization: "Bearer " + current, Accept: "application/json" },
      cache: "no-store",
    });
  } catch (e) {
    throw new ApiError(0, "the gateway did not answer (" + e.message + "): is it still running?");
  }
  if (!response.ok) {
    const error = new ApiError(response.status, await errorText(response));
    if (response.status === 401) tokenRefused(error);
    throw error;
  }
  return response.json();
}

/** The API's `{"error": ...}` text, else the HTTP status line. */
async function errorText(response) {
  try {
    const body = await response.json();
    if (body && typeof body.error === "string") return body.error;
  } catch (_) {
    // Not JSON: fall through to the status line.
  }
  return response.status + " " + response.statusText;
}

// ---- small DOM helpers -------------------------------------------------------------------

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "class") node.className = value;
    else if (key === "onclick") node.addEventListener("click", value);
    else node.setAttribute(key, value === true ? "" : String(value));
  }
  for (const child of children) {
    if (child === undefined || child === null) continue;
    node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

function svg(tag, attrs, ...children) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [key, value] of Object.entries(attrs || {})) node.setAttribute(key, String(value));
  for (const child of children) node.append(child instanceof Node ? child : String(child));
  return node;
}

function fillBody(table, rows) {
  table.tBodies[0].replaceChildren(...rows);
}

function when(ms) {
  return ms === undefined || ms === null ? "–" : new Date(ms).toLocaleString();
}

function clock(ms) {
  return new Date(ms).toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" });
}

function badge(status) {
  return el("span", { class: "status status-" + status }, status);
}

function fields(dl, pairs) {
  const items = [];
  for (const [name, value] of pairs) {
    if (value === undefined || value === null || value === "") continue;
    items.push(el("dt", {}, name), el("dd", {}, value));
  }
  dl.replaceChildren(...items);
}

function showError(what, error) {
  const box = $("error");
  box.textContent = what + ": " + (error && error.message ? error.message : String(error));
  box.hidden = false;
}

function clearError() {
  $("error").hidden = true;
  $("error").textContent = "";
}

/** Asks in a modal dialog; resolves true when the operator confirms. */
function confirmAction(title, text, yes) {
  const dialog = $("confirm");
  $("confirm-title").textContent = title;
  $("confirm-text").textContent = text;
  $("confirm-yes").textContent = yes;
  return new Promise((resolve) => {
    dialog.addEventListener("close", () => resolve(dialog.returnValue === "yes"), { once: true });
    dialog.returnValue = "";
    dialog.showModal();
    $("confirm-no").focus();
  });
}

// ---- the token ---------------------------------------------------------------------------

function showLogin(message) {
  stopEvents();
  for (const page of PAGES) $("page-" + page).hidden = true;
  $("nav").hidden = true;
  $("forget").hidden = true;
  $("login").hidden = false;
  const error = $("login-error");
  error.hidden = !message;
  error.textContent = message || "";
  $("token").focus();
}

function tokenRefused(error) {
  sessionStorage.removeItem(TOKEN_KEY);
  showLogin("The gateway refused this token (" + error.status + "): " + error.message);
}

async function login(event) {
  event.preventDefault();
  const given = $("token").value.trim();
  if (!given) return;
  sessionStorage.setItem(TOKEN_KEY, given);
  try {
    await api("/v1/status");
  } catch (error) {
    if (error.status !== 401) {
      sessionStorage.removeItem(TOKEN_KEY);
      showLogin("Could not check the token: " + error.message);
    }
    return;
  }
  $("token").value = "";
  start();
}

function forget() {
  sessionStorage.removeItem(TOKEN_KEY);
  showLogin();
}

// ---- live status (server-sent events read with fetch: EventSource cannot send a header) --

let events = null;
let lastStatus = null;

function stopEvents() {
  if (events) events.abort();
  events = null;
  setLive(false);
}

function setLive(on) {
  const live = $("live");
  live.textContent = on ? "live" : "not connected";
  live.classList.toggle("on", on);
}

async function runEvents() {
  stopEvents();
  const controller = new AbortController();
  events = controller;
  let delay = 1000;
  while (!controller.signal.aborted) {
    const current = token();
    if (!current) return;
    try {
      const response = await fetch("/v1/events", {
        headers: { Authorization: "Bearer " + current, Accept: "text/event-stream" },
        cache: "no-store",
        signal: controller.signal,
      });
      if (response.status === 401) {
        tokenRefused(new ApiError(401, await errorText(response)));
        return;
      }
      if (!response.ok || !response.body) {
        throw new ApiError(response.status, await errorText(response));
      }
      setLive(true);
      delay = 1000;
      await readEvents(response.body.getReader());
    } catch (error) {
      if (controller.signal.aborted) return;
    }
    setLive(false);
    await new Promise((resolve) => setTimeout(resolve, delay));
    delay = Math.min(delay * 2, 10000);
  }
}

async function readEvents(reader) {
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      dispatch(buffer.slice(0, cut));
      buffer = buffer.slice(cut + 2);
    }
  }
}

/** One server-sent event frame: `event:` and `data:` lines; `:` lines are keep-alives. */
function dispatch(frame) {
  let name = "message";
  const data = [];
  for (const line of frame.split("\n")) {
    if (line === "" || line.startsWith(":")) continue;
    const colon = line.indexOf(":");
    const field = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? "" : line.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    if (field === "event") name = value;
    else if (field === "data") data.push(value);
  }
  if (data.length === 0) return;
  const payload = JSON.parse(data.join("\n"));
  if (name === "status") renderStatus(payload);
  else if (name === "error") showError("Status", payload.error);
}

// ---- overview ----------------------------------------------------------------------------

let metricsAt = 0;

function renderStatus(view) {
  const previous = lastStatus;
  lastStatus = view;
  const g = view.gateway || {};
  const set = (id, value) => { $(id).textContent = value === undefined ? "–" : String(value); };
  set("turns-in-flight", g.turnsInFlight);
  set("turns-queued", g.turnsQueued);
  set("agents-live", g.agentSessionsLive);
  set("agents-in-use", g.agentSessionsInUse);
  set("turns-completed", g.turnsCompleted);
  set("turns-failed", g.turnsFailed);
  set("agent-auth-failures", g.agentAuthFailures);
  set("turn-deadlines", g.turnDeadlines);
  set("turns-cancelled", g.turnsCancelled);
  set("dead-letters", view.inboundDeadLettered);
  set("inbound-unfinished", view.inboundUnfinished);
  set("replies-streaming", view.repliesStreaming);
  set("open-leases", view.openLeases);
  set("sessions-count", view.sessions);
  fillBody($("channels"), (g.channels || []).map((c) =>
    el("tr", { "data-channel": c.name },
      el("td", {}, c.name), el("td", {}, c.kind), el("td", {}, c.account), el("td", {}, c.agent),
      el("td", { class: "wrap" }, c.description))));
  fillBody($("intents-by-status"), STATUSES.map((status) =>
    el("tr", { "data-status": status },
      el("td", {}, el("a", { href: "#outbox", "data-filter": status, onclick: () => { $("outbox-status").value = status; } }, badge(status))),
      el("td", { class: "num" }, String(view.intents[status] || 0)))));
  $("gateway-meta").textContent = "Gateway pid " + (g.pid || "–") + " at " + (g.url || "–") +
    ", up since " + when(g.startedAt) + "; state " + view.stateDir + ", schema " +
    view.schemaVersion + " (this build writes " + view.supportedSchemaVersion + ").";

  // What changed decides what else to read again (pages stay live without polling each).
  const changed = (pick) => !previous || JSON.stringify(pick(previous)) !== JSON.stringify(pick(view));
  const page = currentPage();
  if (page === "overview" && (changed((v) => v.intents) || Date.now() - metricsAt > 30000)) {
    loadMetrics().catch((e) => showError("Charts", e));
  }
  if (page === "outbox" && changed((v) => v.intents)) {
    loadOutbox().catch((e) => showError("Outbox", e));
    if (openIntent) showIntent(openIntent, false).catch((e) => showError("Send intent", e));
  }
  if (page === "inbox" && changed((v) => [v.inboundDeadLettered, v.inboundUnfinished])) {
    loadInbox().catch((e) => showError("Inbox", e));
  }
  if (page === "leases" && changed((v) => [v.openLeases, v.gateway && v.gateway.agentSessionsLive])) {
    loadLeases().catch((e) => showError("Leases", e));
  }
}

async function loadOverview() {
  if (lastStatus) renderStatus(lastStatus);
  await loadMetrics();
}

async function loadMetrics() {
  metricsAt = Date.now();
  const m = await api("/v1/metrics?minutes=60");
  const xs = m.minutes.map((minute) => minute.start);
  lineChart($("chart-throughput"), "throughput", xs, [
    { name: "inbound", cls: "s-inbound", values: m.minutes.map((x) => x.inbound) },
    { name: "sent", cls: "s-sent", values: m.minutes.map((x) => x.sent) },
  ], (v) => String(Math.round(v)), 2);
  lineChart($("chart-latency"), "latency", xs, [
    { name: "median", cls: "s-p50", values: m.minutes.map((x) => x.latencyP50Ms === undefined ? null : x.latencyP50Ms / 1000) },
    { name: "slowest", cls: "s-max", values: m.minutes.map((x) => x.latencyMaxMs === undefined ? null : x.latencyMaxMs / 1000) },
  ], (v) => v.toFixed(v < 10 ? 1 : 0) + " s");
  barChart($("chart-outcomes"), "outcomes", STATUSES.map((status) => [status, m.outcomes[status] || 0]));
  const kinds = Object.entries(m.failureKinds || {});
  $("failure-kinds").textContent = (kinds.length
    ? "Failure classes of failed and unknown intents: " + kinds.map(([k, n]) => k + " " + n).join(", ") + "."
    : "No failed or unknown intents in the hour.") +
    (m.truncated ? " Only the first 10 000 records of the hour are counted." : "");
}

function niceMax(max) {
  if (max <= 0) return 1;
  const step = Math.pow(10, Math.floor(Math.log10(max)));
  for (const f of [1, 2, 5, 10]) if (f * step >= max) return f * step;
  return 10 * step;
}

/** A line chart of per-minute series (null: no value that minute), as inline SVG. */
function lineChart(box, id, xs, series, format, minTop = 0) {
  const W = 420, H = 190, L = 46, R = 8, T = 10, B = 22;
  const all = series.flatMap((s) => s.values.filter((v) => v !== null));
  // Counts get whole-number grid lines (a top of 1 would label its middle line "1" too).
  const top = niceMax(Math.max(minTop, ...all));
  const x = (i) => L + (xs.length <= 1 ? 0 : (i * (W - L - R)) / (xs.length - 1));
  const y = (v) => T + (H - T - B) * (1 - v / top);
  const summary = series.map((s) => {
    const values = s.values.filter((v) => v !== null);
    const total = values.reduce((a, b) => a + b, 0);
    return s.name + ": " + (values.length ? (id === "throughput" ? total + " in the hour" : "up to " + format(Math.max(...values))) : "none");
  }).join("; ");
  const chart = svg("svg", { viewBox: `0 0 ${W} ${H}`, class: "chart", role: "img", "aria-labelledby": `${id}-title ${id}-desc` },
    svg("desc", { id: `${id}-desc` }, summary));
  for (const f of [0, 0.5, 1]) {
    chart.append(svg("line", { class: "grid", x1: L, x2: W - R, y1: y(top * f), y2: y(top * f) }));
    chart.append(svg("text", { class: "axis", x: L - 6, y: y(top * f) + 4, "text-anchor": "end" }, format(top * f)));
  }
  if (xs.length) {
    for (const i of [0, Math.floor((xs.length - 1) / 2), xs.length - 1]) {
      chart.append(svg("text", { class: "axis", x: x(i), y: H - 6, "text-anchor": i === 0 ? "start" : i === xs.length - 1 ? "end" : "middle" }, clock(xs[i])));
    }
  }
  for (const s of series) {
    let d = "";
    let pen = false;
    s.values.forEach((v, i) => {
      if (v === null) { pen = false; return; }
      d += (pen ? " L" : " M") + x(i).toFixed(1) + " " + y(v).toFixed(1);
      pen = true;
    });
    // A lone point still shows: a dot where a line would start.
    s.values.forEach((v, i) => {
      if (v !== null && (i === 0 || s.values[i - 1] === null) && (i === s.values.length - 1 || s.values[i + 1] === null)) {
        chart.append(svg("circle", { class: "dot " + s.cls, cx: x(i), cy: y(v), r: 3.5 }));
      }
    });
    if (d) chart.append(svg("path", { class: "series " + s.cls, d: d.trim(), "data-series": s.name }));
  }
  const legend = el("ul", { class: "legend" }, ...series.map((s) =>
    el("li", {}, el("span", { class: "swatch " + s.cls, "aria-hidden": "true" }), s.name)));
  box.replaceChildren(chart, legend);
}

/** A histogram: one bar per [label, count], as inline SVG. */
function barChart(box, id, bars) {
  const W = 420, H = 190, L = 6, R = 6, T = 16, B = 22;
  const top = niceMax(Math.max(0, ...bars.map(([, n]) => n)));
  const slot = (W - L - R) / bars.length;
  const chart = svg("svg", { viewBox: `0 0 ${W} ${H}`, class: "chart", role: "img", "aria-labelledby": `${id}-title ${id}-desc` },
    svg("desc", { id: `${id}-desc` }, bars.map(([label, n]) => label + " " + n).join(", ")));
  chart.append(svg("line", { class: "grid", x1: L, x2: W - R, y1: H - B, y2: H - B }));
  bars.forEach(([label, n], i) => {
    const h = ((H - T - B) * n) / top;
    const x = L + i * slot + slot * 0.15;
    chart.append(svg("rect", { class: "bar bar-" + label, x, y: H - B - h, width: slot * 0.7, height: Math.max(h, 0), "data-label": label, "data-count": n }));
    chart.append(svg("text", { class: "value", x: x + slot * 0.35, y: H - B - h - 4, "text-anchor": "middle" }, String(n)));
    chart.append(svg("text", { class: "axis", x: x + slot * 0.35, y: H - B + 14, "text-anchor": "middle" }, SHORT[label] || label));
  });
  box.replaceChildren(chart);
}

// ---- outbox ------------------------------------------------------------------------------

let openIntent = null;

async function loadOutbox() {
  const params = new URLSearchParams({ limit: "500" });
  const status = $("outbox-status").value;
  const channel = $("outbox-channel").value.trim();
  if (status) params.set("status", status);
  if (channel) params.set("channel", channel);
  const list = await api("/v1/outbox?" + params);
  fillBody($("outbox-table"), list.intents.map((i) =>
    el("tr", { "data-id": i.id, "data-status": i.status, class: i.id === openIntent ? "selected" : "" },
      el("td", {}, el("button", { type: "button", class: "link", onclick: () => { location.hash = "#outbox/" + encodeURIComponent(i.id); } }, i.id)),
      el("td", {}, badge(i.status)),
      el("td", {}, i.channel),
      el("td", { class: "wrap" }, i.target),
      el("td", { class: "num" }, String(i.attempt)),
      el("td", { class: "wrap" }, i.failureKind ? i.failureKind + (i.failureMessage ? ": " + i.failureMessage : "") : ""),
      el("td", {}, when(i.updatedAt)),
      el("td", { class: "wrap" }, i.preview))));
  $("outbox-more").hidden = !list.more;
}

async function showIntent(id, focus) {
  if (openIntent !== id) $("intent-action-result").textContent = "";
  openIntent = id;
  const intent = await api("/v1/outbox/" + encodeURIComponent(id));
  $("intent-detail").hidden = false;
  $("intent-id").textContent = intent.id;
  for (const row of $("outbox-table").tBodies[0].rows) row.classList.toggle("selected", row.dataset.id === id);
  fields($("intent-fields"), [
    ["Status", badge(intent.status)],
    ["Channel", intent.channel + (intent.accountId ? " (account " + intent.accountId + ")" : "")],
    ["Conversation", intent.message && intent.message.target ? intent.message.target.id : ""],
    ["Idempotency key", intent.idempotencyKey],
    ["Send attempts", String(intent.attempt)],
    ["Reconciliations", intent.reconciliations
      ? intent.reconciliations + " (the platform was asked about this unknown outcome; no answer settled it)"
      : "none asked"],
    ["Live preview", livePreview(intent.liveState)],
    ["Next attempt", intent.nextAttemptAt ? when(intent.nextAttemptAt) : ""],
    ["Expires", intent.expiresAt ? when(intent.expiresAt) : ""],
    ["Created", when(intent.createdAt)],
    ["Updated", when(intent.updatedAt)],
  ]);
  const f = intent.failure;
  fields($("intent-failure"), f ? [
    ["Class", f.kind],
    ["Reason", f.reason],
    ["Message", f.message],
    ["Platform code", f.platformCode],
    ["Retry after", f.retryAfterMs ? f.retryAfterMs + " ms" : ""],
    ["At", when(f.at)],
  ] : [["Failure", "none"]]);
  const parts = [];
  for (const [label, receipt] of [["committed", intent.receipt], ["partial", intent.partialReceipt]]) {
    for (const p of (receipt && receipt.parts) || []) {
      parts.push(el("tr", {}, el("td", {}, label), el("td", { class: "num" }, String(p.index)),
        el("td", {}, p.kind), el("td", { class: "wrap" }, p.platformMessageId), el("td", {}, p.threadId || "")));
    }
  }
  fillBody($("intent-receipt"), parts.length ? parts : [el("tr", {}, el("td", { colspan: 5 }, "No unit has a receipt yet."))]);
  const delivered = new Set(parts.map((row) => row.cells[1].textContent));
  const units = (intent.batch && intent.batch.units) || [];
  fillBody($("intent-units"), units.length ? units.map((u) =>
    el("tr", {}, el("td", { class: "num" }, String(u.index)), el("td", {}, u.kind),
      el("td", {}, delivered.has(String(u.index)) ? "yes" : "no"),
      el("td", { class: "wrap" }, (u.payload && typeof u.payload.text === "string") ? u.payload.text : ""))) :
    [el("tr", {}, el("td", { colspan: 4 }, "Not rendered yet."))]);
  $("intent-json").textContent = JSON.stringify(intent, null, 2);
  $("intent-retry").disabled = !["failed", "unknown_after_send"].includes(intent.status);
  $("intent-cancel").disabled = !["pending", "failed", "unknown_after_send"].includes(intent.status);
  $("intent-retry").dataset.status = intent.status;
  if (focus) $("intent-title").focus();
}

/** A streamed reply's preview: its mode and the platform message that shows it. */
function livePreview(state) {
  if (!state) return "";
  const receipt = state.receipt || {};
  const shown = receipt.primaryPlatformMessageId || (receipt.platformMessageIds || [])[0];
  return (state.mode || "live") + (shown ? ", shown as platform message " + shown : ", not shown yet");
}

async function intentAction(action) {
  const id = openIntent;
  const status = $("intent-retry").dataset.status;
  const [title, text, yes] = action === "retry"
    ? ["Retry this send?", status === "unknown_after_send"
      ? "A retry may duplicate the message: the earlier outcome was unknown, so units without a receipt are sent again, which duplicates them on a platform without reconciliation if they had landed. Check the conversation first."
      : "The intent goes back to pending, due now, with a fresh attempt budget and time-to-live.", "Retry"]
    : ["Cancel this send?", status === "unknown_after_send"
      ? "Cancelling is final. The outcome was unknown: the platform may show the message anyway."
      : "Cancelling is final: the message will not be sent.", "Cancel the send"];
  if (!(await confirmAction(title, text, yes))) return;
  const result = $("intent-action-result");
  try {
    const done = await api("/v1/outbox/" + encodeURIComponent(id) + "/" + action, "POST");
    result.textContent = (action === "retry" ? "Retried" : "Cancelled") + ": " + done.previousStatus +
      " → " + done.intent.status + "." + (done.warning ? " Warning: " + done.warning : "");
    result.className = done.warning ? "error" : "";
  } catch (error) {
    result.textContent = "Could not " + action + " (" + error.status + "): " + error.message;
    result.className = "error";
  }
  await Promise.all([showIntent(id, false), loadOutbox()]);
}

// ---- inbox -------------------------------------------------------------------------------

async function loadInbox() {
  const params = new URLSearchParams({ limit: "500" });
  const status = $("inbox-status").value;
  if (status) params.set("status", status);
  const list = await api("/v1/inbox?" + params);
  fillBody($("inbox-table"), list.records.map((r) =>
    el("tr", { "data-event": r.eventId, "data-status": r.status },
      el("td", {}, r.channel + (r.accountId && r.accountId !== "default" ? " / " + r.accountId : "")),
      el("td", { class: "wrap" }, r.eventId),
      el("td", { class: "wrap" }, r.conversation || ""),
      el("td", {}, badge(r.status)),
      el("td", { class: "num" }, String(r.attempts)),
      el("td", { class: "wrap last-error" }, r.lastError || ""),
      el("td", {}, when(r.receivedAt)),
      el("td", { class: "wrap" }, r.preview))));
  $("inbox-empty").hidden = list.records.length > 0;
  $("inbox-more").hidden = !list.more;
}

// ---- sessions ----------------------------------------------------------------------------

let openSession = null;
let sessionBusy = false;

async function loadSessions(key) {
  const list = await api("/v1/sessions");
  fillBody($("sessions-table"), list.sessions.map((s) =>
    el("tr", { "data-key": s.key, class: s.key === key ? "selected" : "" },
      el("td", {}, el("button", { type: "button", class: "link", onclick: () => { location.hash = "#sessions/" + encodeURIComponent(s.key); } }, s.key)),
      el("td", {}, s.agentId),
      el("td", { class: "num" }, String(s.stateVersion || 0)),
      el("td", {}, s.label || ""),
      el("td", {}, when(s.updatedAt)))));
  if (key) await showSession(key);
  else { openSession = null; $("session-detail").hidden = true; }
}

async function showSession(key) {
  if (openSession !== key) {
    $("session-action-result").textContent = "";
    $("session-action-result").className = "";
  }
  openSession = key;
  const path = "/v1/sessions/" + encodeURIComponent(key);
  const [status, history, leases, watchers] = await Promise.all([
    api(path), api(path + "/history?limit=100"), api("/v1/leases?limit=1000"), api(path + "/watchers"),
  ]);
  $("session-detail").hidden = false;
  $("session-key").textContent = status.sessionKey;
  fields($("session-fields"), [["Agent", status.agentId], ["State version", String(status.stateVersion)]]);
  fillBody($("session-log"), history.events.slice().reverse().map((e) =>
    el("tr", {}, el("td", { class: "num" }, String(e.sequence)), el("td", {}, e.kind),
      el("td", {}, e.actorType + (e.actorId ? " " + e.actorId : "")), el("td", { class: "wrap" }, e.summary),
      el("td", {}, e.outcome || ""), el("td", {}, when(e.createdAt)))));
  $("session-log-note").textContent = (history.events.length ? "" : "No state changes retained. ") +
    (history.truncated ? "Older retained changes exist. " : "") +
    (history.historyGap ? "Older history was removed by retention." : "");
  const watches = watchers.watchedBy.concat(watchers.watching);
  fillBody($("session-watchers"), watches.length ? watches.map((w) =>
    el("tr", { "data-watcher": w.watcher, "data-target": w.target },
      el("td", { class: "wrap" }, w.watcher), el("td", { class: "wrap" }, w.target), el("td", {}, w.source),
      el("td", { class: "num" }, String(w.ackedVersion)),
      el("td", { class: "pending" }, w.targetDeletedBy ? "target deleted by " + w.targetDeletedBy
        : w.pendingNoticeVersion !== undefined ? "up to version " + w.pendingNoticeVersion : "none"),
      el("td", {}, when(w.updatedAt)))) :
    [el("tr", {}, el("td", { colspan: 6 }, "No session watches this one, and it watches none."))]);
  const own = leases.leases.filter((l) => l.sessionKey === key);
  fillBody($("session-leases"), own.length ? own.map((l) =>
    el("tr", { "data-lease": l.leaseId, "data-state": l.state },
      el("td", {}, l.leaseId), el("td", {}, badge(l.state)), el("td", { class: "num" }, l.rootPid ? String(l.rootPid) : "–"),
      el("td", {}, when(l.startedAt)), el("td", {}, l.endedAt ? when(l.endedAt) : ""),
      el("td", { class: "wrap" }, stderrTail(l.stderrTail)))) :
    [el("tr", {}, el("td", { colspan: 6 }, "No agent process lease."))]);
}

/** "Cancel turn" (the running turn ends, the agent session stays) or "Close session" (the
 *  agent session ends: the next message begins a fresh one), then the session read again. */
async function sessionAction(action) {
  const key = openSession;
  if (!key || sessionBusy) return;
  if (action === "close" && !(await confirmAction("Close this agent session?",
    "The agent session is closed (a running turn is cancelled first) and its process ended. The next message in this conversation begins a fresh agent session, without the agent's memory of the conversation so far.",
    "Close the session"))) return;
  const result = $("session-action-result");
  sessionBusy = true;
  try {
    const done = await api("/v1/sessions/" + encodeURIComponent(key) + "/" + action, "POST");
    // Said from the gateway's answer (what it did), not from the button pressed.
    result.textContent = done.action !== "close"
      ? (done.turnWasRunning ? "The running turn was cancelled." : "No turn was running.")
      : (done.turnWasRunning ? "The running turn was cancelled and the agent session closed" : "The agent session was closed") +
        "; the next message begins a fresh one.";
    result.className = "";
  } catch (error) {
    result.textContent = "Could not " + (action === "cancel" ? "cancel the turn" : "close the session") +
      " (" + error.status + "): " + error.message;
    result.className = "error";
  } finally {
    sessionBusy = false;
  }
  if (openSession === key) await showSession(key);
}

// ---- leases ------------------------------------------------------------------------------

async function loadLeases() {
  const params = new URLSearchParams({ limit: "1000" });
  const state = $("leases-state").value;
  if (state) params.set("state", state);
  const list = await api("/v1/leases?" + params);
  fillBody($("leases-table"), list.leases.map((l) =>
    el("tr", { "data-lease": l.leaseId, "data-state": l.state, "data-pid": l.rootPid || "" },
      el("td", { class: "wrap" }, l.leaseId),
      el("td", {}, badge(l.state)),
      el("td", { class: "wrap" }, el("a", { href: "#sessions/" + encodeURIComponent(l.sessionKey) }, l.sessionKey)),
      el("td", { class: "num pid" }, l.rootPid ? String(l.rootPid) : "–"),
      el("td", { class: "num" }, l.processGroupId ? String(l.processGroupId) : "–"),
      el("td", { class: "wrap evidence" }, [
        l.rootStartTime !== undefined ? "start " + l.rootStartTime : null,
        l.bootId ? "boot " + l.bootId.slice(0, 8) : null,
        l.commandHash ? "cmd " + l.commandHash.slice(0, 12) : null,
      ].filter(Boolean).join(", ")),
      el("td", {}, when(l.startedAt)),
      el("td", {}, l.endedAt ? when(l.endedAt) : ""),
      el("td", {}, (l.survivors || []).map((s) => s.pid).join(", ")),
      el("td", { class: "wrap" }, stderrTail(l.stderrTail)))));
  $("leases-more").hidden = !list.more;
}

/** A lease's last agent stderr lines (secrets masked by the gateway), folded; as text only. */
function stderrTail(lines) {
  if (!Array.isArray(lines) || lines.length === 0) return null;
  return el("details", { class: "stderr" },
    el("summary", {}, "stderr (" + lines.length + (lines.length === 1 ? " line)" : " lines)")),
    el("pre", {}, lines.join("\n")));
}

async function reap() {
  const ok = await confirmAction("Reap orphaned agent processes?",
    "Ends the processes of unfinished leases that no live session of this gateway owns — only processes verified as this instance's (start time, boot, command) — then removes finished leases past retention. Agents serving a session are left alone.",
    "Reap");
  if (!ok) return;
  const summary = await api("/v1/leases/reap", "POST");
  const items = summary.outcomes.map((o) => el("li", {}, o.leaseId + ": " + o.result + (o.detail ? " (" + o.detail + ")" : "")));
  items.push(el("li", {}, summary.pruned + " finished lease(s) removed by retention."));
  if (summary.outcomes.length === 0) items.unshift(el("li", {}, "No orphaned lease: nothing was signalled."));
  $("reap-outcomes").replaceChildren(...items);
  $("reap-result").hidden = false;
  $("reap-title").focus();
  await loadLeases();
}

// ---- pages -------------------------------------------------------------------------------

function currentPage() {
  const name = location.hash.slice(1).split("/")[0];
  return PAGES.includes(name) ? name : "overview";
}

async function route(focus) {
  if (!token()) {
    showLogin();
    return;
  }
  const [, ...rest] = location.hash.slice(1).split("/");
  const arg = rest.length ? decodeURIComponent(rest.join("/")) : null;
  const page = currentPage();
  $("login").hidden = true;
  $("nav").hidden = false;
  $("forget").hidden = false;
  for (const name of PAGES) $("page-" + name).hidden = name !== page;
  for (const link of document.querySelectorAll("#nav a")) {
    if (link.dataset.page === page) link.setAttribute("aria-current", "page");
    else link.removeAttribute("aria-current");
  }
  document.title = page[0].toUpperCase() + page.slice(1) + " · clawgate console";
  try {
    clearError();
    if (page === "overview") await loadOverview();
    if (page === "outbox") {
      await loadOutbox();
      if (arg) await showIntent(arg, focus);
      else { openIntent = null; $("intent-detail").hidden = true; }
    }
    if (page === "inbox") await loadInbox();
    if (page === "sessions") await loadSessions(arg);
    if (page === "leases") await loadLeases();
    if (focus && !arg) $(page + "-title").focus();
  } catch (error) {
    if (error.status !== 401) showError(page[0].toUpperCase() + page.slice(1), error);
  }
}

function start() {
  route(false);
  runEvents();
}

document.addEventListener("DOMContentLoaded", () => {
  $("login-form").addEventListener("submit", login);
  $("forget").addEventListener("click", forget);
  $("outbox-filter").addEventListener("submit", (e) => { e.preventDefault(); loadOutbox().catch((x) => showError("Outbox", x)); });
  $("inbox-filter").addEventListener("submit", (e) => { e.preventDefault(); loadInbox().catch((x) => showError("Inbox", x)); });
  $("leases-filter").addEventListener("submit", (e) => { e.preventDefault(); loadLeases().catch((x) => showError("Leases", x)); });
  $("leases-reap").addEventListener("click", () => reap().catch((x) => showError("Reap", x)));
  $("sessions-refresh").addEventListener("click", () => route(false));
  $("intent-retry").addEventListener("click", () => intentAction("retry").catch((x) => showError("Retry", x)));
  $("intent-cancel").addEventListener("click", () => intentAction("cancel").catch((x) => showError("Cancel", x)));
  $("session-cancel").addEventListener("click", () => sessionAction("cancel").catch((x) => showError("Cancel turn", x)));
  $("session-close").addEventListener("click", () => sessionAction("close").catch((x) => showError("Close session", x)));
  window.addEventListener("hashchange", () => route(true));
  if (token()) start();
  else showLogin();
});
