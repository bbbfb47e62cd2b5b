"""``sqlite:///path``: the embedded default, safe across processes on one machine.

Each claim is one ``BEGIN IMMEDIATE`` transaction. SQLite admits one writer at
a time, so the transaction's ``INSERT`` into ``dibs_units`` against its primary
key ``(resource, slot)`` is the check, and the overlap query on ``dibs_spans``
runs inside the same serialized write (the conflict is materialized by the
database's single write lock). The request record is written in the same
transaction. The WAL journal lets readers run while a writer commits.

Durability: with the default ``synchronous=NORMAL`` in WAL mode a committed
claim survives ``kill -9`` of every process; a power cut or OS crash may lose
the last transactions before the next checkpoint. ``?synchronous=full`` makes
every commit wait for the disk.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from datetime import UTC, datetime
from typing import Any, TypeVar
from urllib.parse import parse_qsl, unquote, urlsplit

from dibs._clock import Clock
from dibs._model import (
    Claim,
    ClaimResult,
    ClaimState,
    Span,
    SweepResult,
    Target,
    Unit,
    fingerprint,
    span_bound_to_number,
    targets_from_text,
    targets_to_text,
)
from dibs.exceptions import (
    HoldLost,
    HoldLostReason,
    InvalidInput,
    RequestConflict,
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
    stored_claim,
)
from dibs.stores.capabilities import ChangeFeed, ClaimLog, ClaimReader
from dibs.stores.jobs import JobTable
from dibs.stores.sqlite._conn import SQLitePool
from dibs.stores.sqlite._jobs import SQLiteJobs
from dibs.stores.sqlite._schema import CLAIMS, upgrade

__all__ = ["SCHEMA_VERSION", "SQLiteStore"]

SCHEMA_VERSION = CLAIMS.version
"""The claim schema version this code writes and understands (steps in ``sql/claims/``)."""

_LIVE = "(c.state = 'confirmed' OR (c.state = 'held' AND c.expires_at > :now))"
_SYNCHRONOUS = {"off", "normal", "full", "extra"}
_T = TypeVar("_T")


class _Lost(Exception):
    """Internal: roll the claim back and answer "taken"."""

    def __init__(self, result: ClaimResult) -> None:
        self.result = result


def _micros(seconds: float) -> int:
    return round(seconds * 1_000_000)  # to the nearest µs, as datetime and PostgreSQL do


def _dt(micros: int | None) -> datetime | None:
    return None if micros is None else datetime.fromtimestamp(micros / 1_000_000, UTC)


class SQLiteStore(Store):
    """Claims in a SQLite file (WAL mode); safe across threads and processes on one machine."""

    scheme = "sqlite"
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
    ) -> None:
        super().__init__(clock=clock, request_retention=request_retention)
        if not str(path):
            raise InvalidInput("sqlite path must not be empty", field="path", value=path)
        if str(synchronous).lower() not in _SYNCHRONOUS:
            raise InvalidInput(
                f"synchronous must be one of {sorted(_SYNCHRONOUS)}, got {synchronous!r}",
                field="synchronous",
                value=synchronous,
            )
        self.path = os.fspath(path)
        self.busy_timeout = check_seconds("busy_timeout", busy_timeout)
        self.synchronous = str(synchronous).lower()
        # Connections, transactions, busy retries and the fork rules; shared with the job table.
        self._pool = SQLitePool(
            self.path, busy_timeout=self.busy_timeout, synchronous=self.synchronous
        )
        try:
            self._create_schema()
        except BaseException:
            self._pool.close()
            raise

    @classmethod
    def from_url(cls, url: str, **options: Any) -> SQLiteStore:
        """Open from ``sqlite:///relative.db``, ``sqlite:////abs/path.db`` or ``sqlite:///:memory:``.

        Query options: ``synchronous``, ``busy_timeout`` (seconds),
        ``request_retention`` (seconds).
        """
        path, query = cls._split_url(url)
        return cls(path, **{**query, **options})

    @classmethod
    def exists(cls, url: str, **options: Any) -> bool:
        """Whether the SQLite file exists (``:memory:`` always does); nothing is created."""
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
        unknown = set(query) - {"busy_timeout", "request_retention", "synchronous"}
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

    # --- claim ----------------------------------------------------------------------------------

    def _claim(
        self, targets: tuple[Target, ...], holder: str, request_id: str | None, ttl: float | None
    ) -> ClaimResult:
        text = targets_to_text(targets)
        fp = fingerprint(holder, targets, ttl) if request_id is not None else ""

        def attempt() -> ClaimResult:
            with self._immediate() as conn:
                now = _micros(self._now())
                if request_id is not None:
                    prior = self._prior_request(conn, request_id, fp, now)
                    if prior is not None:
                        return prior
                    conn.execute("SAVEPOINT claim")
                try:
                    result = self._decide(conn, targets, text, holder, request_id, ttl, now)
                except _Lost as lost:
                    result = lost.result
                    if request_id is None:
                        conn.execute("ROLLBACK")
                        return result
                    conn.execute("ROLLBACK TO claim")
                if request_id is not None:
                    conn.execute(
                        "INSERT OR REPLACE INTO dibs_requests "
                        "(request_id, fingerprint, fence, taken, created_at) "
                        "VALUES (?, ?, ?, ?, ?)",
                        (
                            request_id,
                            fp,
                            result.claim.fence if result.claim is not None else None,
                            None if result.granted else targets_to_text(result.taken),
                            now,
                        ),
                    )
                return result

        return self._retrying(attempt)

    def _prior_request(
        self, conn: sqlite3.Connection, request_id: str, fp: str, now: int
    ) -> ClaimResult | None:
        row = conn.execute(
            "SELECT fingerprint, fence, taken FROM dibs_requests "
            "WHERE request_id = ? AND created_at > ?",
            (request_id, now - _micros(self.request_retention)),
        ).fetchone()
        if row is None:
            return None
        if row[0] != fp:
            raise RequestConflict(
                f"request ID {request_id!r} was already used with different input",
                request_id=request_id,
            )
        if row[1] is None:
            return ClaimResult(False, None, targets_from_text(row[2]), replayed=True)
        return ClaimResult(True, self._read(conn, row[1], now), (), replayed=True)

    def _decide(
        self,
        conn: sqlite3.Connection,
        targets: tuple[Target, ...],
        text: str,
        holder: str,
        request_id: str | None,
        ttl: float | None,
        now: int,
    ) -> ClaimResult:
        expires = None if ttl is None else now + _micros(ttl)
        (fence,) = conn.execute(
            "INSERT INTO dibs_claims (holder, targets, state, expires_at, request_id, "
            "created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?) RETURNING fence",
            (holder, text, "confirmed" if ttl is None else "held", expires, request_id, now, now),
        ).fetchone()
        taken: list[Target] = []
        blockers: dict[int, tuple[str, str]] = {}
        for target in targets:
            if isinstance(target, Unit):
                # Linearization point for a unit: the insert against the primary key.
                inserted = conn.execute(
                    "INSERT INTO dibs_units (resource, slot, fence) VALUES (?, ?, ?) "
                    "ON CONFLICT DO NOTHING",
                    (target.resource, target.slot, fence),
                ).rowcount
                if inserted:
                    continue
                row = conn.execute(
                    f"SELECT u.fence, {_LIVE}, c.holder, c.targets FROM dibs_units u "
                    "LEFT JOIN dibs_claims c ON c.fence = u.fence "
                    "WHERE u.resource = :resource AND u.slot = :slot",
                    {"resource": target.resource, "slot": target.slot, "now": now},
                ).fetchone()
                if row[1]:
                    taken.append(target)
                    blockers[row[0]] = (row[2], row[3])
                    continue
                # Lazy reclaim: a conditional write against the dead hold we observed.
                conn.execute(
                    "UPDATE dibs_units SET fence = ? WHERE resource = ? AND slot = ? AND fence = ?",
                    (fence, target.resource, target.slot, row[0]),
                )
                self._take_over(conn, row[0], now)
            else:
                self._claim_span(conn, target, fence, now, taken, blockers)
        if taken:
            if len(blockers) == 1:
                ((other, (other_holder, other_targets)),) = blockers.items()
                # Natural key: the holder re-claiming exactly what it holds.
                if other_holder == holder and targets_from_text(other_targets) == targets:
                    raise _Lost(ClaimResult(True, self._read(conn, other, now), (), replayed=True))
            raise _Lost(ClaimResult(False, None, tuple(taken)))
        created = _dt(now)
        assert created is not None
        claim = Claim(
            id=str(fence),
            holder=holder,
            targets=targets,
            state=ClaimState.CONFIRMED if ttl is None else ClaimState.HELD,
            fence=fence,
            expires_at=_dt(expires),
            request_id=request_id,
            created_at=created,
            updated_at=created,
        )
        return ClaimResult(True, claim)

    def _claim_span(
        self,
        conn: sqlite3.Connection,
        span: Span,
        fence: int,
        now: int,
        taken: list[Target],
        blockers: dict[int, tuple[str, str]],
    ) -> None:
        lo, hi = span_bound_to_number(span.start), span_bound_to_number(span.end)
        # Inside the write transaction no other writer can insert between this
        # query and our insert: SQLite's writer lock materializes the conflict.
        rows = conn.execute(
            f"SELECT s.rowid, s.kind, s.fence, {_LIVE}, c.holder, c.targets FROM dibs_spans s "
            "LEFT JOIN dibs_claims c ON c.fence = s.fence "
            "WHERE s.resource = :resource AND (s.kind != :kind OR (s.lo < :hi AND s.hi > :lo))",
            {"resource": span.resource, "kind": span.kind, "lo": lo, "hi": hi, "now": now},
        ).fetchall()
        blocked = False
        for rowid, kind, other, live, other_holder, other_targets in rows:
            if not live:
                # A dead span of the other kind would have blocked this one had
                # it been live: taken over like an overlap (the reason rule).
                conn.execute("DELETE FROM dibs_spans WHERE rowid = ?", (rowid,))
                self._take_over(conn, other, now)
            elif kind != span.kind:
                raise span_kind_mismatch(span, kind)
            else:
                blocked = True
                blockers[other] = (other_holder, other_targets)
        if blocked:
            taken.append(span)
        else:
            conn.execute(
                "INSERT INTO dibs_spans (resource, lo, hi, kind, fence) VALUES (?, ?, ?, ?, ?)",
                (span.resource, lo, hi, span.kind, fence),
            )

    @staticmethod
    def _take_over(conn: sqlite3.Connection, fence: int, now: int) -> None:
        # Only ever called on a claim found not live, so 'held' here is a dead
        # hold; 'expired' is one the sweep marked first (the reason rule).
        conn.execute(
            "UPDATE dibs_claims SET state = 'expired', taken_over = 1, updated_at = ? "
            "WHERE fence = ? AND state IN ('held', 'expired') AND taken_over = 0",
            (now, fence),
        )

    # --- transitions on one claim ---------------------------------------------------------------

    def _live_state(
        self, conn: sqlite3.Connection, claim_id: str, holder: str, fence: int, now: int
    ) -> str:
        """Return 'held' or 'confirmed', or raise why the claim is not the caller's live hold."""
        number = parse_serial_id(claim_id)
        row = None
        if number is not None:
            row = conn.execute(
                "SELECT fence, holder, state, expires_at, taken_over FROM dibs_claims "
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
        return str(state)

    def _confirm(self, claim_id: str, holder: str, fence: int) -> Claim:
        def attempt() -> Claim:
            with self._immediate() as conn:
                now = _micros(self._now())
                # Linearization point: the check and the update share one write transaction.
                if self._live_state(conn, claim_id, holder, fence, now) == "held":
                    conn.execute(
                        "UPDATE dibs_claims SET state = 'confirmed', expires_at = NULL, "
                        "updated_at = ? WHERE fence = ? AND state = 'held' AND expires_at > ?",
                        (now, fence, now),
                    )
                return self._read(conn, fence, now)

        return self._retrying(attempt)

    def _extend(self, claim_id: str, holder: str, fence: int, ttl: float) -> Claim:
        def attempt() -> Claim:
            with self._immediate() as conn:
                now = _micros(self._now())
                if self._live_state(conn, claim_id, holder, fence, now) == "held":
                    conn.execute(
                        "UPDATE dibs_claims SET expires_at = ?, updated_at = ? "
                        "WHERE fence = ? AND state = 'held' AND expires_at > ?",
                        (now + _micros(ttl), now, fence, now),
                    )
                return self._read(conn, fence, now)

        return self._retrying(attempt)

    def _release(self, claim_id: str, holder: str, fence: int) -> bool:
        def attempt() -> bool:
            with self._immediate() as conn:
                now = _micros(self._now())
                try:
                    self._live_state(conn, claim_id, holder, fence, now)
                except HoldLost as lost:
                    if lost.reason is HoldLostReason.FENCE:
                        raise
                    return False
                (targets,) = conn.execute(
                    "UPDATE dibs_claims SET state = 'released', expires_at = NULL, "
                    "updated_at = ? WHERE fence = ? RETURNING targets",
                    (now, fence),
                ).fetchone()
                self._detach(conn, fence, targets)
                return True

        return self._retrying(attempt)

    @staticmethod
    def _detach(conn: sqlite3.Connection, fence: int, targets: str) -> None:
        """Delete the claim's unit and span rows, found by primary key from its targets."""
        for target in targets_from_text(targets):
            if isinstance(target, Unit):
                conn.execute(
                    "DELETE FROM dibs_units WHERE resource = ? AND slot = ? AND fence = ?",
                    (target.resource, target.slot, fence),
                )
            else:
                conn.execute(
                    "DELETE FROM dibs_spans WHERE resource = ? AND fence = ?",
                    (target.resource, fence),
                )

    # --- reads ----------------------------------------------------------------------------------

    @staticmethod
    def _read(conn: sqlite3.Connection, fence: int, now: int) -> Claim:
        row = conn.execute(
            "SELECT fence, holder, targets, state, expires_at, request_id, created_at, "
            "updated_at, taken_over FROM dibs_claims WHERE fence = ?",
            (fence,),
        ).fetchone()
        return _claim_from_row(row, now)

    def _reading(self, work: Callable[[sqlite3.Connection, int], _T]) -> _T:
        def attempt() -> _T:
            with self._pool.transaction("BEGIN") as conn:  # one snapshot for the whole read
                return work(conn, _micros(self._now()))

        return self._retrying(attempt)

    def _get(self, claim_id: str) -> Claim | None:
        fence = parse_serial_id(claim_id)
        if fence is None:
            return None

        def read(conn: sqlite3.Connection, now: int) -> Claim | None:
            exists = conn.execute("SELECT 1 FROM dibs_claims WHERE fence = ?", (fence,)).fetchone()
            return self._read(conn, fence, now) if exists else None

        return self._reading(read)

    def _holder_of(self, target: Unit | Span) -> str | None:
        def read(conn: sqlite3.Connection, now: int) -> str | None:
            if isinstance(target, Unit):
                row = conn.execute(
                    f"SELECT c.holder FROM dibs_units u JOIN dibs_claims c ON c.fence = u.fence "
                    f"WHERE u.resource = :resource AND u.slot = :slot AND {_LIVE}",
                    {"resource": target.resource, "slot": target.slot, "now": now},
                ).fetchone()
            else:
                row = conn.execute(
                    f"SELECT c.holder FROM dibs_spans s JOIN dibs_claims c ON c.fence = s.fence "
                    f"WHERE s.resource = :resource AND s.kind = :kind AND s.lo < :hi "
                    f"AND s.hi > :lo AND {_LIVE} LIMIT 1",
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
            rows = conn.execute(
                "SELECT fence, holder, targets, state, expires_at, request_id, created_at, "
                f"updated_at, taken_over FROM dibs_claims c WHERE holder = :holder "
                f"AND state IN ('held', 'confirmed') AND {_LIVE} ORDER BY fence",
                {"holder": holder, "now": now},
            ).fetchall()
            return [_claim_from_row(row, now) for row in rows]

        return self._reading(read)

    # --- housekeeping ---------------------------------------------------------------------------

    def _sweep(self, batch: int = 500) -> SweepResult:
        totals = {"expired": 0, "purged_requests": 0, "purged_claims": 0}

        def step() -> bool:
            # Short transactions in batches, so a big sweep never starves claimants.
            with self._immediate() as conn:
                now = _micros(self._now())
                cutoff = now - _micros(self.request_retention)
                # The unit and span rows of an expired claim stay until its purge,
                # so a later claimant can still take it over (the reason rule).
                dead = conn.execute(
                    "UPDATE dibs_claims SET state = 'expired', updated_at = :now "
                    "WHERE fence IN (SELECT fence FROM dibs_claims WHERE state = 'held' "
                    "AND expires_at <= :now LIMIT :batch) RETURNING fence",
                    {"now": now, "batch": batch},
                ).fetchall()
                totals["expired"] += len(dead)
                purged_requests = conn.execute(
                    "DELETE FROM dibs_requests WHERE request_id IN (SELECT request_id FROM "
                    "dibs_requests WHERE created_at <= ? LIMIT ?)",
                    (cutoff, batch),
                ).rowcount
                # Never the highest fence: SQLite would hand its rowid out again.
                ended = conn.execute(
                    "SELECT fence, targets FROM dibs_claims "
                    "WHERE state IN ('released', 'expired') AND updated_at <= ? "
                    "AND fence < (SELECT max(fence) FROM dibs_claims) LIMIT ?",
                    (cutoff, batch),
                ).fetchall()
                for fence, targets in ended:
                    conn.execute("DELETE FROM dibs_claims WHERE fence = ?", (fence,))
                    self._detach(conn, fence, targets)
                totals["purged_requests"] += purged_requests
                totals["purged_claims"] += len(ended)
                return len(dead) == batch or purged_requests == batch or len(ended) == batch

        while self._retrying(step):
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
        """Every row of ``dibs_claims``, read in one transaction."""
        return ClaimReader(self._log)

    def _log(self) -> list[Claim]:
        def read(conn: sqlite3.Connection, now: int) -> list[Claim]:
            rows = conn.execute(
                "SELECT fence, holder, targets, state, expires_at, request_id, created_at, "
                "updated_at, taken_over FROM dibs_claims ORDER BY fence"
            ).fetchall()
            # A "now" before every expiry: the log keeps the stored state (see ClaimLog).
            return [_claim_from_row(row, -(2**62)) for row in rows]

        return self._reading(read)

    def _close(self) -> None:
        self._pool.close()


class _DataVersion:
    """``PRAGMA data_version`` on a connection that never writes.

    It moves on every commit by any other connection, so every change it sees
    is someone else's: another process, or this process's store connections.
    """

    def __init__(self, path: str) -> None:
        self._lock = threading.Lock()  # serializes reads on the one connection
        self._conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)

    def read(self) -> object:
        with self._lock:
            return self._conn.execute("PRAGMA data_version").fetchone()[0]

    def close(self) -> None:
        with self._lock:
            self._conn.close()


def _claim_from_row(row: tuple[Any, ...], now: int) -> Claim:
    fence, holder, targets, state, expires_at, request_id, created_at, updated_at, taken = row
    created, updated = _dt(created_at), _dt(updated_at)
    assert created is not None and updated is not None
    return stored_claim(
        str(fence), holder, targets, state, fence, _dt(expires_at), request_id, created, updated,
        taken, dead=state == "held" and expires_at <= now,
    )  # fmt: skip
