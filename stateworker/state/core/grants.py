"""What a role grants, as pure functions: `*` patterns, function families, the built-in roles
and the records Redis keeps (`KeySpace.principals`, `KeySpace.roles`, JSON). No I/O: the
cache that holds them and answers every call is access.py.

A role is one permission: function families x scope patterns, optionally limited to the
read-only functions, plus the services a trigger it registers may target. A principal holds
roles (the union of their permissions) and `act_as` patterns (who its calls' context may
name: engine principals). Patterns have one wildcard, `*` (any run of characters, a run of
stars counting as one), everything else literal and the whole text matched: the rule of
`list-entries`' patterns (lua/includes/glob.lua), matched the same way here, by literal
chunks, so the time stays linear.

A `--allow` item is a named family or a function-id pattern:

  read      every read-only function (its Spec's `read_only`)
  write     every other function, except the two families below (set, update, barrier ...)
  triggers  state::register-trigger, state::keep-trigger, state::unregister-trigger,
            state::list-triggers
  claims    state::claim-namespace, state::release-namespace
  admin     every function, claims with `adopt`, and the administration (roles, restore,
            state::on-config-change)
  anything else: a function-id pattern (`state::get`, `state::*`, `builtin.state.*`)

A private namespace's accessor (`<prefix>::state::get`) is in the families of the native
function it serves, and a pattern is matched against the id as called.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import msgspec

from stateworker.errors import shown
from stateworker.patterns import glob_match, glob_parts
from stateworker.specs import Spec

FAMILIES = ("read", "write", "triggers", "claims", "admin")
TRIGGERS = frozenset({"state::register-trigger", "state::keep-trigger",
                      "state::unregister-trigger", "state::list-triggers"})
CLAIMS = frozenset({"state::claim-namespace", "state::release-namespace"})
ADMIN = frozenset({"state::on-config-change"})  # changes the service's settings
EVERY_SCOPE = "*"


class Role(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=False):
    """One role's record (`KeySpace.roles`: name -> this, JSON)."""

    allow: tuple[str, ...]  # families and function-id patterns
    scopes: tuple[str, ...]  # scope patterns
    read_only: bool = False  # only read-only functions, whatever `allow` names
    services: tuple[str, ...] = ()  # service-name patterns a trigger may target
    created_ms: int = 0


class Principal(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=False):
    """One principal's record (`KeySpace.principals`: name -> this, JSON). Never a password:
    Redis keeps that, in the principal's ACL user."""

    roles: tuple[str, ...]
    act_as: tuple[str, ...] = ()  # patterns its context's user_id, dag_name ... may match
    created_ms: int = 0
    # When its password last changed (`principal passwd`): a new record, so every replica's
    # console sessions and proven credentials of before end (app/logins.py).
    rotated_ms: int = 0


BUILTIN: dict[str, Role] = {
    "reader": Role(allow=("read",), scopes=(EVERY_SCOPE,), read_only=True),
    "writer": Role(allow=("read", "write"), scopes=(EVERY_SCOPE,)),
    "admin": Role(allow=("admin",), scopes=(EVERY_SCOPE,), services=(EVERY_SCOPE,)),
}

_encoder = msgspec.json.Encoder()


def encode(record: Role | Principal) -> bytes:
    return _encoder.encode(record)


def decode_role(text: bytes | str) -> Role:
    return msgspec.json.decode(text, type=Role)


def decode_principal(text: bytes | str) -> Principal:
    return msgspec.json.decode(text, type=Principal)


# ---- patterns ----------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Pattern:
    """A `*` pattern, compiled into its literal chunks (a run of stars counts as one)."""

    text: str
    parts: tuple[str, ...]

    @classmethod
    def of(cls, text: str) -> Pattern:
        return cls(text, tuple(glob_parts(text)))

    def matches(self, subject: str) -> bool:
        return glob_match(subject, self.parts)


def matches(pattern: str, subject: str) -> bool:
    """Whether `subject` matches the `*` pattern (the whole text)."""
    return Pattern.of(pattern).matches(subject)


# ---- functions ---------------------------------------------------------------------------------
class Functions:
    """Which function is in which family, from the specs of every function served."""

    def __init__(self, specs: Iterable[Spec]) -> None:
        self.specs: dict[str, Spec] = {spec.name: spec for spec in specs}
        self.reads = frozenset(n for n, s in self.specs.items() if s.read_only)

    def native(self, fn: str) -> str:
        """The function `fn` serves: itself, or for an accessor (`<prefix>::state::get`)
        the native function behind it."""
        if fn in self.specs:
            return fn
        head, sep, tail = fn.partition("::")
        return tail if sep and head and tail in self.specs else fn

    def is_read(self, fn: str) -> bool:
        return self.native(fn) in self.reads

    def family(self, fn: str) -> str:
        """The narrowest named family `fn` is in (an unknown function: `admin`)."""
        name = self.native(fn)
        if name in TRIGGERS:
            return "triggers"
        if name in CLAIMS:
            return "claims"
        if name in ADMIN:
            return "admin"
        if name in self.reads:
            return "read"
        return "write" if name in self.specs else "admin"

    def allows(self, item: str, fn: str) -> bool:
        """Whether one `--allow` item covers `fn`."""
        if item == "admin":
            return True
        if item in FAMILIES:
            return self.family(fn) == item or (item == "read" and self.is_read(fn))
        return matches(item, fn)

    def check_item(self, item: str) -> str | None:
        """Why an `--allow` item is refused (None: it is fine): a family, a pattern with a
        `*`, or a function served."""
        if not item or any(c.isspace() for c in item):
            return f"{shown(item)} is not a family nor a function id"
        if item in FAMILIES or "*" in item or self.native(item) in self.specs:
            return None
        return (f"{shown(item)} is no function served nor a family ({', '.join(FAMILIES)}); "
                "a pattern needs a '*'")


# ---- decisions ---------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Compiled:
    """One role, ready to decide on."""

    name: str
    role: Role
    scopes: tuple[Pattern, ...]
    services: tuple[Pattern, ...]

    @classmethod
    def of(cls, name: str, role: Role) -> Compiled:
        return cls(name, role, tuple(Pattern.of(p) for p in role.scopes),
                   tuple(Pattern.of(p) for p in role.services))

    def covers(self, functions: Functions, fn: str) -> bool:
        """Whether the role grants `fn` on some scope."""
        if self.role.read_only and not functions.is_read(fn):
            return False
        return any(functions.allows(item, fn) for item in self.role.allow)

    def on_scope(self, scope: str | None) -> bool:
        """Whether the role's scopes take in `scope` (None: a function naming no scope, so
        only a role on every scope, `*`)."""
        if scope is None:
            return EVERY_SCOPE in self.role.scopes
        return any(p.matches(scope) for p in self.scopes)

    @property
    def is_admin(self) -> bool:
        return "admin" in self.role.allow and EVERY_SCOPE in self.role.scopes \
            and not self.role.read_only


def compiled_roles(stored: Mapping[str, Role]) -> dict[str, Compiled]:
    """The built-in roles and the stored ones (a stored role never replaces a built-in)."""
    roles = {name: Compiled.of(name, role) for name, role in stored.items()}
    roles.update((name, Compiled.of(name, role)) for name, role in BUILTIN.items())
    return roles


def acts_as(principal: str, patterns: Iterable[str], user: str) -> bool:
    """Whether a principal may name `user` in its calls' context: its own name, or a match
    of one of its `act_as` patterns."""
    return user == principal or any(matches(p, user) for p in patterns)
