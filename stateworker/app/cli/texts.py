"""The descriptions and epilogs (exit statuses, examples) of the `stateworker` subcommands."""

from __future__ import annotations

from stateworker.app.cli.common import USAGE_LINE
from stateworker.events.history import HISTORY_BYTES, HISTORY_KEEP, HISTORY_SCAN

FAILED_CALL = """\
  1  the call failed: {code, message, details} on stderr (JSON): an error reply
     (INVALID_REQUEST, CONFLICT, NOT_FOUND, UNKNOWN_FUNCTION ...), TIMEOUT (no reply in
     time; it may still be applied before its deadline) or UNAVAILABLE (no Redis, or no
     consumer group reads the service's stream: nothing serves it; not sent)"""


def call_epilog(ok: str, examples: str, note: str = "") -> str:
    return (f"{note}exit status:\n  0  {ok}\n{FAILED_CALL}\n{USAGE_LINE}\n\n"
            f"examples:\n{examples}")


CALL = call_epilog(
    "the call succeeded: its result (JSON) is on stdout", """\
  stateworker call state::set '{"scope":"orders","key":"o-1","value":{"total":12.50}}'
  stateworker call --timeout 2 state::get '{"scope":"orders","key":"o-1"}'
  stateworker call --service orders orders::create '{"id":"o-7"}'   # a Worker("orders")
  stateworker call --context '{"dag_name":"etl"}' state.set '{"key":"cursor","value":7}'
""", note="""\
--timeout is the call's whole time: waiting for Redis (restarting, loading), sending,
re-sending and the reply. The call carries its deadline (now + timeout, as deadline_ms), so
after a TIMEOUT it is applied before that deadline or never; the message says so. A service
that no consumer group reads (nothing ever served it) is UNAVAILABLE at once, not sent.

""")

GET = call_epilog("the value (JSON) is on stdout", """\
  stateworker get orders o-1
  stateworker get orders o-1 | jq .total
""", note="Prints the stored value as JSON (state::get-entry); a key that is missing or "
   "expired is\nNOT_FOUND (exit 1), so a stored null and no key differ.\n\n")

PUT = call_epilog("written: state::set's result (JSON) is on stdout", """\
  stateworker put orders o-1 '{"total":12.50}'
  stateworker put orders greeting '"hello"'          # a string is JSON too: quoted
  echo '[1,2,3]' | stateworker put orders list -      # the value from stdin
  stateworker put sessions s-9 '{"user":"u-1"}' --ttl 30m --topic web
  stateworker put orders o-1 '{"total":13}' --if-version 1   # CONFLICT unless at version 1
""", note="VALUE is one JSON value, kept as written (numbers exactly); `-` reads it from "
   "stdin.\nNot JSON: exit 2 with the reason, nothing sent. --ttl, --topic and --if-version "
   "are\nstate::set's ttl_ms, topic and expected_version: a write replaces the key's topic "
   "and\nexpiry, so a put without them clears them.\n\n")

DEL = call_epilog("deleted (or there was nothing): the old value (JSON, null when none) is "
                  "on stdout;\n     with --prefix: {\"deleted\": N}", """\
  stateworker del orders o-1
  stateworker del orders --prefix tmp-                # every key that starts with tmp-
""", note="--prefix deletes in batches (state::delete-by-prefix, 1000 keys a call) until none "
   "is left;\neach batch is one step, the whole is not: a failure leaves the batches before "
   "it deleted.\n\n")

DELETE_BARRIER = call_epilog("done: `{\"deleted\": true}` on stdout (`false`: there was no "
                             "such barrier)", """\
  stateworker delete-barrier load-7
""")

LS = call_epilog("one page of entries is on stdout (a table, or the JSON of "
                 "state::list-entries)", """\
  stateworker ls orders
  stateworker ls orders --prefix o- --values
  stateworker ls orders --limit 100 --after WyJrZXkiLCJhc2MiLCJvLTk5IiwiMCIsMF0
                                              # the next page (the cursor next_after)
  stateworker ls orders -o json | jq -r '.entries[].key'
""", note="One page of a scope's entries in key byte order (state::list-entries): key, "
   "version,\nupdated_at, topic (and the value with --values). When there are more, the table "
   "ends\nwith the command for the next page: --after the cursor the page ended with "
   "(next_after\nin the JSON).\n\n")

TXN = call_epilog("done: state::transaction's result is on stdout (a table, or its JSON)", """\
  echo '[{"op":"check","key":"a","expected_version":3},
         {"op":"set","key":"a","value":{"n":4}},
         {"op":"delete","key":"lock"}]' | stateworker txn orders
  stateworker txn orders transfer.json -o json
""", note="FILE (or stdin) holds a JSON list of ops, or an object with ops, compare and "
   "else_ops\n(README: Transactions). All or nothing: when an op's condition fails, nothing "
   "is\nwritten and the error names the op (details.op_index).\n\n")

QUERY = call_epilog("one page of matching entries is on stdout (a table, or the JSON of "
                    "state::query)", """\
  stateworker query orders --where '/status eq "open"' --where '/total gte 100'
  stateworker query orders --where '/tags in ["a","b"]' -o json | jq '.entries[].key'
""", note="Each --where is POINTER OP VALUE: an RFC 6901 pointer into the value, an op (eq ne "
   "lt\nlte gt gte in exists prefix) and a JSON value; every one must hold. When there are "
   "more,\nthe table ends with the command for the next page.\n\n")

LIST_TRIGGERS = call_epilog("the registered triggers are on stdout (a table, or the JSON "
                            "of state::list-triggers)", """\
  stateworker triggers ls
  stateworker triggers ls -o json | jq -r '.triggers[].id'
""")

TRIGGERS = call_epilog("done (each VERB's --help says what it prints)", """\
  stateworker triggers ls
  stateworker triggers add audit::seen --service audit --scope orders --event-type deleted
  stateworker triggers rm t-1
""", note="A trigger calls a service's function (a Worker's) with every change event that "
   "matches\nits filters (README: Triggers); `stateworker call state::register-trigger` takes "
   "every\noption (match rules, conditions).\n\n")

TRIGGERS_ADD = call_epilog("registered: {\"id\": ...} on stdout", """\
  stateworker triggers add audit::seen --service audit --scope orders
  stateworker triggers add mail::send --service mail --scope users --key-prefix u- \\
      --event-type created --id welcome --ttl 1h
""", note="Every filter given must hold; none: every event of every scope. It sees the "
   "events after\nit is registered (state::register-trigger).\n\n")

TRIGGERS_RM = call_epilog("done: {\"id\": ..., \"removed\": true} on stdout (`false`: there "
                          "was no such trigger)", """\
  stateworker triggers rm welcome
""")

SCOPES = call_epilog("the scopes are on stdout (a table, or the JSON of "
                     "state::list-namespaces)", """\
  stateworker scopes
  stateworker scopes --pattern 'order*' -o json | jq -r '.namespaces[]'
""", note="The scopes holding at least one live key, in byte order (state::list-namespaces).\n\n")

HISTORY = f"""\
The key's changes among the last {HISTORY_SCAN} events of its partition's stream, newest first
(at most {HISTORY_KEEP}): revision, time, event, version and the value written (the old one
for a delete). It reads Redis directly, as `watch` does; trimming (STATEWORKER_EVENTS_RETAIN)
and the other keys' events bound how far back it goes, and so does {HISTORY_BYTES // 2**20} MiB of events
read (`stopped_early`: true). The JSON (piped, or --output json) is the console's history:
{{scope, key, scanned, read, stopped_early, events}}, each event as `watch` prints it.

exit status:
  0  the changes found are on stdout (none: it says so)
  1  {{code, message, details}} on stderr (JSON): UNAVAILABLE (no Redis)
{USAGE_LINE}

examples:
  stateworker history orders o-1
  stateworker history orders o-1 -o json | jq '.events[].new_value'
"""

WATCH = f"""\
Prints one JSON line per event, as it happens: {{"type":"state","event_type":"state:updated",
"scope","key","old_value","new_value","version","revision","ts","ts_ms","by"}}. With
--progress also a bookmark {{"type":"bookmark","revision":...}} after STATEWORKER_WATCH_PROGRESS_S
(5) seconds without an event: every event up to it has been printed (or passed over by the
filters), so --from <its revision> goes on from there without printing anything twice. One
scope's events come in their order; without a scope, every partition's, merged in revision
order. A Redis restart or a broken connection is waited out; the watch goes on where it was.

exit status:
  0  stopped by Ctrl-C or SIGTERM, or its reader went away (`| head -n 2`)
  1  {{code, message, details}} on stderr (JSON): COMPACTED (the streams cannot prove the
     history continuous from --from: events after it were trimmed, or Redis was restored or
     replaced since, or the revision is ahead of it; details.reason says which and
     details.oldest_kept names the oldest revision kept: resync), or UNAVAILABLE (no Redis)
{USAGE_LINE}

examples:
  stateworker watch orders
  stateworker watch orders o-1 --from 1700000000000-0
  stateworker watch orders --prefix o- --progress
  stateworker watch | jq -c 'select(.event_type == "state:deleted")'
"""

STATUS = f"""\
The table (on a terminal) is a summary: Redis, each service's pending calls and consumers,
the dispatch and the snapshot with their partitions in one line each ("16 partitions, lag
0"). The JSON (piped, or --output json) is the whole report: every partition, counter and
consumer.

exit status:
  0  Redis answered and holds the data (the compose health check relies on it)
  1  Redis did not answer (reachable: false, and why), or it lost the data PostgreSQL
     holds (store_lost: what was found; `stateworker restore` recovers)
{USAGE_LINE}

examples:
  stateworker status
  stateworker status -o json | jq '.dispatch.partitions[] | select(.lag_events > 0)'
"""

SERVE = f"""\
Prints one JSON line once it serves ({{"serving":"state",...}}; with --http it names the
console's URL, the call API's and Dapr's state paths), then JSON log lines on stderr.

exit status:
  0  stopped by SIGINT or SIGTERM (calls in flight answered within --grace-s)
  1  the service's Redis user lacks a permission (one line naming it; docs/security.md)
{USAGE_LINE} (also a Redis that is unfit: AOF off ...)
"""

RESTORE = f"""\
Rebuilds an empty Redis from the PostgreSQL snapshot: a progress line on stderr, the
summary (JSON) on stdout. The service may run meanwhile: writes are refused (STORE_LOST)
until the restore's last step. A restore that stopped half way may be run again.

exit status:
  0  restored
  1  refused or failed ({{code, message, details}} on stderr)
{USAGE_LINE} (also: no STATEWORKER_POSTGRES_URL)
"""

ACL_RULE = f"""\
exit status:
  0  the line is on stdout
{USAGE_LINE}
"""

COMPLETION = f"""\
Prints a completion script for the shell, generated from this command's own parser:
subcommands (nested ones too), options, and the choices of an option.

  source <(stateworker completion bash)    # e.g. in ~/.bashrc
  source <(stateworker completion zsh)     # in ~/.zshrc, after compinit

exit status:
  0  the script is on stdout
{USAGE_LINE}
"""

TOP = f"""\
Each subcommand has --help with its options, exit statuses and examples. Every command finds
the service's Redis the same way: --redis-url, else STATEWORKER_REDIS_URL, else the embedded
Redis of the state directory (STATEWORKER_STATE_DIR, else ~/.local/share/stateworker).

exit status:
  0  done
  1  the command failed: {{code, message, details}} on stderr (JSON), or Redis unavailable
{USAGE_LINE}
"""
