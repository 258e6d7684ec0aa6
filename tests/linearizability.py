"""A linearizability checker for histories of stateworker keys, each key a register.

A history is a list of `Op`s: who called what on which key, when the call was sent
(`invoke`) and answered (`complete`), and the answer (`output`), or None when there was none
(a timeout, a lost connection): such an op may have taken effect at any time after its
invocation, or never. `check` splits the history by key (keys are independent registers, so
each is linearizable on its own or the whole is not) and searches each for a linearization:
one order of the ops, each placed between its invocation and its completion, in which every
answer is what the register model below gives.

The search is Wing & Gong's: build the order one op at a time, choosing among the ops that
may go next (no op that is not yet placed completed before their invocation), and backtrack
when none fits. Lowe's memoisation makes it practical: the future of the search depends only
on which ops are placed and on the register's state, so each (placed set, state) is
explored once. It is the algorithm of Porcupine and Knossos, written again here from the
papers' description. Unanswered ops are Porcupine's: open until the end of the history, and
any output accepted; the search is done once every answered op is placed (an unanswered one
left out never took effect). Two shortcuts keep the unanswered writes from multiplying the
states, both sound (tests/unit/test_linearizability.py holds the search to an enumeration of
every order): an unanswered op is not placed where it would change nothing, and of the
unanswered sets whose value nobody saw, one at most is tried at each step.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

Kind = Literal["get", "set", "cas", "swap"]
Value = str | int | None  # a register's value (the tests write unique strings); None: absent
State = tuple[Value, int]  # (value, version); a missing key is (None, 0)
MISSING: State = (None, 0)


@dataclass(frozen=True)
class Op:
    """One call on one key. `input` and `output` by kind (`output` None: no answer):

    - get: () -> (value, version) (state::get-entry; a missing key is (None, 0))
    - set: (value,) -> (old value, new version) (state::set)
    - cas: (expected version, value) -> ("ok", old value, new version), or
      ("conflict", current version) (state::set with expected_version)
    - swap: (expected value, value) -> ("swapped",), or ("current", value)
      (state::compare-and-set, which compares values)

    `complete` is None for an op still open at the end of the history; an unanswered op is
    open until the end whatever `complete` says (a call that timed out may still be applied).
    """

    client: int
    key: str
    kind: Kind
    input: tuple[Value, ...]
    output: tuple[Value, ...] | None
    invoke: float
    complete: float | None = None

    def __post_init__(self) -> None:
        if self.output is not None and (self.complete is None or self.complete < self.invoke):
            raise ValueError(f"an answered op needs a completion, not before its invocation: {self}")


def step(state: State, op: Op) -> State | None:
    """The register model: the state after `op`, or None when `op`'s output cannot come from
    `state`. A write bumps the version by one; a refused one changes nothing. An unanswered
    op does what it would do in `state`, whatever it would have answered."""
    value, version = state
    out = op.output
    if op.kind == "get":
        return state if out is None or out == state else None
    new = op.input[-1]
    if op.kind == "set":
        return (new, version + 1) if out in (None, (value, version + 1)) else None
    if op.kind == "cas":
        if op.input[0] == version:
            return (new, version + 1) if out in (None, ("ok", value, version + 1)) else None
        return state if out in (None, ("conflict", version)) else None
    if op.input[0] == value:  # swap
        return (new, version + 1) if out in (None, ("swapped",)) else None
    return state if out in (None, ("current", value)) else None


@dataclass(frozen=True)
class Result:
    """`ok`, or the first key (in key order) that is not linearizable and why."""

    ok: bool
    key: str | None = None
    detail: str = ""

    def __str__(self) -> str:
        return "linearizable" if self.ok else f"key {self.key!r}: {self.detail}"


def check(history: Iterable[Op], max_states: int = 2_000_000) -> Result:
    """Each key's ops checked on their own, from a missing key."""
    by_key: dict[str, list[Op]] = defaultdict(list)
    for op in history:
        by_key[op.key].append(op)
    for key in sorted(by_key):
        result = check_key(by_key[key], max_states)
        if not result.ok:
            return Result(False, key, result.detail)
    return Result(True)


def check_key(history: Sequence[Op], max_states: int = 2_000_000,
              initial: State = MISSING) -> Result:
    # An unanswered get constrains nothing and changes nothing: left out.
    ops = [op for op in history if op.output is not None or op.kind != "get"]
    answered = sum(op.output is not None for op in ops)
    if answered == 0:
        return Result(True)
    # An unanswered set whose value nobody saw or asked for (outside its own input) can only
    # have bumped the version, as any other such set would: trying one of them at a step is
    # enough (the others' futures are the same up to renaming), else they multiply the states.
    mentions: defaultdict[Value, int] = defaultdict(int)
    for op in ops:
        for seen in (*op.input, *(op.output or ())):
            mentions[seen] += 1
    blind = [op.kind == "set" and op.output is None and mentions[op.input[0]] == 1
             for op in ops]

    # The ops' invocations and completions in time order (an unanswered op has no completion:
    # nothing need wait for it), invocations first at a tie, so ops that touch overlap.
    events = sorted([(op.invoke, 0, i) for i, op in enumerate(ops)]
                    + [(op.complete or 0.0, 1, i) for i, op in enumerate(ops)
                       if op.output is not None])
    # A doubly linked list over the events (the last slot is its head), so that placing an
    # op takes its two events out and backtracking puts them back, each in O(1).
    head = len(events)
    nxt = [*range(1, head), -1, 0 if events else -1]
    prv = [head, *range(head - 1), -1]
    op_at = [i for _, _, i in events]
    is_return = [kind == 1 for _, kind, _ in events]
    nodes: list[list[int]] = [[] for _ in ops]  # per op: its invocation, then its completion
    for node, i in enumerate(op_at):
        nodes[i].append(node)

    def lift(i: int) -> None:
        for node in nodes[i]:
            nxt[prv[node]] = nxt[node]
            if nxt[node] != -1:
                prv[nxt[node]] = prv[node]

    def unlift(i: int) -> None:  # (in reverse: the links each node kept are valid again)
        for node in reversed(nodes[i]):
            nxt[prv[node]] = node
            if nxt[node] != -1:
                prv[nxt[node]] = node

    state, placed, done = initial, 0, 0  # placed: a bitset of ops; done: answered ops placed
    stack: list[tuple[int, State, bool]] = []  # op placed, state before it, blind one tried
    explored: set[tuple[int, State]] = set()
    deepest: tuple[int, State, int, list[int]] | None = None  # where the search got furthest
    node, blind_tried = nxt[head], False
    while done < answered:
        if node == -1 or is_return[node]:
            # Every op from here on was invoked after this one completed: it must be placed
            # before them, and it does not fit here. Back to the last choice.
            if node != -1 and (deepest is None or done > deepest[0]):
                deepest = (done, state, op_at[node], _candidates(nxt, head, node, op_at))
            if not stack:
                return Result(False, detail=_explain(ops, deepest))
            i, state, blind_tried = stack.pop()
            placed &= ~(1 << i)
            done -= ops[i].output is not None
            unlift(i)
            blind_tried |= blind[i]
            node = nxt[nodes[i][0]]
            continue
        i = op_at[node]
        after = step(state, ops[i])
        # (An unanswered op that changes nothing here is as good as never applied: skipped.)
        skip = after is None or (ops[i].output is None and after == state) \
            or (blind[i] and blind_tried)
        if not skip and after is not None and (placed | 1 << i, after) not in explored:
            if len(explored) >= max_states:
                return Result(False, detail=f"gave up after {max_states} states ({len(ops)} ops)")
            explored.add((placed | 1 << i, after))
            stack.append((i, state, blind_tried))
            state, placed, done = after, placed | 1 << i, done + (ops[i].output is not None)
            lift(i)
            node, blind_tried = nxt[head], False
            continue
        blind_tried |= blind[i]
        node = nxt[node]
    return Result(True)


def _candidates(nxt: list[int], head: int, stop: int, op_at: list[int]) -> list[int]:
    """The ops whose invocations come before `stop` in the list: those that could go next."""
    found, node = [], nxt[head]
    while node != stop:
        found.append(op_at[node])
        node = nxt[node]
    return found


def _explain(ops: Sequence[Op], deepest: tuple[int, State, int, list[int]] | None) -> str:
    """Where the search got furthest: the register's state there, the op that had to be
    placed next (the first to complete of those left) and why nothing could go next."""
    if deepest is None:
        return "not linearizable"
    done, state, blocker, candidates = deepest
    t0 = min(op.invoke for op in ops)
    lines = [f"not linearizable. The longest linearizable prefix found places {done} of the "
             f"{sum(op.output is not None for op in ops)} answered ops and leaves the register "
             f"at {state}. Next must go {describe(ops[blocker], t0)} (the first of the rest "
             "to complete) or an op invoked before it completed, and none fits:"]
    for i in candidates[:8]:  # (the blocker among them: it was invoked before it completed)
        fits = step(state, ops[i]) is not None
        lines.append(f"  {describe(ops[i], t0)}: "
                     + ("fits, but nothing linearizes after it" if fits else "does not fit"))
    if len(candidates) > 8:
        lines.append(f"  ... and {len(candidates) - 8} more")
    return "\n".join(lines)


def describe(op: Op, t0: float = 0.0) -> str:
    """`client 2 get() -> ('v1', 1) [0.101 .. 0.130]`, times from `t0` in seconds."""
    answer = "no answer" if op.output is None else repr(op.output)
    end = "open" if op.output is None or op.complete is None else f"{op.complete - t0:.3f}"
    return (f"client {op.client} {op.kind}{op.input!r} -> {answer} "
            f"[{op.invoke - t0:.3f} .. {end}]")
