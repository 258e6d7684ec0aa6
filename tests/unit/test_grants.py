"""What roles grant (state/core/grants.py, state/core/access.py), decided without Redis: `*` patterns
against an independent reference, the families, the built-in roles, scopes, act_as, and a
property test of `Access.check` against a reference decision."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from stateworker.engines.catalog import CATALOG
from stateworker.errors import PermissionDenied
from stateworker.keys import KeySpace
from stateworker.specs import NATIVE
from stateworker.state.core import grants
from stateworker.state.core.access import PRINCIPALS, ROLES, Access
from stateworker.state.core.grants import Pattern, Principal, Role
from stateworker.state.tenancy.principals import acl_rule
from stateworker.transport.connection import RedisConnection


def reference_match(pattern: str, subject: str) -> bool:
    """`*` any run of characters, everything else literal, the whole text."""
    regex = ".*".join(re.escape(part) for part in pattern.split("*"))
    return re.fullmatch(regex, subject, re.DOTALL) is not None


texts = st.text(alphabet="ab*:/-", max_size=10)


@given(texts, st.text(alphabet="ab:/-", max_size=12))
@settings(max_examples=2000)
def test_a_pattern_matches_as_the_reference_does(pattern: str, subject: str) -> None:
    assert Pattern.of(pattern).matches(subject) == reference_match(pattern, subject)


@given(st.text(alphabet="ab*", max_size=8), st.text(alphabet="ab", max_size=8))
@example("a*b*b", "ab")  # a middle chunk must not overlap the last one
@settings(max_examples=2000)
def test_a_pattern_of_few_letters_matches_as_the_reference_does(pattern: str,
                                                                subject: str) -> None:
    assert Pattern.of(pattern).matches(subject) == reference_match(pattern, subject)


@given(texts, texts)
@settings(max_examples=500)
def test_a_pattern_matches_a_subject_holding_stars_as_the_reference_does(
        pattern: str, subject: str) -> None:
    assert Pattern.of(pattern).matches(subject) == reference_match(pattern, subject)


def access(roles: dict[str, Role] | None = None,
           principals: dict[str, Principal] | None = None) -> Access:
    held = Access(RedisConnection("redis://127.0.0.1:1/0"), KeySpace("t", 4))  # never connected
    held.serve(CATALOG.specs)  # (as the service does: the engines' functions too)
    for name, role in (roles or {}).items():
        held.set(ROLES, name, grants.encode(role))
    for name, principal in (principals or {}).items():
        held.set(PRINCIPALS, name, grants.encode(principal))
    return held


def denied(held: Access, principal: str, fn: str, scopes: Any) -> PermissionDenied | None:
    try:
        held.check(principal, fn, scopes)
    except PermissionDenied as exc:
        return exc
    return None


def test_the_built_in_roles() -> None:
    held = access(principals={"r": Principal(roles=("reader",)), "w": Principal(roles=("writer",)),
                              "a": Principal(roles=("admin",))})
    for fn in ("state::get", "state::list-entries", "builtin.state.get_state", "state.get",
               "state::list-triggers"):
        assert denied(held, "r", fn, ["orders"]) is None, fn
    for fn in ("state::set", "state::update", "builtin.state.set_state", "state::barrier"):
        assert denied(held, "r", fn, ["orders"]) is not None, fn
        assert denied(held, "w", fn, ["orders"]) is None, fn
    for fn in ("state::register-trigger", "state::claim-namespace"):
        assert denied(held, "w", fn, ["orders"]) is not None, fn
        assert denied(held, "a", fn, ["orders"]) is None, fn
    assert [held.is_admin(p) for p in "rwa"] == [False, False, True]
    assert held.may_call_service("a", "reactor") and not held.may_call_service("w", "reactor")


def test_a_denial_names_the_principal_the_function_the_scope_and_the_missing_grant() -> None:
    held = access({"orders": Role(allow=("read", "state::set"), scopes=("orders/*",))},
                  {"bob": Principal(roles=("orders",))})
    assert denied(held, "bob", "state::set", ["orders/1"]) is None
    assert denied(held, "bob", "state::get", ["orders/1"]) is None
    error = denied(held, "bob", "state::set", ["stock"])
    assert error is not None and error.code == "PERMISSION_DENIED"
    assert error.details == {"principal": "bob", "fn": "state::set", "scope": "stock",
                             "missing": "write (state::set) on stock"}
    for text in ('"bob"', "state::set", '"stock"', "orders", "write (state::set) on stock"):
        assert text in error.message, text
    assert denied(held, "bob", "state::delete", ["orders/1"]) is not None  # not in its allow


def test_a_function_naming_no_scope_needs_a_role_on_every_scope() -> None:
    held = access({"orders": Role(allow=("read",), scopes=("orders/*",))},
                  {"bob": Principal(roles=("orders",)), "r": Principal(roles=("reader",))})
    error = denied(held, "bob", "state::list_groups", None)
    assert error is not None and error.details["scope"] is None
    assert error.details["missing"] == "read (state::list_groups) on *"
    assert denied(held, "bob", "state::list_groups", []) is not None
    assert denied(held, "r", "state::list_groups", None) is None


def test_a_call_naming_several_scopes_needs_each_from_any_role() -> None:
    held = access({"a": Role(allow=("claims",), scopes=("a/*",)),
                   "b": Role(allow=("claims",), scopes=("b/*",))},
                  {"both": Principal(roles=("a", "b")), "one": Principal(roles=("a",))})
    assert denied(held, "both", "state::claim-namespace", ["a/1", "b/1"]) is None
    error = denied(held, "one", "state::claim-namespace", ["a/1", "b/1"])
    assert error is not None and error.details["scope"] == "b/1"


def test_a_read_only_role_grants_only_reads_whatever_it_allows() -> None:
    held = access({"ro": Role(allow=("state::*", "write"), scopes=("*",), read_only=True)},
                  {"p": Principal(roles=("ro",))})
    assert denied(held, "p", "state::get", ["x"]) is None
    assert denied(held, "p", "state::set", ["x"]) is not None
    assert denied(held, "p", "state::delete", ["x"]) is not None


def test_an_accessor_is_in_the_family_of_the_function_it_serves() -> None:
    held = access(principals={"r": Principal(roles=("reader",))})
    assert denied(held, "r", "mallory::state::get", ["m/1"]) is None
    assert denied(held, "r", "mallory::state::compare-and-set", ["m/1"]) is not None


def test_an_unknown_principal_and_a_removed_role_are_denied() -> None:
    held = access({"gone": Role(allow=("read",), scopes=("*",))},
                  {"p": Principal(roles=("gone",))})
    error = denied(held, "nobody", "state::get", ["x"])
    assert error is not None and error.details["missing"] == "principal"
    assert '"nobody"' in error.message
    held.set(ROLES, "gone", "")
    assert denied(held, "p", "state::get", ["x"]) is not None
    held.set(PRINCIPALS, "p", "")
    assert held.principals() == frozenset()


def test_a_stored_role_never_replaces_a_built_in_one() -> None:
    held = access({"reader": Role(allow=("admin",), scopes=("*",))},
                  {"p": Principal(roles=("reader",))})
    assert not held.is_admin("p") and denied(held, "p", "state::set", ["x"]) is not None


def test_context_names_only_the_principal_itself_or_what_act_as_matches() -> None:
    held = access(principals={"moco": Principal(roles=("writer",), act_as=("tenant-*",)),
                              "bob": Principal(roles=("writer",))})
    held.check_context("moco", {"user_id": "tenant-7", "workflow_id": "w"})
    held.check_context("moco", {"user_id": "moco", "dag_name": "tenant-etl"})
    held.check_context("bob", {"user_id": "bob", "org_id": "bob"})
    held.check_context("bob", {"workflow_id": "anything"})
    for principal, context, field in (
            ("bob", {"user_id": "alice"}, "context.user_id"),
            ("moco", {"dag_name": "other"}, "context.dag_name"),
            ("moco", {"root_dag_name": "x"}, "context.root_dag_name"),
            ("bob", {"org_id": "acme"}, "context.org_id"),
            ("bob", {"user_id": ["bob"]}, "context.user_id"),
            ("ghost", {"user_id": "ghost"}, "context.user_id")):
        with pytest.raises(PermissionDenied) as raised:
            held.check_context(principal, context)
        assert raised.value.details["path"] == field, context
        assert field in raised.value.message and json.dumps(principal) in raised.value.message


def test_services_a_trigger_may_target() -> None:
    held = access({"jobs": Role(allow=("triggers",), scopes=("*",), services=("jobs-*",))},
                  {"p": Principal(roles=("jobs",))})
    assert held.may_call_service("p", "jobs-a") and not held.may_call_service("p", "billing")
    assert not held.may_call_service("nobody", "jobs-a")


def test_allow_items_are_families_patterns_or_functions_served() -> None:
    functions = access().functions
    for item in (*grants.FAMILIES, "state::*", "state::get", "builtin.state.*", "state.get"):
        assert functions.check_item(item) is None, item
    for item in ("state::nope", "", "a b"):
        assert functions.check_item(item) is not None, item


def test_the_acl_rule_of_a_principal() -> None:
    assert acl_rule("sw", "bob") == [
        "resetkeys", "resetchannels", "clearselectors", "-@all", "+auth", "+hello", "+ping",
        "+echo", "+quit", "+reset", "+client|setname", "+client|getname",
        "+client|id", "+client|info",
        "+blmpop", "+lpop", "+del", "+pexpire", "~sw:reply:bob:*",
        "(+xadd %W~sw:bus:state:from:bob)"]


# ---- the decision against a reference ----------------------------------------------------------
FUNCTIONS = [spec.name for spec in NATIVE] + ["builtin.state.get_state",
                                               "builtin.state.set_state", "ns::state::get"]
READS = {s.name for s in NATIVE if s.read_only} | {"builtin.state.get_state", "ns::state::get"}
FAMILY = {"state::register-trigger": "triggers", "state::keep-trigger": "triggers",
          "state::unregister-trigger": "triggers",
          "state::list-triggers": "triggers", "state::claim-namespace": "claims",
          "state::release-namespace": "claims", "state::on-config-change": "admin"}


def reference_allows(item: str, fn: str) -> bool:
    if item == "admin":
        return True
    if item == "read":
        return fn in READS
    if item in ("write", "triggers", "claims"):
        kind = FAMILY.get(fn.removeprefix("ns::"), "read" if fn in READS else "write")
        return kind == item
    return reference_match(item, fn)


def reference_permits(roles: list[Role], fn: str, scope: str | None) -> bool:
    for role in roles:
        if role.read_only and fn not in READS:
            continue
        if not any(reference_allows(item, fn) for item in role.allow):
            continue
        if scope is None and "*" in role.scopes:
            return True
        if scope is not None and any(reference_match(p, scope) for p in role.scopes):
            return True
    return False


roles_st = st.lists(st.builds(
    Role,
    allow=st.lists(st.sampled_from([*grants.FAMILIES, "state::*", "state::get", "*::state::*",
                                    "builtin.state.*", "state::list*"]),
                   min_size=1, max_size=3).map(tuple),
    scopes=st.lists(st.sampled_from(["*", "a/*", "a/b", "*b", "a*b*", "b"]),
                    min_size=1, max_size=2).map(tuple),
    read_only=st.booleans()), min_size=0, max_size=3)


@given(roles_st, st.sampled_from(FUNCTIONS),
       st.lists(st.one_of(st.none(), st.sampled_from(["a/b", "a/c", "b", "ab", "a/bb", "x"])),
                max_size=3))
@settings(max_examples=1500)
def test_check_decides_as_the_reference(roles: list[Role], fn: str,
                                        scopes: list[str | None]) -> None:
    names = {f"r{i}": role for i, role in enumerate(roles)}
    held = access(names, {"p": Principal(roles=tuple(names))})
    asked: list[str] | None = [s for s in scopes if s is not None] if scopes and None not in \
        scopes else None
    expected = all(reference_permits(roles, fn, scope) for scope in (asked or [None]))
    assert (denied(held, "p", fn, asked) is None) == expected
