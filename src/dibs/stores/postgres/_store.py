"""``postgresql://``: the arbiter for many application hosts sharing one PostgreSQL.

Each operation is one statement — a call of a server-side function (see
:mod:`dibs.stores.postgres._sql`), or for a free single unit one plain
``INSERT`` CTE — so it is one round trip and one transaction in autocommit
mode:

* a unit is claimed by ``INSERT … ON CONFLICT DO NOTHING`` against the primary
  key ``(resource, slot)`` of the ``units`` table — the insert is the check;
* an expired hold is taken over by a conditional ``UPDATE`` of the unit row it
  was observed on, row-locked, in the claimant's transaction;
* a span is claimed by an insert against ``EXCLUDE USING gist (resource WITH =,
  span WITH &&)``; expired holds in its way are deleted, and their claims
  marked taken over, in the same transaction;
* the fence comes from a sequence, drawn after every target is held;
* confirm, extend and release are conditional updates of the claim row after
  its unit and span rows are locked (the lock order that rules out deadlock);
* expiry is judged on the database's ``clock_timestamp()``, never the client's.

Errors are translated at one boundary (:meth:`PostgresStore._call`), and no
driver error escapes it: serialization failures and deadlocks are retried with
jittered backoff; input PostgreSQL cannot store (a NUL, a lone surrogate,
SQLSTATE class 22) is :class:`~dibs.InvalidInput`; a pool closed by
:meth:`~dibs.Store.close` is :class:`~dibs.StoreClosed`; everything else (a
lost connection, a pool timeout, a server shutting down, ``statement_timeout``,
``lock_timeout``, a read-only standby, retries used up) is
:class:`~dibs.StoreUnavailable`. After that the claim may or may not have
committed: retry with the same request ID to learn which.
"""

from __future__ import annotations

import logging
import os
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any, Literal
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

import psycopg
import psycopg.errors
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import TupleRow
from psycopg_pool import PoolClosed, PoolTimeout

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
    make_claim,
    make_result,
    span_bound_to_number,
    targets_to_text,
)
from dibs.exceptions import (
    HoldLostReason,
    InvalidInput,
    RequestConflict,
    SchemaError,
    StoreClosed,
    StoreUnavailable,
)
from dibs.stores._fork import abandon
from dibs.stores._retry import retrying
from dibs.stores.base import (
    DEFAULT_REQUEST_RETENTION,
    Store,
    check_seconds,
    claim_not_found,
    hold_lost,
    not_holder,
    parse_serial_id,
    span_kind_mismatch,
    stored_claim,
)
from dibs.stores.capabilities import ChangeFeed, ClaimLog, ClaimReader
from dibs.stores.jobs import JobTable
from dibs.stores.postgres._connect import RecordingPool, cause_of, describe, first_connection
from dibs.stores.postgres._jobs import PostgresJobs
from dibs.stores.postgres._sql import CLAIMS, SCHEMA_VERSION, Statements, schema_version, upgrade

__all__ = ["SCHEMA_VERSION", "PostgresStore", "parse_id", "split_url"]

logger = logging.getLogger("dibs.stores.postgres")

_IDENT = re.compile(r"[a-z_][a-z0-9_]{0,62}")
_SURROGATE = re.compile(r"[\ud800-\udfff]")
_MAX_ID = 2**63 - 1
_SWEEP_BATCH = 1000

# SQLSTATEs worth retrying inside the store: the transaction was rolled back
# whole, so running it again is safe and invisible to the caller.
_RETRY = (psycopg.errors.SerializationFailure, psycopg.errors.DeadlockDetected)

# URL query options that belong to dibs, not to libpq.
_OPTIONS: dict[str, Callable[[str], Any]] = {
    "schema": str,
    "pool_min": int,
    "pool_max": int,
    "pool_timeout": float,
    "request_retention": float,
    "max_retries": int,
    "create_extension": lambda v: v.lower() in ("1", "true", "yes", "on"),
}

_STATES = {s.value: s for s in ClaimState}

# SQLSTATEs of a statement written for another schema version: undefined
# table, column or function, and DB009 from version 4's stubs of the version-3
# functions (for code that predates the version check).
_NOT_OUR_SCHEMA = frozenset({"42P01", "42703", "42883", "DB009"})


class _LeaveItToTheFunction(Exception):
    """The plain single-unit statement met a race only the claim function settles."""


def _unique_race(exc: psycopg.Error) -> Exception | None:
    """A unique violation in the plain claim statement: a request ID committed under it."""
    return _LeaveItToTheFunction() if isinstance(exc, psycopg.errors.UniqueViolation) else None


_LOST_REASONS = {
    "fence": HoldLostReason.FENCE,
    "released": HoldLostReason.RELEASED,
    "expired": HoldLostReason.EXPIRED,
    "taken_over": HoldLostReason.TAKEN_OVER,
}


def split_url(url: str) -> tuple[str, dict[str, Any]]:
    """Split a store URL into a libpq conninfo URL and dibs's own options.

    dibs's query options (``schema``, ``pool_min``, ...) are converted and
    taken out; the rest stay for libpq. Raises :class:`~dibs.InvalidInput`
    for a malformed option.
    """
    try:
        parts = urlsplit(url)
    except ValueError as exc:  # a malformed host, such as an unclosed "[" of an IPv6 address
        raise InvalidInput(f"malformed PostgreSQL URL: {exc}", field="url", value=url) from None
    scheme = parts.scheme.split("+", 1)[0].lower()
    ours: dict[str, Any] = {}
    rest: list[tuple[str, str]] = []
    for key, value in parse_qsl(parts.query, keep_blank_values=True):
        convert = _OPTIONS.get(key)
        if convert is None:
            rest.append((key, value))
            continue
        try:
            ours[key] = convert(value)
        except ValueError:
            raise InvalidInput(
                f"{key} in the PostgreSQL URL must be a {convert.__name__}, got {value!r}",
                field=key,
                value=value,
            ) from None
    conninfo = urlunsplit(
        (
            "postgresql" if scheme in ("postgresql", "postgres") else scheme,
            parts.netloc,
            parts.path,
            urlencode(rest, quote_via=quote),
            parts.fragment,
        )
    )
    return conninfo, ours


class PostgresStore(Store):
    """Claims in a PostgreSQL database; safe across threads, processes and hosts.

    ``conninfo`` is a libpq URL or key/value string. Connections come from a
    pool of ``pool_min`` to ``pool_max`` connections; a call waits up to
    ``pool_timeout`` seconds for one, then raises
    :class:`~dibs.StoreUnavailable`. Tables live in the schema ``schema``,
    created on first use with a version stamp.

    ``clock`` is for tests only: when given, the store judges expiry by that
    clock (passing its time to every statement) instead of the database's
    ``clock_timestamp()``, so a :class:`~dibs.FakeClock` can move time. Never
    pass one in production: application hosts' clocks disagree, the
    database's is the one clock they share.

    Raises :class:`~dibs.StoreUnavailable` when the database cannot be reached,
    :class:`~dibs.SchemaError` when its schema is newer than this code or
    ``btree_gist`` is missing and the role may not create it.
    """

    scheme = "postgresql"
    verify_faults = frozenset({"terminate", "restart"})

    def __init__(
        self,
        conninfo: str,
        *,
        clock: Clock | None = None,
        request_retention: float = DEFAULT_REQUEST_RETENTION,
        schema: str = "dibs",
        pool_min: int = 1,
        pool_max: int = 10,
        pool_timeout: float = 10.0,
        max_retries: int = 8,
        create_extension: bool = True,
    ) -> None:
        super().__init__(clock=clock, request_retention=request_retention)
        if not isinstance(schema, str) or not _IDENT.fullmatch(schema):
            raise InvalidInput(
                f"schema must be a lowercase SQL identifier, got {schema!r}",
                field="schema",
                value=schema,
            )
        for name, value, low in (
            ("pool_min", pool_min, 0),
            ("pool_max", pool_max, 1),
            ("max_retries", max_retries, 0),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise InvalidInput(
                    f"{name} must be an integer >= {low}, got {value!r}", field=name, value=value
                )
        if pool_min > pool_max:
            raise InvalidInput(
                f"pool_min ({pool_min}) must not exceed pool_max ({pool_max})",
                field="pool_min",
                value=pool_min,
            )
        check_seconds("pool_timeout", pool_timeout)
        try:
            conninfo_to_dict(conninfo)
        except psycopg.ProgrammingError as exc:
            # A mistake, not an outage: refuse now, rather than let the pool
            # retry it until pool_timeout and call it unavailable.
            raise InvalidInput(
                f"not a valid PostgreSQL connection string: {cause_of(exc)}",
                field="url",
                value=cause_of(exc),
            ) from None
        self.schema = schema
        self.max_retries = max_retries
        self._test_clock = clock is not None
        self._pool_options = {
            "min_size": pool_min,
            "max_size": pool_max,
            "timeout": float(pool_timeout),
        }
        self._sql = Statements(schema, test_clock=self._test_clock)
        self._conninfo = conninfo
        self._fork_lock = threading.Lock()
        self._pid = os.getpid()
        self._where = describe(conninfo)
        self._failing = False  # the last call failed for want of the server (logged once)
        # The first open connects directly, not through a pool: a refusal is raised now
        # with libpq's cause, where a pool would retry it quietly until pool_timeout.
        with first_connection(conninfo, float(pool_timeout)) as conn:
            self._create_schema(conn, create_extension)
        self._own_pool = self._new_pool()
        logger.debug("opened the PostgreSQL store at %s, schema %r", self._where, schema)

    def _new_pool(self) -> RecordingPool:
        pool = RecordingPool(
            self._conninfo,
            kwargs={"autocommit": True},
            name=f"dibs-{self.schema}",
            open=False,
            **self._pool_options,  # type: ignore[arg-type]
        )
        pool.open(wait=False)
        return pool

    @property
    def _pool(self) -> RecordingPool:
        """This process's pool. A forked child opens its own and never touches the parent's.

        The parent's connections share their sockets with the child: a query
        from the child would interleave with the parent's on one session, and
        closing them would end the parent's sessions (libpq sends Terminate).
        """
        if self._pid != os.getpid():
            with self._fork_lock:
                if self._pid != os.getpid():
                    abandon(self._own_pool)
                    self._own_pool = self._new_pool()
                    logger.info(
                        "forked child %d: the parent's (%d) PostgreSQL connections are left "
                        "alone, and this process opened a pool of its own",
                        os.getpid(),
                        self._pid,
                    )
                    self._pid = os.getpid()
        return self._own_pool

    @classmethod
    def from_url(cls, url: str, **options: Any) -> PostgresStore:
        """Open from ``postgresql://user:pass@host:port/db?schema=dibs&pool_max=10``.

        dibs's own query options (``schema``, ``pool_min``, ``pool_max``,
        ``pool_timeout``, ``request_retention``, ``max_retries``,
        ``create_extension``) are taken out; the rest go to libpq (for example
        ``sslmode`` or ``connect_timeout``). Keyword options win over the URL.
        Raises :class:`~dibs.InvalidInput` for a malformed option.
        """
        conninfo, ours = split_url(url)
        return cls(conninfo, **{**ours, **options})

    @classmethod
    def exists(cls, url: str, **options: Any) -> bool:
        """Whether the database holds this store's schema; creates nothing.

        Raises :class:`~dibs.StoreMisconfigured` or :class:`~dibs.StoreUnavailable`
        when the database cannot be reached, as opening does.
        """
        conninfo, ours = split_url(url)
        merged = {**ours, **options}
        with first_connection(conninfo, float(merged.get("pool_timeout", 10.0))) as conn:
            return schema_version(conn, str(merged.get("schema", "dibs"))) > 0

    # --- the one boundary with the driver -------------------------------------------------------

    def _call(
        self,
        query: bytes,
        params: Sequence[Any] | Mapping[str, Any],
        fetch: Literal["one", "all"] = "one",
        *,
        explain: Callable[[psycopg.Error], Exception | None] | None = None,
    ) -> Any:
        """Run one statement on a pooled connection, translating the driver's errors.

        Retries serialization failures and deadlocks with full jitter, then
        raises :class:`~dibs.StoreUnavailable`, as it does for every other
        failure of the server or the connection. Raises
        :class:`~dibs.InvalidInput` for input PostgreSQL cannot take, and
        :class:`~dibs.StoreClosed` once the store is closed. ``explain`` may
        translate a server error first (the claim's own SQLSTATEs).
        """
        answered = False

        def attempt() -> Any:
            nonlocal answered
            answered = False
            with self._pool.connection() as conn:
                cur = conn.execute(query, params)
                answered = True
                return cur.fetchone() if fetch == "one" else cur.fetchall()

        def gave_up(exc: Exception, tries: int) -> Exception:
            sqlstate = getattr(exc, "sqlstate", None)
            return StoreUnavailable(
                f"PostgreSQL store: gave up after {tries} attempts ({sqlstate}: {exc})"
            )

        try:
            answer = retrying(
                attempt,
                transient=lambda exc: isinstance(exc, _RETRY),
                gave_up=gave_up,
                attempts=self.max_retries + 1,
                delay=0.002,
                max_delay=0.25,
                logger=logger,
            )
        except (psycopg.Error, UnicodeError) as exc:
            mapped = explain(exc) if explain and isinstance(exc, psycopg.Error) else None
            error = mapped or self._translate(exc, params, answered=answered)
            if isinstance(error, StoreUnavailable) and not self._failing:
                self._failing = True  # once per outage, not once per call
                logger.warning("%s", error)
            raise error from exc
        if self._failing:
            self._failing = False
            logger.info("the PostgreSQL store at %s answers again", self._where)
        return answer

    def _translate(
        self,
        exc: psycopg.Error | UnicodeError,
        params: Sequence[Any] | Mapping[str, Any],
        *,
        answered: bool,
    ) -> Exception:
        """The dibs error for a driver error (see the module docstring for the mapping)."""
        if isinstance(exc, PoolClosed) and self._closed:
            return StoreClosed(f"this {type(self).__name__} is closed")
        sqlstate = getattr(exc, "sqlstate", None)
        if sqlstate in _NOT_OUR_SCHEMA:
            return self._schema_moved(exc)
        if not answered and (
            isinstance(exc, UnicodeError | psycopg.DataError) or (sqlstate or "")[:2] == "54"
        ):
            # Rejected before anything ran: by the driver (a NUL, a lone
            # surrogate) or by the server (class 22, data exception; class 54,
            # a program limit such as an index row too big for its page).
            return _bad_input(exc, params)
        where = f" ({sqlstate})" if sqlstate else ""
        if isinstance(exc, PoolTimeout) and self._own_pool.last_error:
            return StoreUnavailable(
                f"PostgreSQL store at {self._where} unavailable: {exc}; the last connection "
                f"attempt failed: {self._own_pool.last_error}",
                cause=self._own_pool.last_error,
            )
        # Anything else is the server's or the connection's trouble, and may
        # pass: connection loss, shutdown, statement_timeout, lock_timeout
        # (55P03), a read-only standby (25006), a pool closed underneath. A
        # failed statement rolled back; a lost connection or an unreadable
        # answer leaves the outcome unknown: retry with the same request ID.
        return StoreUnavailable(f"PostgreSQL store unavailable{where}: {exc}")

    def _schema_moved(self, exc: psycopg.Error | UnicodeError) -> SchemaError:
        """SchemaError for a statement that found another schema version than this code's."""
        found = 0
        try:
            with psycopg.connect(self._conninfo, connect_timeout=5) as conn:
                found = schema_version(conn, self.schema)
        except psycopg.Error:
            pass
        return SchemaError(
            f"PostgreSQL schema {self.schema!r} is at version {found}, but this process runs "
            f"code for version {SCHEMA_VERSION} ({exc}). Run one dibs version against a "
            "schema: upgrade or restart every process using it",
            found=found,
            supported=SCHEMA_VERSION,
        )

    def _now_param(self) -> datetime | None:
        """The test clock's time for statements, or None to use the database clock."""
        if not self._test_clock:
            return None
        now = self.clock.now()
        try:
            return _from_micros(round(now * 1_000_000))
        except (OverflowError, ValueError):
            raise InvalidInput(
                f"the test clock's time {now!r} is not a representable date",
                field="clock",
                value=now,
            ) from None

    def _now(self) -> float:
        if self._test_clock:
            return self.clock.now()
        (now,) = self._call(b"SELECT clock_timestamp()", ())
        return float(now.timestamp())

    # --- schema -----------------------------------------------------------------------------------

    def _create_schema(self, conn: psycopg.Connection[TupleRow], create_extension: bool) -> None:
        s = sql.Identifier(self.schema)
        try:
            version = schema_version(conn, self.schema)
            if version == SCHEMA_VERSION:
                return
            with conn.transaction():
                # One creator at a time across every host; the others wait, then
                # find the schema at the current version.
                conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (f"dibs:{self.schema}",))
                version = schema_version(conn, self.schema)
                CLAIMS.check(version, f"PostgreSQL schema {self.schema!r}")
                if version == 0:
                    self._ensure_extension(conn, create_extension)
                    exists = conn.execute(
                        "SELECT 1 FROM pg_namespace WHERE nspname = %s", (self.schema,)
                    ).fetchone()
                    if not exists:  # a schema made for us needs no CREATE on the database
                        conn.execute(sql.SQL("CREATE SCHEMA {}").format(s))
                upgrade(conn, self.schema, CLAIMS)
        except psycopg.errors.InsufficientPrivilege as exc:
            raise SchemaError(
                f"cannot create dibs schema {self.schema!r}: {exc}. Grant CREATE on the "
                "database to this role, or create the schema once as its owner",
                found=0,
                supported=SCHEMA_VERSION,
            ) from exc
        except psycopg.Error as exc:
            raise self._translate(exc, (), answered=True) from exc

    def _ensure_extension(self, conn: psycopg.Connection[TupleRow], create: bool) -> None:
        query = "SELECT 1 FROM pg_extension WHERE extname = 'btree_gist'"
        if conn.execute(query).fetchone():
            return
        if create:
            # The extension is per database, the schema lock per schema: first
            # opens of several schemas need a lock of their own around it, or
            # one trips the catalog's unique index under another. (The two-key
            # form is a key space apart from the schema locks; it is always
            # taken second, so the two cannot deadlock.)
            conn.execute("SELECT pg_advisory_xact_lock(hashtext('dibs'), hashtext('btree_gist'))")
            if conn.execute(query).fetchone():
                return
            try:
                with conn.transaction():
                    conn.execute("CREATE EXTENSION IF NOT EXISTS btree_gist")
                return
            except psycopg.errors.InsufficientPrivilege:
                pass
        raise SchemaError(
            "the btree_gist extension is missing and this role may not create it; run "
            "'CREATE EXTENSION btree_gist;' once in this database as a superuser",
            found=0,
            supported=SCHEMA_VERSION,
        )

    # --- claim ----------------------------------------------------------------------------------

    def _claim(
        self, targets: tuple[Target, ...], holder: str, request_id: str | None, ttl: float | None
    ) -> ClaimResult:
        fp = fingerprint(holder, targets, ttl) if request_id is not None else None
        # One unit: one plain statement settles it unless something is in the
        # way (see Statements.claim_unit); then the claim function decides.
        if len(targets) == 1 and type(targets[0]) is Unit:
            granted = self._claim_unit(targets[0], holder, request_id, fp, ttl)
            if granted is not None:
                return granted
        text = targets_to_text(targets)
        # The lock order (see dibs.stores.postgres._sql): units by (resource,
        # slot), spans by (resource, start), str compared by code point as the
        # "C" collation does, whatever the database's default collation is.
        units = sorted((t for t in targets if isinstance(t, Unit)), key=_unit_key)
        spans = sorted((t for t in targets if isinstance(t, Span)), key=_span_key)
        sent: tuple[Target, ...] = (*units, *spans)
        params = {
            "holder": holder,
            "targets": text,
            "ttl": ttl,
            "rid": request_id,
            "fp": fp,
            "now": self._now_param(),
            "retention": self.request_retention,
            "ures": [u.resource for u in units],
            "uslot": [u.slot for u in units],
            "sres": [x.resource for x in spans] if spans else None,
            "skind": [x.kind for x in spans] if spans else None,
            "slo": [_bound(x.start) for x in spans] if spans else None,
            "shi": [_bound(x.end) for x in spans] if spans else None,
        }
        row = self._call(
            self._sql.claim, params, explain=lambda exc: self._claim_error(exc, sent, request_id)
        )
        outcome, taken = row[0], row[1]
        if outcome in ("granted", "replayed"):
            claim = _claim_from_row(row[2:12], row[12]) if row[2] is not None else None
            return ClaimResult(True, claim, (), replayed=outcome == "replayed")
        lost = {sent[i] for i in taken}
        return ClaimResult(
            False,
            None,
            tuple(t for t in targets if t in lost),
            replayed=outcome == "replayed_taken",
        )

    def _claim_unit(
        self, unit: Unit, holder: str, request_id: str | None, fp: str | None, ttl: float | None
    ) -> ClaimResult | None:
        """Claim one unit in one plain statement; None when the claim function must decide."""
        params = {
            "r": unit.resource,
            "sl": unit.slot,
            "h": holder,
            "st": "confirmed" if ttl is None else "held",
            "ttl": ttl,
            "rid": request_id,
            "fp": fp,
            "retention": self.request_retention,
            "now": self._now_param(),
        }
        try:
            if request_id is None:
                row = self._call(self._sql.claim_fresh, params)
                if row is None:  # the unit has a row: reuse it if its claim ended
                    row = self._call(self._sql.claim_reuse, params, explain=_unique_race)
            else:
                row = self._call(self._sql.claim_unit, params)
                if row is not None and row[0] == "reuse":
                    row = self._call(self._sql.claim_reuse, params, explain=_unique_race)
        except _LeaveItToTheFunction:
            return None
        if row is None:
            return None
        kind, id_, state, fence, expires_at, created, who, fp_seen, taken_over, updated, now = row
        new = kind == "new"
        if not new and (who != holder or fp_seen != fp):
            return None  # a reuse with other input: the function raises RequestConflict
        if new and fp_seen is not None:  # claim_reuse: the dead hold it took over
            self._log_takeover(fp_seen)
        created_at = created.astimezone(UTC)
        claim = make_claim(
            str(id_),
            holder,
            (unit,),
            ClaimState.EXPIRED
            if not new and state == "held" and expires_at <= now
            else _STATES[state],
            fence,
            None if expires_at is None else expires_at.astimezone(UTC),
            request_id,
            created_at,
            created_at if new else updated.astimezone(UTC),
            bool(taken_over),
        )
        return make_result(True, claim, (), replayed=not new)

    def _claim_error(
        self, exc: psycopg.Error, targets: tuple[Target, ...], request_id: str | None
    ) -> Exception | None:
        """The dibs error for the claim function's own SQLSTATEs, else None."""
        diag = exc.diag
        if exc.sqlstate == "DB002":
            return RequestConflict(
                f"request ID {request_id!r} was already used with different input",
                request_id=request_id,
            )
        if exc.sqlstate == "DB001":
            index, kind = (diag.message_detail or "0 ?").split(" ", 1)
            span = targets[int(index)]
            assert isinstance(span, Span)
            return span_kind_mismatch(span, kind)
        return None

    # --- transitions on one claim ---------------------------------------------------------------

    def _number(self, claim_id: str, fence: int) -> int:
        number = parse_id(claim_id)
        if number is None:
            raise claim_not_found(claim_id)
        if fence > _MAX_ID:  # no bigint: the statement would not even find its function
            raise InvalidInput(
                f"fence must fit in 64 bits, got {fence!r}", field="fence", value=fence
            )
        return number

    def _transition(
        self, op: str, number: int, claim_id: str, holder: str, fence: int, ttl: float | None
    ) -> tuple[str, Claim | None]:
        params = {
            "op": op, "id": number, "h": holder, "f": fence, "ttl": ttl, "now": self._now_param()
        }  # fmt: skip
        row = self._call(self._sql.transition, params)
        status = row[0]
        if status == "not_found":
            raise claim_not_found(claim_id)
        if status == "not_holder":
            raise not_holder(claim_id, holder)
        return status, _claim_from_row(row[1:11], row[11])

    def _unit_claim(
        self, row: Sequence[Any], claim_id: str, holder: str, fence: int, state: ClaimState
    ) -> Claim:
        resource, slot, request_id, created, updated, *expires = row
        return make_claim(
            claim_id,
            holder,
            (Unit(resource, slot),),
            state,
            fence,
            expires[0].astimezone(UTC) if expires else None,
            request_id,
            created.astimezone(UTC),
            updated.astimezone(UTC),
        )

    def _confirm(self, claim_id: str, holder: str, fence: int) -> Claim:
        number = self._number(claim_id, fence)
        params = {"id": number, "h": holder, "f": fence, "now": self._now_param()}
        row = self._call(self._sql.confirm, params)
        if row is not None:
            return self._unit_claim(row, claim_id, holder, fence, ClaimState.CONFIRMED)
        status, claim = self._transition("confirm", number, claim_id, holder, fence, None)
        if status != "ok":
            raise hold_lost(claim_id, _LOST_REASONS[status], fence)
        assert claim is not None
        return claim

    def _extend(self, claim_id: str, holder: str, fence: int, ttl: float) -> Claim:
        number = self._number(claim_id, fence)
        params = {"id": number, "h": holder, "f": fence, "ttl": ttl, "now": self._now_param()}
        row = self._call(self._sql.extend, params)
        if row is not None:
            return self._unit_claim(row, claim_id, holder, fence, ClaimState.HELD)
        status, claim = self._transition("extend", number, claim_id, holder, fence, ttl)
        if status != "ok":
            raise hold_lost(claim_id, _LOST_REASONS[status], fence)
        assert claim is not None
        return claim

    def _release(self, claim_id: str, holder: str, fence: int) -> bool:
        number = self._number(claim_id, fence)
        params = {"id": number, "h": holder, "f": fence, "now": self._now_param()}
        if self._call(self._sql.release, params) is not None:
            return True
        status, _ = self._transition("release", number, claim_id, holder, fence, None)
        if status == "fence":
            raise hold_lost(claim_id, _LOST_REASONS[status], fence)
        return status == "ok"

    # --- reads ----------------------------------------------------------------------------------

    def _get(self, claim_id: str) -> Claim | None:
        number = parse_id(claim_id)
        if number is None:
            return None
        row = self._call(self._sql.get, {"id": number, "now": self._now_param()})
        return None if row is None else _claim_from_row(row[:10], row[10])

    def _holder_of(self, target: Unit | Span) -> str | None:
        now = self._now_param()
        params: dict[str, Any]
        if isinstance(target, Unit):
            params = {"r": target.resource, "sl": target.slot, "now": now}
            row = self._call(self._sql.holder_of_unit, params)
        else:
            params = {
                "r": target.resource,
                "kind": target.kind,
                "lo": _bound(target.start),
                "hi": _bound(target.end),
                "now": now,
            }
            row = self._call(self._sql.holder_of_span, params)
        return None if row is None else str(row[0])

    def _claims_of(self, holder: str) -> list[Claim]:
        params = {"h": holder, "now": self._now_param()}
        rows = self._call(self._sql.claims_of, params, fetch="all")
        return [_claim_from_row(row[:10], row[10]) for row in rows]

    # --- housekeeping ---------------------------------------------------------------------------

    def _sweep(self) -> SweepResult:
        expired = purged_claims = purged_requests = 0
        while True:
            # Batches in short transactions, so a big sweep never holds many locks.
            params = {
                "now": self._now_param(),
                "retention": self.request_retention,
                "batch": _SWEEP_BATCH,
            }
            e, c, r = self._call(self._sql.sweep, params)
            expired, purged_claims, purged_requests = (
                expired + e,
                purged_claims + c,
                purged_requests + r,
            )
            if max(e, c, r) < _SWEEP_BATCH:
                return SweepResult(
                    expired=expired, purged_requests=purged_requests, purged_claims=purged_claims
                )

    # --- capabilities ---------------------------------------------------------------------------

    def _jobs_clock(self) -> float | None:
        """The job table's ``now``: the test clock's, or None for the server's own."""
        return self.clock.now() if self._test_clock else None

    def job_table(self) -> JobTable:
        """``jobs`` in this store's schema, on this store's pool (created on first use)."""
        return self._once(
            "job_table",
            lambda: PostgresJobs(self.schema, lambda: self._pool, self._jobs_clock),
        )

    def change_feed(self) -> ChangeFeed:
        """The server's WAL position, read on a connection of its own."""
        return _WalPosition(self._conninfo)

    def claim_log(self) -> ClaimLog:
        """Every row of the schema's ``claims`` table, in one statement."""
        return ClaimReader(self._log)

    def _log(self) -> list[Claim]:
        rows = self._call(self._sql.log, {}, fetch="all")
        return [_claim_from_row(row, _BEFORE_ANY_EXPIRY) for row in rows]

    def _close(self) -> None:
        if self._pid == os.getpid():
            self._own_pool.close()
        else:  # the parent's pool, inherited and never used here: leave its sessions alone
            abandon(self._own_pool)


_BEFORE_ANY_EXPIRY = datetime.min.replace(tzinfo=UTC)
"""A "now" no hold has expired by: the claim log keeps stored states (see ClaimLog)."""


class _WalPosition:
    """PostgreSQL's current WAL position: it moves on every write to the cluster.

    Writes to other databases move it too, which costs a needless refresh,
    never a missed one. Any error answers "changed" and reconnects next time.
    """

    def __init__(self, conninfo: str) -> None:
        self._conninfo = conninfo
        self._lock = threading.Lock()  # guards _conn
        self._conn: psycopg.Connection[TupleRow] | None = None

    def read(self) -> object:
        with self._lock:
            try:
                if self._conn is None:
                    self._conn = psycopg.connect(self._conninfo, autocommit=True, connect_timeout=5)
                row = self._conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
                return row[0] if row else object()
            except psycopg.Error:
                self._drop()
                return object()

    def _drop(self) -> None:
        if self._conn is not None:
            conn, self._conn = self._conn, None
            conn.close()

    def close(self) -> None:
        with self._lock:
            self._drop()


def _bad_input(exc: Exception, params: Sequence[Any] | Mapping[str, Any]) -> InvalidInput:
    """InvalidInput for what PostgreSQL cannot store, naming the offending string if it can."""
    values = list(params.values()) if isinstance(params, Mapping) else params
    strings = [v for p in values for v in (p if isinstance(p, list) else [p]) if type(v) is str]
    value = next((v for v in strings if "\x00" in v or _SURROGATE.search(v)), None)
    return InvalidInput(f"PostgreSQL cannot store this input: {exc}", field="input", value=value)


def parse_id(claim_id: str) -> int | None:
    """The bigint behind a claim ID, or None for one this store never gives out."""
    number = parse_serial_id(claim_id)
    return number if number is not None and 0 < number <= _MAX_ID else None


def _unit_key(unit: Unit) -> tuple[str, str]:
    return (unit.resource, unit.slot)


def _span_key(span: Span) -> tuple[str, Decimal]:
    return (span.resource, _bound(span.start))


def _bound(value: int | float | datetime) -> Decimal:
    """A span bound as an exact numeric: numbers as they are, datetimes in µs."""
    return Decimal(span_bound_to_number(value))


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _from_micros(micros: int) -> datetime:
    return _EPOCH + timedelta(microseconds=micros)


def _utc(value: datetime | None) -> datetime | None:
    return None if value is None else value.astimezone(UTC)


def _claim_from_row(row: Sequence[Any], now: datetime) -> Claim:
    (id_, holder, targets, state, fence, expires_at, taken_over, request_id, created, updated) = row
    created_at, updated_at = _utc(created), _utc(updated)
    assert created_at is not None and updated_at is not None
    return stored_claim(
        str(id_), holder, targets, state, fence, _utc(expires_at), request_id, created_at,
        updated_at, taken_over, dead=state == "held" and expires_at <= now,
    )  # fmt: skip
