"""The access cache: who the principals are, what their roles grant, decided in memory on
every call in `acl` mode (a dict lookup, no round trip), like the claims cache (claims.py).

Redis holds two hashes in the registry's slot: `KeySpace.principals` (name -> grants.Principal,
JSON) and `KeySpace.roles` (name -> grants.Role, JSON; the built-in `reader`, `writer` and
`admin` are never stored). Both are written only by access.lua, which XADDs with every change
a registry entry `{kind: principals|roles, name, record}` (`record` empty: removed). The cache
is loaded when the state opens and after every reconnect of the registry follower, and applies
each entry by overwriting (or dropping) that one name: applying twice changes nothing.

The decisions (grants.py has the families and patterns):

- `check(principal, fn, scopes)`: every scope named needs a role of the principal that grants
  `fn` (a family or a pattern of its `allow`, and a read-only function when the role is
  `read_only`) on a pattern matching the scope; different scopes may be granted by different
  roles. `scopes` None or empty (a function naming no scope: list_groups, list-namespaces,
  barrier, the triggers): only a role on every scope (its scope patterns include `*`), since
  such a function reaches or reveals every scope. An unknown principal is denied.
- `check_context(principal, context)`: the context fields naming a user (moco's `user_id`,
  Dagu's `dag_name` and `root_dag_name`, KeeperHub's `org_id`) must equal the principal's own
  name or match one of its `act_as` patterns; an admin gets no exception (give it `act_as`).
- `is_admin`: one of its roles grants `admin` on `*` (the built-in `admin` does); only an admin
  may adopt a scope in use, and the administration (roles, restore) is the operator's.
- `may_call_service(principal, service)`: an admin, or a role whose `services` patterns match
  (a trigger may target only those).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

import msgspec

from stateworker.errors import PermissionDenied, shown
from stateworker.keys import KeySpace
from stateworker.specs import NATIVE, Spec
from stateworker.state.core import grants
from stateworker.state.core.grants import Compiled, Functions, Principal, Role
from stateworker.state.core.registry import RegistryEntry
from stateworker.transport.connection import RedisConnection

log = logging.getLogger("stateworker.state.core.access")
T = TypeVar("T")

PRINCIPALS = "principals"  # registry kinds
ROLES = "roles"
# The context fields that name who a call acts for (engines/*/rules.py read them).
IDENTITY_FIELDS = ("user_id", "dag_name", "root_dag_name", "org_id")


class Access:
    """Principals and roles of one prefix, and the decisions on them."""

    def __init__(self, conn: RedisConnection, keys: KeySpace) -> None:
        self._conn = conn
        self._keys = keys
        # Every function served and whether it is a read (the roles' families): the native
        # ones, until whoever serves more says so (`serve`: the service and an engines'
        # StateStore at their start, from the catalogue above this layer).
        self.specs: tuple[Spec, ...] = NATIVE
        self._principals: dict[str, Principal] = {}
        self._roles: dict[str, Role] = {}
        self._compiled: dict[str, Compiled] = grants.compiled_roles({})
        self._names: frozenset[str] = frozenset()
        self._covers: dict[tuple[str, str], tuple[Compiled, ...]] = {}
        # (principal, fn) a role grants on `*`: every call of it passes without a match (the
        # hot path of a writer: one set lookup per scope checked)
        self._everywhere: set[tuple[str, str]] = set()
        self._functions: Functions | None = None

    # ---- what is held ----------------------------------------------------------------------
    def principals(self) -> frozenset[str]:
        """Every known principal (the service reads their streams)."""
        return self._names

    def principal(self, name: str) -> Principal | None:
        return self._principals.get(name)

    def roles(self) -> dict[str, Role]:
        """Every role by name: the built-in ones and the stored ones."""
        return {name: c.role for name, c in self._compiled.items()}

    def serve(self, specs: tuple[Spec, ...]) -> None:
        """The functions served (their specs), for the roles' families and grant checks."""
        self.specs = specs
        self._functions = None

    @property
    def functions(self) -> Functions:
        if self._functions is None:
            self._functions = Functions(self.specs)
        return self._functions

    # ---- decisions -------------------------------------------------------------------------
    def check(self, principal: str, fn: str, scopes: Sequence[str] | None) -> None:
        """Raise PermissionDenied unless `principal` may call `fn` on every scope of `scopes`
        (None or empty: a function naming no scope, which needs a role on `*`)."""
        if (principal, fn) in self._everywhere:
            return
        granting = self._granting(principal, fn)
        for scope in scopes or (None,):
            if not any(role.on_scope(scope) for role in granting):
                raise self._denied(principal, fn, scope)

    def check_context(self, principal: str, context: Mapping[str, Any]) -> None:
        """Raise PermissionDenied when `context` names a user (IDENTITY_FIELDS) that
        `principal` may not act as."""
        record = self._principals.get(principal)
        for field in IDENTITY_FIELDS:
            user = context.get(field)
            if user is None:
                continue
            if record is not None and isinstance(user, str) and \
                    grants.acts_as(principal, record.act_as, user):
                continue
            acting = user if isinstance(user, str) else msgspec.json.encode(user).decode()
            raise PermissionDenied(
                f"context.{field}: principal {shown(principal)} may not act as {shown(user)} (its "
                f"act_as: {', '.join(record.act_as) if record and record.act_as else 'none'}; "
                f"a principal acts as itself and as what its act_as patterns match)",
                {"principal": principal, "path": f"context.{field}", "value": user,
                 "missing": f"act_as {acting}"})

    def is_admin(self, principal: str) -> bool:
        return any(role.is_admin for role in self._roles_of(principal))

    def may_call_service(self, principal: str, service: str) -> bool:
        """Whether a trigger `principal` registers may target `service`."""
        return any(role.is_admin or any(p.matches(service) for p in role.services)
                   for role in self._roles_of(principal))

    def _roles_of(self, principal: str) -> Iterable[Compiled]:
        record = self._principals.get(principal)
        if record is None:
            return ()
        return [self._compiled[r] for r in record.roles if r in self._compiled]

    def _granting(self, principal: str, fn: str) -> tuple[Compiled, ...]:
        """The principal's roles that grant `fn` on some scope (cached until a change)."""
        found = self._covers.get((principal, fn))
        if found is None:
            functions = self.functions
            found = tuple(r for r in self._roles_of(principal) if r.covers(functions, fn))
            if len(self._covers) > 100_000:  # principals x functions; an accessor id each
                self._covers.clear()
                self._everywhere.clear()
            self._covers[(principal, fn)] = found
            if any(role.on_scope(None) for role in found):
                self._everywhere.add((principal, fn))
        return found

    def _denied(self, principal: str, fn: str, scope: str | None) -> PermissionDenied:
        where = "every scope (*)" if scope is None else f"scope {shown(scope)}"
        record = self._principals.get(principal)
        if record is None:
            return PermissionDenied(
                f"principal {shown(principal)} is unknown: it may not call {fn} on {where} (add it "
                "with `stateworker principal add`)",
                {"principal": principal, "fn": fn, "scope": scope, "missing": "principal"})
        family = self.functions.family(fn)
        missing = f"{family} ({fn}) on {'*' if scope is None else scope}"
        held = ", ".join(record.roles) or "none"
        return PermissionDenied(
            f"principal {shown(principal)} may not call {fn} on {where}: none of its roles "
            f"({held}) grants {missing}", {"principal": principal, "fn": fn, "scope": scope,
                                           "missing": missing})

    # ---- following Redis -------------------------------------------------------------------
    async def reload(self) -> None:
        """Read every principal and role from Redis (replacing what is held)."""
        principals, roles = await self._conn.pipeline([["HGETALL", self._keys.principals],
                                                       ["HGETALL", self._keys.roles]])
        self._principals = _records(principals, grants.decode_principal, PRINCIPALS)
        self._roles = _records(roles, grants.decode_role, ROLES)
        self._changed()

    async def apply(self, entry: RegistryEntry) -> None:
        """A change served anywhere (a registry entry of kind `principals` or `roles`)."""
        self.set(entry.kind, entry.fields["name"], entry.fields.get("record", ""))

    def set(self, kind: str, name: str, record: str | bytes) -> None:
        """One name's record (empty: removed), as access.lua wrote it."""
        if kind == PRINCIPALS:
            if record:
                self._principals[name] = grants.decode_principal(record)
            else:
                self._principals.pop(name, None)
        elif kind == ROLES:
            if record:
                self._roles[name] = grants.decode_role(record)
            else:
                self._roles.pop(name, None)
        else:
            raise ValueError(f"not an access kind: {shown(kind)}")
        self._changed()

    def _changed(self) -> None:
        self._compiled = grants.compiled_roles(self._roles)
        self._names = frozenset(self._principals)
        self._covers = {}
        self._everywhere = set()


def _records(flat: list[bytes], decode: Callable[[bytes], T], kind: str) -> dict[str, T]:
    """A hash's records; one that does not decode (written by hand) is left out and logged:
    it grants nothing, and the state still opens."""
    found: dict[str, T] = {}
    for name, text in zip(flat[::2], flat[1::2], strict=True):
        try:
            found[name.decode()] = decode(text)
        except (msgspec.DecodeError, UnicodeDecodeError) as exc:
            log.warning("%s record %s is not valid (%s): left out, it grants nothing", kind,
                        shown(name.decode(errors="replace")), exc, extra={"event": "access.bad_record"})
    return found
