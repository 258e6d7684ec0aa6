"""Private namespaces: `state::claim-namespace` and the accessors of a claimed namespace.

A worker claims scopes for itself (claim.lua: all or nothing, the first claimant keeps a
scope). From then on every public function refuses those scopes (`validate.scope`), listings
leave them out, and the namespace's accessors `<prefix>::state::get`, `::list`,
`::list_keys`, `::compare-and-set` serve them, and only them: each runs the public function
of its name with `CallContext.namespace` set, which turns the claimed-scope refusal into the
requirement that the scope is the namespace's own. Any caller may call an accessor (iii
registers them as functions, open to every worker): the claim hides scopes from the public
functions and from triggers, it does not authenticate readers.
"""

from __future__ import annotations

from stateworker.schemas import ClaimResult
from stateworker.scripts.bindings import CLAIM, claim_call
from stateworker.scripts.replies import ClaimReply
from stateworker.scripts.statuses import Target
from stateworker.specs import ACCESSORS as ACCESSED
from stateworker.state.store import RedisState
from stateworker.transport.plans import Plan

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


def claim_plan(state: RedisState, prefix: str, scopes: list[str], target: Target) -> Plan:
    """Claim `scopes` (validated) for `prefix`; this replica's cache learns of it at once,
    the others through the registry entry the script writes."""
    def finish(done: ClaimReply) -> ClaimResult:
        state.claims.add(prefix, done.owned)
        return ClaimResult(done.claimed, sorted(done.owned, key=lambda s: s.encode()),
                           accessor_ids(prefix))

    return state.script_plan(CLAIM, claim_call(state.keys, prefix, scopes), finish, target)

