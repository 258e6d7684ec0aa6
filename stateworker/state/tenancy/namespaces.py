"""Private namespaces: `state::claim-namespace` and the accessors of a claimed namespace.

A worker claims scopes for itself (claim.lua: all or nothing, the first claimant keeps a
scope). From then on every public function refuses those scopes (`validate.scope`), listings
leave them out, and the namespace's accessors `<prefix>::state::get`, `::list`,
`::list_keys`, `::compare-and-set`, `::list_entries` serve them, and only them: each runs the public function
of its name with `CallContext.namespace` set, which turns the claimed-scope refusal into the
requirement that the scope is the namespace's own. Any caller may call an accessor (iii
registers them as functions, open to every worker): the claim hides scopes from the public
functions and from triggers, it does not authenticate readers.

A claim cannot squat: a public scope in use -- it holds entries, a registered trigger's
scope filter names it, or it was written within the dedupe window (its partition's `written`
record, which outlives its entries) -- is SCOPE_IN_USE unless an admin adopts it (`adopt:
true`: one log line naming who adopted what, and the adoption in the registry entry).
`state::release-namespace` gives scopes back to the public, entries kept.
"""

from __future__ import annotations

import logging
from typing import Any

import msgspec

from stateworker.clock import now_ms
from stateworker.errors import shown
from stateworker.schemas import ClaimResult, ReleaseResult
from stateworker.scripts.bindings import CLAIM, RELEASE, claim_call, release_call
from stateworker.scripts.replies import ClaimReply, ReleaseReply
from stateworker.scripts.statuses import Target
from stateworker.specs import ACCESSORS as ACCESSED
from stateworker.state.core import validate
from stateworker.state.core.store import RedisState
from stateworker.state.reactive.triggers import decode_trigger, live
from stateworker.transport.plans import Plan, command_reply
from stateworker.transport.wire import Arg

log = logging.getLogger("stateworker.state.tenancy.namespaces")

ACCESSORS = tuple(name.removeprefix("state::") for name in ACCESSED)  # (specs.py)
_INFIX = "::state::"  # <prefix>::state::<accessor>


def accessor_ids(prefix: str) -> list[str]:
    return [f"{prefix}{_INFIX}{name}" for name in ACCESSORS]


def accessor(state: RedisState, fn: str) -> tuple[str, str] | None:
    """(the public function it runs, the namespace) when `fn` is an accessor of a claimed
    namespace, else None."""
    prefix, infix, name = fn.partition(_INFIX)
    if infix and name in ACCESSORS and state.claims.owns_any(prefix):
        return f"state::{name}", prefix
    return None


def _sorted(scopes: list[str]) -> list[str]:
    return sorted(scopes, key=lambda s: s.encode())


def claim_plan(state: RedisState, prefix: str, scopes: list[str], target: Target,
               adopter: str | None) -> Plan:
    """Claim `scopes` (validated) for `prefix`; `adopter`: the admin who adopts the scopes in
    use (None: they are refused). This replica's cache learns of it at once, the others
    through the registry entry the script writes.

    Two steps, as a scope's entries and last write live in its partition's slot and the
    claims in the registry's: first a read of every scope's key index and `written` record,
    and of the triggers; then claim.lua, which is the one judge of ownership and refuses a
    new scope found in use. What lands between the two is not seen: a write to a scope, or a
    trigger naming it, within that one round trip before the claim becomes the namespace's
    (a write: hidden, not lost: a release makes it public again). That race needs a caller
    who wins by a few ms against someone using the scope at that very moment, while the
    squatting this check stops -- taking a scope in use, at any time -- is closed; closing
    the race too would need every entry script to read the claims (another slot).
    """
    commands: list[list[Arg]] = []
    for scope in scopes:
        part = state.keys.for_scope(scope)
        commands += [["ZCARD", part.key_index(scope)], ["ZSCORE", part.written, scope]]
    commands.append(["HVALS", state.keys.triggers])

    def finish(done: ClaimReply) -> ClaimResult:
        state.claims.add(prefix, done.owned)
        if done.adopted:
            log.warning("namespace %s adopted scopes in use %s, by %s", shown(prefix),
                        shown(done.adopted), shown(adopter),
                        extra={"event": "claims.adopted", "prefix": prefix,
                               "scopes": done.adopted, "by": adopter})
        return ClaimResult(done.claimed, _sorted(done.owned), accessor_ids(prefix),
                           _sorted(done.adopted) if done.adopted else msgspec.UNSET)

    def claim(replies: list[Any]) -> Plan:
        replies = [command_reply(reply, "reading the scopes' use") for reply in replies]
        named: dict[str, list[str]] = {}
        now = now_ms()
        for raw in replies[-1]:
            trigger = decode_trigger(raw)
            if trigger.config.scope is not None and live(trigger, now):
                named.setdefault(trigger.config.scope, []).append(trigger.id)
        window = state.settings.dedupe_window_ms
        uses = [_use(int(replies[2 * i]), replies[2 * i + 1], named.get(scope, []), now, window)
                for i, scope in enumerate(scopes)]
        call = claim_call(state.keys, prefix, scopes, uses, adopter,
                          validate.MAX_NAMESPACE_SCOPES, validate.MAX_CLAIMED_SCOPES)
        return state.script_plan(CLAIM, call, finish, target)

    return Plan(commands, claim)


def _use(entries: int, written: bytes | None, triggers: list[str], now: int,
         window: int) -> str:
    """A scope's use as claim.lua takes it: "" free, else "<entries>:<why>"."""
    why = []
    if entries:
        why.append(f"it holds {entries} {'entry' if entries == 1 else 'entries'}")
    if triggers:
        why.append(f"trigger {', '.join(shown(t) for t in sorted(triggers))} names it")
    if written is not None and now - int(float(written)) < window:
        why.append(f"it was written {max(0, now - int(float(written)))} ms ago, within the "
                   f"dedupe window of {window} ms")
    return f"{entries}:{'; '.join(why)}" if why else ""


def release_plan(state: RedisState, caller: str, scopes: list[str], target: Target,
                 force: bool) -> Plan:
    """Release `scopes` (validated): `caller`'s own, or with `force` (an admin, checked by the
    caller) any namespace's. This replica's cache drops them at once, the others through the
    registry entry; the snapshot copies the claims again on that entry."""
    def finish(done: ReleaseReply) -> ReleaseResult:
        state.claims.remove(done.released)
        others = {scope: owner for scope, owner in done.released.items() if owner != caller}
        if others:
            log.warning("%s released scopes of other namespaces %s (force)", shown(caller),
                        shown(others), extra={"event": "claims.forced_release", "by": caller,
                               "released": others})
        return ReleaseResult(_sorted(list(done.released)), _sorted(done.owned))

    return state.script_plan(RELEASE, release_call(state.keys, caller, force, scopes), finish,
                             target)

