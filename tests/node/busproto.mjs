// A minimal client and worker of the stateworker bus, written from docs/bus-protocol.md alone
// (no stateworker code). Raw Redis commands only, so what is sent is what the doc says.
// Values travel as JSON text and are never parsed where digits must stay exact: a body is
// built as text, a result is cut out of the reply document (it is its last member).
import { createHash, randomUUID } from "node:crypto";
import { createClient } from "redis";

export const REPLY_TTL_MS = 300000; // a reply list expires 5 minutes after its last reply
export const DEDUPE_WINDOW_MS = 900000; // how long a worker keeps a call's record

const RESULT_MARK = ',"ok":true,"result":';

// The reply document's result as its exact JSON text (null when the call failed).
export function resultText(document) {
  const at = document.indexOf(RESULT_MARK);
  return at < 0 ? null : document.slice(at + RESULT_MARK.length, -1);
}

export function replyDocument(id, resultJson, error) {
  const head = `{"id":${JSON.stringify(id)}`;
  if (error) return `${head},"ok":false,"error":${JSON.stringify(error)}}`;
  return `${head}${RESULT_MARK}${resultJson}}`;
}

async function connect(url) {
  const conn = createClient({ url });
  conn.on("error", () => {}); // reconnects on its own; a call's timeout covers the gap
  await conn.connect();
  return conn;
}

// ---- the client: XADD a call, BLMPOP the replies, match them by id -----------------------------
export class Client {
  constructor(url, prefix, service = "state") {
    this.url = url;
    this.stream = `${prefix}:bus:${service}`;
    this.replyKey = `${prefix}:reply:${randomUUID()}`;
    this.waiting = new Map(); // id -> resolve(document)
    this.closed = false;
  }

  async open() {
    this.conn = await connect(this.url);
    this.reader = await connect(this.url); // blocking pops on a connection of their own
    this.reading = this.readReplies();
    return this;
  }

  async readReplies() {
    while (!this.closed) {
      // Every reply waiting at once (a service pushes a batch's replies in one LPUSH); the
      // newest is at the head, so the oldest is popped from the other end first.
      const popped = await this.reader.sendCommand(
        ["BLMPOP", "0.2", "1", this.replyKey, "RIGHT", "COUNT", "100"]);
      for (const document of popped ? popped[1] : []) {
        const id = JSON.parse(document).id; // (only the id and ok are parsed)
        const resolve = this.waiting.get(id);
        if (resolve) resolve(document);
      }
    }
  }

  // Send `fn` with the JSON text `body`; the reply document's text, or a TIMEOUT error.
  // Re-sends the same entry (same id, same deadline) at even intervals within the timeout,
  // as the Python client does.
  async call(fn, body, { id = randomUUID(), timeoutMs = 10000, deadlineMs, sends = 3 } = {}) {
    const deadline = deadlineMs ?? Date.now() + timeoutMs;
    const reply = new Promise((resolve) => this.waiting.set(id, resolve));
    const entry = ["XADD", this.stream, "*", "id", id, "fn", fn, "body", body,
      "reply", this.replyKey, "deadline_ms", String(deadline)];
    try {
      for (let send = 0; send < sends; send++) {
        await this.conn.sendCommand(entry);
        const slice = new Promise((resolve) => setTimeout(resolve, timeoutMs / sends, null));
        const document = await Promise.race([reply, slice]);
        if (document !== null) return document;
      }
    } finally {
      this.waiting.delete(id);
    }
    const error = new Error(`${fn}: no reply within ${timeoutMs} ms (call id ${id})`);
    error.code = "TIMEOUT";
    throw error;
  }

  async close() {
    this.closed = true;
    await this.reading;
    await this.conn.sendCommand(["DEL", this.replyKey]);
    await this.conn.quit();
    await this.reader.quit();
  }
}

// ---- the worker: a service's consumer group, its duties ----------------------------------------
export class Worker {
  constructor(url, prefix, service, functions,
    { consumer = "node-1", visibilityMs = 30000, shards = 1 } = {}) {
    this.url = url;
    this.prefix = prefix;
    this.service = service;
    this.stream = `${prefix}:bus:${service}`;
    // The service's shards (STATEWORKER_BUS_SHARDS): shard 0 is its stream, shard i carries
    // partition i's hash tag. Every one is served: group, pending entries, XAUTOCLAIM.
    this.streams = [this.stream];
    for (let i = 1; i < shards; i++) this.streams.push(`${this.stream}:{${prefix}:p${i}}`);
    this.functions = functions; // fn -> async (bodyText, call) => result JSON text
    this.consumer = consumer;
    this.visibilityMs = visibilityMs;
    this.stopping = false;
  }

  // The group at 0 with its stream (BUSYGROUP: there already, fine): calls already waiting
  // are read too.
  async createGroup() {
    for (const stream of this.streams) {
      try {
        await this.conn.sendCommand(["XGROUP", "CREATE", stream, this.service, "0", "MKSTREAM"]);
      } catch (error) {
        if (!String(error.message).startsWith("BUSYGROUP")) throw error;
      }
    }
  }

  // One read of every shard, each from its own position: [[stream, entries] ...].
  async read(ids, block) {
    const args = ["XREADGROUP", "GROUP", this.service, this.consumer, "COUNT", "16"];
    if (block) args.push("BLOCK", "200");
    const reply = await this.reader.sendCommand([...args, "STREAMS", ...this.streams,
      ...this.streams.map((stream) => ids[stream])]);
    if (!reply) return [];
    // [[stream, entries]] in RESP2; a map {stream: entries} as this client version gives it
    return Array.isArray(reply) ? reply : Object.entries(reply);
  }

  // Serve until stop(): this consumer's own pending entries first (id 0), then new ones
  // (>), and now and then the entries another consumer left idle past the visibility
  // timeout (XAUTOCLAIM). `onlyRead`: read once and leave without answering (a crash).
  async serve({ onlyRead = false } = {}) {
    this.conn = await connect(this.url);
    this.reader = await connect(this.url);
    await this.createGroup();
    // Per shard: "0" then the last id read while reading its own pending entries, ">" after.
    const ids = Object.fromEntries(this.streams.map((stream) => [stream, onlyRead ? ">" : "0"]));
    let lastClaim = Date.now();
    while (!this.stopping) {
      const pending = this.streams.some((stream) => ids[stream] !== ">");
      const read = await this.read(ids, !pending);
      if (onlyRead) break;
      for (const stream of this.streams) {
        if (ids[stream] === ">") continue;
        const entries = read.find(([name]) => name === stream)?.[1] ?? [];
        ids[stream] = entries.length ? entries[entries.length - 1][0] : ">";
      }
      for (const [stream, entries] of read) {
        for (const [entryId, flat] of entries) await this.handle(stream, entryId, flat);
      }
      if (Date.now() - lastClaim > this.visibilityMs / 2) {
        lastClaim = Date.now();
        for (const stream of this.streams) {
          const [, claimed] = await this.conn.sendCommand(["XAUTOCLAIM", stream, this.service,
            this.consumer, String(this.visibilityMs), "0-0", "COUNT", "16"]);
          for (const [entryId, flat] of claimed) if (flat) await this.handle(stream, entryId, flat);
        }
      }
    }
    await this.conn.quit();
    await this.reader.quit();
  }

  stop() {
    this.stopping = true;
  }

  async handle(stream, entryId, flat) {
    const call = {};
    for (let i = 0; i < flat.length; i += 2) call[flat[i]] = flat[i + 1];
    // A reply list that is not one of the prefix's is never written to: not run, acknowledged.
    const replyPrefix = `${this.prefix}:reply:`;
    const foreign = call.reply && !(call.reply.startsWith(replyPrefix) && call.reply.length > replyPrefix.length);
    const document = foreign ? null : !call.id || call.fn === undefined || call.body === undefined
      ? replyDocument(call.id ?? null, null, { code: "INVALID_REQUEST",
        message: "the call entry lacks id, fn or body", details: {} })
      : await this.answer(call);
    const commands = [];
    if (document !== null && call.reply) {
      commands.push(["LPUSH", call.reply, document], ["PEXPIRE", call.reply, String(REPLY_TTL_MS)]);
    }
    // Acknowledged and deleted only once the reply is written.
    commands.push(["XACK", stream, this.service, entryId], ["XDEL", stream, entryId]);
    for (const command of commands) await this.conn.sendCommand(command);
  }

  // The reply document of one call: from its record when it ran before (the same id), else
  // by running it (then recorded as `<digest>\n<document>`, the digest of fn NUL body).
  async answer(call) {
    const record = `${this.stream}:done:{${call.id}}`;
    const digest = createHash("sha1").update(`${call.fn}\0${call.body}`).digest("hex");
    const previous = await this.conn.sendCommand(["GET", record]);
    if (previous !== null) {
      const [was, document] = [previous.slice(0, 40), previous.slice(41)];
      if (was === digest) return document;
      return replyDocument(call.id, null, { code: "CALL_ID_REUSED",
        message: `id ${JSON.stringify(call.id)} was used for another call`, details: { id: call.id } });
    }
    // Not run: its deadline passed, or no such function. Run: its result, or INTERNAL.
    let document;
    const fn = this.functions[call.fn];
    if (call.deadline_ms && Date.now() > Number(call.deadline_ms)) {
      document = replyDocument(call.id, null, { code: "DEADLINE_EXCEEDED",
        message: `${call.fn}: its deadline_ms ${call.deadline_ms} passed before it ran`,
        details: { deadline_ms: Number(call.deadline_ms) } });
    } else if (!fn) {
      document = replyDocument(call.id, null, { code: "UNKNOWN_FUNCTION",
        message: `fn: unknown function ${JSON.stringify(call.fn)}`, details: { fn: call.fn } });
    } else {
      try {
        document = replyDocument(call.id, await fn(call.body, call), null);
      } catch (error) {
        document = replyDocument(call.id, null, { code: "INTERNAL", message: String(error), details: {} });
      }
    }
    // Whatever the reply, it is recorded: a retry gets it again.
    await this.conn.sendCommand(["SET", record, `${digest}\n${document}`, "PX", String(DEDUPE_WINDOW_MS)]);
    return document;
  }
}
