"""Who may act beyond their own namespace: the two decisions `acl` mode's roles make.

- `may_administer`: adopt a public scope in use (`state::claim-namespace` with `adopt:
  true`), release another namespace's scope (`state::release-namespace` with `force: true`).
- `may_call_service`: register a trigger whose calls go to a service (its `service` and
  `condition_service`).

In `off` mode (`ctx.principal` is None: the bus names no principal) and for in-process calls
every caller is trusted, so both say yes; an admin still has to ask (`adopt`, `force`), so no
call takes a scope by accident. In `acl` mode they ask the principals' roles,
`state.access` (`is_admin(principal)`, `may_call(principal, service)`), looked up by name so
these hooks work before roles exist: without them nobody is an admin and no service may be
targeted (closed, not open).
"""

from __future__ import annotations

from typing import Any

from stateworker.context import CallContext
from stateworker.errors import PermissionDenied


def _ask(state: Any, method: str, *args: str) -> bool:
    check = getattr(getattr(state, "access", None), method, None)
    return bool(check(*args)) if callable(check) else False


def may_administer(state: Any, ctx: CallContext) -> bool:
    """Whether the caller may adopt scopes in use and release other namespaces' scopes."""
    if ctx.principal is None:
        return True
    return _ask(state, "is_admin", ctx.principal)


def may_call_service(state: Any, ctx: CallContext, service: str) -> bool:
    """Whether the caller may make the service's functions be called (a trigger's target)."""
    if ctx.principal is None:
        return True
    return _ask(state, "may_call", ctx.principal, service)


def need_admin(state: Any, ctx: CallContext, fn: str, option: str) -> None:
    """Refuse `option` (`adopt`, `force`) of `fn` to a principal that is not an admin."""
    if not may_administer(state, ctx):
        raise PermissionDenied(
            f"$.{option}: principal {ctx.principal!r} may not {fn} with `{option}: true`: "
            "that needs the admin role", {"path": f"$.{option}", "principal": ctx.principal,
                                          "fn": fn, "missing": "admin"})
