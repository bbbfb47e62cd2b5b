"""Per-resource linearizability: Wing & Gong's search with Lowe's memoization.

The history is split by resource (every operation of the workload touches one
resource, as Porcupine splits by key), and each part is checked on its own
against :mod:`dibs.verify._model`.

The search (after Wing & Gong 1993, as refined by Lowe 2017 and used in
Porcupine): the invocations and completions of the part form one list in
real-time order. Walking it from the front, an invocation whose operation can
be applied to the current model state is applied and both of its entries are
lifted out of the list; the walk restarts from the front. Reaching the
completion of an operation not yet applied means no order of the
concurrent operations so far works: undo the last choice and try the next
one. A configuration is the set of applied operations (a bitset) with the
model state; one already seen is never explored again (Lowe's cache), which
keeps the search polynomial on the histories real stores produce.

An operation whose outcome is unknown has no completion in the list: it may
take effect at any point of the order (within its store-time window) or
never, so the search succeeds once every operation with a known outcome is
applied. A part whose search runs past its time budget is reported
``unknown``, never as passing.
"""

from __future__ import annotations

import bisect
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from dibs.verify._history import OK, UNKNOWN, Op
from dibs.verify._model import READS, READS_ALL, State, keys_of, op_targets, successors

__all__ = ["PartitionResult", "check_partition", "minimal_witness"]

Window = Callable[[Op], tuple[float, float]]
"""Maps an op to the store-time bounds (µs) of its linearization point."""

PASS, ANOMALY, INCONCLUSIVE = "ok", "anomaly", "unknown"


@dataclass
class PartitionResult:
    """The verdict on one resource: ``ok``, ``anomaly`` or ``unknown`` (budget overrun)."""

    resource: str
    verdict: str
    ops: int
    seconds: float
    witness: list[Op] = field(default_factory=list)
    witness_note: str = ""
    impossible: Op | None = None
    """The op of the sub-history no order could apply: the search always got
    stuck at its completion."""
    before: list[State] = field(default_factory=list)
    """Model states the search reached just before ``impossible`` (a sample)."""


class _Budget(Exception):
    """Internal: the search ran out of time."""


def check_partition(
    ops: Sequence[Op],
    window: Window,
    deadline: float,
    *,
    outlive: bool = False,
    stamped: bool = False,
) -> str:
    """Return ``ok``, ``anomaly`` or ``unknown`` for the ops of one resource.

    ``deadline`` is a ``time.monotonic()`` value; running past it gives ``unknown``.
    ``outlive``: holds may live past their expiry; ``stamped``: the store's times are
    the writing client's stamps (see :func:`~dibs.verify._model.successors`).
    """
    try:
        return (
            PASS
            if _search(ops, window, deadline, outlive=outlive, stamped=stamped) is None
            else ANOMALY
        )
    except _Budget:
        return INCONCLUSIVE


class _Trace:
    """Where the search got stuck last: the op at the frontier and the states before it."""

    def __init__(self, limit: int = 4) -> None:
        self.limit = limit
        self.op: int | None = None
        self.end = -math.inf
        self.states: list[State] = []
        self._keys: set[tuple[object, ...]] = set()

    def stuck(self, i: int, end: float, state: State) -> None:
        if end > self.end:
            self.op, self.end, self.states, self._keys = i, end, [], set()
        if i == self.op and len(self.states) < self.limit and state.key() not in self._keys:
            self._keys.add(state.key())
            self.states.append(state)


def _search(
    ops: Sequence[Op],
    window: Window,
    deadline: float,
    trace: _Trace | None = None,
    *,
    outlive: bool = False,
    stamped: bool = False,
) -> float | None:
    """None if the ops are linearizable; else the frontier: the latest completion
    time (``Op.end``) at which some branch of the search got stuck.

    No prefix of the history that ends before the frontier can contradict, so
    the shrinker starts looking for the shortest failing prefix there.
    ``trace``, if given, keeps the op stuck at the frontier and the states before it.
    """
    n = len(ops)
    windows = [window(op) for op in ops]
    # An op has a completion entry when its effect, if any, must precede it:
    # every known op, and an unknown one whose store-time window ends.
    bounded = [op.status != UNKNOWN or not math.isinf(windows[i][1]) for i, op in enumerate(ops)]
    # Entries 1..n are invocations, n+1..2n completions; 0 is the list head.
    events: list[tuple[float, int, int]] = []
    for i, op in enumerate(ops):
        events.append((op.start, 0, i + 1))
        if bounded[i]:
            # At equal times the invocation comes first: the ops overlap.
            events.append((op.end, 1, n + 1 + i))
    events.sort()
    size = 2 * n + 2
    nxt = [-1] * size
    prv = [-1] * size
    last = 0
    for _, _, e in events:
        nxt[last] = e
        prv[e] = last
        last = e
    nxt[last] = -1

    claim_refs, request_refs = _references(ops)
    readers = _Readers(ops, windows)
    required = sum(1 for op in ops if op.status != UNKNOWN)
    bits = 0
    state = State.empty()
    cache: set[tuple[int, tuple[object, ...]]] = set()
    # Each frame: (invocation entry, state before it, alternatives not yet
    # tried); alternatives is None for an unknown op decided to have had no effect.
    stack: list[tuple[int, State, list[State] | None]] = []
    entry = nxt[0]
    steps = 0
    frontier = -math.inf

    def remove(e: int) -> None:
        nxt[prv[e]] = nxt[e]
        if nxt[e] != -1:
            prv[nxt[e]] = prv[e]

    def restore(e: int) -> None:
        # Dancing links: e's own pointers still name its old neighbours.
        nxt[prv[e]] = e
        if nxt[e] != -1:
            prv[nxt[e]] = e

    def lift(e: int) -> None:
        remove(e)
        if bounded[e - 1]:
            remove(e + n)
        readers.applied(e - 1, bits)

    def unlift(e: int) -> None:
        if bounded[e - 1]:
            restore(e + n)
        restore(e)
        readers.unapplied(e - 1)

    def choose(alternatives: list[State], new_bits: int) -> State | None:
        while alternatives:
            candidate = _collect(alternatives.pop(0), new_bits, claim_refs, request_refs, readers)
            key = (new_bits, candidate.key())
            if key not in cache:
                cache.add(key)
                return candidate
        return None

    while True:
        if required == 0:
            return None
        steps += 1
        if steps & 255 == 0 and time.monotonic() > deadline:
            raise _Budget
        if entry != -1 and entry <= n:
            i = entry - 1
            op = ops[i]
            lo, hi = windows[i]
            alternatives = successors(state, op, lo, hi, outlive=outlive, stamped=stamped)
            chosen = choose(alternatives, bits | (1 << i)) if alternatives else None
            if chosen is not None:
                stack.append((entry, state, alternatives))
                state = chosen
                bits |= 1 << i
                lift(entry)
                if op.status != UNKNOWN:
                    required -= 1
                entry = nxt[0]
            else:
                entry = nxt[entry]
            continue
        if entry != -1 and ops[entry - n - 1].status == UNKNOWN:
            # The window of an unknown op closed before it was applied: it had
            # no effect. The only choice left here, so no alternatives.
            i = entry - n - 1
            skipped = _collect(state, bits | (1 << i), claim_refs, request_refs, readers)
            key = (bits | (1 << i), skipped.key())
            if key not in cache:
                cache.add(key)
                stack.append((i + 1, state, None))
                state = skipped
                bits |= 1 << i
                lift(i + 1)
                entry = nxt[0]
                continue
        # A completion of an op not yet applied (or the end): backtrack.
        if entry != -1:
            frontier = max(frontier, ops[entry - n - 1].end)
            if trace is not None and ops[entry - n - 1].status != UNKNOWN:
                trace.stuck(entry - n - 1, ops[entry - n - 1].end, state)
        while True:
            if not stack:
                return frontier
            e, before, maybe = stack.pop()
            i = e - 1
            unlift(e)
            bits &= ~(1 << i)
            state = before
            if maybe is None:
                continue  # skipping was the last option of the configuration before it
            if ops[i].status != UNKNOWN:
                required += 1
            chosen = choose(maybe, bits | (1 << i))
            if chosen is not None:
                stack.append((e, before, maybe))
                state = chosen
                bits |= 1 << i
                lift(e)
                if ops[i].status != UNKNOWN:
                    required -= 1
                entry = nxt[0]
            else:
                entry = nxt[e]
            break


def _references(ops: Sequence[Op]) -> tuple[dict[str, int], dict[str, int]]:
    """Which ops can still ask about each claim ID and each request ID (bitsets)."""
    claims: dict[str, int] = {}
    requests: dict[str, int] = {}
    for i, op in enumerate(ops):
        bit = 1 << i
        cid = op.args.get("claim_id")
        if cid is not None:
            claims[str(cid)] = claims.get(str(cid), 0) | bit
        seen = op.value.get("claim_id")
        if seen is not None:
            claims[str(seen)] = claims.get(str(seen), 0) | bit
        for shown in op.value.get("claims", ()):
            claims[str(shown["claim_id"])] = claims.get(str(shown["claim_id"]), 0) | bit
        rid = op.args.get("rid")
        if rid is not None:
            requests[rid] = requests.get(rid, 0) | bit
    # An unacknowledged grant can be named later only by a replay of its request.
    for op in ops:
        if op.fn == "claim" and op.status == UNKNOWN and op.args.get("rid") is not None:
            claims[f"?{op.id}"] = requests[op.args["rid"]]
    return claims, requests


class _Readers:
    """Which ops that may *read* a hold without taking its lock are still to be applied.

    A hold whose expiry every later write must judge past (the floor is past
    it) can still look live to a read or a refusal, which keep no floor; it
    may be forgotten only once every such op whose window opens before its
    expiry is applied. Per serialization key, those ops sorted by the start
    of their window, and the position of the first not yet applied.
    """

    def __init__(self, ops: Sequence[Op], windows: list[tuple[float, float]]) -> None:
        per_key: dict[Any, list[tuple[float, int]]] = {}
        self.keys: list[tuple[Any, ...]] = []
        for i, op in enumerate(ops):
            writes = op.fn not in READS and (
                op.fn != "claim"
                or (op.status == OK and op.value.get("granted") and not op.value.get("replayed"))
            )
            mine = () if writes else tuple(keys_of(op_targets(op)))
            if op.fn == "claims_of":
                mine = (READS_ALL,)
            self.keys.append(mine)
            for k in mine:
                per_key.setdefault(k, []).append((windows[i][0], i))
        self.starts: dict[Any, list[float]] = {}
        self.order: dict[Any, list[int]] = {}
        self.position: dict[tuple[Any, int], int] = {}
        for k, entries in per_key.items():
            entries.sort()
            self.starts[k] = [lo for lo, _ in entries]
            self.order[k] = [i for _, i in entries]
            for p, (_, i) in enumerate(entries):
                self.position[k, i] = p
        self.first = dict.fromkeys(per_key, 0)

    def applied(self, i: int, bits: int) -> None:
        for k in self.keys[i]:
            self.first[k] = self._advance(k, self.first[k], bits)

    def unapplied(self, i: int) -> None:
        for k in self.keys[i]:
            self.first[k] = min(self.first[k], self.position[k, i])

    def _advance(self, k: Any, p: int, bits: int) -> int:
        order = self.order[k]
        while p < len(order) and bits >> order[p] & 1:
            p += 1
        return p

    def settled(self, keys: set[Any], expiry: float, bits: int) -> bool:
        """Whether every read of ``keys`` whose window opens before ``expiry`` is in ``bits``."""
        for k in [*keys, READS_ALL]:
            p = self.first.get(k)
            if p is None:
                continue
            p = self._advance(k, p, bits)
            if p < len(self.starts[k]) and self.starts[k][p] < expiry:
                return False
        return True


def _collect(
    state: State,
    bits: int,
    claim_refs: dict[str, int],
    request_refs: dict[str, int],
    readers: _Readers,
) -> State:
    """Drop what no op left to apply can observe, so equal futures get equal states."""
    gone_claims = []
    for cid, rec in state.claims.items():
        if claim_refs.get(cid, 0) & ~bits:
            continue
        if rec.state in ("released", "expired"):
            gone_claims.append(cid)
        elif rec.state == "held":
            keys = keys_of(rec.targets)
            floor = min(state.tau.get(k, -math.inf) for k in keys)
            # Dead for every later write on its targets, and no read left can see it.
            if floor >= rec.ehi and readers.settled(keys, rec.ehi, bits):
                gone_claims.append(cid)
    gone_requests = [rid for rid in state.requests if not request_refs.get(rid, 0) & ~bits]
    return state.drop(gone_claims, gone_requests)


def explain(
    ops: Sequence[Op],
    window: Window,
    budget: float,
    *,
    outlive: bool = False,
    stamped: bool = False,
) -> tuple[Op | None, list[State]]:
    """The op of a failing history that no order can apply, and model states just before it.

    Searches ``ops`` again, keeping where it got stuck last; (None, []) if
    the search ran out of ``budget`` seconds or found the ops linearizable.
    """
    trace = _Trace()
    try:
        if (
            _search(ops, window, time.monotonic() + budget, trace, outlive=outlive, stamped=stamped)
            is None
        ):
            return None, []
    except _Budget:
        return None, []
    return (None if trace.op is None else ops[trace.op]), trace.states


def minimal_witness(
    ops: Sequence[Op],
    window: Window,
    budget: float,
    *,
    outlive: bool = False,
    stamped: bool = False,
) -> tuple[list[Op], str, list[Op]]:
    """Shrink a non-linearizable history to a few ops whose outcomes already contradict.

    Shrinking only ever *forgets* outcomes (an op becomes unknown: it may or
    may not have taken effect), never deletes an op whose effect might explain
    another's — so every history tried is implied by the real one, and one
    that fails proves the real one fails. First the earliest completion time
    ``T`` such that the ops completed by ``T`` already contradict (ops still
    running at ``T`` become unknown, later ones cannot come before any of
    them); then delta debugging (Zeller's ddmin) forgets chunks of outcomes
    while the contradiction stays. A check that runs out of time counts as
    passing, so the result fails for certain. Returns the ops whose outcomes
    the contradiction needs, and a note saying how far shrinking got.
    """
    deadline = time.monotonic() + budget
    ordered = sorted(ops, key=lambda o: o.start)

    def build(known: set[int], cut: float) -> list[Op]:
        kept = _closed([o for o in ordered if o.index in known and o.end <= cut])
        keep = {o.index for o in kept}
        return [
            o if o.index in keep else replace(o, status=UNKNOWN) for o in ordered if o.start <= cut
        ]

    full_seconds = [0.0]  # how long the search of the whole history took

    failing = [list(ordered)]  # the smallest history known to fail

    def fails_ops(sub: list[Op]) -> bool:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise _Budget
        # A prefix takes at most about as long as the whole history did.
        step = min(remaining, max(0.2, budget / 40, 2 * full_seconds[0]))
        verdict = check_partition(
            sub, window, time.monotonic() + step, outlive=outlive, stamped=stamped
        )
        failed = verdict == ANOMALY
        if failed:
            failing[0] = sub
        return failed

    def fails(known: set[int], cut: float) -> bool:
        return fails_ops(build(known, cut))

    known = [o.index for o in ordered if o.status != UNKNOWN]
    ends = sorted({o.end for o in ordered if o.status != UNKNOWN})
    cut = ends[-1] if ends else math.inf
    note = "no single outcome can be forgotten and keep the contradiction"
    try:
        # The shortest failing prefix ends at or after the frontier of the full
        # search (before it, every prefix had a linearization): try that first.
        low, high = 0, len(ends) - 1
        began = time.monotonic()
        frontier = _search(ordered, window, deadline, outlive=outlive, stamped=stamped)
        full_seconds[0] = time.monotonic() - began
        if frontier is not None:
            low = min(bisect.bisect_left(ends, frontier), high)
            if low < high and fails(set(known), ends[low]):
                high = low
        while low < high:
            mid = (low + high) // 2
            if fails(set(known), ends[mid]):
                high = mid
            else:
                low = mid + 1
        cut = ends[high] if ends else cut
        ordered = _component(ordered, cut, fails_ops)
        known = [o.index for o in ordered if o.status != UNKNOWN]
        end_of = {o.index: o.end for o in ordered}
        items = [i for i in known if end_of[i] <= cut]
        chunks = 2
        while len(items) >= 2:
            size = math.ceil(len(items) / chunks)
            for first in range(0, len(items), size):
                rest = items[:first] + items[first + size :]
                if rest and fails(set(rest), cut):
                    items = rest
                    chunks = max(chunks - 1, 2)
                    break
            else:
                if chunks >= len(items):
                    break
                chunks = min(len(items), chunks * 2)
    except _Budget:
        note = "shrinking stopped at its time budget; the sub-history may not be minimal"
        items = known if "items" not in locals() else items
    witness = [o for o in failing[0] if o.status != UNKNOWN]
    forgotten = len(failing[0]) - len(witness)
    if forgotten:
        note += f"; {forgotten} other ops on this resource were taken as unknown"
    return witness, note, failing[0]


def _component(ops: list[Op], cut: float, fails: Callable[[list[Op]], bool]) -> list[Op]:
    """The ops (invoked by ``cut``) of one group of units that fails on its own.

    Ops on disjoint units commute in the model, unless a group claim or a
    request ID ties them: a history fails exactly when one of its groups
    does, so the others can be dropped outright. The group of the op that
    completed last is tried first.
    """
    live = [o for o in ops if o.start <= cut]
    parent: dict[Any, Any] = {}

    def find(x: Any) -> Any:
        while parent.setdefault(x, x) != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    def keys(op: Op) -> list[Any]:
        if op.fn == "claims_of":
            return [READS_ALL]  # joined to every group below
        found: list[Any] = sorted(keys_of(op_targets(op)), key=repr)
        if op.args.get("rid") is not None:
            found.append(("rid", op.args["rid"]))
        return found

    for op in live:
        first, *rest = keys(op)
        for k in rest:
            parent[find(k)] = find(first)
    if any(op.fn == "claims_of" for op in live):
        for op in live:
            parent[find(keys(op)[0])] = find(READS_ALL)
    groups: dict[Any, list[Op]] = {}
    for op in live:
        groups.setdefault(find(keys(op)[0]), []).append(op)
    if len(groups) == 1:
        return live
    last = max((o for o in live if o.status != UNKNOWN and o.end <= cut), key=lambda o: o.end)
    mine = find(keys(last)[0])
    for root in sorted(groups, key=lambda r: r != mine):
        if fails(groups[root]):
            return groups[root]
    return live


def _closed(ops: list[Op]) -> list[Op]:
    """Keep only ops whose claim and first request are themselves kept.

    A confirm whose grant was forgotten, or a replay whose first request was,
    would contradict for a reason that is not in the store; they are
    forgotten too.
    """
    granted: set[str] = set()
    requested: set[str] = set()
    kept = []
    for op in sorted(ops, key=lambda o: o.start):
        cid = op.args.get("claim_id")
        if cid is not None and str(cid) not in granted:
            continue
        if any(str(c["claim_id"]) not in granted for c in op.value.get("claims", ())):
            continue
        if op.fn == "claim":
            rid = op.args.get("rid")
            first = rid is None or rid not in requested
            if first and op.value.get("error") == "RequestConflict":
                continue
            if first and op.value.get("replayed"):
                seen = op.value.get("claim_id")
                if seen is None or str(seen) not in granted:
                    continue
            if rid is not None:
                requested.add(rid)
        seen = op.value.get("claim_id")
        if seen is not None:
            granted.add(str(seen))
        kept.append(op)
    return kept


def describe_ops(ops: Sequence[Op], origin_us: float) -> list[str]:
    """Readable lines for a sub-history, times in ms on the wall clock from ``origin_us``.

    Store timestamps in results (``*_at``) are shown on the same scale.
    """
    lines = []
    for op in sorted(ops, key=lambda o: o.start):
        start = (op.wall_start - origin_us) / 1000
        end = "      ?" if math.isinf(op.wall_end) else f"{(op.wall_end - origin_us) / 1000:9.3f}"
        lines.append(f"  [{start:9.3f} .. {end} ms] {op.describe(origin_us)}")
    return lines


def describe_state(state: State, origin_us: float, about: Op | None = None) -> list[str]:
    """A model state as readable lines: each claim, store times in ms from ``origin_us``.

    With ``about``, only the claims that op can see: on its targets, named by
    it, or (``claims_of``) of its holder.
    """

    def ms(v: float) -> str:
        return "never" if math.isinf(v) else f"{(v - origin_us) / 1000:.3f}ms"

    lines = []
    near = set() if about is None else keys_of(op_targets(about))
    for cid, rec in sorted(state.claims.items(), key=lambda kv: (kv[1].fence or 0, kv[0])):
        if about is not None and not (
            keys_of(rec.targets) & near
            or cid in (str(about.args.get("claim_id")), str(about.value.get("claim_id")))
            or (about.fn == "claims_of" and rec.holder == about.args.get("holder"))
        ):
            continue
        targets = "+".join(
            f"{t[1]}/{t[2]}" if t[0] == "u" else f"{t[1]}[{t[2]},{t[3]})" for t in rec.targets
        )
        text = f"claim {cid} {rec.holder} {targets} {rec.state} fence={rec.fence}"
        if rec.state == "held":
            text += " expires " + (
                ms(rec.elo) if rec.elo == rec.ehi else f"in [{ms(rec.elo)}, {ms(rec.ehi)}]"
            )
        if rec.taken_over:
            text += " taken_over"
        if rec.updated is not None:
            text += f" updated_at={ms(rec.updated)}"
        lines.append(text)
    if not lines:
        lines.append("no claims" if about is None else "no claims on its targets")
    return lines


def describe_states(states: Sequence[State], origin_us: float, about: Op | None) -> list[list[str]]:
    """Distinct descriptions of several states (as ``about`` sees them)."""
    out: list[list[str]] = []
    for state in states:
        lines = describe_state(state, origin_us, about)
        if lines not in out:
            out.append(lines)
    return out
