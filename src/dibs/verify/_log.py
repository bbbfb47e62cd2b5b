"""The store's durable log, dumped and replayed in fence order: an O(n) second opinion.

The linearizability search judges what clients saw; this judges what the
store kept. One pass over the claim rows in fence order, with the history's
acknowledged operations indexed by claim ID, checks that:

* every acknowledged grant, confirm, extend and release is in the log
  (0 lost acknowledged confirmations);
* fences are unique, and on each unit (and each span resource) a higher
  fence never started earlier on the store's clock;
* no claim was granted while an earlier claim on a conflicting target was
  still live (held before its expiry, or confirmed and not yet released);
* a confirmed claim was confirmed by its holder before its hold expired and
  was never taken over;
* an acknowledged grant holds exactly the targets asked for;
* an acknowledged confirm, extend or release used the claim's own fence;
* an acknowledged extension of a hold was decided (its new ``expires_at``
  minus its TTL) before the hold's latest known expiry;
* a request ID answered twice answered alike (the same claim, or the same
  refusal), and never took two different inputs.

The last three need no log: they judge the history's own answers, so they
hold whatever the store kept, and they are what the linearizability search
would find on a resource it could not finish.

A claim's live interval is read from its final row: from ``created_at`` to
``expires_at`` for holds that expired (or still wait), to ``updated_at`` for
released claims, and without end for confirmed ones.

A store whose times are its clients' stamps (:attr:`dibs.Store.client_stamps`:
etcd, which keeps no clock) stamps a grant or a release before its write
reaches the store, so a grant that serialized after a release may carry the
earlier time. There the last two checks use the calls instead of the stamps: a
grant (or a higher fence) is proven early only when its call had returned
before the call that ended the earlier claim (or granted the lower fence) was
made, or before the earlier hold's ``expires_at``. A grant whose call went
unanswered may have taken effect any time after that call began; a row no
call explains falls back to its stamp, widened by the longest call in the
history.

:func:`acknowledged_fences` needs no log: no fence was acknowledged for two
claims, and on each unit (and span point) a grant that began after another
was acknowledged has the higher fence. It judges what clients were told,
whatever the store kept: a failover to a standby that missed the end of the
old primary's log hands out its fences again, and its claim IDs with them.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from dibs._model import target_to_json
from dibs.exceptions import StoreUnavailable
from dibs.stores.base import Store
from dibs.verify._history import OK, UNKNOWN, LogRow, Op
from dibs.verify._model import TOLERANCE, keys_of

__all__ = ["LogAnomaly", "acknowledged_fences", "answers", "dump_log", "micros", "replay_log"]

_SPAN_HORIZON = 60 * 1_000_000
"""µs: span claims that ended this long before a new one are no longer compared."""


@dataclass
class LogAnomaly:
    """One broken promise found in the log, with the rows and ops that show it."""

    kind: str
    message: str
    rows: list[LogRow] = field(default_factory=list)
    ops: list[Op] = field(default_factory=list)


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICRO = timedelta(microseconds=1)


def micros(value: datetime) -> int:
    """An aware datetime as whole µs since the epoch, exactly (no float rounding)."""
    return (value - _EPOCH) // _MICRO


def dump_log(store: Store) -> list[LogRow]:
    """Read every claim the store keeps, ordered by fence, through its claim log.

    Raises :class:`TypeError` for a store that offers no claim log
    (:meth:`dibs.Store.claim_log`), and :class:`~dibs.StoreUnavailable` if it
    cannot be read.
    """
    log = store.claim_log()
    if log is None:
        raise TypeError(f"cannot read the durable log of a {type(store).__name__}")
    for attempt in range(5):
        # After a restart or pg_terminate_backend a pool may hand out a dead
        # connection first; it discards it on error, so try again.
        try:
            claims = log.claims()
            break
        except StoreUnavailable:
            if attempt == 4:
                raise
            time.sleep(0.2)
    rows = [
        LogRow(
            id=claim.id,
            fence=claim.fence,
            holder=claim.holder,
            targets=tuple(tuple(target_to_json(t)) for t in claim.targets),
            state=claim.state.value,
            created_at=micros(claim.created_at),
            expires_at=None if claim.expires_at is None else micros(claim.expires_at),
            updated_at=micros(claim.updated_at),
            taken_over=claim.taken_over,
            mode=claim.mode,
        )
        for claim in claims
    ]
    rows.sort(key=lambda r: r.fence)
    return rows


def _live_end(row: LogRow) -> float:
    if row.state == "confirmed":
        return math.inf
    if row.state == "released":
        return row.updated_at
    return row.expires_at if row.expires_at is not None else row.updated_at


def _keys(row: LogRow) -> list[tuple[Any, ...]]:
    return [("u", t[1], t[2]) if t[0] == "u" else ("s", t[1]) for t in row.targets]


def _excludes(a: LogRow, b: LogRow) -> bool:
    """Whether two claims on one target exclude each other: unless both are shared."""
    return a.mode == "exclusive" or b.mode == "exclusive"


def _overlap(a: tuple[Any, ...], b: tuple[Any, ...]) -> bool:
    return bool(a[2] < b[3] and b[2] < a[3])


@dataclass(frozen=True)
class _Calls:
    """When the calls behind a client-stamped log ran (wall-clock µs), claim by claim."""

    on_claim: dict[str, list[Op]]
    unanswered: dict[str, list[Op]]
    """Claims whose outcome the client never learned, by holder: they name no claim ID."""
    slack: float
    """µs: the longest completed call; a stamp no call explains is off by at most this."""

    def _grants(self, row: LogRow) -> tuple[list[Op], list[Op]]:
        """The calls that may have made ``row``: acknowledged grants of it, and claims of
        its targets by its holder left unanswered, begun before its stamp."""
        acked = [
            o
            for o in self.on_claim.get(row.id, [])
            if o.fn == "claim" and o.status == OK and o.value.get("granted")
        ]
        targets = frozenset(row.targets)
        unanswered = [
            o
            for o in self.unanswered.get(row.holder, [])
            if o.wall_start <= row.created_at
            and frozenset(tuple(t) for t in o.args["targets"]) == targets
        ]
        return acked, unanswered

    def granted_by(self, row: LogRow) -> float:
        """When ``row``'s grant had surely taken effect: its first acknowledgement."""
        acked, unanswered = self._grants(row)
        if acked:
            return min(o.wall_end for o in acked)
        if unanswered:
            return math.inf  # a call with no answer may take effect any time after it began
        return row.created_at + self.slack

    def granted_from(self, row: LogRow) -> float:
        """The earliest ``row``'s grant can have taken effect: its first call."""
        acked, unanswered = self._grants(row)
        if acked or unanswered:
            return min(o.wall_start for o in acked + unanswered)
        return row.created_at - self.slack

    def ended_from(self, row: LogRow) -> float:
        """The earliest ``row`` can have stopped being live (see :func:`_live_end`)."""
        if row.state != "released":
            return _live_end(row)  # an expiry is a promise, not a stamp of a write
        released = [
            o.wall_start
            for o in self.on_claim.get(row.id, [])
            if o.fn == "release" and (o.status == UNKNOWN or o.value.get("released"))
        ]
        return min(released) if released else row.updated_at - self.slack


def replay_log(
    ops: Sequence[Op], rows: Sequence[LogRow], *, outlive: bool = False, stamped: bool = False
) -> list[LogAnomaly]:
    """Replay the log in fence order against the history; return what broke.

    ``outlive``: the store's holds may live past their ``expires_at`` (etcd's
    leases restart on a leader change), so a confirmation after it is no
    anomaly; a grant over a hold before it still is. ``stamped``: the store's
    times are its clients' stamps, taken before the write; order grants and
    releases by the calls that made them (see the module's notes).
    """
    anomalies: list[LogAnomaly] = []
    by_id = {row.id: row for row in rows}
    on_claim: dict[str, list[Op]] = {}
    for op in ops:
        cid = op.args.get("claim_id") or op.value.get("claim_id")
        if cid is not None:
            on_claim.setdefault(str(cid), []).append(op)
    calls = None
    if stamped:
        took = [o.wall_end - o.wall_start for o in ops if o.status != UNKNOWN]
        unanswered: dict[str, list[Op]] = {}
        for op in ops:
            if op.fn == "claim" and op.status == UNKNOWN:
                unanswered.setdefault(str(op.args["holder"]), []).append(op)
        calls = _Calls(on_claim, unanswered, max(took, default=0.0))

    # 1. Every acknowledged operation is in the log.
    for op in ops:
        if op.status != OK:
            continue
        v = op.value
        if op.fn == "claim" and v.get("granted"):
            cid = v.get("claim_id")  # absent: a grant answered without its claim
            row = None if cid is None else by_id.get(str(cid))
            if row is None:
                anomalies.append(
                    LogAnomaly(
                        "lost-grant",
                        f"acknowledged grant {cid} is not in the log"
                        if cid is not None
                        else "a grant was acknowledged without a claim",
                        [],
                        [op],
                    )
                )
            elif row.fence != v["fence"] or row.holder != op.args["holder"]:
                anomalies.append(
                    LogAnomaly(
                        "grant-mismatch",
                        f"claim {row.id} in the log differs from its acknowledgement",
                        [row],
                        [op],
                    )
                )
            elif frozenset(row.targets) != _asked(op):
                anomalies.append(
                    LogAnomaly(
                        "grant-targets",
                        f"claim {row.id} was granted on {_text(row.targets)}, "
                        f"asked for {_text(_asked(op))}",
                        [row],
                        [op],
                    )
                )
        elif op.fn in ("confirm", "release", "extend"):
            cid = str(op.args["claim_id"])
            row = by_id.get(cid)
            later = on_claim.get(cid, [])
            if row is None:
                anomalies.append(
                    LogAnomaly("lost-claim", f"claim {cid} is not in the log", [], [op])
                )
                continue
            if op.args["fence"] != row.fence:
                anomalies.append(
                    LogAnomaly(
                        "stale-fence-accepted",
                        f"{op.fn} of claim {cid} with fence {op.args['fence']} was acknowledged, "
                        f"but the claim's fence is {row.fence}",
                        [row],
                        [op],
                    )
                )
            if op.fn == "confirm" and row.state not in ("confirmed", "released"):
                anomalies.append(
                    LogAnomaly(
                        "lost-confirmation",
                        f"acknowledged confirmation of claim {cid} is lost: "
                        f"the log says {row.state}",
                        [row],
                        later,
                    )
                )
            elif op.fn == "release" and v.get("released") and row.state != "released":
                anomalies.append(
                    LogAnomaly(
                        "lost-release", f"acknowledged release of claim {cid} is lost", [row], later
                    )
                )
            elif (
                op.fn == "extend"
                and v.get("state") == "held"
                and row.state in ("held", "expired")
                and (row.expires_at or 0) < v["expires_at"]
                and not any(o.fn == "extend" and o.status == UNKNOWN for o in later)
            ):
                anomalies.append(
                    LogAnomaly(
                        "lost-extend",
                        f"acknowledged extension of claim {cid} is lost",
                        [row],
                        later,
                    )
                )

    anomalies.extend(answers(ops, outlive=outlive))

    # 2-4. One pass in fence order.
    seen_fences: dict[int, LogRow] = {}
    # A unit's last exclusive claim and the shared ones after it: a writer must follow
    # all of them, a reader only the writer (readers overlap one another).
    on_unit: dict[tuple[Any, ...], list[LogRow]] = {}
    spans_on: dict[str, list[tuple[tuple[Any, ...], LogRow]]] = {}
    for row in rows:
        twin = seen_fences.get(row.fence)
        if twin is not None:
            anomalies.append(
                LogAnomaly("fence-reused", f"fence {row.fence} given twice", [twin, row])
            )
        seen_fences[row.fence] = row
        for target in row.targets:
            if target[0] == "u":
                key = ("u", target[1], target[2])
                before = on_unit.get(key, [])
                for prev in before:
                    if _excludes(prev, row):
                        where = f"unit {target[1]}/{target[2]}"
                        _compare(prev, row, where, anomalies, on_claim, calls)
                on_unit[key] = [row] if row.mode == "exclusive" else [*before, row]
            else:
                entries = spans_on.setdefault(target[1], [])
                entries[:] = [
                    e for e in entries if _live_end(e[1]) + _SPAN_HORIZON > row.created_at
                ]
                for span, prev in entries:
                    if prev.id != row.id and _overlap(span, target) and _excludes(prev, row):
                        _compare(prev, row, f"span {target[1]}", anomalies, on_claim, calls)
                entries.append((target, row))
        if row.state == "released" and not any(
            o.fn == "release" and (o.status == UNKNOWN or o.value.get("released"))
            for o in on_claim.get(row.id, [])
        ):
            # Only a release ends a claim as released; anything else that does
            # (a blind overwrite, a confirmation lost) took a grant from its holder.
            anomalies.append(
                LogAnomaly(
                    "released-by-nobody",
                    f"claim {row.id} ({row.holder}) is released, but no release of it "
                    "was acknowledged or left unknown",
                    [row],
                    on_claim.get(row.id, []),
                )
            )
        if row.state == "confirmed" and row.taken_over:
            anomalies.append(
                LogAnomaly(
                    "confirm-after-takeover",
                    f"claim {row.id} is confirmed although it was taken over",
                    [row],
                    on_claim.get(row.id, []),
                )
            )
        if row.state == "confirmed" and not outlive:
            _check_confirm_time(row, on_claim.get(row.id, []), anomalies)
    return anomalies


def _asked(op: Op) -> frozenset[tuple[Any, ...]]:
    return frozenset(tuple(t) for t in op.args["targets"])


def _text(targets: Any) -> str:
    return "+".join(
        f"{t[1]}/{t[2]}" if t[0] == "u" else f"{t[1]}[{t[2]},{t[3]})" for t in sorted(targets)
    )


def answers(ops: Sequence[Op], *, outlive: bool = False) -> list[LogAnomaly]:
    """What the history's answers alone break: stale fences, late extends, request replays.

    ``outlive``: holds may live past their ``expires_at`` (etcd), so an extend
    after it is no anomaly. Needs no log, and runs in O(n log n).
    """
    found: list[LogAnomaly] = []
    by_claim: dict[str, list[Op]] = {}
    by_request: dict[str, list[Op]] = {}
    for op in ops:
        cid = op.args.get("claim_id") or op.value.get("claim_id")
        if cid is not None:
            by_claim.setdefault(str(cid), []).append(op)
        if op.fn == "claim" and op.args.get("rid") is not None:
            by_request.setdefault(str(op.args["rid"]), []).append(op)
    if not outlive:
        for cid, on in by_claim.items():
            found.extend(_late_extends(cid, on))
    for rid, asked in by_request.items():
        found.extend(_replays(rid, asked))
    return found


def _late_extends(cid: str, on: list[Op]) -> list[LogAnomaly]:
    """Acknowledged extensions decided after the hold's latest known expiry."""
    if any(o.status == UNKNOWN and o.fn in ("claim", "extend") for o in on):
        return []  # an unacknowledged grant or extension may have moved the expiry: no bound
    known = sorted(
        (o.start, o.value["expires_at"])
        for o in on
        if o.status == OK and o.fn in ("claim", "extend") and o.value.get("expires_at") is not None
    )
    found = []
    for op in on:
        v = op.value
        if not (op.fn == "extend" and op.status == OK and v.get("state") == "held"):
            continue
        if v.get("expires_at") is None:
            continue
        decided = int(v["expires_at"]) - round(float(op.args["ttl"]) * 1_000_000)
        # Every write that set the expiry this extend judged began before it ended.
        before = [exp for start, exp in known if start < op.end and exp != v["expires_at"]]
        if before and decided > max(before) + TOLERANCE:
            found.append(
                LogAnomaly(
                    "extend-after-expiry",
                    f"claim {cid} was extended {(decided - max(before)) / 1000:.3f} ms after "
                    "its hold had expired",
                    [],
                    on,
                )
            )
    return found


def _outcome(op: Op) -> tuple[Any, ...]:
    v = op.value
    if v.get("granted"):
        return ("granted", v.get("claim_id"), v.get("fence"))
    return ("refused", frozenset(tuple(t) for t in v.get("taken", ())))


def _replays(rid: str, asked: list[Op]) -> list[LogAnomaly]:
    """A request ID's acknowledged answers: one input, one outcome, one fresh answer at most."""
    answered = sorted((o for o in asked if o.status == OK), key=lambda o: o.end)
    if len(answered) < 2:
        return []
    inputs: dict[tuple[Any, ...], Op] = {}
    for op in answered:
        a = op.args
        inputs.setdefault((a["holder"], tuple(map(tuple, a["targets"])), a.get("ttl")), op)
    if len(inputs) > 1:
        first, other, *_ = inputs.values()
        return [
            LogAnomaly(
                "request-input-ignored",
                f"request ID {rid} was answered for two different inputs (ttl "
                f"{first.args.get('ttl')} for {_text(_asked(first))}, then ttl "
                f"{other.args.get('ttl')} for {_text(_asked(other))}) instead of a "
                "RequestConflict",
                [],
                answered,
            )
        ]
    first = answered[0]
    for op in answered[1:]:
        # A fresh answer after one the client already had: the request was forgotten.
        fresh_again = not op.value.get("replayed") and op.start > first.end
        if _outcome(op) != _outcome(first) or fresh_again:
            return [
                LogAnomaly(
                    "replay-differs",
                    f"request ID {rid} was answered {_describe(first)}, then {_describe(op)}",
                    [],
                    answered,
                )
            ]
    return []


def _describe(op: Op) -> str:
    v = op.value
    how = "replayed" if v.get("replayed") else "fresh"
    if v.get("granted"):
        return f"granted claim {v.get('claim_id')} ({how})"
    return f"refused, taken {_text(v.get('taken', ()))} ({how})"


def _fresh_grants(ops: Sequence[Op]) -> list[Op]:
    return [
        op
        for op in ops
        if op.fn == "claim"
        and op.status == OK
        and op.value.get("granted")
        and not op.value.get("replayed")
        and op.value.get("fence") is not None
    ]


def acknowledged_fences(ops: Sequence[Op]) -> list[LogAnomaly]:
    """Fences as the clients were told them: each given once, rising along real time per key."""
    found: list[LogAnomaly] = []
    grants = _fresh_grants(ops)
    first: dict[int, Op] = {}
    for op in sorted(grants, key=lambda o: o.end):
        fence = int(op.value["fence"])
        twin = first.get(fence)
        if twin is None:
            first[fence] = op
        elif str(twin.value.get("claim_id")) != str(op.value.get("claim_id")) or (
            twin.args.get("holder") != op.args.get("holder")
        ):
            found.append(
                LogAnomaly(
                    "fence-reissued",
                    f"fence {fence} was acknowledged twice: to {twin.args.get('holder')} for "
                    f"claim {twin.value.get('claim_id')}, then to {op.args.get('holder')} for "
                    f"claim {op.value.get('claim_id')}",
                    [],
                    [twin, op],
                )
            )
    on_key: dict[Any, list[Op]] = {}
    for op in grants:
        for key in keys_of(tuple(tuple(t) for t in op.args["targets"])):
            on_key.setdefault((op.args["res"], key), []).append(op)
    backwards: dict[tuple[str, str], tuple[Op, Op]] = {}
    for part in on_key.values():
        by_end = sorted(part, key=lambda o: o.end)
        highest: Op | None = None
        i = 0
        for op in sorted(part, key=lambda o: o.start):
            while i < len(by_end) and by_end[i].end < op.start:
                done = by_end[i]
                if highest is None or done.value["fence"] > highest.value["fence"]:
                    highest = done
                i += 1
            if highest is not None and op.value["fence"] < highest.value["fence"]:
                backwards.setdefault((highest.id, op.id), (highest, op))
    for earlier, later in backwards.values():
        found.append(
            LogAnomaly(
                "fence-backwards",
                f"fence {later.value['fence']} was granted ({later.args.get('holder')}, claim "
                f"{later.value.get('claim_id')}) after fence {earlier.value['fence']} had been "
                f"acknowledged on a target they share ({earlier.args.get('holder')}, claim "
                f"{earlier.value.get('claim_id')})",
                [],
                [earlier, later],
            )
        )
    return found


def _compare(
    prev: LogRow,
    row: LogRow,
    where: str,
    anomalies: list[LogAnomaly],
    on_claim: dict[str, list[Op]],
    calls: _Calls | None = None,
) -> None:
    context = on_claim.get(prev.id, []) + on_claim.get(row.id, [])
    if calls is None:
        early = row.created_at < prev.created_at
        over_live = row.created_at < _live_end(prev)
    else:
        granted = calls.granted_by(row)
        early = granted < calls.granted_from(prev)
        over_live = granted < calls.ended_from(prev)
    if early:
        anomalies.append(
            LogAnomaly(
                "fence-order",
                f"on {where}, fence {row.fence} started before the lower fence {prev.fence}",
                [prev, row],
                context,
            )
        )
    if over_live:
        anomalies.append(
            LogAnomaly(
                "grant-over-live-claim",
                f"on {where}, claim {row.id} (fence {row.fence}) was granted while claim "
                f"{prev.id} (fence {prev.fence}) was live",
                [prev, row],
                context,
            )
        )


def _check_confirm_time(row: LogRow, on_claim: list[Op], anomalies: list[LogAnomaly]) -> None:
    """A confirmed row's ``updated_at`` is when it was confirmed: it must precede the expiry."""
    if any(o.fn == "extend" and o.status == UNKNOWN for o in on_claim):
        return  # an unacknowledged extension may have moved the expiry: no bound
    expiries = [
        o.value["expires_at"]
        for o in on_claim
        if o.status == OK and o.value.get("expires_at") is not None and o.fn in ("claim", "extend")
    ]
    if not expiries:
        return
    if row.updated_at >= max(expiries):
        anomalies.append(
            LogAnomaly(
                "confirm-after-expiry",
                f"claim {row.id} was confirmed after its hold expired",
                [row],
                on_claim,
            )
        )


def describe_row(row: LogRow, origin_us: int) -> str:
    """A log row as one readable line, store times in ms from ``origin_us``."""

    def ms(v: float | None) -> str:
        return "-" if v is None else f"{(v - origin_us) / 1000:.3f}"

    targets = "+".join(
        f"{t[1]}/{t[2]}" if t[0] == "u" else f"{t[1]}[{t[2]},{t[3]})" for t in row.targets
    )
    return (
        f"  claim {row.id} fence={row.fence} holder={row.holder} {targets} state={row.state}"
        f" created={ms(row.created_at)} expires={ms(row.expires_at)} updated={ms(row.updated_at)}"
        f"{' taken_over' if row.taken_over else ''}"
    )
