"""The typed face of `StateClient`, derived from the function specs (specs.py): one method per
`state::*` function (`spec_method`: positional fields, keyword fields and options, Python
values in and out, its docstring and Raises text from the spec), and `typed(spec, request)`,
any function's (an engine's too) request Struct in, its result Struct out. Kept apart from the
transport (bus/client.py: sends, retries; bus/reply_reader.py: replies)."""

from __future__ import annotations

import abc
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec

from stateworker import specs
from stateworker.specs import Face, Spec, spec_method

CLIENT = Face("call", "CallTimeout (TIMEOUT), Unavailable (UNAVAILABLE), InternalError "
                      "(INTERNAL): as `call_json`.")
_encoder = msgspec.json.Encoder()


class TypedCalls(abc.ABC):
    """`state::*` as methods; the class that mixes it in provides `call` and `call_json`."""

    @abc.abstractmethod
    async def call(self, fn: str, body: Any, **options: Any) -> Any:
        """Call `fn` with `body` (Python values); the result as Python values."""

    call_json: Callable[..., Awaitable[bytes]]  # `fn` with a JSON body; the result's JSON

    async def typed(self, spec: Spec, request: msgspec.Struct, **options: Any) -> Any:
        """Call `spec`'s function with its request Struct; its result as `spec.result`
        (values stay raw JSON, `msgspec.Raw`, as the service wrote them).

        Args:
            spec: the function's spec (stateworker.specs, or an engine's `SPECS`).
            request: an instance of `spec.request`.
            **options: `call_json`'s keyword options.

        Raises:
            StateError: as `call_json`, and the errors of the function (its spec's `raises`).

        Example: `await client.typed(specs.GET, GetRequest("orders", "o-1"))`
        """
        raw = await self.call_json(spec.name, _encoder.encode(request), **options)
        return msgspec.json.decode(raw, type=spec.result)

    get = spec_method(specs.GET, CLIENT)
    set = spec_method(specs.SET, CLIENT)
    delete = spec_method(specs.DELETE, CLIENT)
    list = spec_method(specs.LIST, CLIENT)
    list_keys = spec_method(specs.LIST_KEYS, CLIENT)
    list_groups = spec_method(specs.LIST_GROUPS, CLIENT)
    compare_and_set = spec_method(specs.COMPARE_AND_SET, CLIENT)
    get_entry = spec_method(specs.GET_ENTRY, CLIENT)
    update = spec_method(specs.UPDATE, CLIENT)
    list_entries = spec_method(specs.LIST_ENTRIES, CLIENT)
    diff = spec_method(specs.DIFF, CLIENT)
    update_topic = spec_method(specs.UPDATE_TOPIC, CLIENT)
    delete_by_topic = spec_method(specs.DELETE_BY_TOPIC, CLIENT)
    list_namespaces = spec_method(specs.LIST_NAMESPACES, CLIENT)
    barrier = spec_method(specs.BARRIER, CLIENT)
    delete_barrier = spec_method(specs.DELETE_BARRIER, CLIENT)
    claim_namespace = spec_method(specs.CLAIM_NAMESPACE, CLIENT)
    release_namespace = spec_method(specs.RELEASE_NAMESPACE, CLIENT)
    register_trigger = spec_method(specs.REGISTER_TRIGGER, CLIENT)
    keep_trigger = spec_method(specs.KEEP_TRIGGER, CLIENT)
    unregister_trigger = spec_method(specs.UNREGISTER_TRIGGER, CLIENT)
    list_triggers = spec_method(specs.LIST_TRIGGERS, CLIENT)
    transaction = spec_method(specs.TRANSACTION, CLIENT)
    set_many = spec_method(specs.SET_MANY, CLIENT)
    delete_many = spec_method(specs.DELETE_MANY, CLIENT)
    get_many = spec_method(specs.GET_MANY, CLIENT)
    delete_by_prefix = spec_method(specs.DELETE_BY_PREFIX, CLIENT)
    query = spec_method(specs.QUERY, CLIENT)
    create_index = spec_method(specs.CREATE_INDEX, CLIENT)
    drop_index = spec_method(specs.DROP_INDEX, CLIENT)
    list_indexes = spec_method(specs.LIST_INDEXES, CLIENT)
    ui_content = spec_method(specs.UI_CONTENT, CLIENT)
    list_entries_page = spec_method(specs.LIST_ENTRIES_PAGE, CLIENT)
    on_config_change = spec_method(specs.ON_CONFIG_CHANGE, CLIENT)
