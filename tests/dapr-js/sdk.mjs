// Dapr's JavaScript SDK over HTTP, its state API used as Dapr's docs show it
// (docs.dapr.io, "JavaScript Client SDK", state management). The service stands where
// the sidecar would: DAPR_HOST and DAPR_HTTP_PORT name its HTTP face. Prints one JSON line
// of what the SDK answered, for tests/integration/http/test_dapr_sdk.py.
import { CommunicationProtocolEnum, DaprClient } from "@dapr/dapr";

const daprHost = process.env.DAPR_HOST ?? "127.0.0.1";
const daprPort = process.env.DAPR_HTTP_PORT;
const serviceStoreName = process.env.STORE ?? "statestore";

const client = new DaprClient({
  daprHost,
  daprPort,
  communicationProtocol: CommunicationProtocolEnum.HTTP,
});
await client.start(); // waits on the sidecar's /v1.0/metadata

const seen = {};
// The SDK answers a failed save or delete with `{ error }`: the sidecar's answer is its message.
const failure = (answer) => (answer.error ? JSON.parse(answer.error.message) : answer);

// Save State
seen.save = await client.state.save(serviceStoreName, [
  { key: "first-key-name", value: "hello", metadata: { foo: "bar" } },
  { key: "second-key-name", value: "world" },
]);

// Get State
seen.get = await client.state.get(serviceStoreName, "first-key-name");
seen.getMissing = await client.state.get(serviceStoreName, "never-saved");

// Get Bulk State
seen.getBulk = await client.state.getBulk(serviceStoreName, ["first-key-name", "second-key-name"]);

// Save with an ETag: the one the bulk read gave holds, a stale one is refused
const etag = seen.getBulk.find((item) => item.key === "first-key-name").etag;
seen.saveWithEtag = await client.state.save(serviceStoreName, [
  { key: "first-key-name", value: "hello again", etag },
]);
seen.saveStale = failure(await client.state.save(serviceStoreName, [
  { key: "first-key-name", value: "lost", etag },
]));

// Delete State, with an ETag (a stale one first)
seen.deleteStale = failure(
  await client.state.delete(serviceStoreName, "second-key-name", { etag: "99" }));
const [second] = await client.state.getBulk(serviceStoreName, ["second-key-name"]);
seen.delete = await client.state.delete(serviceStoreName, "second-key-name", { etag: second.etag });
seen.afterDelete = await client.state.get(serviceStoreName, "second-key-name");

// Execute State Transaction
await client.state.transaction(serviceStoreName, [
  { operation: "upsert", request: { key: "first-key-name", value: "new-data" } },
  { operation: "delete", request: { key: "second-key-name" } },
  { operation: "upsert", request: { key: "third-key-name", value: { person: { org: "Dev Ops", id: 3 } } } },
]);
seen.afterTransaction = await client.state.getBulk(serviceStoreName, [
  "first-key-name", "second-key-name", "third-key-name"]);

// Save with a TTL (request metadata)
seen.saveTtl = await client.state.save(
  serviceStoreName,
  [{ key: "ttl-key-name", value: "short-lived" }],
  { metadata: { ttlInSeconds: "60" } },
);

// State Query
await client.state.save(serviceStoreName, [
  { key: "p1", value: { person: { org: "Dev Ops", id: 1036 }, city: "Seattle", state: "WA" } },
  { key: "p2", value: { person: { org: "Hardware", id: 1028 }, city: "Portland", state: "OR" } },
  { key: "p3", value: { person: { org: "Finance", id: 1071 }, city: "Sacramento", state: "CA" } },
  { key: "p4", value: { person: { org: "Dev Ops", id: 1042 }, city: "Spokane", state: "WA" } },
]);
seen.query = await client.state.query(serviceStoreName, {
  filter: {
    OR: [
      { EQ: { "person.org": "Dev Ops" } },
      { AND: [{ EQ: { "person.org": "Finance" } }, { IN: { state: ["CA", "WA"] } }] },
    ],
  },
  sort: [
    { key: "state", order: "DESC" },
    { key: "person.id" },
  ],
  page: { limit: 10 },
});

await client.stop();
console.log(JSON.stringify(seen));
