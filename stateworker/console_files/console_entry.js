// A key's detail, beside the list: its metadata, its value (exact digits; a large one folded
// with its size and a download), its recent changes as diffs, and the writes a caller may
// make (acl: its roles decide; off mode: on a loopback bind only): put, update ops, TTL,
// retag, delete.
"use strict";

const FOLD_BYTES = 16 * 1024; // a value larger than this is folded
const FOLD_SHOWN = 4096; // ... to its first this many characters
const DIFF_TEXT = 400; // a diff line's text at most
let downloadUrl = null; // the folded value's Blob URL (revoked when another entry opens)

async function openEntry(scope, key) {
  const entry = await call("state::get-entry", { scope, key });
  if (keysView.key !== key) return; // (another row was picked meanwhile)
  $("entry").hidden = false;
  $("entry-title").textContent = `${scope} / ${key}`;
  const meta = $("entry-meta");
  meta.replaceChildren();
  for (const field of ["version", "hash", "topic", "created_at", "updated_at", "expires_at", "updated_by", "revision"]) {
    meta.append(el("dt", field), el("dd", entry.found ? (entry[field] ?? "-") : "-"));
  }
  showValue(entry.found ? entry.value : undefined, key);
  $("write-value").value = entry.found ? pretty(entry.value) : "";
  $("write-topic").value = entry.found && entry.topic ? entry.topic : "";
  $("entry-write").hidden = !session.writes;
  const params = new URLSearchParams({ scope, key });
  const history = await getJSON(`/v1/console/history?${params}`, {}, parseExact);
  $("entry-history").replaceChildren(...history.events.map(renderChange));
}

// The value, or its first FOLD_SHOWN characters with its size, a download and "Show all".
function showValue(value, key) {
  if (downloadUrl) { URL.revokeObjectURL(downloadUrl); downloadUrl = null; }
  const fold = $("entry-fold");
  if (value === undefined) { $("entry-value").textContent = "(no such key)"; fold.hidden = true; return; }
  const compact = stringifyExact(value), size = new TextEncoder().encode(compact).length;
  const text = pretty(value);
  if (size <= FOLD_BYTES) { $("entry-value").textContent = text; fold.hidden = true; return; }
  $("entry-value").textContent = text.slice(0, FOLD_SHOWN) + "\n...";
  downloadUrl = URL.createObjectURL(new Blob([compact], { type: "application/json" }));
  const link = el("a", "download");
  link.id = "entry-download";
  link.href = downloadUrl;
  link.download = `${key}.json`;
  const all = el("button", "Show all");
  all.type = "button";
  all.onclick = () => { $("entry-value").textContent = text; fold.hidden = true; };
  fold.replaceChildren(el("span", `${sizeText(size)} (${size} bytes): the first ${sizeText(FOLD_SHOWN)} shown · `), link, all);
  fold.hidden = false;
}

function renderChange(event) {
  const li = el("li");
  li.append(el("div", `${event.ts} · ${event.event_type} · version ${event.version} · by ${event.by || "-"} · revision ${event.revision}`, "muted"));
  const diff = el("div", null, "diff");
  const changes = jsonDiff(event.old_value, event.new_value);
  for (const [path, before, after] of changes.slice(0, 50)) {
    if (before !== undefined) diff.append(el("div", clip(`- ${path || "/"}: ${before}`, DIFF_TEXT), "old"));
    if (after !== undefined) diff.append(el("div", clip(`+ ${path || "/"}: ${after}`, DIFF_TEXT), "new"));
  }
  if (changes.length > 50) diff.append(el("div", `(${changes.length - 50} more changes)`, "muted"));
  li.append(diff);
  return li;
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
  $("write-result").scrollIntoView({ block: "nearest" }); // (what became of it, in view)
}

// A field's JSON (exact digits), or null after saying why it is not JSON.
function jsonOf(id, what) {
  try { return parseExact($(id).value); } catch (error) {
    $("write-result").className = "error"; $("write-result").textContent = `${what} is not JSON: ${error.message}`;
    return null;
  }
}

// The TTL field (ms; empty: none), or undefined after saying why it is not one.
function ttl(body) {
  const text = $("write-ttl").value.trim();
  if (!text) return body;
  if (!/^[1-9]\d*$/.test(text)) {
    $("write-result").className = "error"; $("write-result").textContent = "the TTL is a whole number of ms";
    return undefined;
  }
  return { ...body, ttl_ms: Number(text) };
}

$("write-put").onclick = () => {
  const value = jsonOf("write-value", "the value");
  if (value === null && $("write-value").value.trim() !== "null") return;
  const body = ttl({ scope: keysView.scope, key: keysView.key, value });
  if (!body) return;
  if ($("write-topic").value) body.topic = $("write-topic").value;
  write("state::set", body);
};
$("write-update").onclick = () => {
  const ops = jsonOf("write-ops", "the ops");
  if (ops === null) return;
  const body = ttl({ scope: keysView.scope, key: keysView.key, ops });
  if (body) write("state::update", body);
};
$("write-retag").onclick = () => write("state::update-topic", { scope: keysView.scope, key: keysView.key, topic: $("write-topic").value || null });
$("write-delete").onclick = () => write("state::delete", { scope: keysView.scope, key: keysView.key });
