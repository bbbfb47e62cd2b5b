"""Check a history: both checkers, the store-clock bounds, and one report.

Store time. Memory and SQLite stores read the machine's wall clock, the
clock the history's ``w`` stamps come from, so an op's store time lies
between its invocation and completion stamps exactly. A remote store
(PostgreSQL) has its own clock: its offset from ours is bounded by every
time the store returned (a grant's ``created_at`` lies inside that op's
window), and the tightest bounds are used. Timestamps no single offset can
explain are themselves an anomaly.

Unknown outcomes. On a local store an op whose client died or gave up
cannot take effect after that moment (the client process did the write).
A server may still commit an op after its client is gone, so on a remote
store an unknown op's window ends only where the history shows the server
was done with it: the runner terminated a killed client's backends and saw
them gone (``settled``), or the client saw an error on a server it reaches
over the loopback (the header's ``errors_settle``), where a connection breaks
only when the server closes it, after its transaction ended. Otherwise the
window has no end.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from dibs.ratelimit import Rate
from dibs.verify._history import FAIL, OK, UNKNOWN, History, Op
from dibs.verify._linear import (
    ANOMALY,
    INCONCLUSIVE,
    PartitionResult,
    check_partition,
    describe_ops,
    describe_states,
    explain,
    minimal_witness,
)
from dibs.verify._log import LogAnomaly, acknowledged_fences, describe_row, replay_log
from dibs.verify._model import TOLERANCE, keys_of, op_targets, rate_over_limit
from dibs.verify._waitlist import waitlist_anomalies, waitlist_resources

__all__ = ["Report", "check_history"]

WITNESS_LINES = 60
"""At most this many ops of an offending sub-history are printed."""

BOOKKEEPING = {
    "settle": "killed clients' server work seen ended",
    "cont": "paused clients resumed",
    "integrity_check": "store integrity checks",
    "standbys-behind": "standbys held behind before a failover",
    "promoted": "standbys promoted",
    "elected": "leaders elected",
    "rejoined": "killed members started again",
    "resumed": "paused members resumed",
}
"""Nemesis events that are no faults: what the runner did around one."""

FENCE_KINDS = frozenset({"fence-reissued", "fence-backwards"})
"""Anomalies in the fences clients were acknowledged (:func:`acknowledged_fences`)."""


@dataclass
class Report:
    """What the checkers found: counts, verdicts per resource, anomalies with evidence."""

    operations: int
    acknowledged: int
    unknown: int
    failed: int
    partitions: list[PartitionResult]
    log_anomalies: list[LogAnomaly] | None
    other_anomalies: list[str] = field(default_factory=list)
    seconds: float = 0.0
    origin: float = 0.0
    origin_us: int = 0
    faults: dict[str, int] = field(default_factory=dict)
    """Every nemesis event by kind, bookkeeping (:data:`BOOKKEEPING`) included."""
    log_rows: int = 0
    header: dict[str, Any] = field(default_factory=dict)
    kinds: dict[str, int] = field(default_factory=dict)
    """Operations by kind (claim, confirm, ..., get, claims_of, sweep)."""
    races: int = 0
    """Confirms and extends that found their hold dead: the expiry races exercised."""
    notes: list[dict[str, Any]] = field(default_factory=list)
    fence_anomalies: list[LogAnomaly] = field(default_factory=list)
    """Fences acknowledged twice, or lower than one acknowledged before on a shared target."""

    @property
    def anomalies(self) -> int:
        """How many anomalies both checkers found."""
        return (
            sum(1 for p in self.partitions if p.verdict == ANOMALY)
            + len(self.log_anomalies or [])
            + len(self.fence_anomalies)
            + len(self.other_anomalies)
        )

    @property
    def inconclusive(self) -> int:
        """Resources whose search ran out of time."""
        return sum(1 for p in self.partitions if p.verdict == INCONCLUSIVE)

    @property
    def verdict(self) -> str:
        """``anomaly``, else ``unknown`` if a search ran out of time, or ``ok``."""
        if self.anomalies:
            return "anomaly"
        return "unknown" if self.inconclusive else "ok"

    def evidence(self) -> list[dict[str, Any]]:
        """Every anomaly as a JSON-able dict: its kind, the ops (by ID) and claims that show it."""
        found: list[dict[str, Any]] = []
        for p in self.partitions:
            if p.verdict != ANOMALY:
                continue
            item: dict[str, Any] = {
                "kind": "not-linearizable",
                "resource": p.resource,
                "ops": [op.id for op in p.witness],
                "shrunk": bool(p.witness),
                "note": p.witness_note,
            }
            if p.impossible is not None:
                item["impossible"] = p.impossible.id
                item["states_before"] = describe_states(p.before, self.origin_us, p.impossible)
            found.append(item)
        for a in [*(self.log_anomalies or []), *self.fence_anomalies]:
            found.append(
                {
                    "kind": a.kind,
                    "message": a.message,
                    "claims": [r.id for r in a.rows],
                    "ops": [op.id for op in a.ops],
                }
            )
        for msg in self.other_anomalies:
            kind = "clock" if msg.startswith("CLOCK") else "integrity"
            if msg.startswith("RATE"):
                kind = "rate-limit"
            found.append({"kind": kind, "message": msg})
        return found

    def to_json(self) -> dict[str, Any]:
        """The figures as a JSON-able dict, with every anomaly's evidence."""
        evidence = self.evidence()
        kinds: dict[str, int] = {}
        for item in evidence:
            kinds[item["kind"]] = kinds.get(item["kind"], 0) + 1
        return {
            "verdict": self.verdict,
            "store": self.header.get("store"),
            "plant": self.header.get("plant"),
            "operations": self.operations,
            "acknowledged": self.acknowledged,
            "failed": self.failed,
            "unknown": self.unknown,
            "operation_kinds": self.kinds,
            "expiry_races": self.races,
            "anomalies": self.anomalies,
            "anomaly_kinds": kinds,
            "linearizability": {
                "resources": len(self.partitions),
                "ok": sum(1 for p in self.partitions if p.verdict == "ok"),
                "anomaly": sum(1 for p in self.partitions if p.verdict == ANOMALY),
                "unknown": self.inconclusive,
            },
            "log": None
            if self.log_anomalies is None
            else {"rows": self.log_rows, "anomalies": len(self.log_anomalies)},
            "fences": {"anomalies": len(self.fence_anomalies)},
            "faults": self.faults,
            "notes": {str(n.get("about")): n.get("count", 0) for n in self.notes},
            "evidence": evidence,
            "check_seconds": round(self.seconds, 3),
        }

    def render(self, limit: int = 5, log_limit: int = 10) -> str:
        """The report as text: up to ``limit`` witnesses and ``log_limit`` log anomalies in full."""
        j = self.to_json()
        lin = j["linearizability"]
        lines = [f"verdict: {self.verdict.upper()}"]
        if self.header.get("store"):
            plant = self.header.get("plant")
            lines.append(f"store: {self.header['store']}" + (f" (plant {plant})" if plant else ""))
        lines.append(
            f"operations {self.operations}: acknowledged {self.acknowledged} "
            f"(of which definite failures {self.failed}), unknown {self.unknown}"
        )
        if self.kinds:
            lines.append(
                "  by kind: "
                + ", ".join(f"{k} {v}" for k, v in sorted(self.kinds.items()))
                + f"; expiry races (confirm/extend after the hold died) {self.races}"
            )
        verdicts = f"linearizability: {lin['resources']} resources, {lin['ok']} ok, "
        verdicts += f"{lin['anomaly']} anomalous"
        if lin["unknown"]:
            verdicts += f", {lin['unknown']} unknown (search budget exceeded)"
        lines.append(verdicts)
        if self.log_anomalies is None:
            lines.append("log replay: not run (no log in the history)")
        else:
            lines.append(f"log replay: {self.log_rows} claims, {len(self.log_anomalies)} anomalies")
        grants = self.kinds.get("claim", 0)
        lines.append(
            f"fences acknowledged: {len(self.fence_anomalies)} given twice or going back"
            + ("" if grants else " (no claims)")
        )
        lines.extend(self._fault_lines())
        for note in self.notes:
            lines.append(
                f"logged by the clients: {note.get('count')} {note.get('about')} warnings "
                "(connections cut by faults, reopened); first: "
                + " | ".join(note.get("examples", [])[:1])
            )
        shown = 0
        for p in self.partitions:
            if p.verdict == ANOMALY:
                lines.append(f"\nNOT LINEARIZABLE on resource {p.resource} ({p.ops} ops)")
                if p.witness and shown < limit:
                    shown += 1
                    lines.extend(self._witness_lines(p))
                else:
                    lines.append("(sub-history not shown: raise --witnesses to shrink more)")
            elif p.verdict == INCONCLUSIVE:
                lines.append(f"\nresource {p.resource}: search budget exceeded, verdict unknown")
        logged = [*(self.log_anomalies or []), *self.fence_anomalies]
        for a in logged[:log_limit]:
            label = "FENCE" if a.kind in FENCE_KINDS else "LOG"
            lines.append(f"\n{label}: {a.kind}: {a.message}")
            lines.extend(describe_row(r, self.origin_us) for r in a.rows)
            lines.extend(describe_ops(a.ops[-8:], self.origin_us))
        if len(logged) > log_limit:
            lines.append(f"\n... {len(logged) - log_limit} more log anomalies (--log-anomalies N)")
        lines.extend(f"\n{msg}" for msg in self.other_anomalies)
        lines.append(f"\nchecked in {self.seconds:.1f} s")
        return "\n".join(lines)

    def _fault_lines(self) -> list[str]:
        named = [str(f) for f in self.header.get("faults", ())]
        counts = {k: v for k, v in self.faults.items() if k not in BOOKKEEPING}
        # A paused client process is a "stop" event (SIGSTOP); a thread's is "pause".
        counts["pause"] = counts.get("pause", 0) + counts.pop("stop", 0)
        shown = [f for f in named if f not in ("skew", "integrity")]
        shown += sorted(k for k, v in counts.items() if v and k not in shown)
        parts = [f"{k} {counts.get(k, 0)}" for k in shown]
        if "skew" in named:
            parts.append(f"skew ±{self.header.get('skew', 5.0):g} s")
        lines = ["faults: " + (", ".join(parts) if parts else "none")]
        kept = [f"{BOOKKEEPING[k]} {v}" for k, v in sorted(self.faults.items()) if k in BOOKKEEPING]
        if kept:
            lines.append("  runner: " + ", ".join(kept))
        return lines

    def _witness_lines(self, p: PartitionResult) -> list[str]:
        lines = [f"offending sub-history ({p.witness_note}):"]
        ops = sorted(p.witness, key=lambda o: o.start)
        bad = p.impossible
        if len(ops) > WITNESS_LINES:
            # Too long to read whole: the ops that share a lock with the impossible
            # one (or read the whole resource) up to it, which is where the orders fail.
            if bad is not None:
                near = keys_of(op_targets(bad))
                ops = [
                    o
                    for o in ops
                    if o.start <= bad.end and (o.fn == "claims_of" or keys_of(op_targets(o)) & near)
                ]
            hidden = len(p.witness) - len(ops[-WITNESS_LINES:])
            ops = ops[-WITNESS_LINES:]
            lines.append(
                f"  ({hidden} of its {len(p.witness)} ops not shown: the last {len(ops)} "
                "on the impossible op's targets follow)"
            )
        described = describe_ops(ops, self.origin_us)
        for op, text in zip(ops, described, strict=True):
            lines.append(text + ("   <== IMPOSSIBLE" if bad is not None and op is bad else ""))
        if bad is not None:
            lines.append(
                f"no order of the ops before it lets {bad.id} ({bad.fn}) return what it did; "
                "the model's possible states just before it:"
            )
            states = describe_states(p.before, self.origin_us, bad)
            if not states:
                lines.append("  (none recorded)")
            for i, st in enumerate(states, 1):
                lines.append(f"  state {i} (claims on its targets):")
                lines.extend("    " + line for line in st)
        return lines


def _offset(ops: Sequence[Op], local: bool) -> tuple[float, float, list[str]]:
    """Bounds on (store clock - our wall clock) in µs, and any contradiction found."""
    if local:
        return 0.0, 0.0, []
    low, high = -math.inf, math.inf
    low_op: Op | None = None
    high_op: Op | None = None
    for op in ops:
        if (
            op.status == OK
            and op.fn == "claim"
            and op.value.get("granted")
            and not op.value.get("replayed")
        ):
            created = op.value["created_at"]
            if created - op.wall_end > low:
                low, low_op = created - op.wall_end, op
            if created - op.wall_start < high:
                high, high_op = created - op.wall_start, op
    if low > high + TOLERANCE and low_op is not None and high_op is not None:
        return (
            0.0,
            0.0,
            [
                "CLOCK: the store's timestamps fit no single clock offset:\n"
                + "\n".join(describe_ops([low_op, high_op], low_op.wall_start))
            ],
        )
    if math.isinf(low):
        return -math.inf, math.inf, []
    return low, high, []


UNMODELLED = frozenset({"sweep", "rate", "semaphore", "waitlist"})
"""Ops in no resource's history: a sweep (the model gives it no step); rate-limit
decisions, judged apart by :func:`rate_anomalies` (their slot claims are plain claims,
which the log replay judges); and semaphore holds, judged apart by
:func:`semaphore_anomalies` (their slot claims are left out of the log replay)."""


def rate_anomalies(ops: Sequence[Op]) -> list[str]:
    """Rate limits that admitted more than their rate in some window, as report lines.

    Each key's acknowledged admissions are judged on the store's times they
    carry, over windows as long as the shortest admission's hold (the rate's
    window; etcd's whole-second leases make theirs longer): no such window may
    hold more than the rate's limit.
    """
    admitted: dict[tuple[str, str], list[tuple[int, int]]] = {}
    shortest: dict[tuple[str, str], int] = {}
    for op in ops:
        if op.fn != "rate" or op.status != OK or not op.value.get("allowed"):
            continue
        key = (op.resource, str(op.args["rate"]))
        created, ends = op.value["created_at"], op.value.get("expires_at")
        admitted.setdefault(key, []).append((int(created), int(op.args["cost"])))
        if ends is not None:
            shortest[key] = min(shortest.get(key, ends - created), ends - created)
    found = []
    for (name, text), admissions in sorted(admitted.items()):
        rate = Rate.parse(text)
        window = max(rate.window_us, shortest.get((name, text), rate.window_us))
        for start, units in rate_over_limit(admissions, rate.limit, window)[:3]:
            found.append(
                f"RATE: key {name} admitted {units} units in the {window / 1000:g} ms from "
                f"store time {start} µs; its rate {text} allows {rate.limit}"
            )
    return found


def partition(ops: Sequence[Op]) -> dict[str, list[Op]]:
    """The ops of each resource, in invocation order.

    A sweep touches every resource, and the model gives it no step (see
    :mod:`dibs.verify._model`): it is in no part. A ``claims_of`` read is
    split: each resource gets the claims it showed on that resource.
    """
    parts: dict[str, list[Op]] = {}
    spread: list[Op] = []
    for op in ops:
        if op.fn in UNMODELLED:
            continue
        if op.fn == "claims_of":
            spread.append(op)
            continue
        parts.setdefault(op.resource, []).append(op)
    for op in spread:
        for resource, part in parts.items():
            claims = [c for c in op.value.get("claims", ()) if c["targets"][0][1] == resource]
            value = {**op.value, "claims": claims} if "claims" in op.value else op.value
            part.append(replace(op, args={**op.args, "res": resource}, value=value))
    for part in parts.values():
        part.sort(key=lambda o: o.start)
    return parts


def semaphore_anomalies(ops: Sequence[Op]) -> list[str]:
    """More holders of a semaphore at once than its permits: each hold's surely-held
    interval (entered to left, monotonic), overlaps counted per semaphore."""
    found = []
    by_key: dict[str, list[Op]] = {}
    for op in ops:
        if op.fn == "semaphore" and op.status == OK and op.value.get("entered") is not None:
            by_key.setdefault(str(op.args["res"]), []).append(op)
    for key, held in sorted(by_key.items()):
        permits = int(held[0].args["permits"])
        edges = sorted(
            [(op.value["entered"], 1, op) for op in held]
            + [(op.value["left"], -1, op) for op in held],
            key=lambda edge: (edge[0], edge[1]),  # a hold leaving at t before one entering
        )
        inside: dict[str, Op] = {}
        for _, step, op in edges:
            if step < 0:
                inside.pop(op.id, None)
                continue
            inside[op.id] = op
            if len(inside) > permits:
                names = ", ".join(sorted(f"{o.client} ({o.id})" for o in inside.values()))
                found.append(
                    f"SEMAPHORE: {len(inside)} holders of {key!r} at once under"
                    f" {permits} permits: {names}"
                )
                break
    return found


def check_history(
    history: History, *, budget: float = 10.0, shrink_budget: float = 10.0, max_witnesses: int = 3
) -> Report:
    """Run both checkers on a history.

    ``budget`` is the search time per resource (seconds); a resource past it
    is reported unknown. ``shrink_budget`` bounds the time spent shrinking
    each offending sub-history.
    """
    began = time.monotonic()
    ops = history.ops
    # A store on this machine's clock is judged strictly; the runner records which it was.
    local = bool(history.header.get("local_clock", False))
    low, high, clock_anomalies = _offset(ops, local)

    errors_settle = bool(history.header.get("errors_settle", False))
    # etcd: a lease restarts its TTL on a leader change, so a hold may outlive its expiry.
    outlive = bool(history.header.get("holds_outlive_ttl", False))
    # etcd: the store's times are the writing client's stamps, taken before its write.
    stamped = bool(history.header.get("client_stamps", False))

    def settled(op: Op) -> bool:
        if op.value.get("error") == "killed":
            return bool(op.value.get("settled"))
        return errors_settle

    def window(op: Op) -> tuple[float, float]:
        lo = op.wall_start + low
        if op.status == UNKNOWN and not local and not settled(op):
            return lo, math.inf
        return lo, op.wall_end + high

    parts = partition(ops)
    results = []
    witnesses = 0
    for resource in sorted(parts):
        part = parts[resource]
        start = time.monotonic()
        verdict = check_partition(part, window, start + budget, outlive=outlive, stamped=stamped)
        result = PartitionResult(resource, verdict, len(part), time.monotonic() - start)
        if verdict == ANOMALY and witnesses < max_witnesses:
            witnesses += 1
            result.witness, result.witness_note, failing = minimal_witness(
                part, window, shrink_budget, outlive=outlive, stamped=stamped
            )
            result.impossible, result.before = explain(
                failing, window, max(1.0, shrink_budget), outlive=outlive, stamped=stamped
            )
        results.append(result)
    # The semaphore's claims are the pattern's, not ops of the history: judged by its holds.
    sem_resources = {str(op.args["res"]) for op in ops if op.fn == "semaphore"}
    rows = [
        row
        for row in history.log or ()
        if not any(t[1] in sem_resources or waitlist_resources(t[1]) for t in row.targets)
    ]
    log_anomalies = (
        None if history.log is None else replay_log(ops, rows, outlive=outlive, stamped=stamped)
    )
    faults: dict[str, int] = {}
    other = list(clock_anomalies) + semaphore_anomalies(ops) + waitlist_anomalies(ops)
    other.extend(rate_anomalies(ops))
    for event in history.nemesis:
        faults[event["f"]] = faults.get(event["f"], 0) + 1
        if event["f"] == "integrity_check" and event.get("result") != "ok":
            other.append(
                f"INTEGRITY: the store's integrity check after a kill said {event.get('result')!r}"
            )
    kinds: dict[str, int] = {}
    for op in ops:
        kinds[op.fn] = kinds.get(op.fn, 0) + 1
    origin = min((op.start for op in ops), default=0.0)
    origin_us = min((op.wall_start for op in ops), default=0)
    return Report(
        operations=len(ops),
        acknowledged=sum(1 for op in ops if op.status in (OK, FAIL)),
        unknown=sum(1 for op in ops if op.status == UNKNOWN),
        failed=sum(1 for op in ops if op.status == FAIL),
        partitions=results,
        log_anomalies=log_anomalies,
        other_anomalies=other,
        seconds=time.monotonic() - began,
        origin=origin,
        origin_us=origin_us,
        faults=faults,
        log_rows=len(history.log or []),
        header=history.header,
        notes=history.notes,
        fence_anomalies=acknowledged_fences(ops),
        kinds=kinds,
        races=sum(
            1
            for op in ops
            if op.fn in ("confirm", "extend")
            and op.value.get("reason") in ("expired", "taken_over")
        ),
    )
