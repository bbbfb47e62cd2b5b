"""A pure model of the claim rules on one resource, with time as bounds.

The linearizability search (:mod:`dibs.verify._linear`) asks one question of
this module: given the model state and an operation with what the client saw,
which successor states are possible? The answer is a list; an empty list means
the operation cannot take effect here with that outcome.

Time. The store decides expiry on its own clock, which the history does not
read directly. Each operation carries a window ``[lo, hi]`` of store times
(microseconds) in which its linearization point must lie, narrowed to a point
(± :data:`TOLERANCE`) when the store returned the time it used (a grant's
``created_at``, an extend's new ``expires_at``). The store reads its clock
inside the step that serializes operations on a unit, so along the
linearization order the store time of one unit never goes back: the state keeps
that floor per target key (``tau``). Reads (``holder_of``) take no lock, so
they are judged in their own window and leave the floor alone; so are claims
that were refused (or answered from a remembered request): they write nothing,
and a store may judge the targets after the first one it finds taken from a
snapshot, without waiting for locks (PostgreSQL does). A hold's expiry
is an interval ``[elo, ehi]`` — exact when the store returned it, wide when the
grant or extend was never acknowledged. Inside that interval a later operation
may judge the hold live or dead (each judgement independently: a deliberate
over-approximation, so an anomaly report never rests on a guess).

Within a window, outcomes change only where some expiry bound lies, so the
search tries the earliest possible time in each such region: an earlier time
leaves a lower floor for what follows and the same state otherwise.

Shared claims (an op's ``mode`` argument, ``"shared"``; absent: exclusive) are
readers: two of them never block each other, and a claim blocks another only
when either is exclusive (:func:`excludes`). The mode is part of a request
ID's input and of a claim's natural key.

The reason rule (docs/stores.md). A grant takes over every dead hold that
would have blocked it had it been live (:func:`would_block`); from then on the
hold answers ``taken_over``, and until then ``expired``. ``sweep()`` marking a
hold expired changes neither, so the model has no sweep step.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from typing import Any, NamedTuple

from dibs.verify._history import FAIL, OK, UNKNOWN, Op

__all__ = [
    "READS",
    "READS_ALL",
    "TOLERANCE",
    "State",
    "keys_of",
    "rate_over_limit",
    "successors",
    "target_keys",
]

READS = frozenset({"holder_of", "get", "claims_of"})
"""Operations that take no lock and write nothing."""
READS_ALL = ("*",)
"""The key under which a read of a whole resource (``claims_of``) waits to be applied."""

TOLERANCE = 2
"""µs of slack around a store-reported time: the stores round to whole µs."""

TargetKey = tuple[Any, ...]
Target = tuple[Any, ...]

_HELD, _CONFIRMED, _RELEASED, _EXPIRED = "held", "confirmed", "released", "expired"
_MAX_AMBIGUOUS = 4


class Rec(NamedTuple):
    """A claim in the model; ``elo``/``ehi`` bound a hold's expiry (µs).

    ``created``/``updated`` are the store's ``created_at``/``updated_at`` once
    a result showed them (None: not known yet); every later result must agree.
    """

    holder: str
    targets: tuple[Target, ...]
    state: str
    fence: int | None
    elo: float
    ehi: float
    taken_over: bool
    created: int | None = None
    updated: int | None = None
    mode: str = "exclusive"


class Request(NamedTuple):
    """A remembered request ID: its input and its outcome."""

    fingerprint: tuple[Any, ...]
    claim_id: str | None
    taken: frozenset[Target]


class State:
    """The model state of one resource; never mutated once built."""

    __slots__ = ("_key", "claims", "fences", "requests", "tau")

    def __init__(
        self,
        claims: dict[str, Rec],
        requests: dict[str, Request],
        tau: dict[TargetKey, float],
        fences: dict[TargetKey, int],
    ) -> None:
        self.claims = claims
        self.requests = requests
        self.tau = tau
        self.fences = fences
        self._key: tuple[Any, ...] | None = None

    @classmethod
    def empty(cls) -> State:
        """The state before any operation."""
        return cls({}, {}, {}, {})

    def key(self) -> tuple[Any, ...]:
        """A hashable value equal for equal states (for the search's memo)."""
        if self._key is None:
            self._key = (
                frozenset(self.claims.items()),
                frozenset(self.requests.items()),
                frozenset(self.tau.items()),
                frozenset(self.fences.items()),
            )
        return self._key

    def copy(self) -> State:
        """A shallow copy to build a successor from."""
        return State(dict(self.claims), dict(self.requests), dict(self.tau), dict(self.fences))

    def drop(self, claim_ids: list[str], request_ids: list[str]) -> State:
        """This state without claims and requests that can no longer matter."""
        if not claim_ids and not request_ids:
            return self
        new = self.copy()
        for cid in claim_ids:
            del new.claims[cid]
        for rid in request_ids:
            del new.requests[rid]
        return new


def target_keys(target: Target) -> tuple[TargetKey, ...]:
    """The serialization keys of a target: its unit, or each whole number its span covers.

    Two claims serialize (and their fences and store times must agree in
    order) exactly when they share a key: a unit, or a point of two
    overlapping spans. Spans that do not overlap need not serialize, and on
    PostgreSQL they do not. The workload's spans have whole-number bounds;
    other bounds, and datetime spans, fall back to one key for the whole span
    resource, which serializes every such span on it.
    """
    if target[0] == "u":
        return (("u", target[2]),)
    lo, hi = target[2], target[3]
    if target[0] == "n" and isinstance(lo, int) and isinstance(hi, int) and hi - lo <= 1000:
        return tuple(("s", x) for x in range(lo, hi))
    return (("s",),)


def keys_of(targets: tuple[Target, ...]) -> set[TargetKey]:
    """The serialization keys of several targets."""
    return {k for t in targets for k in target_keys(t)}


def conflicts(a: Target, b: Target) -> bool:
    """Whether two targets of one resource exclude each other."""
    if a[0] == "u" or b[0] == "u":
        return a == b
    return bool(a[0] == b[0] and a[2] < b[3] and b[2] < a[3])


def kind_switch(a: Target, b: Target) -> bool:
    """Whether two spans of one resource are of different kinds (number, datetime)."""
    return bool(a[0] != "u" and b[0] != "u" and a[0] != b[0])


def would_block(a: Target, b: Target) -> bool:
    """Whether a live claim of ``a`` would stop a claim of ``b``: taken, or a kind mismatch."""
    return conflicts(a, b) or kind_switch(a, b)


def excludes(rec: Rec, target: Target, mode: str) -> bool:
    """Whether ``rec``, were it live, would stop a claim of ``target`` in ``mode``."""
    return any(
        kind_switch(u, target)
        or ((mode == "exclusive" or rec.mode == "exclusive") and conflicts(u, target))
        for u in rec.targets
    )


def op_targets(op: Op) -> tuple[Target, ...]:
    """The targets an operation touches (a claim-ID op: its claim's targets)."""
    a = op.args
    if op.fn == "holder_of":
        return (tuple(a["target"]),)
    if op.fn == "claims_of":
        return ()  # every claim of a holder on the resource: see ``READS_ALL``
    return tuple(tuple(t) for t in a["targets"])


def successors(
    state: State, op: Op, lo: float, hi: float, *, outlive: bool = False, stamped: bool = False
) -> list[State]:
    """Every state the model can reach by linearizing ``op`` now, given what the client saw.

    ``lo``/``hi`` bound the store time of the op's linearization point (µs).
    ``outlive`` (the hold rule of stores whose holds may outlive their TTL,
    :attr:`dibs.Store.holds_outlive_ttl`): a hold lives *at least* until its
    expiry, and from then on may be live or dead at any time; so it may still
    block a claim, or be confirmed, long after ``expires_at``, but it is never
    taken over, or seen expired, before it. An extend's new ``expires_at``
    minus its TTL must then lie inside the op (a lease counts from its grant,
    before the write), not at the write's instant.

    ``stamped`` (stores whose times are the writing client's clock, read before
    its write reaches the store: :attr:`dibs.Store.client_stamps`): a returned
    time must lie inside the op's window, but it does not pin the op there; a
    grant stamped before a release may still serialize after it.
    """
    targets = op_targets(op)
    # A read takes no lock: its snapshot may predate a write that read the
    # clock earlier, or follow one that read it later. Reads (and refusals)
    # neither obey nor move the floor; they are judged inside their own window.
    keys = keys_of(targets)
    floor = max((state.tau.get(k, -math.inf) for k in keys), default=-math.inf)
    a, b = lo, hi
    exact = _exact_time(op)
    if exact is not None and (stamped or (outlive and op.fn == "extend")):
        # A lease counts from its grant, before the write that serializes: the new
        # expiry is a lower bound of the hold's end, from inside the op, not its instant.
        # A client's stamp, likewise, was read inside the op but before its write.
        if not (lo - TOLERANCE <= exact <= hi + TOLERANCE):
            return []
        exact = None
    if exact is not None:
        # The store said when it decided: judge at that instant, if it fits the window.
        if not (max(floor, lo) - TOLERANCE <= exact <= hi + TOLERANCE):
            return []
        a = b = exact
        floor = min(floor, exact)
    if a > b:
        return []
    bounds = {floor} if a < floor <= b else set()
    for rec in state.claims.values():
        if rec.state == _HELD:
            bounds.add(rec.elo)
            bounds.add(rec.ehi)
    candidates = [a, *sorted(x for x in bounds if a < x <= b)]
    seen: set[tuple[Any, ...]] = set()
    out: list[State] = []
    for now in candidates:
        for new, wrote in _apply(state, op, targets, now, b):
            if wrote and now < floor:
                continue  # a write is serialized after the last write on its targets
            k = new.key()
            if k in seen:
                continue
            seen.add(k)
            if wrote:
                for key in keys:
                    new.tau[key] = now
                new._key = None
            if outlive:
                _outlive(new)
            out.append(new)
    return out


def _outlive(state: State) -> None:
    """Lift every hold's latest expiry to never, in a state just built: no bound on its death."""
    claims = state.claims
    bounded = [cid for cid, rec in claims.items() if rec.state == _HELD and rec.ehi != math.inf]
    for cid in bounded:
        claims[cid] = claims[cid]._replace(ehi=math.inf)
    if bounded:
        state._key = None


def _exact_time(op: Op) -> int | None:
    """The store time the result pins the op to, if it returned one."""
    v = op.value
    if op.status != OK:
        return None
    if op.fn == "claim" and v.get("granted") and not v.get("replayed"):
        return int(v["created_at"])
    if op.fn == "extend" and v.get("state") == _HELD and v.get("expires_at") is not None:
        return int(v["expires_at"]) - round(float(op.args["ttl"]) * 1_000_000)
    return None


# --- liveness with uncertain expiry ---------------------------------------------------------------


def _judgements(state: State, relevant: list[str], now: float) -> Iterator[dict[str, bool]]:
    """Yield each consistent assignment of live/dead to the relevant claims at ``now``."""
    fixed: dict[str, bool] = {}
    open_: list[str] = []
    for cid in relevant:
        rec = state.claims[cid]
        if rec.state == _CONFIRMED:
            fixed[cid] = True
        elif rec.state != _HELD or now >= rec.ehi:
            fixed[cid] = False
        elif now < rec.elo:
            fixed[cid] = True
        else:
            open_.append(cid)
    if len(open_) > _MAX_AMBIGUOUS:
        open_ = open_[:_MAX_AMBIGUOUS]  # the rest judged live: still only an over-approximation
        for cid in relevant:
            if cid not in fixed and cid not in open_:
                fixed[cid] = True
    for combo in itertools.product((True, False), repeat=len(open_)):
        yield {**fixed, **dict(zip(open_, combo, strict=True))}


# --- the rules ------------------------------------------------------------------------------------


def _apply(
    state: State, op: Op, targets: tuple[Target, ...], now: float, hi: float
) -> Iterator[tuple[State, bool]]:
    """Each successor, and whether the op wrote (took the targets' locks) to reach it."""
    # ``hi`` bounds when an unacknowledged grant or extend could have set its expiry.
    if op.fn == "claim":
        for new in _claim(state, op, targets, now, hi):
            yield new, _granted(state, new)
    elif op.fn == "holder_of":
        for new in _holder_of(state, op, targets[0], now):
            yield new, False
    elif op.fn == "get":
        for new in _get(state, op, now):
            yield new, False
    elif op.fn == "claims_of":
        for new in _claims_of(state, op, now):
            yield new, False
    elif op.fn in ("confirm", "extend", "release"):
        for new in _transition(state, op, now, hi):
            yield new, True
    else:
        raise ValueError(f"unknown operation {op.fn!r} in the history")


def _granted(before: State, after: State) -> bool:
    """Whether a claim's successor has one claim more than its predecessor: a grant.

    (A replay that learns an unacknowledged grant's ID renames a claim; it adds none.)
    """
    return len(after.claims) > len(before.claims)


def _claim(
    state: State, op: Op, targets: tuple[Target, ...], now: float, hi: float
) -> Iterator[State]:
    a, v, status = op.args, op.value, op.status
    holder, rid, ttl = a["holder"], a.get("rid"), a.get("ttl")
    mode = a.get("mode", "exclusive")
    fp = (holder, targets, ttl, mode)
    if rid is not None and rid in state.requests:
        prior = state.requests[rid]
        if prior.fingerprint != fp:
            if status == UNKNOWN or (status == FAIL and v.get("error") == "RequestConflict"):
                yield state.copy()
            return
        # A replay: the first outcome again, no new claim.
        if status == UNKNOWN:
            yield state.copy()
        elif status == OK and v.get("replayed"):
            if prior.claim_id is None:
                if not v.get("granted") and frozenset(map(tuple, v["taken"])) == prior.taken:
                    yield state.copy()
            elif v.get("granted"):
                bound = _bind(state, prior.claim_id, v)
                if bound is not None:
                    yield bound
        return
    if status == FAIL and v.get("error") != "SpanKindMismatch":
        return  # the only definite failure of a fresh claim
    relevant = [
        cid
        for cid, rec in state.claims.items()
        if rec.state in (_HELD, _CONFIRMED) and any(excludes(rec, t, mode) for t in targets)
    ]
    for live in _judgements(state, relevant, now):
        blockers = [cid for cid in relevant if live[cid]]
        if any(
            kind_switch(t, u)
            for cid in blockers
            for t in targets
            for u in state.claims[cid].targets
        ):
            # Refused before anything is written, the request ID included.
            if status == UNKNOWN or (status == FAIL and v.get("error") == "SpanKindMismatch"):
                yield state.copy()
            continue
        if blockers:
            taken = frozenset(
                t
                for t in targets
                for cid in blockers
                if any(conflicts(t, u) for u in state.claims[cid].targets)
            )
            if len(blockers) == 1:
                mine = state.claims[blockers[0]]
                if mine.holder == holder and mine.targets == targets and mine.mode == mode:
                    # Natural key: the holder re-claiming exactly what it holds, as it holds it.
                    if status == UNKNOWN:
                        yield _remember(state.copy(), rid, fp, blockers[0], frozenset())
                    elif status == OK and v.get("granted") and v.get("replayed"):
                        # An unacknowledged grant is named here for the first time.
                        bound = _bind(state, blockers[0], v)
                        if bound is not None:
                            yield _remember(bound, rid, fp, str(v["claim_id"]), frozenset())
                    continue
            if status == UNKNOWN or (
                status == OK
                and not v.get("granted")
                and not v.get("replayed")
                and frozenset(map(tuple, v["taken"])) == taken
            ):
                yield _remember(state.copy(), rid, fp, None, taken)
            continue
        # Granted: every dead hold it would have blocked is taken over (the reason rule).
        new = state.copy()
        for cid in relevant:
            rec = new.claims[cid]
            if rec.state == _HELD:
                new.claims[cid] = rec._replace(state=_EXPIRED, taken_over=True)
        keys = keys_of(targets)
        if status == UNKNOWN:
            # A recorded ID is kept when shrinking forgets an outcome; a real
            # unknown grant has none, and a replay of its request may name it.
            hinted = v.get("claim_id") if not v.get("replayed") else None
            cid = f"?{op.id}" if hinted is None else str(hinted)
            if cid in new.claims:
                continue
            exp = math.inf if ttl is None else now + ttl * 1_000_000
            new.claims[cid] = Rec(
                holder,
                targets,
                _CONFIRMED if ttl is None else _HELD,
                None if hinted is None else int(v["fence"]),
                exp,
                math.inf if ttl is None else hi + ttl * 1_000_000,
                False,
                mode=mode,
            )
            yield _remember(new, rid, fp, cid, frozenset())
            continue
        if not (status == OK and v.get("granted") and not v.get("replayed")):
            continue
        cid, fence = str(v["claim_id"]), int(v["fence"])
        if cid in new.claims or any(new.fences.get(k, 0) >= fence for k in keys):
            continue  # an ID given twice, or a fence that did not increase
        for k in keys:
            new.fences[k] = fence
        exp = math.inf if v.get("expires_at") is None else int(v["expires_at"])
        if (ttl is None) != (v.get("expires_at") is None):
            continue
        state_now = _CONFIRMED if ttl is None else _HELD
        if v.get("state", state_now) != state_now or v.get("holder", holder) != holder:
            continue
        if v.get("mode", "exclusive") != mode:
            continue  # a grant in the other mode than asked
        created, updated = int(v["created_at"]), int(v["updated_at"])
        new.claims[cid] = Rec(
            holder, targets, state_now, fence, exp, exp, False, created, updated, mode
        )
        yield _remember(new, rid, fp, cid, frozenset())


def _remember(
    state: State, rid: str | None, fp: tuple[Any, ...], cid: str | None, taken: frozenset[Target]
) -> State:
    if rid is not None:
        state.requests[rid] = Request(fp, cid, taken)
    return state


def _bind(state: State, cid: str, v: dict[str, Any]) -> State | None:
    """A replay names the claim its first request got; learn an unacknowledged one's ID."""
    if v.get("claim_id") is None:
        return None  # a grant answered without its claim (a broken store): no state explains it
    seen = str(v["claim_id"])
    rec = state.claims.get(cid)
    if rec is not None and not _same(rec.created, v.get("created_at")):
        return None  # a replay shows the first grant: its creation time never changes
    if cid == seen:
        return state.copy()
    if not cid.startswith("?") or seen in state.claims:
        return None
    new = state.copy()
    rec = new.claims.pop(cid)
    new.claims[seen] = rec._replace(fence=int(v["fence"]))
    for rid, req in list(new.requests.items()):
        if req.claim_id == cid:
            new.requests[rid] = req._replace(claim_id=seen)
    return new


def _holder_of(state: State, op: Op, target: Target, now: float) -> Iterator[State]:
    relevant = [
        cid
        for cid, rec in state.claims.items()
        if rec.state in (_HELD, _CONFIRMED) and any(conflicts(target, u) for u in rec.targets)
    ]
    for live in _judgements(state, relevant, now):
        holders = [state.claims[cid].holder for cid in relevant if live[cid]]
        allowed: list[str | None] = [*holders] if holders else [None]
        if op.status == UNKNOWN or (op.status == OK and op.value.get("holder") in allowed):
            yield state.copy()


def _transition(state: State, op: Op, now: float, hi: float) -> Iterator[State]:
    a, v, status = op.args, op.value, op.status
    cid = str(a["claim_id"])
    rec = state.claims.get(cid)
    if rec is None:
        # Not a claim this model granted on this resource: only "not found" fits.
        if status == UNKNOWN or (status == FAIL and v.get("error") == "ClaimNotFound"):
            yield state.copy()
        return
    if rec.holder != a["holder"]:
        if status == UNKNOWN or (status == FAIL and v.get("error") == "NotHolder"):
            yield state.copy()
        return
    if rec.fence is not None and rec.fence != a["fence"]:
        if status == UNKNOWN or (
            status == FAIL and v.get("error") == "HoldLost" and v.get("reason") == "fence"
        ):
            yield state.copy()
        return
    for live in _judgements(state, [cid], now):
        if not live[cid]:
            if rec.state == _RELEASED:
                reason = "released"
            elif rec.taken_over:
                reason = "taken_over"
            else:
                reason = "expired"
            if op.fn == "release":
                if status == UNKNOWN or (status == OK and v.get("released") is False):
                    yield state.copy()
            elif status == UNKNOWN or (
                status == FAIL and v.get("error") == "HoldLost" and v.get("reason") == reason
            ):
                yield state.copy()
            continue
        new = state.copy()
        if op.fn == "confirm":
            if status == UNKNOWN:
                if rec.state == _HELD:
                    rec = rec._replace(updated=None)
                new.claims[cid] = rec._replace(state=_CONFIRMED, elo=math.inf, ehi=math.inf)
                yield new
            elif status == OK and v.get("state") == _CONFIRMED:
                fit = _written(rec, v, now, hi, rewrites=rec.state == _HELD)
                if fit is not None:
                    new.claims[cid] = fit._replace(state=_CONFIRMED, elo=math.inf, ehi=math.inf)
                    yield new
        elif op.fn == "extend":
            if rec.state == _CONFIRMED:
                if status == UNKNOWN or (status == OK and v.get("state") == _CONFIRMED):
                    fit = rec if status == UNKNOWN else _written(rec, v, now, hi, rewrites=False)
                    if fit is not None:
                        new.claims[cid] = fit
                        yield new
            elif status == UNKNOWN:
                ttl_us = op.args["ttl"] * 1_000_000
                new.claims[cid] = rec._replace(elo=now + ttl_us, ehi=hi + ttl_us, updated=None)
                yield new
            elif status == OK and v.get("state") == _HELD:
                exp = int(v["expires_at"])
                fit = _written(rec, v, now, hi, rewrites=True)
                if fit is not None:
                    new.claims[cid] = fit._replace(elo=exp, ehi=exp)
                    yield new
        elif status == UNKNOWN or (status == OK and v.get("released") is True):  # release
            new.claims[cid] = rec._replace(
                state=_RELEASED, elo=math.inf, ehi=math.inf, updated=None
            )
            yield new


# --- the fields of a result, and the reads get() and claims_of() ----------------------------------


def _same(known: int | None, shown: Any) -> bool:
    """Whether a store time a result shows agrees with the one the model knows (if any)."""
    return known is None or shown is None or int(shown) == known


def _written(rec: Rec, v: dict[str, Any], now: float, hi: float, *, rewrites: bool) -> Rec | None:
    """The claim after a confirm or extend that returned ``v``, or None if ``v`` cannot be.

    Every field the model knows must agree: holder, fence, creation time. A
    write that changed the claim (``rewrites``) stamps ``updated_at`` with the
    store time of its step, inside the op's window and before the hold's
    expiry; one that found the claim already confirmed leaves it alone, so a
    second confirm shows the first one's ``updated_at``.
    """
    if v.get("holder", rec.holder) != rec.holder:
        return None
    if rec.fence is not None and v.get("fence", rec.fence) != rec.fence:
        return None
    if not _same(rec.created, v.get("created_at")):
        return None
    if v.get("state") == _CONFIRMED and v.get("expires_at") is not None:
        return None
    updated = v.get("updated_at")
    if updated is None:
        return rec
    updated = int(updated)
    if rewrites:
        if not (now - TOLERANCE <= updated <= hi + TOLERANCE) or updated > rec.ehi + TOLERANCE:
            return None
    elif not _same(rec.updated, updated):
        return None
    created = rec.created if rec.created is not None else v.get("created_at")
    return rec._replace(updated=updated, created=None if created is None else int(created))


def _shown_fits(rec: Rec, c: dict[str, Any], state: str) -> bool:
    """Whether a claim a read returned matches the model's record judged ``state``."""
    if c.get("state") != state or c.get("holder", rec.holder) != rec.holder:
        return False
    if rec.fence is not None and c.get("fence", rec.fence) != rec.fence:
        return False
    if not _same(rec.created, c.get("created_at")):
        return False
    expires = c.get("expires_at")
    if state == _CONFIRMED:
        if expires is not None:
            return False
    elif (
        state in (_HELD, _EXPIRED)
        and rec.state in (_HELD, _EXPIRED)
        and (expires is None or not (rec.elo - TOLERANCE <= expires <= rec.ehi + TOLERANCE))
    ):
        return False
    # A sweep or a takeover restamps an expired claim; a held or confirmed one
    # shows the time of the last write on it.
    return state not in (_HELD, _CONFIRMED) or _same(rec.updated, c.get("updated_at"))


def _judged(rec: Rec, live: bool) -> str:
    """The state a read shows for a record judged live or dead."""
    if rec.state == _HELD:
        return _HELD if live else _EXPIRED
    return rec.state


def _get(state: State, op: Op, now: float) -> Iterator[State]:
    v = op.value
    cid = str(op.args["claim_id"])
    rec = state.claims.get(cid)
    if op.status == UNKNOWN:
        yield state.copy()
        return
    if op.status != OK:
        return
    if rec is None:
        if not v.get("found"):
            yield state.copy()
        return
    if not v.get("found"):
        return
    for live in _judgements(state, [cid], now):
        if _shown_fits(rec, v, _judged(rec, live[cid])):
            yield state.copy()
            return


def _claims_of(state: State, op: Op, now: float) -> Iterator[State]:
    if op.status == UNKNOWN:
        yield state.copy()
        return
    if op.status != OK:
        return
    holder = op.args["holder"]
    shown = {str(c["claim_id"]): c for c in op.value.get("claims", [])}
    mine = [
        cid
        for cid, rec in state.claims.items()
        if rec.holder == holder and rec.state in (_HELD, _CONFIRMED)
    ]
    for live in _judgements(state, mine, now):
        expected = {cid for cid in mine if live[cid]}
        # A grant whose outcome no one learned is named "?op" in the model: a
        # claim shown under an ID the model does not know may be one of them.
        unnamed = [cid for cid in expected if cid.startswith("?")]
        fits = True
        for cid, c in shown.items():
            rec = state.claims.get(cid)
            if rec is None:
                targets = tuple(tuple(t) for t in c.get("targets", []))
                match = next((u for u in unnamed if state.claims[u].targets == targets), None)
                if match is None:
                    fits = False
                    break
                unnamed.remove(match)
                expected.discard(match)
                continue
            if cid not in expected or not _shown_fits(rec, c, _judged(rec, live=True)):
                fits = False
                break
            expected.discard(cid)
        if fits and not expected:
            yield state.copy()
            return


# --- rate limits ----------------------------------------------------------------------------------


def rate_over_limit(
    admissions: list[tuple[int, int]], limit: int, window_us: int
) -> list[tuple[int, int]]:
    """The windows ``[t, t + window_us)`` that hold more than ``limit`` admitted units.

    ``admissions`` are ``(store time in µs, cost)`` pairs of acknowledged
    admissions; returns ``(t, units)`` for each offending window. Windows that
    start at an admission are the only ones to look at: a window holding the
    most units can slide right until it starts at one. An admission whose
    outcome is unknown is left out, so a window found over the limit is over it
    on acknowledged admissions alone.
    """
    rows = sorted(admissions)
    over: list[tuple[int, int]] = []
    total, j = 0, 0
    for i, (start, _) in enumerate(rows):
        while j < len(rows) and rows[j][0] < start + window_us:
            total += rows[j][1]
            j += 1
        if total > limit:
            over.append((start, total))
        total -= rows[i][1]
    return over
