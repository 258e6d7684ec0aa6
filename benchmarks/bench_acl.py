"""The `acl` part of `stateworker bench`: bus `state::set` from a principal (its own Redis ACL
user and stream, its roles checked on every call) side by side with the same call in `off`
mode, in one run on one Redis: two services (one per mode, each its own prefix), measured in
alternation, so the ratio is what `acl` mode costs."""

from __future__ import annotations

import secrets
import statistics
from typing import Any

from benchmarks.bench_bus import start_service
from benchmarks.benchtime import timed
from stateworker.bus.client import StateClient
from stateworker.settings import Settings
from stateworker.state.api import StateStore
from stateworker.state.tenancy import principals

OFF, ACL = "benchacl_off", "benchacl_on"
PRINCIPAL = "bench-principal"


async def acl_section(url: str, socket: str, seconds: float, rounds: int, out: Any
                      ) -> dict[str, Any]:
    password = secrets.token_urlsafe(16)
    async with StateStore.open(url, prefix=ACL, reaper=False) as store:
        if store.state.access.principal(PRINCIPAL) is None:
            await principals.add_principal(store.state, PRINCIPAL, ["writer"], ())
        await principals.set_user(store.state, PRINCIPAL, password)
    services = [start_service(url, OFF),
                start_service(url, ACL, env={"STATEWORKER_AUTH": "acl"})]
    value = b'{"n":1,"name":"bench","tags":["a","b"],"ok":true}'
    principal_url = f"unix://{PRINCIPAL}:{password}@{socket}"
    try:
        async with StateClient(settings=Settings(redis_url=url, prefix=OFF)) as off, \
                StateClient(settings=Settings(redis_url=principal_url, prefix=ACL,
                                              auth="acl")) as acl:
            def setter(client: StateClient) -> Any:
                async def op(w: int, i: int) -> Any:
                    return await client.call_json(
                        "state::set", b'{"scope":"bench","key":"k%d","value":%s}' % (w, value))
                return op

            await setter(off)(0, 0)  # warm up: both services have loaded scripts and groups
            await setter(acl)(0, 0)
            samples: dict[str, list[float]] = {}
            for _ in range(rounds):
                for concurrency in (1, 64):
                    for mode, client in (("off", off), ("acl", acl)):
                        rate, _ = await timed(setter(client), concurrency, seconds)
                        samples.setdefault(f"{mode}_{concurrency}", []).append(rate)
    finally:
        for service in services:
            service.terminate()
            service.wait(timeout=30)
    figures: dict[str, Any] = {name: round(statistics.median(rates))
                               for name, rates in samples.items()}
    figures["ratios"] = {f"acl_{n}_vs_off_{n}": round(figures[f"acl_{n}"] / figures[f"off_{n}"], 3)
                         for n in (1, 64)}
    print(f"\n{'acl mode (bus state::set)':<30}{'ops/s':>10}", file=out)
    for name in ("off_1", "acl_1", "off_64", "acl_64"):
        print(f"{name:<30}{figures[name]:>10,}", file=out)
    for name, ratio in figures["ratios"].items():
        print(f"{name:<40}{ratio:>8.2f}", file=out)
    return figures
