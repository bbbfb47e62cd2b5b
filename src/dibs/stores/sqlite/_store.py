"""``sqlite:///path``: the embedded default, safe across processes on one machine.

Each write is one ``BEGIN IMMEDIATE`` transaction, or its turn inside a shared
one with ``group_commit`` (see :mod:`dibs.stores.sqlite._group`). SQLite
admits one writer at a time. A single-unit claim is its unit row in
``dibs_units_v2``: the ``INSERT`` against the primary key ``(resource, slot)``
is the check, the grant and the record, and a dead or released claim there is
replaced by one conditional ``UPDATE``. Group and span claims keep a row in
``dibs_claims_v2`` that their unit and span rows point at; the overlap query on
``dibs_spans_v2`` runs inside the same serialized write (the conflict is
materialized by the database's single write lock). The WAL journal lets
readers run while a writer commits.

Durability: with the default ``synchronous=NORMAL`` in WAL mode a committed
claim survives ``kill -9`` of every process; a power cut or OS crash may lose
the last transactions before the next checkpoint. ``?synchronous=full`` makes
every commit wait for the disk; ``?group_commit=1`` shares that wait among the
threads claiming at once.
"""

from __future__ import annotations

import functools
import os
import sqlite3
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, TypeVar
from urllib.parse import parse_qsl, unquote, urlsplit

from dibs._clock import Clock
from dibs._model import (
    EXCLUSIVE,
    SHARED,
    Claim,
    ClaimResult,
    ClaimState,
    Span,
    SweepResult,
    Target,
    Unit,
    check_retention,
    claim_from_micros,
    make_claim,
    make_result,
    span_bound_to_number,
    targets_from_text,
    targets_to_text,
)
from dibs._request import ClaimRequest
from dibs.exceptions import (
    HoldLost,
    HoldLostReason,
    InvalidInput,
    RequestConflict,
    StoreClosed,
    StoreUnavailable,
)
from dibs.stores.base import (
    DEFAULT_REQUEST_RETENTION,
    Store,
    check_seconds,
    claim_not_found,
    hold_lost,
    lost_reason,
    not_holder,
    parse_serial_id,
    span_kind_mismatch,
)
from dibs.stores.capabilities import ChangeFeed, ClaimLog, ClaimReader
from dibs.stores.durability import Finding
from dibs.stores.jobs import JobTable
from dibs.stores.sqlite._conn import SQLitePool
from dibs.stores.sqlite._durability import findings as durability_findings
from dibs.stores.sqlite._group import GroupCommit
from dibs.stores.sqlite._jobs import SQLiteJobs
from dibs.stores.sqlite._schema import CLAIMS, upgrade
from dibs.stores.sqlite._sql import (
    CLAIM_COLS,
    INSERT_UNIT,
    INSERT_UNIT_NEW_REQUEST,
    LIVE,
    NEXT_FENCE,
    PRIOR_REQUEST,
    REPLACE_UNIT,
    SELECT_UNIT,
    UNIT_COLS,
    claim_from_row,
    dt,
    micros,
    unit_claim,
)

__all__ = ["SCHEMA_VERSION", "SQLiteStore"]

SCHEMA_VERSION = CLAIMS.version
"""The claim schema version this code writes and understands (steps in ``sql/claims/``)."""

_SYNCHRONOUS = {"off", "normal", "full", "extra"}
_FLAGS = {"1": True, "true": True, "yes": True, "on": True,
          "0": False, "false": False, "no": False, "off": False}  # fmt: skip
_T = TypeVar("_T")


def _check_options(path: object, **options: Any) -> dict[str, Any]:
    """The store's own options that are given, checked and normalized; raises InvalidInput."""
    if not str(path):
        raise InvalidInput("sqlite path must not be empty", field="path", value=path)
    checked: dict[str, Any] = {}
    for name, value in options.items():
        if name == "synchronous":
            if str(value).lower() not in _SYNCHRONOUS:
                raise InvalidInput(
                    f"synchronous must be one of {sorted(_SYNCHRONOUS)}, got {value!r}",
                    field="synchronous",
                    value=value,
                )
            checked[name] = str(value).lower()
        elif name == "busy_timeout":
            checked[name] = check_seconds("busy_timeout", value)
        elif name == "group_commit":
            if not isinstance(value, bool):
                raise InvalidInput(
                    f"group_commit must be True or False, got {value!r}",
                    field="group_commit",
                    value=value,
                )
            checked[name] = value
        else:
            raise InvalidInput(f"unknown SQLite store option {name!r}", field=name, value=value)
    return checked


class _Lost(Exception):
    """Internal: roll the claim back and answer "taken"."""

    def __init__(self, result: ClaimResult) -> None:
        self.result = result


class SQLiteStore(Store):
    """Claims in a SQLite file (WAL mode); safe across threads and processes on one machine."""

    scheme = "sqlite"
    shared_holds = True
    local_clock = True
    verify_faults = frozenset({"integrity"})

    def __init__(
        self,
        path: str | os.PathLike[str] = "dibs.db",
        *,
        clock: Clock | None = None,
        request_retention: float = DEFAULT_REQUEST_RETENTION,
        busy_timeout: float = 60.0,
        synchronous: str = "normal",
        group_commit: bool = False,
    ) -> None:
        super().__init__(clock=clock, request_retention=request_retention)
        checked = _check_options(
            path, busy_timeout=busy_timeout, synchronous=synchronous, group_commit=group_commit
        )
        self.path = os.fspath(path)
        self.busy_timeout = checked["busy_timeout"]
        self.synchronous = checked["synchronous"]
        self.group_commit = checked["group_commit"]
        # Connections, transactions, busy retries and the fork rules; shared with the job table.
        self._pool = SQLitePool(
            self.path, busy_timeout=self.busy_timeout, synchronous=self.synchronous
        )
        # Shares one write transaction among the threads of this process writing at once.
        self._group = GroupCommit(self._pool) if group_commit else None
        try:
            self._create_schema()
        except BaseException:
            self._pool.close()
            raise

    @classmethod
    def from_url(cls, url: str, **options: Any) -> SQLiteStore:
        """Open from ``sqlite:///relative.db``, ``sqlite:////abs/path.db`` or ``sqlite:///:memory:``.

        Query options: ``synchronous``, ``busy_timeout`` (seconds),
        ``request_retention`` (seconds), ``group_commit`` (``1``/``0``,
        ``true``/``false``).
        """
        path, query = cls._split_url(url)
        return cls(path, **{**query, **options})

    @classmethod
    def check_url(cls, url: str, **options: Any) -> None:
        """Refuse what :meth:`from_url` would refuse, without touching the file."""
        path, query = cls._split_url(url)
        merged = {**query, **options}
        if "request_retention" in merged:
            check_retention(merged.pop("request_retention"))
        merged.pop("clock", None)
        _check_options(path, **merged)

    @classmethod
    def durability(cls, url: str, *, timeout: float = 5.0) -> list[Finding]:
        """The file's journal mode and the URL's ``synchronous``: :meth:`dibs.Store.durability`."""
        # The store's own reading of the URL: the same file, percent-decoded, and the
        # synchronous it would run with (its default when the URL names none).
        path, options = cls._split_url(url)
        return durability_findings(path, str(options.get("synchronous", "normal")).lower())

    @classmethod
    def exists(cls, url: str, **options: Any) -> bool:
        """Whether the SQLite file exists (``:memory:`` always does); nothing is created."""
        cls.check_url(url, **options)  # what opening would refuse, refused alike
        path, _ = cls._split_url(url)
        return path == ":memory:" or os.path.isfile(path)

    @staticmethod
    def _split_url(url: str) -> tuple[str, dict[str, Any]]:
        """The file path and the options of a ``sqlite://`` URL; raises InvalidInput."""
        parts = urlsplit(url)
        if parts.netloc not in ("", "localhost"):
            raise InvalidInput(
                f"sqlite URLs name a local file (sqlite:///path), got host {parts.netloc!r}",
                field="url",
                value=url,
            )
        path = unquote(parts.path)
        path = path[1:] if path.startswith("/") else path
        if not path:
            raise InvalidInput(f"sqlite URL has no file path: {url!r}", field="url", value=url)
        query: dict[str, Any] = dict(parse_qsl(parts.query, keep_blank_values=True))
        for name in ("busy_timeout", "request_retention"):
            if name in query:
                try:
                    query[name] = float(query[name])
                except ValueError:
                    raise InvalidInput(
                        f"{name} in {url!r} must be a number, got {query[name]!r}",
                        field=name,
                        value=query[name],
                    ) from None
        if "group_commit" in query:
            flag = _FLAGS.get(str(query["group_commit"]).lower())
            if flag is None:
                raise InvalidInput(
                    f"group_commit in {url!r} must be 1 or 0, got {query['group_commit']!r}",
                    field="group_commit",
                    value=query["group_commit"],
                )
            query["group_commit"] = flag
        unknown = set(query) - {"busy_timeout", "request_retention", "synchronous", "group_commit"}
        if unknown:
            raise InvalidInput(
                f"unknown sqlite URL option(s) {sorted(unknown)} in {url!r}",
                field="url",
                value=url,
            )
        return path, query

    # --- connections and transactions -----------------------------------------------------------

    def _immediate(self) -> AbstractContextManager[sqlite3.Connection]:
        """One write transaction; SQLite's writer lock makes it the linearization point."""
        return self._pool.transaction("BEGIN IMMEDIATE")

    def _retrying(self, work: Callable[[], _T]) -> _T:
        """Run ``work``, retrying while the database is busy, up to ``busy_timeout``."""
        return self._pool.retrying(work)

    def _create_schema(self) -> None:
        def create() -> None:
            with self._pool.connection() as conn:
                mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if mode.lower() not in ("wal", "memory"):
                raise StoreUnavailable(f"cannot switch {self.path!r} to WAL mode (got {mode})")
            with self._immediate() as conn:
                upgrade(conn, CLAIMS, self.path)

        self._retrying(create)

    # --- writes ---------------------------------------------------------------------------------

    def _write(self, work: Callable[[sqlite3.Connection], _T]) -> _T:
        """Run ``work`` in a write transaction: its own, or its turn in a group commit."""
        if self._group is not None:
            return self._group.run(work)
        return self._retrying(functools.partial(self._pool.run, work))

    # --- claim ----------------------------------------------------------------------------------

    def _claim(self, request: ClaimRequest) -> ClaimResult:
        targets, holder, request_id, ttl = (
            request.targets,
            request.holder,
            request.request_id,
            request.ttl,
        )
        # The dead holds this claim took over, logged once its transaction committed:
        # a work may run again (busy, or a batch that a driver error voided), and a
        # group claim that loses rolls its takeovers back with the rest.
        took: list[str] = []
        first = targets[0]  # a request's targets are never empty
        if len(targets) == 1 and type(first) is Unit and request.mode != SHARED:
            answer = self._write(functools.partial(self._claim_single, request, first, took))
        else:
            fp = request.fingerprint if request_id is not None else None
            shared = request.mode == SHARED

            def work(conn: sqlite3.Connection) -> ClaimResult:
                took.clear()
                now = micros(self._now())
                if request_id is not None:
                    prior = self._prior_request(conn, request_id, fp, now)
                    if prior is not None:
                        return prior
                conn.execute("SAVEPOINT dibs_claim")
                try:
                    result = self._claim_rows(
                        conn, targets, holder, request_id, ttl, now, took, shared
                    )
                except _Lost as lost:
                    conn.execute("ROLLBACK TO dibs_claim")
                    took.clear()
                    result = lost.result
                conn.execute("RELEASE dibs_claim")
                if request_id is not None:
                    self._record_request(conn, request_id, fp, result, now)
                return result

            answer = self._write(work)
        for claim_id in took:
            self._log_takeover(claim_id)
        return answer

    def _claim_single(
        self, request: ClaimRequest, unit: Unit, took: list[str], conn: sqlite3.Connection
    ) -> ClaimResult:
        """One exclusive unit: its row is the arbiter, the claim and the request's record.

        The common case is one statement: the insert against the primary key
        ``(resource, slot)`` (the linearization point), which with a request ID
        also checks that no record of that ID is within retention. When it
        inserts nothing, the unit is taken or the ID was used, and the general
        steps below find out which, in the same transaction.
        """
        took.clear()
        holder, request_id, ttl = request.holder, request.request_id, request.ttl
        now = micros(self._now())
        if ttl is None:
            state, expires = "confirmed", None
        else:
            state, expires = "held", now + micros(ttl)
        if request_id is None:
            fp = None
            row = conn.execute(
                INSERT_UNIT,
                (unit.resource, unit.slot, state, holder, expires, None, None, now, now),
            ).fetchone()
        else:
            fp = request.fingerprint
            cutoff = now - micros(self.request_retention)
            row = conn.execute(
                INSERT_UNIT_NEW_REQUEST,
                (unit.resource, unit.slot, state, holder, expires, request_id, fp, now, cutoff),
            ).fetchone()
            if row is None:
                prior = self._prior_request(conn, request_id, fp, now)
                if prior is not None:
                    return prior
        if row is None:
            result = self._claim_taken_unit(
                conn, unit, holder, request_id, fp, state, expires, now, took
            )
            if request_id is not None and not (result.granted and not result.replayed):
                # Only a new single-unit grant keeps its request in its unit row.
                self._record_request(conn, request_id, fp, result, now)
            return result
        return make_result(True, self._granted_unit(row[0], holder, unit, expires, request_id, now))

    @staticmethod
    def _granted_unit(
        fence: int, holder: str, unit: Unit, expires: int | None, request_id: str | None,
        now: int,
    ) -> Claim:  # fmt: skip
        """The claim a single-unit grant made; its times become datetimes when first read."""
        return claim_from_micros({
            "id": str(fence), "holder": holder, "targets": (unit,),
            "state": ClaimState.CONFIRMED if expires is None else ClaimState.HELD,
            "fence": fence, "request_id": request_id, "taken_over": False,
            "_expires_at_us": expires, "_created_at_us": now, "_updated_at_us": now,
        })  # fmt: skip

    def _record_request(
        self,
        conn: sqlite3.Connection,
        request_id: str,
        fp: str | None,
        result: ClaimResult,
        now: int,
    ) -> None:
        """Keep a request's outcome in ``dibs_requests_v2`` (lost, group and span claims)."""
        conn.execute(
            "INSERT OR REPLACE INTO dibs_requests_v2 "
            "(request_id, fingerprint, fence, taken, created_at) VALUES (?, ?, ?, ?, ?)",
            (
                request_id,
                fp,
                result.claim.fence if result.claim is not None else None,
                None if result.granted else targets_to_text(result.taken),
                now,
            ),
        )

    def _prior_request(
        self, conn: sqlite3.Connection, request_id: str, fp: str | None, now: int
    ) -> ClaimResult | None:
        row = conn.execute(
            PRIOR_REQUEST, (request_id, now - micros(self.request_retention))
        ).fetchone()
        if row is None:
            return None
        if row[0] != fp:
            raise RequestConflict(
                f"request ID {request_id!r} was already used with different input",
                request_id=request_id,
            )
        if row[1] is None:
            return make_result(False, None, targets_from_text(row[2]), True)
        claim = self._read(conn, row[1], now)
        if claim is None:
            # Only a natural-key replay's record can outlive its claim (it names an older
            # claim, purged since): nothing to answer with, so the request runs anew.
            return None
        return make_result(True, claim, (), True)

    def _claim_taken_unit(
        self,
        conn: sqlite3.Connection,
        unit: Unit,
        holder: str,
        request_id: str | None,
        fp: str | None,
        state: str,
        expires: int | None,
        now: int,
        took: list[str],
    ) -> ClaimResult:
        """One unit whose insert met a row: replace a dead or released claim, or answer taken."""
        old = conn.execute(SELECT_UNIT, (unit.resource, unit.slot)).fetchone()
        if old is None:  # the insert was skipped for the request ID's sake, not the unit's
            row = conn.execute(
                INSERT_UNIT,
                (unit.resource, unit.slot, state, holder, expires, request_id, fp, now, now),
            ).fetchone()
        else:
            blocker = self._vacate(conn, unit, old, now, took)
            if blocker is not None:
                other, other_holder, other_targets = blocker
                # Natural key: the holder re-claiming exactly what it holds.
                if other_holder == holder and other_targets == targets_to_text((unit,)):
                    claim = self._read(conn, other, now)
                    assert claim is not None
                    return make_result(True, claim, (), True)
                return make_result(False, None, (unit,), False)
            # The dead or released claim we observed, replaced by a conditional write.
            row = conn.execute(
                REPLACE_UNIT,
                (
                    state,
                    holder,
                    expires,
                    request_id,
                    fp,
                    now,
                    now,
                    unit.resource,
                    unit.slot,
                    old[0],
                ),
            ).fetchone()
        return make_result(
            True,
            self._granted_unit(row[0], holder, unit, expires, request_id, now),
            (),
            False,
        )

    def _vacate(
        self, conn: sqlite3.Connection, unit: Unit, row: tuple[Any, ...], now: int, took: list[str]
    ) -> tuple[int, str, str] | None:
        """Free ``unit``'s row for a new claim, or return its live claim (fence, holder, targets).

        A dead hold is marked taken over (the reason rule); a single-unit claim
        moves to ``dibs_claims_v2`` so that its ID, reason and request still answer.
        The caller's claim must then be granted in the same transaction (or rolled back).
        """
        fence, state, holder, expires_at, request_id, fp, created_at, updated_at = row
        if fence == 0:  # the readers' marker
            return self._vacate_readers(conn, unit, now, took)
        if state is None:  # a unit of a group or span claim
            claim = conn.execute(
                "SELECT holder, targets, state, expires_at FROM dibs_claims_v2 WHERE fence = ?",
                (fence,),
            ).fetchone()
            if claim[2] == "confirmed" or (claim[2] == "held" and claim[3] > now):
                return fence, claim[0], claim[1]
            self._take_over(conn, fence, now, took)
            return None
        targets = targets_to_text((unit,))
        if state == "confirmed" or (state == "held" and expires_at > now):
            return fence, holder, targets
        taken_over = state != "released"  # a dead hold, swept or not, now taken over
        if taken_over:
            took.append(str(fence))
        conn.execute(
            "INSERT INTO dibs_claims_v2 (fence, holder, targets, state, expires_at, taken_over, "
            "request_id, created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                fence, holder, targets, "expired" if taken_over else state, expires_at,
                int(taken_over), request_id, created_at, now if taken_over else updated_at,
            ),
        )  # fmt: skip
        if fp is not None and created_at > now - micros(self.request_retention):
            conn.execute(
                "INSERT OR REPLACE INTO dibs_requests_v2 "
                "(request_id, fingerprint, fence, taken, created_at) VALUES (?, ?, ?, NULL, ?)",
                (request_id, fp, fence, created_at),
            )
        return None

    def _vacate_readers(
        self, conn: sqlite3.Connection, unit: Unit, now: int, took: list[str]
    ) -> tuple[int, str, str] | None:
        """Free a unit held by readers for a writer, or return a live reader (as ``_vacate``).

        Every reader there is dead when none is live: each is taken over (the
        reason rule) and its reader row goes; the caller replaces the marker.
        """
        rows = conn.execute(
            f"SELECT c.fence, c.holder, c.targets, {LIVE} FROM dibs_readers r "
            "JOIN dibs_claims_v2 c ON c.fence = r.fence "
            "WHERE r.resource = :resource AND r.slot = :slot ORDER BY r.fence",
            {"resource": unit.resource, "slot": unit.slot, "now": now},
        ).fetchall()
        for fence, holder, targets, live in rows:
            if live:
                return fence, holder, _natural(targets, SHARED)
        for fence, *_ in rows:
            self._take_over(conn, fence, now, took)
        conn.execute(
            "DELETE FROM dibs_readers WHERE resource = ? AND slot = ?", (unit.resource, unit.slot)
        )
        return None

    def _claim_rows(
        self,
        conn: sqlite3.Connection,
        targets: tuple[Target, ...],
        holder: str,
        request_id: str | None,
        ttl: float | None,
        now: int,
        took: list[str],
        shared: bool = False,
    ) -> ClaimResult:
        """A group, span or shared claim: a claim row, and unit or span rows pointing at it."""
        text = targets_to_text(targets)
        expires = None if ttl is None else now + micros(ttl)
        (fence,) = conn.execute(
            "INSERT INTO dibs_claims_v2 (fence, holder, targets, state, expires_at, request_id, "
            f"created_at, updated_at, mode) VALUES ({NEXT_FENCE}, ?, ?, ?, ?, ?, ?, ?, ?) "
            "RETURNING fence",
            (
                holder, text, "confirmed" if ttl is None else "held", expires, request_id, now,
                now, SHARED if shared else None,
            ),
        ).fetchone()  # fmt: skip
        taken: list[Target] = []
        blockers: dict[int, tuple[str, str]] = {}
        for target in targets:
            if shared and isinstance(target, Unit):
                self._claim_reader(conn, target, fence, now, taken, blockers, took)
            elif isinstance(target, Unit):
                # Linearization point for a unit: the insert against the primary key.
                inserted = conn.execute(
                    "INSERT INTO dibs_units_v2 (resource, slot, fence) VALUES (?, ?, ?) "
                    "ON CONFLICT DO NOTHING",
                    (target.resource, target.slot, fence),
                ).rowcount
                if inserted:
                    continue
                old = conn.execute(SELECT_UNIT, (target.resource, target.slot)).fetchone()
                blocker = self._vacate(conn, target, old, now, took)
                if blocker is not None:
                    taken.append(target)
                    blockers[blocker[0]] = blocker[1:]
                    continue
                conn.execute(
                    "UPDATE dibs_units_v2 SET fence = ?, state = NULL, holder = NULL, "
                    "expires_at = NULL, request_id = NULL, fingerprint = NULL, created_at = NULL, "
                    "updated_at = NULL WHERE resource = ? AND slot = ? AND fence = ?",
                    (fence, target.resource, target.slot, old[0]),
                )
            else:
                self._claim_span(conn, target, fence, now, taken, blockers, took, shared)
        if taken:
            if len(blockers) == 1:
                ((other, (other_holder, other_targets)),) = blockers.items()
                # Natural key: the holder re-claiming exactly what it holds, as it holds it.
                if other_holder == holder and other_targets == _natural(
                    text, SHARED if shared else EXCLUSIVE
                ):
                    claim = self._read(conn, other, now)
                    assert claim is not None
                    raise _Lost(make_result(True, claim, (), True))
            raise _Lost(make_result(False, None, tuple(taken), False))
        created = dt(now)
        assert created is not None
        claim = make_claim(
            str(fence), holder, targets, ClaimState.CONFIRMED if ttl is None else ClaimState.HELD,
            fence, dt(expires), request_id, created, created, False,
            SHARED if shared else EXCLUSIVE,
        )  # fmt: skip
        return make_result(True, claim, (), False)

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
        """One unit of a shared claim: join its readers, unless a live writer holds it."""
        # Linearization point for a reader: the marker's insert against the primary key,
        # or the writer's row found below, inside the one write transaction.
        inserted = conn.execute(
            "INSERT INTO dibs_units_v2 (resource, slot, fence) VALUES (?, ?, 0) "
            "ON CONFLICT DO NOTHING",
            (unit.resource, unit.slot),
        ).rowcount
        if not inserted:
            old = conn.execute(SELECT_UNIT, (unit.resource, unit.slot)).fetchone()
            if old[0] != 0:
                blocker = self._vacate(conn, unit, old, now, took)
                if blocker is not None:
                    taken.append(unit)
                    blockers[blocker[0]] = blocker[1:]
                    return
                conn.execute(
                    "UPDATE dibs_units_v2 SET fence = 0, state = NULL, holder = NULL, "
                    "expires_at = NULL, request_id = NULL, fingerprint = NULL, created_at = NULL, "
                    "updated_at = NULL WHERE resource = ? AND slot = ? AND fence = ?",
                    (unit.resource, unit.slot, old[0]),
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
        lo, hi = span_bound_to_number(span.start), span_bound_to_number(span.end)
        # Inside the write transaction no other writer can insert between this
        # query and our insert: SQLite's writer lock materializes the conflict.
        rows = conn.execute(
            f"SELECT s.rowid, s.kind, s.fence, {LIVE}, c.holder, c.targets, s.shared "
            "FROM dibs_spans_v2 s "
            "LEFT JOIN dibs_claims_v2 c ON c.fence = s.fence "
            "WHERE s.resource = :resource AND (s.kind != :kind OR (s.lo < :hi AND s.hi > :lo))",
            {"resource": span.resource, "kind": span.kind, "lo": lo, "hi": hi, "now": now},
        ).fetchall()
        blocked = False
        for rowid, kind, other, live, other_holder, other_targets, other_shared in rows:
            if kind == span.kind and shared and other_shared:
                continue  # readers beside readers, live or dead: neither blocks the other
            if not live:
                # A dead span of the other kind would have blocked this one had
                # it been live: taken over like an overlap (the reason rule).
                conn.execute("DELETE FROM dibs_spans_v2 WHERE rowid = ?", (rowid,))
                self._take_over(conn, other, now, took)
            elif kind != span.kind:
                raise span_kind_mismatch(span, kind)
            else:
                blocked = True
                blockers[other] = (
                    other_holder,
                    _natural(other_targets, SHARED if other_shared else EXCLUSIVE),
                )
        if blocked:
            taken.append(span)
        else:
            conn.execute(
                "INSERT INTO dibs_spans_v2 (resource, lo, hi, kind, fence, shared) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (span.resource, lo, hi, span.kind, fence, int(shared)),
            )

    def _take_over(self, conn: sqlite3.Connection, fence: int, now: int, took: list[str]) -> None:
        # Only ever called on a claim row found not live, so 'held' here is a
        # dead hold; 'expired' is one the sweep marked first (the reason rule).
        taken = conn.execute(
            "UPDATE dibs_claims_v2 SET state = 'expired', taken_over = 1, updated_at = ? "
            "WHERE fence = ? AND state IN ('held', 'expired') AND taken_over = 0",
            (now, fence),
        ).rowcount
        if taken:
            took.append(str(fence))

    # --- transitions on one claim ---------------------------------------------------------------

    def _owned(
        self, conn: sqlite3.Connection, claim_id: str, holder: str, fence: int, now: int
    ) -> tuple[bool, str]:
        """(in a unit row?, 'held' or 'confirmed'); raises why it is not the caller's live hold."""
        number = parse_serial_id(claim_id)
        row = None
        in_unit = True
        if number is not None:
            row = conn.execute(
                "SELECT fence, holder, state, expires_at, 0 FROM dibs_units_v2 "
                "WHERE fence = ? AND state IS NOT NULL",
                (number,),
            ).fetchone()
            if row is None:
                in_unit = False
                row = conn.execute(
                    "SELECT fence, holder, state, expires_at, taken_over FROM dibs_claims_v2 "
                    "WHERE fence = ?",
                    (number,),
                ).fetchone()
        if row is None:
            raise claim_not_found(claim_id)
        real_fence, real_holder, state, expires_at, taken_over = row
        if real_holder != holder:
            raise not_holder(claim_id, holder)
        reason = lost_reason(
            real_fence=real_fence,
            fence=fence,
            state=ClaimState(state),
            dead=state == "held" and expires_at <= now,
            taken_over=bool(taken_over),
        )
        if reason is not None:
            raise hold_lost(claim_id, reason, fence)
        return in_unit, str(state)

    def _confirm(self, claim_id: str, holder: str, fence: int) -> Claim:
        def work(conn: sqlite3.Connection) -> Claim:
            now = micros(self._now())
            # Linearization point: the check and the update share one write transaction.
            in_unit, state = self._owned(conn, claim_id, holder, fence, now)
            if state == "held":
                if in_unit:
                    row = conn.execute(
                        "UPDATE dibs_units_v2 SET state = 'confirmed', expires_at = NULL, "
                        f"updated_at = ? WHERE fence = ? AND state = 'held' RETURNING {UNIT_COLS}",
                        (now, fence),
                    ).fetchone()
                    return unit_claim(row, now)
                conn.execute(
                    "UPDATE dibs_claims_v2 SET state = 'confirmed', expires_at = NULL, "
                    "updated_at = ? WHERE fence = ? AND state = 'held'",
                    (now, fence),
                )
            claim = self._read(conn, fence, now)
            assert claim is not None
            return claim

        return self._write(work)

    def _extend(self, claim_id: str, holder: str, fence: int, ttl: float) -> Claim:
        def work(conn: sqlite3.Connection) -> Claim:
            now = micros(self._now())
            in_unit, state = self._owned(conn, claim_id, holder, fence, now)
            if state == "held":
                if in_unit:
                    row = conn.execute(
                        "UPDATE dibs_units_v2 SET expires_at = ?, updated_at = ? "
                        f"WHERE fence = ? AND state = 'held' RETURNING {UNIT_COLS}",
                        (now + micros(ttl), now, fence),
                    ).fetchone()
                    return unit_claim(row, now)
                conn.execute(
                    "UPDATE dibs_claims_v2 SET expires_at = ?, updated_at = ? "
                    "WHERE fence = ? AND state = 'held'",
                    (now + micros(ttl), now, fence),
                )
            claim = self._read(conn, fence, now)
            assert claim is not None
            return claim

        return self._write(work)

    def _release(self, claim_id: str, holder: str, fence: int) -> bool:
        def work(conn: sqlite3.Connection) -> bool:
            now = micros(self._now())
            try:
                in_unit, _ = self._owned(conn, claim_id, holder, fence, now)
            except HoldLost as lost:
                if lost.reason is HoldLostReason.FENCE:
                    raise
                return False
            if in_unit:
                # The row stays, released, until a claimant or the sweep replaces it.
                conn.execute(
                    "UPDATE dibs_units_v2 SET state = 'released', expires_at = NULL, "
                    "updated_at = ? WHERE fence = ? AND state IS NOT NULL",
                    (now, fence),
                )
                return True
            targets, mode = conn.execute(
                "UPDATE dibs_claims_v2 SET state = 'released', expires_at = NULL, "
                "updated_at = ? WHERE fence = ? RETURNING targets, mode",
                (now, fence),
            ).fetchone()
            self._detach(conn, fence, targets, mode)
            return True

        return self._write(work)

    @staticmethod
    def _detach(conn: sqlite3.Connection, fence: int, targets: str, mode: str | None) -> None:
        """Delete a claim row's unit and span rows, found by primary key from its targets."""
        for target in targets_from_text(targets):
            if isinstance(target, Unit) and mode == SHARED:
                conn.execute(
                    "DELETE FROM dibs_readers WHERE resource = ? AND slot = ? AND fence = ?",
                    (target.resource, target.slot, fence),
                )
                # The last reader out takes the marker with it.
                conn.execute(
                    "DELETE FROM dibs_units_v2 WHERE resource = ?1 AND slot = ?2 AND fence = 0 "
                    "AND NOT EXISTS (SELECT 1 FROM dibs_readers WHERE resource = ?1 AND slot = ?2)",
                    (target.resource, target.slot),
                )
            elif isinstance(target, Unit):
                conn.execute(
                    "DELETE FROM dibs_units_v2 WHERE resource = ? AND slot = ? AND fence = ? "
                    "AND state IS NULL",
                    (target.resource, target.slot, fence),
                )
            else:
                conn.execute(
                    "DELETE FROM dibs_spans_v2 WHERE resource = ? AND fence = ?",
                    (target.resource, fence),
                )

    # --- reads ----------------------------------------------------------------------------------

    @staticmethod
    def _read(conn: sqlite3.Connection, fence: int, now: int) -> Claim | None:
        row = conn.execute(
            f"SELECT {UNIT_COLS} FROM dibs_units_v2 WHERE fence = ? AND state IS NOT NULL",
            (fence,),
        ).fetchone()
        if row is not None:
            return unit_claim(row, now)
        row = conn.execute(
            f"SELECT {CLAIM_COLS} FROM dibs_claims_v2 WHERE fence = ?", (fence,)
        ).fetchone()
        return None if row is None else claim_from_row(row, now)

    def _reading(self, work: Callable[[sqlite3.Connection, int], _T]) -> _T:
        def attempt() -> _T:
            with self._pool.transaction("BEGIN") as conn:  # one snapshot for the whole read
                return work(conn, micros(self._now()))

        return self._retrying(attempt)

    def _get(self, claim_id: str) -> Claim | None:
        fence = parse_serial_id(claim_id)
        if fence is None:
            return None
        return self._reading(lambda conn, now: self._read(conn, fence, now))

    def _holder_of(self, target: Unit | Span) -> str | None:
        def read(conn: sqlite3.Connection, now: int) -> str | None:
            if isinstance(target, Unit):
                row = conn.execute(
                    "SELECT coalesce(u.state, c.state), coalesce(u.holder, c.holder), "
                    "coalesce(u.expires_at, c.expires_at) FROM dibs_units_v2 u "
                    "LEFT JOIN dibs_claims_v2 c ON u.state IS NULL AND c.fence = u.fence "
                    "WHERE u.resource = ? AND u.slot = ?",
                    (target.resource, target.slot),
                ).fetchone()
                if row is not None and (
                    row[0] == "confirmed" or (row[0] == "held" and row[2] > now)
                ):
                    return str(row[1])
                # Readers: the oldest live one answers.
                row = conn.execute(
                    "SELECT c.holder FROM dibs_readers r "
                    "JOIN dibs_claims_v2 c ON c.fence = r.fence "
                    f"WHERE r.resource = :resource AND r.slot = :slot AND {LIVE} "
                    "ORDER BY r.fence LIMIT 1",
                    {"resource": target.resource, "slot": target.slot, "now": now},
                ).fetchone()
                return None if row is None else str(row[0])
            row = conn.execute(
                "SELECT c.holder FROM dibs_spans_v2 s JOIN dibs_claims_v2 c ON c.fence = s.fence "
                f"WHERE s.resource = :resource AND s.kind = :kind AND s.lo < :hi "
                f"AND s.hi > :lo AND {LIVE} LIMIT 1",
                {
                    "resource": target.resource,
                    "kind": target.kind,
                    "lo": span_bound_to_number(target.start),
                    "hi": span_bound_to_number(target.end),
                    "now": now,
                },
            ).fetchone()
            return None if row is None else str(row[0])

        return self._reading(read)

    def _claims_of(self, holder: str) -> list[Claim]:
        def read(conn: sqlite3.Connection, now: int) -> list[Claim]:
            args = {"holder": holder, "now": now}
            units = conn.execute(
                f"SELECT {UNIT_COLS} FROM dibs_units_v2 c WHERE holder = :holder "
                f"AND state IN ('held', 'confirmed') AND {LIVE}",
                args,
            ).fetchall()
            rows = conn.execute(
                f"SELECT {CLAIM_COLS} FROM dibs_claims_v2 c WHERE holder = :holder "
                f"AND state IN ('held', 'confirmed') AND {LIVE}",
                args,
            ).fetchall()
            claims = [unit_claim(row, now) for row in units]
            claims += [claim_from_row(row, now) for row in rows]
            claims.sort(key=lambda claim: claim.fence)
            return claims

        return self._reading(read)

    # --- housekeeping ---------------------------------------------------------------------------

    def _sweep(self, batch: int = 1000) -> SweepResult:
        totals = {"expired": 0, "purged_requests": 0, "purged_claims": 0}

        def claims_step() -> bool:
            # Short transactions in batches, so a big sweep never starves claimants.
            with self._immediate() as conn:
                now = micros(self._now())
                cutoff = now - micros(self.request_retention)
                # The unit and span rows of an expired claim stay until its purge,
                # so a later claimant can still take it over (the reason rule).
                dead = conn.execute(
                    "UPDATE dibs_claims_v2 SET state = 'expired', updated_at = :now "
                    "WHERE fence IN (SELECT fence FROM dibs_claims_v2 WHERE state = 'held' "
                    "AND expires_at <= :now LIMIT :batch) RETURNING fence",
                    {"now": now, "batch": batch},
                ).fetchall()
                purged_requests = conn.execute(
                    "DELETE FROM dibs_requests_v2 WHERE request_id IN (SELECT request_id FROM "
                    "dibs_requests_v2 WHERE created_at <= ? LIMIT ?)",
                    (cutoff, batch),
                ).rowcount
                # Never the highest fence: the next claim would get it again.
                ended = conn.execute(
                    "SELECT fence, targets, mode FROM dibs_claims_v2 "
                    "WHERE state IN ('released', 'expired') AND updated_at <= ? "
                    f"AND fence < {NEXT_FENCE} - 1 LIMIT ?",
                    (cutoff, batch),
                ).fetchall()
                for fence, targets, mode in ended:
                    conn.execute("DELETE FROM dibs_claims_v2 WHERE fence = ?", (fence,))
                    self._detach(conn, fence, targets, mode)
            # Counted once committed: a busy retry runs the step again.
            totals["expired"] += len(dead)
            totals["purged_requests"] += purged_requests
            totals["purged_claims"] += len(ended)
            return len(dead) == batch or purged_requests == batch or len(ended) == batch

        after: tuple[str, str] = ("", "")

        def units_step() -> bool:
            # The unit rows in key order, one range per transaction: no index on expiry
            # to write on every hold, and the whole sweep reads each row once.
            nonlocal after
            with self._immediate() as conn:
                now = micros(self._now())
                cutoff = now - micros(self.request_retention)
                last = conn.execute(
                    "SELECT resource, slot FROM dibs_units_v2 WHERE (resource, slot) > (?, ?) "
                    "ORDER BY resource, slot LIMIT 1 OFFSET ?",
                    (*after, batch - 1),
                ).fetchone()
                where = "(resource, slot) > (:r, :s)" + (
                    "" if last is None else " AND (resource, slot) <= (:lr, :ls)"
                )
                args = {
                    "r": after[0], "s": after[1], "lr": last and last[0], "ls": last and last[1],
                    "now": now, "cutoff": cutoff,
                }  # fmt: skip
                expired = conn.execute(
                    f"UPDATE dibs_units_v2 SET state = 'expired', updated_at = :now WHERE {where} "
                    "AND state = 'held' AND expires_at <= :now",
                    args,
                ).rowcount
                purged_requests = conn.execute(
                    f"UPDATE dibs_units_v2 SET fingerprint = NULL WHERE {where} "
                    "AND fingerprint IS NOT NULL AND created_at <= :cutoff",
                    args,
                ).rowcount
                purged_claims = conn.execute(
                    f"DELETE FROM dibs_units_v2 WHERE {where} "
                    "AND state IN ('released', 'expired') AND updated_at <= :cutoff "
                    f"AND fence < {NEXT_FENCE} - 1",
                    args,
                ).rowcount
            totals["expired"] += expired
            totals["purged_requests"] += purged_requests
            totals["purged_claims"] += purged_claims
            if last is None:
                return False
            after = (last[0], last[1])
            return True

        while self._retrying(claims_step):
            pass
        while self._retrying(units_step):
            pass
        return SweepResult(
            expired=totals["expired"],
            purged_requests=totals["purged_requests"],
            purged_claims=totals["purged_claims"],
        )

    # --- capabilities ---------------------------------------------------------------------------

    def job_table(self) -> JobTable:
        """``dibs_jobs`` in this store's file, on its connections (created on first use)."""
        return self._once("job_table", lambda: SQLiteJobs(self._pool, self._now))

    def change_feed(self) -> ChangeFeed:
        """``PRAGMA data_version`` on a connection of its own, which moves on every commit."""
        return _DataVersion(self.path)

    def integrity_check(self) -> str:
        """SQLite's ``PRAGMA integrity_check``: ``"ok"``, or its findings joined by ``"; "``."""
        rows = self._reading(lambda conn, _now: conn.execute("PRAGMA integrity_check").fetchall())
        return "ok" if rows == [("ok",)] else "; ".join(str(row[0]) for row in rows)

    def claim_log(self) -> ClaimLog:
        """Every claim: the single-unit ones in their unit rows and the claim rows, in one read."""
        return ClaimReader(self._log)

    def _log(self) -> list[Claim]:
        def read(conn: sqlite3.Connection, now: int) -> list[Claim]:
            # A "now" before every expiry: the log keeps the stored state (see ClaimLog).
            past = -(2**62)
            units = conn.execute(
                f"SELECT {UNIT_COLS} FROM dibs_units_v2 WHERE state IS NOT NULL"
            ).fetchall()
            rows = conn.execute(f"SELECT {CLAIM_COLS} FROM dibs_claims_v2").fetchall()
            claims = [unit_claim(row, past) for row in units]
            claims += [claim_from_row(row, past) for row in rows]
            claims.sort(key=lambda claim: claim.fence)
            return claims

        return self._reading(read)

    def _close(self) -> None:
        self._pool.close()


def _natural(targets: str, mode: str) -> str:
    """A claim's natural key: its targets, as it holds them (a reader's differ from a writer's)."""
    return targets if mode == EXCLUSIVE else f"{mode}:{targets}"


class _DataVersion:
    """``PRAGMA data_version`` on a connection that never writes.

    It moves on every commit by any other connection, so every change it sees
    is someone else's: another process, or this process's store connections.
    """

    def __init__(self, path: str) -> None:
        self._lock = threading.Lock()  # serializes reads on the one connection, and close
        self._conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self._closed = False

    def read(self) -> object:
        """The token; a fresh ``object()`` ("maybe changed") on a failing read, and
        :class:`~dibs.StoreClosed` once the feed is closed (never sqlite3's error)."""
        with self._lock:
            if self._closed:
                raise StoreClosed("this SQLite change feed is closed")
            try:
                return self._conn.execute("PRAGMA data_version").fetchone()[0]
            except sqlite3.Error:
                return object()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._conn.close()
