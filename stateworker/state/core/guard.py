"""`acl` mode's checks of each call before it is planned: who may call which function, on
which scope, acting for whom (docs/security.md).

Redis decides who a caller is (the stream its ACL user may write to: bus/sources.py); this
module decides what that principal may do, asking the roles cache (`RedisState.access`,
state/core/access.py):
- `admit` (functions.prepare, once per call): the context's user fields (moco's `user_id`,
  Dagu's `dag_name` …) may name only whom the principal may act for; a function that names
  no scope needs a grant of its own on `*`; a private namespace's accessors serve only their
  owner (or an admin); the writer recorded is the principal.
- `scope` (validate.scope, for every scope a function touches, engines' included), and
  `each_scope` (a claim's or a release's scopes): the function the principal called must be
  granted on each.
- `every_scope` (list_groups, whoever runs it: moco's list_namespaces too) and `may_read` (a
  trigger's scope: its events carry values): a role on `*`, a read grant.
- `may_administer`, `may_call_service`, `need_admin`: adopting, forcing a release, a trigger's
  target services.
A call with no principal (`off` mode, an in-process call) is trusted: nothing is checked.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec

from stateworker import specs
from stateworker.context import CallContext
from stateworker.errors import PermissionDenied, shown

if TYPE_CHECKING:
    from stateworker.schemas import Trigger
    from stateworker.state.core.store import RedisState


READ_PROBE = specs.GET.name  # the read a trigger's values stand for (the `read` family)
# Native functions that name no `scope` but a list of them, each checked (`each_scope`).
PER_SCOPE = frozenset({specs.CLAIM_NAMESPACE, specs.RELEASE_NAMESPACE})


def admit(state: RedisState, fn: str, ctx: CallContext, *, scoped: bool) -> CallContext:
    """`ctx` for a call of `fn` (the id called: an engine's, an accessor's) by its principal,
    with the function noted for the scope checks; raises PermissionDenied."""
    principal = ctx.principal
    if principal is None:
        return ctx
    access = state.access
    access.check_context(principal, ctx.context)
    if ctx.namespace is not None:
        if ctx.namespace != principal and not access.is_admin(principal):
            raise PermissionDenied(
                f"{fn}: namespace {shown(ctx.namespace)} is not principal {shown(principal)}'s; its "
                "accessors serve only the principal that claimed it (or an admin)",
                {"principal": principal, "fn": fn, "namespace": ctx.namespace,
                 "missing": f"ownership of namespace {ctx.namespace}"})
    elif not scoped:
        access.check(principal, fn, None)
    return msgspec.structs.replace(ctx, function=fn, writer=_writer(principal, ctx))


def scope(state: RedisState, ctx: CallContext, text: str) -> None:
    """The principal's function must be granted on scope `text` (an accessor too: it is in
    the family of the native function it serves; its ownership is `admit`'s)."""
    if ctx.principal is not None:
        state.access.check(ctx.principal, ctx.function or "", [text])


def may_read(state: RedisState, ctx: CallContext, scope: str | None, path: str) -> None:
    """What a trigger delivers, its principal must be able to read: the scope its filter
    names (None: every scope, a read role on `*`)."""
    if ctx.principal is None:
        return
    try:
        state.access.check(ctx.principal, READ_PROBE, None if scope is None else [scope])
    except PermissionDenied as exc:
        where = "every scope" if scope is None else f"scope {shown(scope)}"
        raise PermissionDenied(
            f"{path}: a trigger on {where} hands its values to the service it calls; principal "
            f"{shown(ctx.principal)} may not read them ({exc.message})",
            {**exc.details, "path": path}) from None


def trigger_granted(state: RedisState, trigger: Trigger, scope: str) -> bool:
    """At delivery: whether a trigger's owner may still read `scope` and call its services
    (a role narrowed or a principal removed since it registered stops it at once). A trigger
    with no owner (`off` mode) is the service's: always."""
    owner = trigger.owner
    if owner is None:
        return True
    access = state.access
    try:
        access.check(owner, READ_PROBE, [scope])
    except PermissionDenied:
        return False
    services = {trigger.service, trigger.config.condition_service or trigger.service}
    return all(access.may_call_service(owner, service) for service in services)


def each_scope(state: RedisState, ctx: CallContext, scopes: list[str]) -> None:
    """A function naming several scopes (a claim, a release): each granted."""
    if ctx.principal is not None:
        state.access.check(ctx.principal, ctx.function or "", scopes)


def every_scope(state: RedisState, ctx: CallContext) -> None:
    """A function that reaches every scope (list_groups, whoever calls it: moco's
    list_namespaces does): a role on `*`."""
    if ctx.principal is not None:
        state.access.check(ctx.principal, ctx.function or "", None)


def _writer(principal: str, ctx: CallContext) -> str:
    """The writer recorded (`updated_by`, an event's `by`): the principal, with the execution
    id it names (`alice/run-7`), so no field makes a write look like another's (an engine
    principal's too: its execution ids are its own)."""
    execution = ctx.context.get("execution_id")
    return f"{principal}/{execution}" if isinstance(execution, str) and execution else principal


# ---- beyond a principal's own namespace -------------------------------------------------------
def may_administer(state: RedisState, ctx: CallContext) -> bool:
    """Whether the caller may adopt scopes in use (`state::claim-namespace` with `adopt:
    true`) and release other namespaces' scopes (`state::release-namespace` with `force:
    true`). `off` mode and in-process calls (no principal) are trusted; an admin still has
    to ask (`adopt`, `force`), so no call takes a scope by accident."""
    return ctx.principal is None or state.access.is_admin(ctx.principal)


def may_call_service(state: RedisState, ctx: CallContext, service: str) -> bool:
    """Whether the caller may make `service`'s functions be called (a trigger's `service`
    and `condition_service`)."""
    return ctx.principal is None or state.access.may_call_service(ctx.principal, service)


def need_admin(state: RedisState, ctx: CallContext, fn: str, option: str) -> None:
    """Refuse `option` (`adopt`, `force`) of `fn` to a principal that is not an admin."""
    if not may_administer(state, ctx):
        raise PermissionDenied(
            f"$.{option}: principal {shown(ctx.principal)} may not {fn} with `{option}: true`: "
            "that needs the admin role", {"path": f"$.{option}", "principal": ctx.principal,
                                          "fn": fn, "missing": "admin"})
