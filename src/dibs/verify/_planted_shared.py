"""``reader-beside-writer``: stores whose readers do not look at writers.

A shared claim (``mode="shared"``) must be refused while an exclusive claim
on an overlapping target is live. These broken twins of the memory and SQLite
stores grant a reader without looking at the writers in its way, the way a
plausible bug would (a reader's check that consults only other readers). The
history check (a reader granted over a live writer) and the log replay
(``grant-over-live-claim``) must flag them on every run.
"""

from __future__ import annotations

import sqlite3

from dibs._model import SHARED, ClaimResult, Span, Target, Unit, span_bound_to_number
from dibs._request import ClaimRequest
from dibs.stores.base import Store
from dibs.stores.memory import MemoryStore
from dibs.stores.sqlite import SQLiteStore

__all__ = ["SHARED_PLANTS", "shared_plants"]

SHARED_PLANTS = ("reader-beside-writer",)
"""The plants in the stores' shared holds (memory, SQLite and PostgreSQL take shared claims)."""


class _ReaderBesideWriterMemory(MemoryStore):
    def _claim(self, request: ClaimRequest) -> ClaimResult:
        if request.mode != SHARED:
            return super()._claim(request)
        stripes = set(self._target_stripes(request.targets))
        if request.request_id is not None:
            stripes.add(self._stripe(request.request_id))
        with self._locked(tuple(sorted(stripes))):
            # BUG: the writers on the reader's targets are hidden from its check (and
            # put back after), as if a reader looked only at other readers.
            writers = {
                t._key: self._units.pop(t._key)
                for t in request.targets
                if isinstance(t, Unit) and t._key in self._units
            }
            spans: dict[str, list[tuple[Span, object]]] = {}
            for target in request.targets:
                if isinstance(target, Span) and target.resource in self._spans:
                    entries = self._spans[target.resource]
                    spans[target.resource] = list(entries)
                    entries[:] = [e for e in entries if e[1].get("mode") == SHARED]
            try:
                return self._claim_locked(
                    request.targets,
                    request.holder,
                    request.request_id,
                    request.ttl,
                    self._now_us(),
                    SHARED,
                )
            finally:
                self._units.update(writers)
                for resource, before in spans.items():
                    added = [e for e in self._spans[resource] if e not in before]
                    self._spans[resource][:] = [*before, *added]  # type: ignore[list-item]


class _ReaderBesideWriterSQLite(SQLiteStore):
    def _claim_reader(
        self,
        conn: sqlite3.Connection,
        unit: Unit,
        fence: int,
        now: int,
        taken: list[Target],
        blockers: dict[int, tuple[str, str]],
        took: list[str],
    ) -> None:
        # BUG: a reader joins the readers without looking at the unit's writer.
        conn.execute(
            "INSERT INTO dibs_units_v2 (resource, slot, fence) VALUES (?, ?, 0) "
            "ON CONFLICT DO NOTHING",
            (unit.resource, unit.slot),
        )
        conn.execute(
            "INSERT INTO dibs_readers (resource, slot, fence) VALUES (?, ?, ?)",
            (unit.resource, unit.slot, fence),
        )

    def _claim_span(
        self,
        conn: sqlite3.Connection,
        span: Span,
        fence: int,
        now: int,
        taken: list[Target],
        blockers: dict[int, tuple[str, str]],
        took: list[str],
        shared: bool = False,
    ) -> None:
        if not shared:
            super()._claim_span(conn, span, fence, now, taken, blockers, took, shared)
            return
        # BUG: a reader's span goes in without looking at the spans in its way.
        conn.execute(
            "INSERT INTO dibs_spans_v2 (resource, lo, hi, kind, fence, shared) "
            "VALUES (?, ?, ?, ?, ?, 1)",
            (
                span.resource,
                span_bound_to_number(span.start),
                span_bound_to_number(span.end),
                span.kind,
                fence,
            ),
        )


def shared_plants() -> dict[tuple[str, str], type[Store]]:
    """The broken twins by (plant, scheme)."""
    return {
        ("reader-beside-writer", "memory"): _ReaderBesideWriterMemory,
        ("reader-beside-writer", "sqlite"): _ReaderBesideWriterSQLite,
    }
