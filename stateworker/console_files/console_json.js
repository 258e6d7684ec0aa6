// Exact JSON for the console: a value's numbers keep their digits. JSON.parse reads every
// number as a double, so 9007199254740993 would show as ...992; parseExact keeps each number
// as its text (a Num), stringifyExact writes it back verbatim, jsonDiff compares by that text.
"use strict";

class Num {
  constructor(text) { this.text = text; }
  toString() { return this.text; }
}

function parseExact(text) {
  let at = 0;
  const fail = (what) => { throw new SyntaxError(`${what} at position ${at}`); };
  const space = () => { while (at < text.length && " \t\n\r".includes(text[at])) at++; };
  const NUMBER = /-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?/y;
  function value() {
    space();
    const c = text[at];
    if (c === "{") {
      at++; const obj = {}; space();
      if (text[at] === "}") { at++; return obj; }
      for (;;) {
        space(); if (text[at] !== '"') fail("expected a key");
        const k = string(); space();
        if (text[at++] !== ":") fail("expected ':'");
        Object.defineProperty(obj, k, { value: value(), enumerable: true, writable: true, configurable: true });
        space(); const sep = text[at++];
        if (sep === "}") return obj;
        if (sep !== ",") fail("expected ',' or '}'");
      }
    }
    if (c === "[") {
      at++; const list = []; space();
      if (text[at] === "]") { at++; return list; }
      for (;;) {
        list.push(value()); space(); const sep = text[at++];
        if (sep === "]") return list;
        if (sep !== ",") fail("expected ',' or ']'");
      }
    }
    if (c === '"') return string();
    for (const [word, v] of [["true", true], ["false", false], ["null", null]]) {
      if (text.startsWith(word, at)) { at += word.length; return v; }
    }
    NUMBER.lastIndex = at;
    const m = NUMBER.exec(text);
    if (!m) fail("unexpected character");
    at += m[0].length;
    return new Num(m[0]);
  }
  function string() {
    const start = at++;
    while (at < text.length && text[at] !== '"') at += text[at] === "\\" ? 2 : 1;
    if (at >= text.length) fail("unterminated string");
    at++;
    return JSON.parse(text.slice(start, at)); // (a string alone: JSON.parse is exact)
  }
  const result = value(); space();
  if (at !== text.length) fail("unexpected text after the value");
  return result;
}

// JSON text of a value read by parseExact (Num written as its digits); `indent` as JSON.stringify's.
function stringifyExact(v, indent = 0, depth = 0) {
  if (v instanceof Num) return v.text;
  if (v === null || typeof v !== "object") return JSON.stringify(v);
  const pad = indent ? "\n" + " ".repeat(indent * (depth + 1)) : "";
  const end = indent ? "\n" + " ".repeat(indent * depth) : "";
  const sep = indent ? ": " : ":";
  const items = Array.isArray(v)
    ? v.map((x) => stringifyExact(x === undefined ? null : x, indent, depth + 1))
    : Object.keys(v).filter((k) => v[k] !== undefined).map((k) => JSON.stringify(k) + sep + stringifyExact(v[k], indent, depth + 1));
  const [open, close] = Array.isArray(v) ? ["[", "]"] : ["{", "}"];
  return items.length ? open + pad + items.join("," + pad) + end + close : open + close;
}

// The leaves that differ between two JSON values: [pointer, old text, new text].
function jsonDiff(a, b, path = "", out = []) {
  const isObj = (v) => v !== null && typeof v === "object" && !(v instanceof Num);
  if (isObj(a) && isObj(b) && Array.isArray(a) === Array.isArray(b)) {
    for (const k of new Set([...Object.keys(a), ...Object.keys(b)])) {
      const sub = `${path}/${String(k).replace(/~/g, "~0").replace(/\//g, "~1")}`;
      if (!Object.hasOwn(b, k)) out.push([sub, stringifyExact(a[k]), undefined]);
      else if (!Object.hasOwn(a, k)) out.push([sub, undefined, stringifyExact(b[k])]);
      else jsonDiff(a[k], b[k], sub, out);
    }
  } else if (stringifyExact(a ?? null) !== stringifyExact(b ?? null)) {
    out.push([path, a === null || a === undefined ? undefined : stringifyExact(a),
      b === null || b === undefined ? undefined : stringifyExact(b)]);
  }
  return out;
}

// A size for people: 268 KB, 1.2 MB.
function sizeText(bytes) {
  if (bytes < 1024) return `${bytes} bytes`;
  if (bytes < 1024 * 1024) return `${Math.round(bytes / 1024)} KB`;
  return `${(bytes / 1024 / 1024).toFixed(1)} MB`;
}
