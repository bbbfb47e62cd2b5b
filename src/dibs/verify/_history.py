"""Histories: the JSON-lines record of a run, and the operations assembled from it.

A history file is one JSON object per line:

* ``{"e": "run", ...}`` — the header: store URL, workload settings, faults,
  and ``errors_settle``: whether an error a client saw means the store was
  done with the op (see :mod:`dibs.verify._check`);
* ``{"e": "i", "id": ..., "c": client, "f": op, "a": {...}, "t": mono, "w": wall}``
  — an operation was invoked;
* ``{"e": "ok" | "fail" | "unknown", "id": ..., "v": {...}, "t": ..., "w": ...}``
  — it completed with a result, with a definite failure (it took no
  effect), or without the client learning the outcome (``v.error`` is
  ``"killed"`` for a client the nemesis killed, with ``v.settled`` when its
  server-side work was seen to end, at this event's time);
* ``{"e": "nemesis", "f": "kill" | "stop" | "cont" | ..., ...}`` — a fault;
* ``{"e": "note", "about": ..., "count": ...}`` — something the runner counted
  that is no anomaly (psycopg's warnings about connections cut by faults);
* ``{"e": "log", ...}`` — one claim row of the store's durable log, dumped
  after the workload, for the log replay.

``t`` is ``time.monotonic()`` (system-wide on Linux, so comparable between
client processes of one machine) and orders operations in real time; ``w``
is ``time.time()`` and bounds the store's clock. Store timestamps in results
are integer microseconds since the epoch.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

__all__ = ["LogRow", "Op", "read_history", "write_events"]

OK = "ok"
FAIL = "fail"
UNKNOWN = "unknown"


@dataclass
class Op:
    """One operation: its invocation, its completion, and what the client learned.

    ``status`` is ``ok``, ``fail`` (a definite error: the op took no effect) or
    ``unknown``. ``start``/``end`` are monotonic seconds (``end`` is ``inf``
    when the client never completed); ``wall_start``/``wall_end`` bound the
    store's clock in microseconds.
    """

    index: int
    id: str
    client: str
    fn: str
    args: dict[str, Any]
    status: str = UNKNOWN
    value: dict[str, Any] = field(default_factory=dict)
    start: float = 0.0
    end: float = math.inf
    wall_start: int = 0
    wall_end: float = math.inf

    @property
    def resource(self) -> str:
        """The partition key: the resource all of this op's targets are on."""
        return str(self.args["res"])

    def describe(self, origin_us: float = 0) -> str:
        """A one-line readable form: who did what and what came back.

        Store times in the result are shown in ms after ``origin_us``.
        """
        a = self.args
        if self.fn == "claim":
            ttl = a.get("ttl")
            what = (
                f"claim {_targets_text(a['targets'])} ttl={'none' if ttl is None else f'{ttl:g}'}"
            )
            what += f" rid={a.get('rid')}"
        elif self.fn == "holder_of":
            what = f"holder_of {_targets_text([a['target']])}"
        elif self.fn == "get":
            what = f"get claim={a['claim_id']}"
        elif self.fn == "claims_of":
            what = f"claims_of {a['holder']}"
        elif self.fn == "sweep":
            what = "sweep"
        else:
            what = f"{self.fn} claim={a['claim_id']} fence={a['fence']}"
            if self.fn == "extend":
                what += f" ttl={a['ttl']}"
        return f"{self.client} {what} -> {self.status} {_value_text(self.value, origin_us)}"


@dataclass(frozen=True)
class LogRow:
    """One claim as the store's durable log holds it (times in µs since the epoch)."""

    id: str
    fence: int
    holder: str
    targets: tuple[tuple[Any, ...], ...]
    state: str
    created_at: int
    expires_at: int | None
    updated_at: int
    taken_over: bool
    mode: str = "exclusive"

    def to_json(self) -> dict[str, Any]:
        """The row as a history line (``mode`` only for a shared claim)."""
        return ({"mode": self.mode} if self.mode != "exclusive" else {}) | {
            "e": "log",
            "id": self.id,
            "fence": self.fence,
            "holder": self.holder,
            "targets": [list(t) for t in self.targets],
            "state": self.state,
            "created_at": self.created_at,
            "expires_at": self.expires_at,
            "updated_at": self.updated_at,
            "taken_over": self.taken_over,
        }


@dataclass
class History:
    """A parsed history file: header, operations in invocation order, faults, log rows."""

    header: dict[str, Any]
    ops: list[Op]
    nemesis: list[dict[str, Any]]
    log: list[LogRow] | None
    notes: list[dict[str, Any]] = field(default_factory=list)
    """What the runner noticed that is no anomaly (e.g. psycopg's warnings, counted)."""


def _targets_text(targets: Iterable[list[Any]]) -> str:
    parts = []
    for t in targets:
        parts.append(f"{t[1]}/{t[2]}" if t[0] == "u" else f"{t[1]}[{t[2]},{t[3]})")
    return "+".join(parts)


def _value_text(value: dict[str, Any], origin_us: float) -> str:
    parts = []
    for k, v in value.items():
        if k.endswith("_at") and isinstance(v, int):
            parts.append(f"{k}={(v - origin_us) / 1000:.3f}ms")
        elif k == "taken" and isinstance(v, list):
            if v:
                parts.append(f"taken={_targets_text(v)}")
        elif k == "claims" and isinstance(v, list):
            shown = [f"{c['claim_id']}:{c['state']}" for c in v]
            parts.append(f"claims=[{', '.join(shown)}]")
        else:
            parts.append(f"{k}={v}")
    return " ".join(parts)


def write_events(out: TextIO | int, events: Iterable[dict[str, Any]]) -> None:
    """Write events as JSON lines to a text stream or a raw file descriptor."""
    text = "".join(json.dumps(e, separators=(",", ":")) + "\n" for e in events)
    if isinstance(out, int):
        os.write(out, text.encode())
    else:
        out.write(text)


def iter_events(path: str | Path) -> Iterator[dict[str, Any]]:
    """Yield the events of a JSON-lines file, skipping a torn last line (a killed writer)."""
    with open(path, encoding="utf-8") as f:
        for line in f:
            if not line.endswith("\n"):
                break  # the writer was killed mid-line: that event never happened
            if line.strip():
                yield json.loads(line)


def assemble(events: Iterable[dict[str, Any]]) -> History:
    """Pair invocations with completions; an invocation never completed stays unknown.

    Raises :class:`ValueError` for a completion without an invocation.
    """
    header: dict[str, Any] = {}
    ops: dict[str, Op] = {}
    nemesis: list[dict[str, Any]] = []
    notes: list[dict[str, Any]] = []
    log: list[LogRow] | None = None
    for event in events:
        kind = event["e"]
        if kind == "i":
            ops[event["id"]] = Op(
                index=len(ops),
                id=event["id"],
                client=event["c"],
                fn=event["f"],
                args=event["a"],
                start=event["t"],
                wall_start=math.floor(event["w"] * 1_000_000),
            )
        elif kind in (OK, FAIL, UNKNOWN):
            op = ops.get(event["id"])
            if op is None:
                raise ValueError(f"completion of {event['id']!r} without an invocation")
            op.status = kind
            op.value = event.get("v", {})
            op.end = event["t"]
            op.wall_end = math.ceil(event["w"] * 1_000_000)
        elif kind == "run":
            header = event
        elif kind == "nemesis":
            nemesis.append(event)
        elif kind == "log":
            if log is None:
                log = []
            log.append(
                LogRow(
                    id=str(event["id"]),
                    fence=int(event["fence"]),
                    holder=event["holder"],
                    targets=tuple(tuple(t) for t in event["targets"]),
                    state=event["state"],
                    created_at=int(event["created_at"]),
                    expires_at=event["expires_at"],
                    updated_at=int(event["updated_at"]),
                    taken_over=bool(event["taken_over"]),
                    mode=event.get("mode", "exclusive"),
                )
            )
        elif kind == "log-empty":
            log = log or []
        elif kind == "note":
            notes.append(event)
    ordered = sorted(ops.values(), key=lambda op: op.start)
    for i, op in enumerate(ordered):
        op.index = i
    return History(header, ordered, nemesis, log, notes)


def read_history(path: str | Path) -> History:
    """Read and assemble a history file; raises :class:`ValueError` if it is malformed."""
    return assemble(iter_events(path))
