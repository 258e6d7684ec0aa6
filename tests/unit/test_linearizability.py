"""The linearizability checker (tests/linearizability.py) proves itself: hand-made histories it
must accept and must refuse (a stale read, a lost write, a compare-and-set on a version that
was not current), and generated ones: any history made by running the register model with
each op taking effect at a random moment within its call is accepted, and the same history
with one read changed to a value never written is refused; and on small histories, right or
corrupted, the search with its shortcuts says what an enumeration of every order says."""

from __future__ import annotations

import random

from hypothesis import given
from hypothesis import strategies as st

from tests.linearizability import MISSING, Op, State, Value, check, check_key, step


def get(t0: float, t1: float, value: Value, version: int, client: int = 1, key: str = "k") -> Op:
    return Op(client, key, "get", (), (value, version), t0, t1)


def put(t0: float, t1: float | None, value: Value, answer: tuple[Value, ...] | None,
        client: int = 1, key: str = "k") -> Op:
    """A set; `answer` (old value, new version), or None: no answer."""
    return Op(client, key, "set", (value,), answer, t0, t1)


def test_a_sequential_history_of_every_kind_passes() -> None:
    history = [
        get(0, 1, None, 0),
        put(2, 3, "a", (None, 1)),
        get(4, 5, "a", 1),
        Op(1, "k", "cas", (1, "b"), ("ok", "a", 2), 6, 7),
        Op(1, "k", "cas", (1, "x"), ("conflict", 2), 8, 9),  # a CAS that failed
        Op(1, "k", "swap", ("b", "c"), ("swapped",), 10, 11),
        Op(1, "k", "swap", ("b", "y"), ("current", "c"), 12, 13),
        get(14, 15, "c", 3),
    ]
    assert check(history).ok


def test_a_read_overlapping_a_write_may_see_it_or_not() -> None:
    write = put(0, 10, "a", (None, 1), client=1)
    assert check([write, get(1, 2, None, 0, client=2)]).ok  # read linearized first
    assert check([write, get(1, 2, "a", 1, client=2)]).ok  # write linearized first
    # Two overlapping writes, in either order as a later read shows.
    for first, second in (("a", "b"), ("b", "a")):
        writes = [put(0, 10, first, (None, 1), client=1), put(1, 11, second, (first, 2), client=2)]
        assert check([*writes, get(12, 13, second, 2, client=3)]).ok
    # ... but not both first: each answered as the write that created the key.
    both_first = [put(0, 10, "a", (None, 1), client=1), put(1, 11, "b", (None, 1), client=2)]
    assert not check(both_first).ok


def test_an_unanswered_write_may_show_up_later_or_never() -> None:
    lost_call = put(1, 2, "x", None, client=2)
    later = [put(0, 0.5, "a", (None, 1)), lost_call, get(3, 4, "a", 1), get(5, 6, "x", 2),
             put(7, 8, "b", ("x", 3))]
    assert check(later).ok  # applied after the first read, long after its call ended
    never = [put(0, 0.5, "a", (None, 1)), lost_call, get(3, 4, "a", 1),
             put(7, 8, "b", ("a", 2)), get(9, 10, "b", 2)]
    assert check(never).ok
    # An unanswered compare-and-set: it may have won ...
    cas = Op(2, "k", "cas", (1, "c"), None, 1, None)
    assert check([put(0, 0.5, "a", (None, 1)), cas, get(3, 4, "c", 2)]).ok
    # ... but not on a version that was never current when it could run.
    assert not check([put(0, 0.5, "a", (None, 1)), put(0.6, 0.7, "b", ("a", 2)), cas,
                      get(3, 4, "c", 3)]).ok


def test_a_stale_read_fails_and_says_where() -> None:
    history = [put(0, 1, "a", (None, 1)), put(2, 3, "b", ("a", 2)),
               get(4, 5, "a", 1, client=2)]  # completes after "b" was acknowledged
    result = check(history)
    assert not result.ok and result.key == "k"
    assert "client 2 get() -> ('a', 1)" in result.detail
    assert "leaves the register at ('b', 2)" in result.detail


def test_a_lost_write_fails() -> None:
    """`b` acknowledged, then the register goes on from `a` as if `b` never was (a restore
    from a snapshot that missed it, a failover to a replica without it)."""
    history = [put(0, 1, "a", (None, 1)), put(2, 3, "b", ("a", 2)),
               get(4, 5, "a", 1, client=2), put(6, 7, "c", ("a", 2)), get(8, 9, "c", 2)]
    assert not check(history).ok
    # The same without the read: the write after it still shows `b` is gone.
    assert not check([history[0], history[1], history[3]]).ok


def test_a_cas_that_won_on_a_version_not_current_fails() -> None:
    history = [put(0, 1, "a", (None, 1)), put(2, 3, "b", ("a", 2)),
               Op(2, "k", "cas", (1, "c"), ("ok", "b", 3), 4, 5)]
    assert not check(history).ok
    # A value compare-and-set that won though the value had changed: refused too.
    swapped = [put(0, 1, "a", (None, 1)), put(2, 3, "b", ("a", 2)),
               Op(2, "k", "swap", ("a", "c"), ("swapped",), 4, 5)]
    assert not check(swapped).ok


def test_keys_are_checked_apart_and_the_failing_one_is_named() -> None:
    history = [put(0, 1, "a", (None, 1), key="k1"), get(2, 3, "a", 1, key="k1"),
               put(0, 1, "a", (None, 1), key="k2"), get(2, 3, None, 0, key="k2")]
    result = check(history)
    assert not result.ok and result.key == "k2"
    assert check(history[:2]).ok


def test_many_unanswered_writes_that_never_happened_stay_cheap() -> None:
    """40 lost calls, never applied, among 400 answered ops: each could have taken effect
    anywhere after its call, which the search must rule out without trying every subset."""
    history: list[Op] = []
    state: State = MISSING
    for n in range(400):
        t = float(n)
        if n % 10 == 5:
            history.append(put(t, None, f"lost{n}", None, client=2))
        elif n % 2:
            history.append(put(t, t + 0.5, f"v{n}", (state[0], state[1] + 1)))
            state = (f"v{n}", state[1] + 1)
        else:
            history.append(get(t, t + 0.5, *state))
    assert check_key(history, max_states=20_000).ok


# ---- generated histories ------------------------------------------------------------------
def run_model(seed: int, n: int, concurrency: int) -> list[Op]:
    """Ops on two keys by `concurrency` clients, each op taking effect at a random moment
    within its call (its linearization point): their outputs are what the model gives in that
    order. Some writes lose their answer, and some unanswered writes never take effect."""
    rng = random.Random(seed)
    intervals: list[tuple[float, float, float, int]] = []  # (invoke, effect, complete, client)
    free = [0.0] * concurrency  # when each client may call again
    for _ in range(n):
        client = rng.randrange(concurrency)
        start = free[client] + rng.random()
        end = start + rng.random() * 3
        intervals.append((start, rng.uniform(start, end), end, client))
        free[client] = end
    states: dict[str, State] = {"k1": MISSING, "k2": MISSING}
    history: list[Op] = []
    order = sorted(range(n), key=lambda i: intervals[i][1])
    for serial, i in enumerate(order):
        start, _, end, client = intervals[i]
        key = rng.choice(["k1", "k2"])
        value, version = states[key]
        kind = rng.choice(["get", "set", "cas", "swap", "lost"])
        if kind == "lost":  # called, never applied, never answered
            history.append(Op(client, key, "set", (f"lost{serial}",), None, start, None))
            continue
        new = f"w{serial}"
        op_input: tuple[Value, ...] = {
            "get": (), "set": (new,), "cas": (rng.choice([version, version + 1]), new),
            "swap": (rng.choice([value, f"w{rng.randrange(serial + 1)}"]), new)}[kind]
        probe = Op(client, key, kind, op_input, None, start, end)  # type: ignore[arg-type]
        after = step(states[key], probe)
        assert after is not None
        output: tuple[Value, ...] | None = {
            "get": (value, version),
            "set": (value, version + 1),
            "cas": ("ok", value, version + 1) if after != states[key] else ("conflict", version),
            "swap": ("swapped",) if after != states[key] else ("current", value)}[kind]
        if kind != "get" and rng.random() < 0.1:
            output = None  # applied, but the answer was lost
        history.append(Op(client, key, probe.kind, op_input, output, start, end))
        states[key] = after
    return history


@given(seed=st.integers(0, 2**32), n=st.integers(1, 60), concurrency=st.integers(1, 5))
def test_histories_made_by_the_model_pass(seed: int, n: int, concurrency: int) -> None:
    history = run_model(seed, n, concurrency)
    assert check(history).ok, check(history)


@given(seed=st.integers(0, 2**32), n=st.integers(1, 60), concurrency=st.integers(1, 5),
       pick=st.integers(0, 10**6))
def test_a_read_of_a_value_never_written_fails(seed: int, n: int, concurrency: int,
                                               pick: int) -> None:
    history = run_model(seed, n, concurrency)
    reads = [i for i, op in enumerate(history) if op.kind == "get"]
    if not reads:
        history.append(get(0, 1e9, None, 0, key="k1"))
        reads = [len(history) - 1]
    i = reads[pick % len(reads)]
    read = history[i]
    assert read.output is not None
    history[i] = Op(read.client, read.key, "get", (), ("never written", read.output[1]),
                    read.invoke, read.complete)
    result = check(history)
    assert not result.ok and result.key == read.key


def brute_force(ops: list[Op]) -> bool:
    """Linearizable by enumeration: some order of the answered ops and a subset of the
    unanswered ones, respecting real time, that the model accepts op by op."""
    answered = [i for i, op in enumerate(ops) if op.output is not None]

    def before(a: Op, b: Op) -> bool:  # a completed before b was invoked
        return a.output is not None and a.complete is not None and a.complete < b.invoke

    def extend(order: list[int], state: State) -> bool:
        if all(i in order for i in answered):
            return True
        for i, op in enumerate(ops):
            if i in order or any(before(other, op) for j, other in enumerate(ops)
                                 if j not in order and j != i):
                continue
            after = step(state, op)
            if after is not None and extend([*order, i], after):
                return True
        return False

    return extend([], MISSING)


@given(seed=st.integers(0, 2**32), n=st.integers(1, 7), concurrency=st.integers(1, 4),
       noise=st.integers(0, 3))
def test_the_search_agrees_with_enumerating_every_order(seed: int, n: int, concurrency: int,
                                                        noise: int) -> None:
    """Small histories, some of them corrupted (an answer replaced by another op's, a value
    or a version changed): the search, with its shortcuts, says what enumeration says."""
    rng = random.Random(seed)
    history = [op for op in run_model(seed, n, concurrency) if op.key == "k1"]
    for _ in range(noise):
        if not history:
            break
        i = rng.randrange(len(history))
        op = history[i]
        if op.output is None:
            continue
        version = rng.randrange(4)
        output = {"get": (rng.choice([None, "w0", "w1", "w2", "lost3"]), version),
                  "set": (rng.choice([None, "w0", "w1"]), version),
                  "cas": rng.choice([("ok", "w0", version), ("conflict", version)]),
                  "swap": rng.choice([("swapped",), ("current", "w1")])}[op.kind]
        history[i] = Op(op.client, op.key, op.kind, op.input, output, op.invoke, op.complete)
    assert check_key(history).ok == brute_force(history), history
