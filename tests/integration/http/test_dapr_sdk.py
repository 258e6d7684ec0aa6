"""Dapr's official JavaScript SDK (`@dapr/dapr`, tests/dapr-js/: its package installed there by
scripts/_setup.sh) over HTTP against the service, the SDK's code as Dapr's docs give it: save,
get, get bulk, ETags on save and delete, a transaction, a TTL in the request's metadata and a
query with OR and sort; and the edges a program meets (tests/dapr-js/edges.mjs) answered as
Dapr's state stores answer them. The service stands where Dapr's sidecar would."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import anyio
import pytest

from stateworker import StateStore
from stateworker.app.service import StateService
from stateworker.bus.protocol import BusOptions
from tests.integration.services import settings_for
from tests.servers import RedisServer

pytestmark = pytest.mark.anyio

SDK_DIR = Path(__file__).resolve().parents[3] / "tests" / "dapr-js"


def run_sdk(port: str, script: str = "sdk.mjs") -> dict[str, Any]:
    node = shutil.which("node")
    assert node is not None, "node is not installed (./scripts/test installs it)"
    assert (SDK_DIR / "node_modules" / "@dapr" / "dapr").is_dir(), \
        "the Dapr SDK is not installed in tests/dapr-js (./scripts/test installs it)"
    done = subprocess.run([node, script], cwd=SDK_DIR, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "DAPR_HOST": "127.0.0.1",
                                            "DAPR_HTTP_PORT": port, "STORE": "statestore"})
    assert done.returncode == 0, done.stderr[-3000:]
    seen: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return seen


async def test_the_dapr_javascript_sdk_works_unchanged(redis_server: RedisServer, prefix: str,
                                                      scope: str) -> None:
    settings = settings_for(redis_server, prefix, http="127.0.0.1:0",
                            dapr_stores=f"statestore={scope}")
    async with StateService.running(settings, BusOptions(block_ms=50)) as service:
        port = service.http_address.rsplit(":", 1)[1]
        seen = await anyio.to_thread.run_sync(run_sdk, port)
        store = StateStore(service.state)
        ttl_entry = await store.get_entry(scope, "ttl-key-name")
    assert seen["save"] == {} and seen["get"] == "hello" and seen["getMissing"] == ""
    assert seen["getBulk"] == [{"key": "first-key-name", "data": "hello", "etag": "1"},
                               {"key": "second-key-name", "data": "world", "etag": "1"}]
    assert seen["saveWithEtag"] == {}
    for answer, code in ((seen["saveStale"], "ERR_STATE_SAVE"),
                         (seen["deleteStale"], "ERR_STATE_DELETE")):
        assert answer["status"] == 409 and json.loads(answer["error_msg"])["errorCode"] == code
    assert seen["delete"] == {} and seen["afterDelete"] == ""
    assert seen["afterTransaction"] == [
        {"key": "first-key-name", "data": "new-data", "etag": "3"}, {"key": "second-key-name"},
        {"key": "third-key-name", "data": {"person": {"org": "Dev Ops", "id": 3}}, "etag": "1"}]
    assert seen["saveTtl"] == {} and ttl_entry is not None and ttl_entry.expires_at is not None
    # Dev Ops, or Finance in CA/WA; state descending (a missing one last), then person.id
    assert [r["key"] for r in seen["query"]["results"]] == ["p1", "p4", "p3", "third-key-name"]


async def test_the_sdk_meets_the_edges_as_dapr_stores_answer_them(
        redis_server: RedisServer, prefix: str, scope: str) -> None:
    settings = settings_for(redis_server, prefix, http="127.0.0.1:0",
                            dapr_stores=f"statestore={scope}")
    async with StateService.running(settings, BusOptions(block_ms=50)) as service:
        port = service.http_address.rsplit(":", 1)[1]
        seen = await anyio.to_thread.run_sync(run_sdk, port, "edges.mjs")
        store = StateStore(service.state)
        ttl_entries = [await store.get_entry(scope, key) for key in ("ttl-zero", "ttl-empty")]
        expiring_entry = await store.get_entry(scope, "expiring")
    assert expiring_entry is not None and expiring_entry.expires_at is not None
    def conflict(answer: dict[str, Any]) -> tuple[int, str, bool]:
        """(status, errorCode, whether the message says it in Dapr's words, which programs
        match to retry)."""
        return answer["status"], answer["errorCode"], "possible etag mismatch" in answer["message"]

    # first-write without an ETag is create-only: a second writer is refused, not let over
    assert seen["firstWrite"] == {}
    for refused in ("secondWrite", "secondWriteEmptyEtag", "staleEtag"):
        assert conflict(seen[refused]) == (409, "ERR_STATE_SAVE", True), refused
    assert seen["claim"] == "worker-a"
    assert conflict(seen["transactionFirstWrite"]) == (409, "ERR_STATE_TRANSACTION", True)
    assert seen["transactionDeleteThenFirstWrite"] == {}
    assert seen["claimAfter"] == "worker-e"
    assert seen["saveTwice"] == {} and seen["batch"] == 2
    assert conflict(seen["saveTwiceStale"]) == (409, "ERR_STATE_SAVE", True)
    assert seen["batchAfter"] == 2  # (all or nothing: the first item is not written either)
    assert seen["queryBadToken"] == {
        "status": 400, "errorCode": "ERR_MALFORMED_REQUEST",
        "message": '$.page.token: not a token this query gave, got "not-a-token"'}
    # ttlInSeconds 0 and "" save with no expiry
    assert seen["ttlZero"] == {} and seen["ttlEmpty"] == {}
    assert [(e is not None and e.expires_at) for e in ttl_entries] == [None, None]
    # getBulk says when an item with a TTL expires (RFC 3339 in UTC, to the second, as the
    # entry's expiry), nothing of one without
    expiring, lasting = seen["expiring"]
    assert seen["saveExpiring"] == {} and lasting == {"key": "lasting", "data": 2, "etag": "1"}
    assert expiring["data"] == 1 and expiring["metadata"]["ttlExpireTime"] == \
        expiring_entry.expires_at[:19] + "Z"
    # the save's metadata (on the URL) wins over the item's, as Dapr's runtime merges them
    assert seen["saveUrlOverItem"] == {} and "metadata" not in seen["urlWins"][0]
