"""`stateworker serve` with the HTTP face says where it serves on its start line: the console's
URL, the call API's and Dapr's state paths, each answering there."""

from __future__ import annotations

import httpx

from tests.servers import RedisServer, ServiceProcess


def test_the_start_line_names_the_console_and_the_http_paths(redis_server: RedisServer,
                                                              prefix: str) -> None:
    service = ServiceProcess(redis_server.url, prefix, env={"STATEWORKER_HTTP": "127.0.0.1:0"})
    service.start()
    try:
        started = service.started
        base = f"http://{started['http']}"
        assert started["console"] == f"{base}/console/"
        assert started["calls"] == f"{base}/v1/call/<function>"
        assert started["dapr"] == f"{base}/v1.0/state/<store>"
        with httpx.Client() as http:
            assert http.get(started["console"]).status_code == 200
            called = http.post(started["calls"].replace("<function>", "state::get"),
                               json={"scope": "s", "key": "k"})
            assert called.json()["ok"] is True
            saved = http.post(started["dapr"].replace("<store>", "statestore"),
                              json=[{"key": "k", "value": 1}])
            assert saved.status_code == 204
    finally:
        service.signal(15)
        assert service.wait() == 0
