// The keys view: the scopes with their key counts (/v1/console/counts), a scope's keys
// (state::list-entries, or state::query when a value condition is given), the picked key's
// detail beside the list (console_entry.js) with its row marked.
"use strict";

const COUNTED = 500; // the scopes counted at once (the server's cap)

async function openKeys(scope, key) {
  showError("keys-error", null);
  try {
    if (!$("scopes").childElementCount) await loadScopes();
    if (scope !== keysView.scope) { keysView.scope = scope; keysView.pages = []; keysView.after = null; await loadEntries(); }
    for (const li of $("scopes").children) li.classList.toggle("picked", li.dataset.scope === scope);
    $("write-result").textContent = ""; // (a write's result stays while its entry is shown again)
    keysView.key = key;
    markPicked();
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
  const shown = groups.filter((g) => g.includes(filter));
  $("scopes").replaceChildren(...shown.map((scope) => {
    const li = el("li");
    li.append(el("span", scope), el("span", "", "count"));
    li.dataset.scope = scope;
    li.onclick = () => { location.hash = `#/keys/${encodeURIComponent(scope)}`; };
    return li;
  }));
  loadCounts(shown.slice(0, COUNTED)).catch(() => {}); // (the list stands without them)
}

// Each scope's keys, beside its name.
async function loadCounts(scopes) {
  if (!scopes.length) return;
  const params = new URLSearchParams();
  for (const scope of scopes) params.append("scope", scope);
  const counts = await getJSON(`/v1/console/counts?${params}`);
  for (const li of $("scopes").children) {
    const n = counts[li.dataset.scope];
    if (n !== undefined) li.lastChild.textContent = String(n);
  }
}

$("scope-filter").addEventListener("input", () => loadScopes().catch((e) => showError("keys-error", e)));
$("scope-filter").addEventListener("keydown", (event) => {
  if (event.key === "Enter" && $("scope-filter").value) location.hash = `#/keys/${encodeURIComponent($("scope-filter").value)}`;
});

// The value condition of the search form (state::query's `where`), or null without a pointer.
function valueCondition() {
  const pointer = $("search-pointer").value;
  if (!pointer) return null;
  const op = $("search-op").value, text = $("search-value").value;
  const item = { pointer: pointer === "/" ? "" : pointer, op };
  if (op === "exists") item.value = text !== "false";
  else {
    try { item.value = parseExact(text); } catch { item.value = text; } // (a bare word: a string)
  }
  return item;
}

async function loadEntries() {
  const scope = keysView.scope;
  $("scope-title").textContent = scope ? `Scope ${scope}` : "Pick a scope";
  if (!scope) { fillTable("entries", [], () => []); return; }
  const where = valueCondition();
  const body = { scope, limit: PAGE };
  if (keysView.after) body.after = keysView.after;
  if (where) body.where = [where];
  else {
    if ($("search-prefix").value) body.prefix = $("search-prefix").value;
    if ($("search-pattern").value) body.key_pattern = $("search-pattern").value;
    if ($("search-topic").value) body.topic_pattern = $("search-topic").value;
  }
  const result = await call(where ? "state::query" : "state::list-entries", body);
  const columns = (e) => where
    ? [e.key, clip(stringifyExact(e.value), 80), num(e.version), e.updated_at || "-"]
    : [e.key, e.topic || "-", num(e.version), e.updated_at || "-", e.updated_by || "-"];
  $("entries").tHead.rows[0].replaceChildren(...(where ? ["key", "value", "version", "updated"]
    : ["key", "topic", "version", "updated", "by"]).map((name) => el("th", name)));
  fillTable("entries", result.entries, columns);
  $("entries").tBodies[0].querySelectorAll("tr").forEach((tr, i) => {
    tr.className = "pick";
    tr.dataset.key = result.entries[i].key;
    tr.onclick = () => { location.hash = `#/keys/${encodeURIComponent(scope)}/${encodeURIComponent(result.entries[i].key)}`; };
  });
  markPicked();
  keysView.next = result.next_after || null;
  $("page-next").disabled = !keysView.next;
  const count = result.entries.length;
  // A query examines a bounded number of entries per call: a page may hold fewer matches.
  $("page-note").textContent = where
    ? `${count} match${count === 1 ? "" : "es"} on page ${keysView.pages.length + 1}${keysView.next ? " (more may follow: Next page)" : ""}`
    : `${count} key${count === 1 ? "" : "s"} on page ${keysView.pages.length + 1}`;
  if (!document.body.dataset.firstKeysMs) document.body.dataset.firstKeysMs = performance.now().toFixed(1);
}

// The open key's row marked (class and aria-selected), kept in view in the list's box.
function markPicked() {
  for (const tr of $("entries").tBodies[0].rows) {
    const picked = keysView.key !== null && tr.dataset.key === keysView.key;
    tr.classList.toggle("picked", picked);
    tr.setAttribute("aria-selected", String(picked));
  }
}

$("search").addEventListener("submit", (event) => {
  event.preventDefault();
  keysView.after = null; keysView.pages = [];
  loadEntries().catch((e) => showError("keys-error", e));
});
$("page-next").onclick = () => { keysView.pages.push(keysView.after); keysView.after = keysView.next; loadEntries().catch((e) => showError("keys-error", e)); };
$("page-first").onclick = () => { keysView.pages = []; keysView.after = null; loadEntries().catch((e) => showError("keys-error", e)); };
