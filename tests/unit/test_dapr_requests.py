"""Dapr's requests read into native calls (app/dapr_requests.py): the configured stores, a
transaction's operations applied in order, and `ttlInSeconds`."""

from __future__ import annotations

from typing import Any

import pytest

from stateworker.app.dapr_requests import DaprError, Store, in_order, parse_stores, ttl_ms


def test_stores_are_names_scopes_or_prefixes() -> None:
    assert parse_stores(None) == {"statestore": Store("statestore", "statestore")}
    assert parse_stores(" a , b=orders ,c=t-* ") == {
        "a": Store("a", "a"), "b": Store("b", "orders"), "c": Store("c", "t-", spans=True)}
    for bad in ("a,a", "a=*", "a=x*y", "a/b"):
        with pytest.raises(ValueError, match="STATEWORKER_DAPR_STORES"):
            parse_stores(bad)
    spread = Store("c", "t-", spans=True)
    assert spread.address("app||k||x", "key") == ("t-app", "k||x")
    with pytest.raises(DaprError, match="<app>"):
        spread.address("k", "key")


def ops(*items: tuple[str, str, int | None]) -> list[dict[str, Any]]:
    return [{"op": op, "key": key, **({"value": 1} if op == "set" else {}),
             **({} if etag is None else {"expected_version": etag})} for op, key, etag in items]


def test_a_transaction_ends_as_its_last_operation_per_key() -> None:
    assert in_order(ops(("delete", "k1", None), ("set", "k2", None), ("delete", "k2", None),
                        ("set", "k3", None)), {}) == [
        {"op": "delete", "key": "k1"}, {"op": "delete", "key": "k2"},
        {"op": "set", "key": "k3", "value": 1}]
    # the first operation's ETag stays the key's condition; a later one is checked in order
    assert in_order(ops(("set", "k", 4), ("set", "k", 5), ("delete", "k", 6)), {}) == [
        {"op": "delete", "key": "k", "expected_version": 4}]
    with pytest.raises(DaprError) as caught:
        in_order(ops(("set", "k", 4), ("set", "k", 4)), {})
    assert caught.value.status == 409
    # a key read first (a later ETag on it): the read version is the condition
    assert in_order(ops(("set", "k", None), ("set", "k", 8)), {"k": 7}) == [
        {"op": "set", "key": "k", "value": 1, "expected_version": 7}]
    assert in_order(ops(("set", "k", None), ("set", "k", 1)), {"k": None}) == [
        {"op": "set", "key": "k", "value": 1, "expected_version": 0}]  # (absent: create)
    with pytest.raises(DaprError):
        in_order(ops(("delete", "k", None), ("set", "k", 3)), {"k": 3})
    # a first-write without an ETag (expected_version 0: absent) after a delete holds
    assert in_order(ops(("delete", "k", None), ("set", "k", 0)), {"k": 3}) == [
        {"op": "set", "key": "k", "value": 1, "expected_version": 3}]
    with pytest.raises(DaprError):
        in_order(ops(("set", "k", None), ("set", "k", 0)), {"k": None})


def test_ttl_in_seconds_as_dapr_stores_read_it() -> None:
    item = "$[0].metadata."
    assert ttl_ms([({}, item)]) == (None, None)
    for never in ("", "0", "-1"):
        assert ttl_ms([({"ttlInSeconds": never}, item)]) == (None, f"{item}ttlInSeconds")
    assert ttl_ms([({"ttlInSeconds": "60"}, item)]) == (60_000, f"{item}ttlInSeconds")
    assert ttl_ms([({"ttlInSeconds": "315360000"}, item)])[0] == 315_360_000_000  # ten years
    for bad in ("-2", "1.5", "x", "1" * 13, "315360001"):
        with pytest.raises(DaprError, match=r"\$\[0\]\.metadata\.ttlInSeconds"):
            ttl_ms([({"ttlInSeconds": bad}, item)])


def test_the_urls_metadata_wins_over_an_items_over_a_transactions() -> None:
    """Dapr's runtime copies the URL's `metadata.*` over each item's (decision 0065)."""
    shared, item, url = ({"ttlInSeconds": "30"}, "$.metadata."), \
        ({"ttlInSeconds": "60"}, "$.operations[0].request.metadata."), \
        ({"ttlInSeconds": "-1"}, "metadata.")
    assert ttl_ms([shared, item, url]) == (None, "metadata.ttlInSeconds")
    assert ttl_ms([shared, item, ({}, "metadata.")]) == (
        60_000, "$.operations[0].request.metadata.ttlInSeconds")
    assert ttl_ms([shared, ({}, "$.operations[0].request.metadata."), ({}, "metadata.")]) == (
        30_000, "$.metadata.ttlInSeconds")
