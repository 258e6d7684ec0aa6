// Dapr's JavaScript SDK over HTTP in the edge cases a program meets, each as Dapr's state
// stores answer it (components-contrib's state conformance and its Redis and PostgreSQL
// stores): first-write concurrency without an ETag, an ETag that does not hold, a TTL of 0 or
// "", when an item with a TTL expires, a TTL on the URL and the item, a save naming a key twice; and a query's page token it never gave, refused naming
// `page.token`. Prints one JSON line of what the SDK answered, for
// tests/integration/http/test_dapr_sdk.py.
import { CommunicationProtocolEnum, DaprClient } from "@dapr/dapr";
import { StateConcurrencyEnum } from "@dapr/dapr/enum/StateConcurrency.enum.js";

const client = new DaprClient({
  daprHost: process.env.DAPR_HOST ?? "127.0.0.1",
  daprPort: process.env.DAPR_HTTP_PORT,
  communicationProtocol: CommunicationProtocolEnum.HTTP,
});
await client.start();
const store = process.env.STORE ?? "statestore";
const seen = {};
// A failed save or delete answers `{ error }`, a failed transaction throws: either as
// {status, errorCode, message}.
const refusal = (error) => {
  const { status, error_msg: body } = JSON.parse(error.message);
  const { errorCode, message } = JSON.parse(body);
  return { status, errorCode, message };
};
const saved = (answer) => (answer.error ? refusal(answer.error) : answer);
const transacted = async (operations) => {
  try {
    await client.state.transaction(store, operations);
    return {};
  } catch (error) {
    return refusal(error);
  }
};
const firstWrite = { concurrency: StateConcurrencyEnum.CONCURRENCY_FIRST_WRITE };

// First-write without an ETag: the first save of a key wins, a second one is refused
seen.firstWrite = saved(await client.state.save(store, [
  { key: "claim", value: "worker-a", options: firstWrite }]));
seen.secondWrite = saved(await client.state.save(store, [
  { key: "claim", value: "worker-b", options: firstWrite }]));
seen.secondWriteEmptyEtag = saved(await client.state.save(store, [
  { key: "claim", value: "worker-c", etag: "", options: firstWrite }]));
seen.claim = await client.state.get(store, "claim");
seen.staleEtag = saved(await client.state.save(store, [
  { key: "claim", value: "worker-b", etag: "7" }]));
seen.transactionFirstWrite = await transacted([
  { operation: "upsert", request: { key: "claim", value: "worker-d", options: firstWrite } }]);
// deleted first in the same transaction, the key is absent for the first-write after it
seen.transactionDeleteThenFirstWrite = await transacted([
  { operation: "delete", request: { key: "claim" } },
  { operation: "upsert", request: { key: "claim", value: "worker-e", options: firstWrite } }]);
seen.claimAfter = await client.state.get(store, "claim");

// ttlInSeconds 0 and "": never expire, as Dapr's stores take them
seen.ttlZero = saved(await client.state.save(
  store, [{ key: "ttl-zero", value: 0 }], { metadata: { ttlInSeconds: "0" } }));
seen.ttlEmpty = saved(await client.state.save(
  store, [{ key: "ttl-empty", value: "" , metadata: { ttlInSeconds: "" } }]));

// An item with a TTL: getBulk gives when it expires (`metadata.ttlExpireTime`), none without
// one; the save's metadata (the SDK sends it on the URL) wins over an item's, as in Dapr
seen.saveExpiring = saved(await client.state.save(store, [
  { key: "expiring", value: 1, metadata: { ttlInSeconds: "3600" } },
  { key: "lasting", value: 2 }]));
seen.expiring = await client.state.getBulk(store, ["expiring", "lasting"]);
seen.saveUrlOverItem = saved(await client.state.save(
  store, [{ key: "url-wins", value: 3, metadata: { ttlInSeconds: "3600" } }],
  { metadata: { ttlInSeconds: "-1" } }));
seen.urlWins = await client.state.getBulk(store, ["url-wins"]);

// A save naming a key twice: its items apply one after the other, as Dapr's stores apply
// them, the last one's value staying; an ETag is checked against what the items before it made
seen.saveTwice = saved(await client.state.save(store, [
  { key: "batch", value: 1 }, { key: "batch", value: 2 }]));
seen.batch = await client.state.get(store, "batch");
const [{ etag: batchEtag }] = await client.state.getBulk(store, ["batch"]);
seen.saveTwiceStale = saved(await client.state.save(store, [
  { key: "batch", value: 3, etag: batchEtag }, { key: "batch", value: 4, etag: batchEtag }]));
seen.batchAfter = await client.state.get(store, "batch");

// a page token the query never gave: refused naming the field the program sent
try {
  seen.queryBadToken = await client.state.query(store, {
    filter: { EQ: { owner: "worker-a" } }, page: { limit: 1, token: "not-a-token" } });
} catch (error) {
  seen.queryBadToken = refusal(error);
}

await client.stop();
console.log(JSON.stringify(seen));
