"""`X-Stateworker-Caller` is the bus entry's `caller` over HTTP (docs/http.md): the functions
that belong to a caller (state::list_entries' cursors, state::claim-namespace and
state::release-namespace) answered UNKNOWN_CALLER to every request in `off` mode, since no
header carried one. The same name is the same caller at both doors; in `acl` mode the caller
is the principal, and a header naming anyone else is refused, nothing run."""

from __future__ import annotations

import uuid

import httpx
import pytest
import redis.asyncio as aredis

from stateworker.app.service import StateService
from tests.integration.acl import credentials, principal, role
from tests.integration.busproto import roundtrip
from tests.integration.http.conftest import post
from tests.servers import RedisServer

pytestmark = pytest.mark.anyio

CALLER = "X-Stateworker-Caller"


async def test_a_named_caller_owns_its_namespace_and_cursors_at_both_doors(
        served: tuple[StateService, httpx.AsyncClient], redis_server: RedisServer,
        prefix: str, scope: str) -> None:
    _, http = served
    owned = f"agent7-{uuid.uuid4().hex[:8]}"
    claim = {"functions_prefix": "agent7", "scopes": [owned]}
    status, nobody = await post(http, "state::claim-namespace", claim)
    assert (status, nobody["error"]["code"]) == (401, "UNKNOWN_CALLER"), nobody
    status, claimed = await post(http, "state::claim-namespace", claim, **{CALLER: "agent7"})
    assert status == 200 and claimed["result"]["scopes"] == [owned], claimed
    for key in ("a", "b"):
        status, written = await post(http, "state::set", {"scope": scope, "key": key,
                                                         "value": key})
        assert status == 200, written
    status, page = await post(http, "state::list_entries", {"scope": scope, "limit": 1},
                              **{CALLER: "agent7"})
    assert status == 200 and page["result"]["entries"] == [["a", "a"]], page
    cursor = page["result"]["next_cursor"]
    raw = aredis.Redis(port=redis_server.port)
    try:  # the same name on the bus is the same caller: its cursor, its namespace
        other = await roundtrip(raw, prefix, "state::list_entries",
                                {"scope": scope, "limit": 1, "cursor": cursor}, caller="intruder")
        assert other["error"]["code"] == "INVALID_CURSOR", other
        rest = await roundtrip(raw, prefix, "state::list_entries",
                               {"scope": scope, "limit": 1, "cursor": cursor}, caller="agent7")
        assert rest["ok"] and rest["result"]["entries"] == [["b", "b"]], rest
        taken = await roundtrip(raw, prefix, "state::release-namespace", {"scopes": [owned]},
                                caller="intruder")
        assert taken["error"]["code"] == "FORBIDDEN", taken
        released = await roundtrip(raw, prefix, "state::release-namespace", {"scopes": [owned]},
                                   caller="agent7")
        assert released["ok"], released
    finally:
        await raw.aclose()


async def test_a_caller_header_out_of_bounds_is_refused_naming_it(
        served: tuple[StateService, httpx.AsyncClient], scope: str) -> None:
    _, http = served
    for sent, problem in ((b"", "must be 1 to 256 bytes, got 0"),
                          (b"a" * 257, "must be 1 to 256 bytes, got 257"),
                          (b"caf\xe9", "not valid UTF-8 text")):
        response = await http.post("/v1/call/state::set", headers={CALLER: sent},
                                   content=b'{"scope":"%s","key":"k","value":1}' % scope.encode())
        error = response.json()["error"]
        assert (response.status_code, error["code"], error["details"]["path"]) == (
            400, "INVALID_REQUEST", CALLER), error
        assert problem in error["message"], error
    status, nothing = await post(http, "state::get", {"scope": scope, "key": "k"})
    assert (status, nothing["result"]) == (200, None), nothing


async def test_in_acl_mode_the_header_may_name_the_principal_alone(
        acl_served: StateService, acl_redis: RedisServer, scope: str) -> None:
    writer = await role(acl_served.state, ["read", "write"], [f"{scope}*"])
    name, url = await principal(acl_served.state, acl_redis, [writer])
    _, other = await principal(acl_served.state, acl_redis, [writer])
    write = {"scope": scope, "key": "k", "value": 1}
    async with httpx.AsyncClient(base_url=f"http://{acl_served.http_address}",
                                 auth=credentials(url)) as http:
        status, posing = await post(http, "state::set", write,
                                    **{CALLER: credentials(other)[0]})
        assert (status, posing["error"]["code"]) == (403, "PERMISSION_DENIED"), posing
        status, nothing = await post(http, "state::get", {"scope": scope, "key": "k"})
        assert (status, nothing["result"]) == (200, None), nothing
        status, itself = await post(http, "state::set", write, **{CALLER: name})
        assert status == 200 and itself["result"]["version"] == 1, itself
