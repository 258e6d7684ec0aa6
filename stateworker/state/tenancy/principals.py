"""Principals and roles in Redis: their records (access.lua writes each with its registry
entry), a principal's Redis ACL user and the one rule it gets.

A principal's ACL user (user name = principal name) may do what a client of the bus needs
and nothing else (`acl_rule`):

- XADD to its own stream to the state service, `<prefix>:bus:state:from:<name>` (write-only:
  it cannot read, trim or delete it, nor see another's calls; and it can make no other
  stream, so no stream nobody reads grows); a selector of its own, so XADD reaches no other
  key and the reply commands reach no stream;
- BLMPOP, LPOP, DEL and PEXPIRE on its own reply lists, `<prefix>:reply:<name>:*`;
- the connection commands: AUTH, HELLO, PING, ECHO, SELECT, QUIT, RESET, CLIENT SETNAME /
  GETNAME / ID / INFO.

No SCAN, no KEYS, no read of an entry, the registry or another principal's stream or replies,
no publish (`resetchannels`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from stateworker.clock import now_ms
from stateworker.context import CallContext
from stateworker.errors import Conflict, InvalidRequest, NotFound, shown
from stateworker.keys import (
    PRINCIPAL_RE,
    STATE_SERVICE,
    principal_reply_pattern,
    principal_stream,
)
from stateworker.scripts.bindings import ACCESS, access_call
from stateworker.scripts.replies import AccessReply
from stateworker.state.core import grants
from stateworker.state.core.access import PRINCIPALS, ROLES
from stateworker.state.core.grants import BUILTIN, Principal, Role
from stateworker.state.core.store import RedisState
from stateworker.state.reactive import triggers
from stateworker.transport.plans import command_reply

SERVICE = STATE_SERVICE  # the stream `principal add` creates (with its consumer group)
# (no SELECT: a principal's keys are database 0's; in another it would XADD its own stream's
# name where no service reads, and that stream would grow for good)
CONNECTION_COMMANDS = ("+auth", "+hello", "+ping", "+echo", "+quit", "+reset",
                       "+client|setname", "+client|getname", "+client|id", "+client|info")
REPLY_COMMANDS = ("+blmpop", "+lpop", "+del", "+pexpire")


def acl_rule(prefix: str, name: str) -> list[str]:
    """The ACL SETUSER rules of principal `name` (no password, no on/off): what it may do. It
    starts from nothing (`resetkeys`, `clearselectors` ...), so setting it again over an
    existing user (`principal passwd`) gives the same user, not one more selector."""
    return ["resetkeys", "resetchannels", "clearselectors", "-@all", *CONNECTION_COMMANDS, *REPLY_COMMANDS,
            f"~{principal_reply_pattern(prefix, name)}",
            f"(+xadd %W~{principal_stream(prefix, SERVICE, name)})"]


def check_name(name: str, what: str = "principal") -> str:
    if not PRINCIPAL_RE.match(name):
        raise InvalidRequest(f"{what} name {shown(name)}: 1 to 64 of A-Z a-z 0-9 _ - (it names a "
                             "Redis ACL user and its streams)", {"name": name})
    return name


# ---- records -----------------------------------------------------------------------------------
async def _write(state: RedisState, op: str, name: str, record: bytes | str,
                 roles: Sequence[str] = ()) -> AccessReply:
    reply: AccessReply = await state.execute(state.script_plan(
        ACCESS, access_call(state.keys, op, name, record, roles), lambda r: r))
    if reply.reason == "exists":
        raise Conflict(f"principal {shown(name)} exists (remove it first, or `principal passwd` "
                       "for a new password)", {"name": name})
    if reply.reason == "no-role":
        raise NotFound(f"role {shown(reply.about)} does not exist (`stateworker role add`; built "
                       f"in: {', '.join(BUILTIN)})", {"role": reply.about})
    if reply.reason == "in-use":
        raise Conflict(f"role {shown(name)} is held by principal {shown(reply.about)}: remove or change "
                       "its principals first", {"role": name, "principal": reply.about})
    kind = ROLES if op.startswith("role") else PRINCIPALS
    state.access.set(kind, name, "" if op.endswith("-del") else record)  # this replica at once
    return reply


async def add_principal(state: RedisState, name: str, roles: Sequence[str],
                        act_as: Sequence[str]) -> Principal:
    """Store a new principal's record (CONFLICT when it exists, NOT_FOUND for a role that does
    not), then its stream to the state service with the service's consumer group."""
    check_name(name)
    if not roles:
        raise InvalidRequest("a principal needs at least one role (--role)", {"name": name})
    for pattern in act_as:
        if not pattern or any(c.isspace() for c in pattern):
            raise InvalidRequest(f"--act-as {shown(pattern)}: a pattern without spaces", {})
    record = Principal(roles=tuple(dict.fromkeys(roles)), act_as=tuple(act_as),
                       created_ms=now_ms())
    await _write(state, "principal-add", name, grants.encode(record),
                 [r for r in record.roles if r not in BUILTIN])
    await ensure_stream(state, name)
    return record


async def ensure_stream(state: RedisState, name: str) -> None:
    """The principal's stream to the state service and its group (BUSYGROUP: there)."""
    stream = principal_stream(state.settings.prefix, SERVICE, name)
    reply = await state.conn.pipeline([["XGROUP", "CREATE", stream, SERVICE, "0", "MKSTREAM"]])
    if isinstance(reply[0], Exception) and not str(reply[0]).startswith("BUSYGROUP"):
        raise reply[0]


async def remove_principal(state: RedisState, name: str) -> bool:
    """Drop the record (its stream is the caller's: principal remove drains it first)."""
    return (await _write(state, "principal-del", name, "")).existed


async def drop_registered(state: RedisState, name: str) -> tuple[list[str], list[str]]:
    """What a principal being removed registered: its triggers unregistered (they would go on
    calling its services), and its namespace's scopes named but left claimed, so its private
    entries stay private (an admin releases them with `force`; a principal added again under
    the name has them back). (trigger ids, scopes kept private)"""
    flat, claims = await state.conn.pipeline([["HGETALL", state.keys.triggers],
                                              ["HGETALL", state.keys.claims]])
    trusted = CallContext()  # (the operator's: no ownership to check)
    ids = [t.id for t in map(triggers.decode_trigger, flat[1::2]) if t.owner == name]
    for trigger_id in ids:
        await state.execute(triggers.unregister_plan(state, trigger_id, trusted))
    kept = sorted(scope.decode() for scope, owner in _pairs(claims) if owner.decode() == name)
    return ids, kept


async def add_role(state: RedisState, name: str, allow: Sequence[str], scopes: Sequence[str],
                   read_only: bool, services: Sequence[str]) -> tuple[Role, bool]:
    """Store a role (replacing one of that name); the record and whether it replaced one."""
    check_name(name, "role")
    if name in BUILTIN:
        raise Conflict(f"role {shown(name)} is built in: it cannot be replaced", {"role": name})
    functions = state.access.functions
    for item in allow:
        why = functions.check_item(item)
        if why is not None:
            raise InvalidRequest(f"--allow: {why}", {"allow": item})
    if not allow or not scopes:
        raise InvalidRequest("a role needs --allow and --scopes", {"role": name})
    for pattern in (*scopes, *services):
        if not pattern or any(c.isspace() for c in pattern):
            raise InvalidRequest(f"pattern {shown(pattern)}: a pattern without spaces", {})
    role = Role(allow=tuple(allow), scopes=tuple(scopes), read_only=read_only,
                services=tuple(services), created_ms=now_ms())
    reply = await _write(state, "role-set", name, grants.encode(role))
    return role, reply.existed


async def remove_role(state: RedisState, name: str) -> bool:
    if name in BUILTIN:
        raise Conflict(f"role {shown(name)} is built in: it cannot be removed", {"role": name})
    return (await _write(state, "role-del", name, "")).existed


async def stored(state: RedisState) -> tuple[dict[str, Principal], dict[str, Role]]:
    """Every stored principal and role, read from Redis now; STORE_LOST where Redis lost
    the registry or a restore writes it (`RedisState.registry_read_plan`): not none."""
    def records(replies: list[Any]) -> tuple[dict[str, Principal], dict[str, Role]]:
        principals = command_reply(replies[0], "reading the principals")
        roles = command_reply(replies[1], "reading the roles")
        return ({k.decode(): grants.decode_principal(v) for k, v in _pairs(principals)},
                {k.decode(): grants.decode_role(v) for k, v in _pairs(roles)})

    return await state.execute(state.registry_read_plan(  # type: ignore[no-any-return]
        [["HGETALL", state.keys.principals], ["HGETALL", state.keys.roles]], records))


def _pairs(flat: list[Any]) -> list[tuple[Any, Any]]:
    return list(zip(flat[::2], flat[1::2], strict=True))


# ---- ACL users ---------------------------------------------------------------------------------
async def set_user(state: RedisState, name: str, password: str | None) -> None:
    """Create or reset the principal's ACL user with its rule: on with `password`, or off with
    none (a user that cannot log in, until `principal passwd`)."""
    auth = ["on", f">{password}"] if password is not None else ["off"]
    await state.conn.execute("ACL", "SETUSER", name, "reset", *auth,
                             *acl_rule(state.settings.prefix, name))


async def set_password(state: RedisState, name: str, password: str) -> None:
    """A new password, the old ones dropped (rotation); the rule is set again, so a user
    missing after a restore comes back whole. The record says when (`rotated_ms`): every
    replica then ends the console sessions and HTTP proofs made with the old one."""
    await state.conn.execute("ACL", "SETUSER", name, "resetpass", "on", f">{password}",
                             *acl_rule(state.settings.prefix, name))
    await rotate(state, name)


async def rotate(state: RedisState, name: str) -> None:
    """The principal's record written again with `rotated_ms` now (nothing else changed): a
    changed record ends, on every replica within a moment, the console sessions and proven
    HTTP credentials made under the one before (app/logins.py). A new password, and a
    removal (its ACL user gone, its record kept while its streams drain), end them so."""
    records, _ = await stored(state)
    record = records.get(name)
    if record is not None:
        changed = msgspec.structs.replace(record, rotated_ms=now_ms())
        await _write(state, "principal-set", name, grants.encode(changed),
                     [r for r in changed.roles if r not in BUILTIN])


async def has_user(state: RedisState, name: str) -> bool:
    return await state.conn.execute("ACL", "GETUSER", name) is not None


async def save_acl(state: RedisState) -> bool:
    """ACL SAVE, when Redis has an aclfile; False when it has none (the users then live until
    redis-server restarts, unless its config is rewritten)."""
    reply = await state.conn.pipeline([["ACL", "SAVE"]])
    return not isinstance(reply[0], Exception)
