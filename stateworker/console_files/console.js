// The stateworker console: one page, no framework, no CDN. Every read and write is a call of
// the HTTP face (POST /v1/call/<function>, the bus's functions and roles); the overview, a
// key's history and the live tail are /v1/console/* (app/console.py). Text from the state is
// only ever set as textContent.
"use strict";

const $ = (id) => document.getElementById(id);
const PAGE = 100; // keys per page
const SAMPLES = 60; // points of the overview's graphs (one per poll)
const POLL_MS = 2000;
let session = { auth: "off", principal: null, writes: false, admin: true };
const keysView = { scope: null, after: null, pages: [], key: null };
let tailSource = null;
let overviewTimer = null;
let samples = []; // {t, calls, latency_us}

// ---- calls -----------------------------------------------------------------------------
class CallError extends Error {
  constructor(error, status) { super(`${error.code}: ${error.message}`); this.code = error.code; this.status = status; }
}

// Calls made before they are needed (the first page's, while the session loads), taken once.
const early = new Map();

function callEarly(fn, body) {
  early.set(fn + JSON.stringify(body), call(fn, body));
}

async function call(fn, body) {
  const key = fn + JSON.stringify(body);
  if (early.has(key)) { const made = early.get(key); early.delete(key); return made; }
  const response = await fetch(`/v1/call/${fn}`, {
    method: "POST", body: JSON.stringify(body), credentials: "same-origin",
    headers: { "Content-Type": "application/json", "X-Stateworker-Console": "1" },
  });
  const doc = await response.json();
  if (!doc.ok) throw new CallError(doc.error, response.status);
  return doc.result;
}

async function getJSON(path, options = {}) {
  const response = await fetch(path, { credentials: "same-origin", ...options });
  const doc = await response.json();
  if (!response.ok) throw new CallError(doc.error, response.status);
  return doc;
}

// ---- small DOM helpers -----------------------------------------------------------------
function el(tag, text, cls) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  if (cls) node.className = cls;
  return node;
}

function fillTable(id, rows, make) {
  const body = $(id).tBodies[0];
  body.replaceChildren(...rows.map((row) => {
    const tr = el("tr");
    for (const cell of make(row)) tr.append(cell instanceof Node ? cell : el("td", cell));
    return tr;
  }));
}

function num(value) { return el("td", value === null || value === undefined ? "-" : value, "num"); }
function pretty(value) { return JSON.stringify(value, null, 2); }
function shortJSON(value) { const t = JSON.stringify(value); return t.length > 120 ? t.slice(0, 117) + "..." : t; }

function showError(id, error) { $(id).textContent = error ? String(error.message || error) : ""; }

// ---- session and login -----------------------------------------------------------------
async function loadSession() {
  session = await getJSON("/v1/console/session");
  const who = $("who");
  who.replaceChildren();
  if (session.auth === "acl" && session.principal) {
    who.append(el("span", `principal ${session.principal}`));
    const out = el("button", "Log out");
    out.id = "logout";
    out.onclick = async () => { await getJSON("/v1/console/logout", { method: "POST" }); await start(); };
    who.append(out);
  } else {
    who.append(el("span", session.auth === "acl" ? "acl mode: not logged in" : "off mode: read-only"));
  }
}

$("login-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  try {
    await getJSON("/v1/console/login", {
      method: "POST", headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ principal: $("login-principal").value, password: $("login-password").value }),
    });
    $("login-password").value = "";
    showError("login-error", null);
    await start();
  } catch (error) { showError("login-error", error); }
});

// ---- routing ---------------------------------------------------------------------------
function where() {
  const parts = location.hash.replace(/^#\/?/, "").split("/").map(decodeURIComponent);
  return { view: ["overview", "keys", "tail"].includes(parts[0]) ? parts[0] : "overview", parts };
}

function route() {
  const { view, parts } = where();
  for (const name of ["overview", "keys", "tail"]) {
    $(name).hidden = name !== view;
    $(`nav-${name}`).classList.toggle("active", name === view);
  }
  clearInterval(overviewTimer);
  if (view === "overview") { loadOverview(); overviewTimer = setInterval(loadOverview, POLL_MS); }
  if (view === "keys") openKeys(parts[1] || null, parts[2] || null);
}

// ---- overview --------------------------------------------------------------------------
async function loadOverview() {
  try {
    const ov = await getJSON("/v1/console/overview");
    showError("ov-error", null);
    renderOverview(ov);
  } catch (error) { showError("ov-error", error); }
}

function renderOverview(ov) {
  const status = ov.status;
  $("ov-redis").textContent = status.reachable
    ? `${status.redis} · AOF ${status.aof ? "on" : "OFF"} · prefix ${status.prefix}` : `unreachable: ${status.error}`;
  // A Redis that lost the data PostgreSQL holds: every write is refused until a restore.
  showError("ov-error", status.store_lost
    ? `STORE LOST: writes are refused: ${status.store_lost}; recover with \`stateworker restore\`` : null);
  const services = Object.entries(status.services || {});
  fillTable("ov-services", services, ([name, s]) => [name, num(s.pending), num(s.consumers.length),
    num(s.stream_length), num(s.counters.calls), s.counters_as_of || "-"]);
  const state = (status.services || {}).state;
  if (state) sample(state.counters);
  fillTable("ov-triggers", ov.triggers, (t) => [t.id, t.function_id, t.service,
    t.scope || "(every scope)", num(t.lag_events), num(t.lag_ms), num(t.delivered),
    t.last_error ? `${t.last_error.ts} ${t.last_error.code}: ${t.last_error.message}` : "-", t.owner || "-"]);
  const dispatch = status.dispatch || {};
  $("ov-dispatch").textContent = `dispatch: ${dispatch.triggers || 0} triggers, counters ${JSON.stringify(dispatch.counters || {})}`;
  fillTable("ov-barriers", ov.barriers.barriers, (b) => [b.id, b.expect || "-",
    `${b.arrived} of ${b.expected}`, b.complete ? "complete" : "waiting"]);
  $("ov-barriers-note").textContent = ov.barriers.more ? "(the first 100 shown)" : "";
  const snapshot = status.snapshot || {};
  fillTable("ov-snapshot", snapshot.partitions || [], (p) => [p.partition, num(p.lag_events), num(p.lag_ms)]);
  $("ov-snapshot-note").textContent = snapshot.partitions ? (snapshot.last_error ? `last error: ${snapshot.last_error}` : "")
    : "no snapshot (STATEWORKER_POSTGRES_URL is not set)";
  fillTable("ov-namespaces", Object.entries(ov.namespaces), ([name, scopes]) => [name, scopes.join(", ")]);
  const acl = session.auth === "acl";
  $("ov-principals").hidden = $("ov-roles").hidden = !acl;
  $("ov-principals-note").textContent = acl ? "" : "off mode: no principals (every caller is trusted; docs/security.md)";
  fillTable("ov-principals", Object.entries(ov.principals), ([name, p]) => [name, (p.roles || []).join(", "), (p.act_as || []).join(", ") || "-"]);
  fillTable("ov-roles", Object.entries(ov.roles), ([name, r]) => [name, (r.allow || []).join(", "), (r.scopes || []).join(", "), r.read_only ? "yes" : "no"]);
}

function sample(counters) {
  samples.push({ t: performance.now(), calls: counters.calls || 0, latency: counters.latency_us_sum || 0 });
  samples = samples.slice(-SAMPLES - 1);
  const rates = [], latencies = [];
  for (let i = 1; i < samples.length; i++) {
    const a = samples[i - 1], b = samples[i], calls = b.calls - a.calls;
    rates.push(Math.max(0, calls / ((b.t - a.t) / 1000)));
    latencies.push(calls > 0 ? (b.latency - a.latency) / calls / 1000 : 0);
  }
  spark("ov-rate", rates);
  spark("ov-latency", latencies);
  const last = (list) => (list.length ? list[list.length - 1] : 0);
  $("ov-rate-text").textContent = `${last(rates).toFixed(1)} calls/s now, peak ${Math.max(0, ...rates).toFixed(1)}`;
  $("ov-latency-text").textContent = `${last(latencies).toFixed(2)} ms now`;
}

function spark(id, values) {
  const svg = $(id), top = Math.max(1e-9, ...values);
  const line = document.createElementNS("http://www.w3.org/2000/svg", "polyline");
  line.setAttribute("points", values.map((v, i) => `${(i / Math.max(1, SAMPLES - 1)) * 240},${46 - (v / top) * 44}`).join(" "));
  svg.replaceChildren(line);
}

// ---- keys ------------------------------------------------------------------------------
async function openKeys(scope, key) {
  showError("keys-error", null);
  try {
    if (!$("scopes").childElementCount) await loadScopes();
    if (scope !== keysView.scope) { keysView.scope = scope; keysView.pages = []; keysView.after = null; await loadEntries(); }
    for (const li of $("scopes").children) li.classList.toggle("picked", li.dataset.scope === scope);
    $("write-result").textContent = ""; // (a write's result stays while its entry is shown again)
    if (key) await openEntry(scope, key); else $("entry").hidden = true;
  } catch (error) { showError("keys-error", error); }
}

async function loadScopes() {
  let groups;
  try {
    ({ groups } = await call("state::list_groups", {}));
  } catch (error) { // (listing every scope needs a role on `*`: the scope can still be typed)
    const li = el("li", `scopes not listed: ${error.message}. Type a scope and press Enter.`, "muted");
    $("scopes").replaceChildren(li);
    return;
  }
  const filter = $("scope-filter").value;
  $("scopes").replaceChildren(...groups.filter((g) => g.includes(filter)).map((scope) => {
    const li = el("li", scope);
    li.dataset.scope = scope;
    li.onclick = () => { location.hash = `#/keys/${encodeURIComponent(scope)}`; };
    return li;
  }));
}

$("scope-filter").addEventListener("input", () => loadScopes().catch((e) => showError("keys-error", e)));
$("scope-filter").addEventListener("keydown", (event) => {
  if (event.key === "Enter" && $("scope-filter").value) location.hash = `#/keys/${encodeURIComponent($("scope-filter").value)}`;
});

async function loadEntries() {
  const scope = keysView.scope;
  $("scope-title").textContent = scope ? `Scope ${scope}` : "Pick a scope";
  if (!scope) { fillTable("entries", [], () => []); return; }
  const body = { scope, limit: PAGE };
  if (keysView.after) body.after = keysView.after;
  if ($("search-prefix").value) body.prefix = $("search-prefix").value;
  if ($("search-pattern").value) body.key_pattern = $("search-pattern").value;
  if ($("search-topic").value) body.topic_pattern = $("search-topic").value;
  const result = await call("state::list-entries", body);
  fillTable("entries", result.entries, (e) => [e.key, e.topic || "-", num(e.version), e.updated_at || "-", e.updated_by || "-"]);
  $("entries").tBodies[0].querySelectorAll("tr").forEach((tr, i) => {
    tr.className = "pick";
    tr.onclick = () => { location.hash = `#/keys/${encodeURIComponent(scope)}/${encodeURIComponent(result.entries[i].key)}`; };
  });
  keysView.next = result.next_after || null;
  $("page-next").disabled = !keysView.next;
  const count = result.entries.length;
  $("page-note").textContent = `${count} key${count === 1 ? "" : "s"} on page ${keysView.pages.length + 1}`;
  if (!document.body.dataset.firstKeysMs) document.body.dataset.firstKeysMs = performance.now().toFixed(1);
}

$("search").addEventListener("submit", (event) => {
  event.preventDefault();
  keysView.after = null; keysView.pages = [];
  loadEntries().catch((e) => showError("keys-error", e));
});
$("page-next").onclick = () => { keysView.pages.push(keysView.after); keysView.after = keysView.next; loadEntries().catch((e) => showError("keys-error", e)); };
$("page-first").onclick = () => { keysView.pages = []; keysView.after = null; loadEntries().catch((e) => showError("keys-error", e)); };

async function openEntry(scope, key) {
  keysView.key = key;
  const entry = await call("state::get-entry", { scope, key });
  $("entry").hidden = false;
  $("entry-title").textContent = `${scope} / ${key}`;
  const meta = $("entry-meta");
  meta.replaceChildren();
  for (const field of ["version", "hash", "topic", "created_at", "updated_at", "expires_at", "updated_by", "revision"]) {
    meta.append(el("dt", field), el("dd", entry.found ? (entry[field] ?? "-") : "-"));
  }
  $("entry-value").textContent = entry.found ? pretty(entry.value) : "(no such key)";
  $("write-value").value = entry.found ? pretty(entry.value) : "";
  $("write-topic").value = entry.found && entry.topic ? entry.topic : "";
  $("entry-write").hidden = !session.writes;
  const params = new URLSearchParams({ scope, key });
  const history = await getJSON(`/v1/console/history?${params}`);
  $("entry-history").replaceChildren(...history.events.map(renderChange));
}

function renderChange(event) {
  const li = el("li");
  li.append(el("div", `${event.ts} · ${event.event_type} · version ${event.version} · by ${event.by || "-"} · revision ${event.revision}`, "muted"));
  const diff = el("div", null, "diff");
  for (const [path, before, after] of jsonDiff(event.old_value, event.new_value)) {
    if (before !== undefined) diff.append(el("div", `- ${path || "/"}: ${before}`, "old"));
    if (after !== undefined) diff.append(el("div", `+ ${path || "/"}: ${after}`, "new"));
  }
  li.append(diff);
  return li;
}

// The leaves that differ between two JSON values: [pointer, old text, new text].
function jsonDiff(a, b, path = "", out = []) {
  const isObj = (v) => v !== null && typeof v === "object";
  if (isObj(a) && isObj(b) && Array.isArray(a) === Array.isArray(b)) {
    for (const k of new Set([...Object.keys(a), ...Object.keys(b)])) {
      const sub = `${path}/${String(k).replace(/~/g, "~0").replace(/\//g, "~1")}`;
      if (!(k in b)) out.push([sub, JSON.stringify(a[k]), undefined]);
      else if (!(k in a)) out.push([sub, undefined, JSON.stringify(b[k])]);
      else jsonDiff(a[k], b[k], sub, out);
    }
  } else if (JSON.stringify(a) !== JSON.stringify(b)) {
    out.push([path, a === null || a === undefined ? undefined : JSON.stringify(a), b === null || b === undefined ? undefined : JSON.stringify(b)]);
  }
  return out;
}

async function write(fn, body) {
  try {
    const result = await call(fn, body);
    $("write-result").className = "";
    $("write-result").textContent = `${fn}: done ${shortJSON(result)}`;
    await openEntry(keysView.scope, keysView.key);
  } catch (error) {
    $("write-result").className = "error";
    $("write-result").textContent = `${fn} refused: ${error.message}`;
  }
  $("write-result").scrollIntoView({ block: "center" }); // (what became of it, in view)
}

$("write-put").onclick = () => {
  let value;
  try { value = JSON.parse($("write-value").value); } catch (error) {
    $("write-result").className = "error"; $("write-result").textContent = `the value is not JSON: ${error.message}`; return;
  }
  const body = { scope: keysView.scope, key: keysView.key, value };
  if ($("write-topic").value) body.topic = $("write-topic").value;
  write("state::set", body);
};
$("write-retag").onclick = () => write("state::update-topic", { scope: keysView.scope, key: keysView.key, topic: $("write-topic").value || null });
$("write-delete").onclick = () => write("state::delete", { scope: keysView.scope, key: keysView.key });

// ---- live tail -------------------------------------------------------------------------
$("tail-form").addEventListener("submit", (event) => {
  event.preventDefault();
  stopTail();
  const params = new URLSearchParams();
  for (const name of ["scope", "key", "prefix"]) if ($(`tail-${name}`).value) params.set(name, $(`tail-${name}`).value);
  showError("tail-error", null);
  tailSource = new EventSource(`/v1/console/tail?${params}`);
  $("tail-state").textContent = "connecting";
  tailSource.onopen = () => { $("tail-state").textContent = "watching"; };
  tailSource.onerror = () => {
    $("tail-state").textContent = "disconnected";
    if (tailSource && tailSource.readyState === EventSource.CLOSED) {
      getJSON(`/v1/console/tail?${params}`).catch((error) => showError("tail-error", error));
    }
  };
  tailSource.onmessage = (message) => {
    const e = JSON.parse(message.data);
    const tr = el("tr");
    for (const cell of [e.revision, e.ts, e.event_type, e.scope, e.key, e.version, e.by || "-"]) tr.append(el("td", cell));
    tr.append(el("td", shortJSON(e.new_value), "value"));
    const body = $("tail-events").tBodies[0];
    body.prepend(tr);
    while (body.rows.length > 500) body.deleteRow(-1);
  };
});

function stopTail() {
  if (tailSource) { tailSource.close(); tailSource = null; $("tail-state").textContent = "stopped"; }
}
$("tail-stop").onclick = stopTail;

// ---- start -----------------------------------------------------------------------------
async function start() {
  const { view, parts } = where();
  if (view === "keys" && parts[1]) { // (refused in acl mode before a login: dropped then)
    callEarly("state::list_groups", {});
    callEarly("state::list-entries", { scope: parts[1], limit: PAGE });
    for (const made of early.values()) made.catch(() => {});
  }
  await loadSession();
  const needsLogin = session.auth === "acl" && !session.principal;
  $("login").hidden = !needsLogin;
  document.querySelector("nav").hidden = needsLogin;
  $("scopes").replaceChildren();
  keysView.scope = undefined;
  if (needsLogin) {
    early.clear();
    for (const name of ["overview", "keys", "tail"]) $(name).hidden = true;
    return;
  }
  route();
}

window.addEventListener("hashchange", route);
start();
