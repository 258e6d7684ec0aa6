// The live tail: /v1/console/tail's server-sent events, newest first (500 rows kept).
"use strict";

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
    const e = parseExact(message.data);
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
