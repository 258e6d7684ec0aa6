// Scenarios for tests/integration/bus/test_polyglot.py; each prints one JSON line of what it saw.
//   node main.mjs client URL PREFIX SCOPE     calls: exact values both ways, a retry, deadlines
//   node main.mjs worker URL PREFIX SERVICE SEEN_SCOPE [--only-read]
//        serves SERVICE: `<SERVICE>::on_event` (a trigger's handler: stores the event
//        document it got under SEEN_SCOPE/<key>, over the bus), `<SERVICE>::judge` (a
//        condition: `false` for keys starting with "skip") and `<SERVICE>::echo`; until
//        SIGTERM. --only-read: reads its calls and exits without answering (a crash).
//        STATEWORKER_BUS_SHARDS=N in the environment: serves every one of the N shards.
import { Client, Worker, resultText } from "./busproto.mjs";

const [mode, url, prefix, ...rest] = process.argv.slice(2);

// Exact JSON text: big integers, trailing zeros, empty containers, key order, unicode.
export const VALUE = '{"big":9007199254740993,"dec":1.2300,"e":[],"o":{},"z":1,"a":2,"u":"é😀"}';

async function client(scope) {
  const c = await new Client(url, prefix).open();
  const out = {};
  const set = await c.call("state::set", `{"scope":${JSON.stringify(scope)},"key":"from-node","value":${VALUE}}`);
  out.set = JSON.parse(set).ok;
  out.get_own = resultText(await c.call("state::get", `{"scope":${JSON.stringify(scope)},"key":"from-node"}`));
  out.get_python = resultText(await c.call("state::get", `{"scope":${JSON.stringify(scope)},"key":"from-python"}`));
  // A retry: the same id, the body serialized again (other spacing): the same reply, once.
  const inc = `{"scope":${JSON.stringify(scope)},"key":"counter","ops":[{"type":"increment","path":"n","by":1}]}`;
  const first = await c.call("state::update", inc, { id: "node-retry-1" });
  const again = await c.call("state::update", inc.replaceAll(",", ", "), { id: "node-retry-1" });
  out.retry_same = first === again;
  out.retry_result = resultText(again);
  out.counter = resultText(await c.call("state::get", `{"scope":${JSON.stringify(scope)},"key":"counter"}`));
  // A deadline already past: not applied. (A minute past: the service judges deadlines on
  // Redis's clock, which this process's clock may differ from by a few ms.)
  const late = await c.call("state::set", `{"scope":${JSON.stringify(scope)},"key":"late","value":1}`,
    { deadlineMs: Date.now() - 60000 });
  out.late = JSON.parse(late).error.code;
  out.late_value = resultText(await c.call("state::get", `{"scope":${JSON.stringify(scope)},"key":"late"}`));
  // No one serves this service: the client's own timeout.
  const nobody = await new Client(url, prefix, `nobody-${scope}`).open();
  try {
    await nobody.call("nobody::x", "{}", { timeoutMs: 300 });
  } catch (error) {
    out.nobody = error.code;
  }
  await nobody.close();
  await c.close();
  console.log(JSON.stringify(out));
}

async function worker(service, seenScope, onlyRead) {
  const states = await new Client(url, prefix).open(); // the handler's own calls to state
  const runs = { on_event: 0, echo: 0 };
  const conditions = []; // the ids of the condition calls answered
  const shards = Number(process.env.STATEWORKER_BUS_SHARDS || "1");
  const w = new Worker(url, prefix, service, {
    [`${service}::on_event`]: async (body) => {
      runs.on_event++;
      // The event document is stored as it came, text for text (no parse of its values).
      const key = JSON.parse(body).key;
      const set = await states.call("state::set",
        `{"scope":${JSON.stringify(seenScope)},"key":${JSON.stringify(key)},"value":${body}}`);
      if (!JSON.parse(set).ok) throw new Error(set);
      return "null";
    },
    // A trigger's condition: only an explicit `false` skips the event.
    [`${service}::judge`]: async (body, call) => {
      conditions.push(call.id);
      return JSON.parse(body).key.startsWith("skip") ? "false" : "true";
    },
    [`${service}::echo`]: async (body) => {
      runs.echo++;
      return `{"body":${body},"runs":${runs.echo}}`;
    },
  }, { shards });
  process.on("SIGTERM", () => w.stop());
  await w.serve({ onlyRead });
  await states.close();
  console.log(JSON.stringify({ stopped: true, runs, conditions }));
}

if (mode === "client") await client(rest[0]);
else if (mode === "worker") await worker(rest[0], rest[1], rest.includes("--only-read"));
else throw new Error(`unknown mode ${mode}`);
