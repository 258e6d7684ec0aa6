// The stateworker console: one page, no framework, no CDN. Every read and write is a call of
// the HTTP face (POST /v1/call/<function>, the bus's functions and roles); the overview, a
// key's history, scope counts and the live tail are /v1/console/* (app/console.py). Text from
// the state is only ever set as textContent. This file holds the calls, the session and the
// routing; console_json.js the exact JSON, console_overview.js, console_keys.js and
// console_tail.js the views (the page loads them all before start() runs).
"use strict";

const $ = (id) => document.getElementById(id);
const PAGE = 200; // keys per page (the list scrolls in its own box, beside the detail)
const POLL_MS = 2000;
let session = { auth: "off", principal: null, writes: false, admin: true, local: false };
const keysView = { scope: null, after: null, pages: [], key: null };
let tailSource = null;
let overviewTimer = null;

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
    method: "POST", body: stringifyExact(body), credentials: "same-origin",
    headers: { "Content-Type": "application/json", "X-Stateworker-Console": "1" },
  });
  const doc = parseExact(await response.text()); // (values' numbers keep their digits)
  if (!doc.ok) throw new CallError(doc.error, response.status);
  return doc.result;
}

// A /v1/console/* document; `parse`: parseExact where it holds values (a key's history).
async function getJSON(path, options = {}, parse = JSON.parse) {
  const response = await fetch(path, { credentials: "same-origin", ...options });
  const doc = parse(await response.text());
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
function pretty(value) { return stringifyExact(value, 2); }
function clip(text, most) { return text.length > most ? text.slice(0, most - 3) + "..." : text; }
function shortJSON(value) { return clip(stringifyExact(value), 120); }

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
    who.append(el("span", session.auth === "acl" ? "acl mode: not logged in"
      : session.local ? "off mode: local edits (bound to loopback)" : "off mode: read-only"));
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
document.addEventListener("DOMContentLoaded", start); // (after every script of the page ran)
