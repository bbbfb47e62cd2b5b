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
from dataclasses import dataclass, field
from typing import Any

from dibs.verify._history import FAIL, LOCAL_SCHEMES, OK, UNKNOWN, History, Op
from dibs.verify._linear import (
    ANOMALY,
    INCONCLUSIVE,
    PartitionResult,
    check_partition,
    describe_ops,
    minimal_witness,
)
from dibs.verify._log import LogAnomaly, describe_row, replay_log
from dibs.verify._model import TOLERANCE

__all__ = ["Report", "check_history"]

WITNESS_LINES = 60
"""At most this many ops of an offending sub-history are printed (its last ones)."""


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
    log_rows: int = 0

    @property
    def anomalies(self) -> int:
        """How many anomalies both checkers found."""
        return (
            sum(1 for p in self.partitions if p.verdict == ANOMALY)
            + len(self.log_anomalies or [])
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

    def to_json(self) -> dict[str, Any]:
        """The figures as a JSON-able dict."""
        return {
            "verdict": self.verdict,
            "operations": self.operations,
            "acknowledged": self.acknowledged,
            "failed": self.failed,
            "unknown": self.unknown,
            "anomalies": self.anomalies,
            "linearizability": {
                "resources": len(self.partitions),
                "ok": sum(1 for p in self.partitions if p.verdict == "ok"),
                "anomaly": sum(1 for p in self.partitions if p.verdict == ANOMALY),
                "unknown": self.inconclusive,
            },
            "log": None
            if self.log_anomalies is None
            else {"rows": self.log_rows, "anomalies": len(self.log_anomalies)},
            "faults": self.faults,
            "check_seconds": round(self.seconds, 3),
        }

    def render(self, limit: int = 5) -> str:
        """The report as text, with up to ``limit`` anomalies shown in full."""
        j = self.to_json()
        lin = j["linearizability"]
        lines = [
            f"verdict: {self.verdict.upper()}",
            f"operations {self.operations}: acknowledged {self.acknowledged} "
            f"(of which definite failures {self.failed}), unknown {self.unknown}",
            f"linearizability: {lin['resources']} resources, {lin['ok']} ok, "
            f"{lin['anomaly']} anomalous, {lin['unknown']} unknown (search budget exceeded)",
        ]
        if self.log_anomalies is None:
            lines.append("log replay: not run (no log in the history)")
        else:
            lines.append(f"log replay: {self.log_rows} claims, {len(self.log_anomalies)} anomalies")
        if self.faults:
            lines.append("faults: " + ", ".join(f"{k} {v}" for k, v in sorted(self.faults.items())))
        shown = 0
        for p in self.partitions:
            if p.verdict == ANOMALY and shown < limit:
                shown += 1
                lines.append(f"\nNOT LINEARIZABLE on resource {p.resource} ({p.ops} ops)")
                if p.witness:
                    lines.append(f"offending sub-history ({p.witness_note}):")
                    shown_ops = p.witness[-WITNESS_LINES:]
                    if len(shown_ops) < len(p.witness):
                        # The contradiction is at the end: no order explains its last op.
                        lines.append(
                            f"  ... its first {len(p.witness) - len(shown_ops)} ops not shown; "
                            f"the last {len(shown_ops)}, where no order works, follow"
                        )
                    lines.extend(describe_ops(shown_ops, self.origin_us))
                else:
                    lines.append("(sub-history not shrunk: only the first anomalies are)")
            elif p.verdict == INCONCLUSIVE:
                lines.append(f"\nresource {p.resource}: search budget exceeded, verdict unknown")
        for a in (self.log_anomalies or [])[: max(0, limit - shown)]:
            lines.append(f"\nLOG: {a.kind}: {a.message}")
            lines.extend(describe_row(r, self.origin_us) for r in a.rows)
            lines.extend(describe_ops(a.ops[-8:], self.origin_us))
        lines.extend(f"\n{msg}" for msg in self.other_anomalies)
        lines.append(f"\nchecked in {self.seconds:.1f} s")
        return "\n".join(lines)


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
    url = str(history.header.get("store", ""))
    local = url.split("://", 1)[0].lower() in LOCAL_SCHEMES
    low, high, clock_anomalies = _offset(ops, local)

    errors_settle = bool(history.header.get("errors_settle", False))

    def settled(op: Op) -> bool:
        if op.value.get("error") == "killed":
            return bool(op.value.get("settled"))
        return errors_settle

    def window(op: Op) -> tuple[float, float]:
        lo = op.wall_start + low
        if op.status == UNKNOWN and not local and not settled(op):
            return lo, math.inf
        return lo, op.wall_end + high

    parts: dict[str, list[Op]] = {}
    for op in ops:
        parts.setdefault(op.resource, []).append(op)
    results = []
    witnesses = 0
    for resource in sorted(parts):
        part = parts[resource]
        start = time.monotonic()
        verdict = check_partition(part, window, start + budget)
        result = PartitionResult(resource, verdict, len(part), time.monotonic() - start)
        if verdict == ANOMALY and witnesses < max_witnesses:
            witnesses += 1
            result.witness, result.witness_note = minimal_witness(part, window, shrink_budget)
        results.append(result)
    log_anomalies = None if history.log is None else replay_log(ops, history.log)
    faults: dict[str, int] = {}
    other = list(clock_anomalies)
    for event in history.nemesis:
        faults[event["f"]] = faults.get(event["f"], 0) + 1
        if event["f"] == "integrity_check" and event.get("result") != "ok":
            other.append(
                f"SQLITE: PRAGMA integrity_check after a kill said {event.get('result')!r}"
            )
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
    )
