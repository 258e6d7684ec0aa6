// The overview (/v1/console/overview, polled every POLL_MS): Redis, the rate graphs from the
// service's recent samples (app/console_reads.py Rates: the last minutes show at once), the
// services (a stalled one flagged), triggers, dispatch counters, barriers, snapshot, access.
"use strict";

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
  fillTable("ov-services", services, ([name, s]) => [name, health(s), num(s.pending),
    num(s.consumers.length), num(s.stream_length), age(s.oldest_unread_ms), num(s.counters.calls),
    s.counters_as_of || "-"]);
  $("ov-services").tBodies[0].querySelectorAll("tr").forEach((tr, i) => {
    tr.classList.toggle("stalled", Boolean(services[i][1].stalled));
  });
  rates(ov.rates || []);
  fillTable("ov-triggers", ov.triggers, (t) => [t.id, t.function_id, t.service,
    t.scope || "(every scope)", num(t.lag_events), num(t.lag_ms), num(t.delivered),
    t.last_error ? `${t.last_error.ts} ${t.last_error.code}: ${t.last_error.message}` : "-", t.owner || "-"]);
  const dispatch = status.dispatch || {};
  $("ov-dispatch").textContent = `dispatch: ${dispatch.triggers || 0} triggers, ${Object.keys(dispatch.replicas || {}).length} replicas`;
  fillTable("ov-counters", counterRows(dispatch.counters || {}), (row) => [row[0], num(row[1])]);
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

// A service's health cell: "ok", or STALLED with why (status.py `stalled`).
function health(service) {
  return service.stalled ? el("td", `STALLED: ${service.stalled}`, "bad") : el("td", "ok");
}

function age(ms) { return el("td", ms === null || ms === undefined ? "-" : `${(ms / 1000).toFixed(1)} s`, "num"); }

// Dispatch counters as rows, nested objects flattened ("delivered", "errors.timeout").
function counterRows(counters, path = "", rows = []) {
  for (const [name, value] of Object.entries(counters)) {
    const label = path ? `${path}.${name}` : name;
    if (value !== null && typeof value === "object") counterRows(value, label, rows);
    else rows.push([label, value]);
  }
  return rows;
}

// The calls per second and mean latency between the server's samples ([ms, calls, latency_us]).
function rates(samples) {
  const perSecond = [], latencies = [];
  for (let i = 1; i < samples.length; i++) {
    const [ta, ca, la] = samples[i - 1], [tb, cb, lb] = samples[i], calls = cb - ca;
    perSecond.push(tb > ta ? Math.max(0, calls / ((tb - ta) / 1000)) : 0);
    latencies.push(calls > 0 ? (lb - la) / calls / 1000 : 0);
  }
  spark("ov-rate", perSecond);
  spark("ov-latency", latencies);
  $("ov-rate").dataset.points = String(perSecond.length);
  const last = (list) => (list.length ? list[list.length - 1] : 0);
  const span = samples.length > 1 ? Math.round((samples[samples.length - 1][0] - samples[0][0]) / 1000) : 0;
  $("ov-rate-text").textContent = `${last(perSecond).toFixed(1)} calls/s now, peak ${Math.max(0, ...perSecond).toFixed(1)} (last ${span} s)`;
  $("ov-latency-text").textContent = `${last(latencies).toFixed(2)} ms now`;
}

function spark(id, values) {
  const svg = $(id), top = Math.max(1e-9, ...values);
  const line = document.createElementNS("http://www.w3.org/2000/svg", "polyline");
  line.setAttribute("points", values.map((v, i) => `${(i / Math.max(1, values.length - 1)) * 240},${46 - (v / top) * 44}`).join(" "));
  svg.replaceChildren(line);
}

