"""What the PostgreSQL store does, without the I/O: one implementation behind both faces.

Each operation (claim, confirm, extend, release, the reads, sweep) is a
*plan*: a generator that yields the statements to run, one
:data:`Step` at a time, receives each answer, and returns the operation's
result. The plan holds every rule: which statement, its parameters, what the
answer means, when to fall back to the server-side function, which error a
claim's SQLSTATE becomes, how a row becomes a :class:`~dibs.Claim`. A driver
only runs the statements, as psycopg 3 keeps its protocol in generators
behind its sync and async connections:

* :class:`~dibs.stores.postgres.PostgresStore` runs them on a thread's pooled
  connection (:meth:`~dibs.stores.postgres.PostgresStore._run`);
* ``dibs.stores.postgres._aio.AsyncPostgresStore`` awaits them on an async one.

A driver sends each answer back with ``plan.send`` and throws the one
exception a plan catches, :class:`LeaveItToTheFunction`, with ``plan.throw``.
Error translation (:func:`translate`), the retry policy (:func:`backoff`), the
URL options (:func:`split_url`, :func:`pool_options`) and the one-time schema
setup (:func:`create_schema`) live here too.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Generator, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any, TypeAlias, TypeVar
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
    make_claim,
    make_result,
    span_bound_to_number,
    targets_to_text,
)
from dibs._request import ClaimRequest
from dibs.exceptions import (
    HoldLostReason,
    InvalidInput,
    RequestConflict,
    SchemaError,
    StoreClosed,
    StoreMisconfigured,
    StoreUnavailable,
)
from dibs.stores._retry import Backoff
from dibs.stores.base import (
    check_seconds,
    claim_not_found,
    hold_lost,
    not_holder,
    parse_serial_id,
    span_kind_mismatch,
    stored_claim,
)
from dibs.stores.postgres._connect import cause_of
from dibs.stores.postgres._sql import (
    CLAIMS,
    SCHEMA_VERSION,
    Statements,
    schema_version,
    upgrade,
)

__all__ = [
    "ALL",
    "ONE",
    "LeaveItToTheFunction",
    "Operations",
    "Plan",
    "Step",
    "backoff",
    "create_schema",
    "cursor_of",
    "parse_id",
    "pool_options",
    "schema_moved",
    "split_url",
    "translate",
]

logger = logging.getLogger("dibs.stores.postgres")

_T = TypeVar("_T")

Explain: TypeAlias = Callable[[psycopg.Error], Exception | None]
Params: TypeAlias = Sequence[Any] | Mapping[str, Any]

ONE = False
ALL = True

Step: TypeAlias = tuple[bytes, Params, bool, Explain | None]
"""One statement of a plan: its text, its parameters, whether to fetch all rows (else
one, or None), and how to explain a server error first (None: the usual translation)."""

Plan: TypeAlias = Generator[Step, Any, _T]
"""An operation: yields :data:`Step`, is sent each answer, returns the result."""

_IDENT = re.compile(r"[a-z_][a-z0-9_]{0,62}")
_SURROGATE = re.compile(r"[\ud800-\udfff]")
_MAX_ID = 2**63 - 1
_SWEEP_BATCH = 1000

# SQLSTATEs worth retrying inside the store: the transaction was rolled back
# whole, so running it again is safe and invisible to the caller.
RETRY = (psycopg.errors.SerializationFailure, psycopg.errors.DeadlockDetected)

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

_LOST_REASONS = {
    "fence": HoldLostReason.FENCE,
    "released": HoldLostReason.RELEASED,
    "expired": HoldLostReason.EXPIRED,
    "taken_over": HoldLostReason.TAKEN_OVER,
}


class LeaveItToTheFunction(Exception):
    """The plain single-unit statement met a race only the claim function settles."""


def _unique_race(exc: psycopg.Error) -> Exception | None:
    """A unique violation in the plain claim statement: a request ID committed under it."""
    return LeaveItToTheFunction() if isinstance(exc, psycopg.errors.UniqueViolation) else None


# --- options --------------------------------------------------------------------------------------


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


def pool_options(
    conninfo: str,
    *,
    schema: object,
    pool_min: object,
    pool_max: object,
    pool_timeout: object,
    max_retries: object,
) -> dict[str, Any]:
    """Check a store's options without I/O; the pool's ``min_size``, ``max_size``, ``timeout``.

    Raises :class:`~dibs.InvalidInput` naming the bad value.
    """
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
    assert isinstance(pool_min, int) and isinstance(pool_max, int)
    if pool_min > pool_max:
        raise InvalidInput(
            f"pool_min ({pool_min}) must not exceed pool_max ({pool_max})",
            field="pool_min",
            value=pool_min,
        )
    timeout = check_seconds("pool_timeout", pool_timeout)
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
    return {"min_size": pool_min, "max_size": pool_max, "timeout": float(timeout)}


# --- connections ----------------------------------------------------------------------------------

_CURSOR = "_dibs_cursor"


def cursor_of(conn: Any) -> Any:
    """A pooled connection's own cursor, made on its first statement and kept with it.

    psycopg's ``conn.execute`` makes a cursor per call, which costs about as
    much client CPU as the rest of a claim's driver work; a connection runs one
    statement at a time, so one cursor serves all of them. Both drivers call
    this as ``getattr(conn, "_dibs_cursor", None) or cursor_of(conn)``.
    """
    cur = conn.cursor()
    setattr(conn, _CURSOR, cur)
    return cur


# --- errors ---------------------------------------------------------------------------------------


def backoff(max_retries: int) -> Backoff:
    """The retry policy of one statement: serialization failures and deadlocks, jittered."""
    return Backoff(
        transient=_transient,
        gave_up=_gave_up,
        attempts=max_retries + 1,
        delay=0.002,
        max_delay=0.25,
        logger=logger,
    )


def _transient(exc: Exception) -> bool:
    return isinstance(exc, RETRY)


def _gave_up(exc: Exception, tries: int) -> Exception:
    sqlstate = getattr(exc, "sqlstate", None)
    return StoreUnavailable(f"PostgreSQL store: gave up after {tries} attempts ({sqlstate}: {exc})")


def translate(
    exc: psycopg.Error | UnicodeError,
    params: Params,
    *,
    answered: bool,
    closed: bool,
    last_error: str | None,
    where: str,
    store: str,
) -> Exception | None:
    """The dibs error for a driver error (see the store's docstring for the mapping).

    None means the statement found another schema version than this code's:
    the driver reads the version found and raises :func:`schema_moved`.
    ``closed``: the store was closed (a closed pool is then
    :class:`~dibs.StoreClosed`); ``last_error``: why the pool's last connection
    attempt failed, if it did; ``store``: the store's class name.
    """
    if isinstance(exc, PoolClosed) and closed:
        return StoreClosed(f"this {store} is closed")
    sqlstate = getattr(exc, "sqlstate", None)
    if sqlstate in _NOT_OUR_SCHEMA:
        return None
    if not answered and (
        isinstance(exc, UnicodeError | psycopg.DataError) or (sqlstate or "")[:2] == "54"
    ):
        # Rejected before anything ran: by the driver (a NUL, a lone
        # surrogate) or by the server (class 22, data exception; class 54,
        # a program limit such as an index row too big for its page).
        return _bad_input(exc, params)
    if sqlstate == "42501" and "pg_logical_emit_message" in str(exc):
        # A replay with synchronous standbys waits for them through this function
        # (_sql.REPLICATED); a role refused it stays refused: no retry helps.
        return StoreMisconfigured(
            f"PostgreSQL store at {where}: {cause_of(exc)}. A replayed answer waits for "
            "the synchronous standbys through pg_logical_emit_message: GRANT EXECUTE ON "
            "FUNCTION pg_logical_emit_message(boolean, text, text) TO the store's role",
            cause=cause_of(exc),
        )
    if isinstance(exc, PoolTimeout) and last_error:
        return StoreUnavailable(
            f"PostgreSQL store at {where} unavailable: {exc}; the last connection "
            f"attempt failed: {last_error}",
            cause=last_error,
        )
    # Anything else is the server's or the connection's trouble, and may
    # pass: connection loss, shutdown, statement_timeout, lock_timeout
    # (55P03), a read-only standby (25006), a pool closed underneath. A
    # failed statement rolled back; a lost connection or an unreadable
    # answer leaves the outcome unknown: retry with the same request ID.
    where_code = f" ({sqlstate})" if sqlstate else ""
    return StoreUnavailable(f"PostgreSQL store unavailable{where_code}: {exc}")


def schema_moved(schema: str, found: int, exc: BaseException) -> SchemaError:
    """SchemaError for a statement that found schema version ``found``, not this code's."""
    return SchemaError(
        f"PostgreSQL schema {schema!r} is at version {found}, but this process runs "
        f"code for version {SCHEMA_VERSION} ({exc}). Run one dibs version against a "
        "schema: upgrade or restart every process using it",
        found=found,
        supported=SCHEMA_VERSION,
    )


def found_version(conninfo: str, schema: str) -> int:
    """The schema version recorded at ``conninfo``, read on a connection of its own (0: none)."""
    try:
        with psycopg.connect(conninfo, connect_timeout=5) as conn:
            return schema_version(conn, schema)
    except psycopg.Error:
        return 0


def _bad_input(exc: Exception, params: Params) -> InvalidInput:
    """InvalidInput for what PostgreSQL cannot store, naming the offending string if it can."""
    values = list(params.values()) if isinstance(params, Mapping) else params
    strings = [v for p in values for v in (p if isinstance(p, list) else [p]) if type(v) is str]
    value = next((v for v in strings if "\x00" in v or _SURROGATE.search(v)), None)
    return InvalidInput(f"PostgreSQL cannot store this input: {exc}", field="input", value=value)


class Outage:
    """Logs an outage once, as a WARNING, and its end as INFO, however many calls fail."""

    __slots__ = ("failing", "where")

    def __init__(self, where: str) -> None:
        self.where = where
        self.failing = False
        """The last call failed for want of the server (logged once)."""

    def failed(self, error: Exception) -> None:
        if isinstance(error, StoreUnavailable) and not self.failing:
            self.failing = True  # once per outage, not once per call
            logger.warning("%s", error)

    def answered(self) -> None:
        if self.failing:
            self.failing = False
            logger.info("the PostgreSQL store at %s answers again", self.where)


# --- schema ---------------------------------------------------------------------------------------


def create_schema(conn: psycopg.Connection[TupleRow], schema: str, create_extension: bool) -> None:
    """Create or upgrade the claim schema on ``conn`` (blocking; once, at open).

    Raises :class:`~dibs.SchemaError` for a schema newer than this code or a
    role that may not create it, :class:`~dibs.StoreUnavailable` when the
    server fails underneath.
    """
    s = sql.Identifier(schema)
    try:
        version = schema_version(conn, schema)
        if version == SCHEMA_VERSION:
            return
        with conn.transaction():
            # One creator at a time across every host; the others wait, then
            # find the schema at the current version.
            conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (f"dibs:{schema}",))
            version = schema_version(conn, schema)
            CLAIMS.check(version, f"PostgreSQL schema {schema!r}")
            if version == 0:
                _ensure_extension(conn, create_extension)
                exists = conn.execute(
                    "SELECT 1 FROM pg_namespace WHERE nspname = %s", (schema,)
                ).fetchone()
                if not exists:  # a schema made for us needs no CREATE on the database
                    conn.execute(sql.SQL("CREATE SCHEMA {}").format(s))
            upgrade(conn, schema, CLAIMS)
    except psycopg.errors.InsufficientPrivilege as exc:
        raise SchemaError(
            f"cannot create dibs schema {schema!r}: {exc}. Grant CREATE on the "
            "database to this role, or create the schema once as its owner",
            found=0,
            supported=SCHEMA_VERSION,
        ) from exc
    except psycopg.Error as exc:
        error = translate(
            exc, (), answered=True, closed=False, last_error=None, where="", store="PostgresStore"
        )
        if error is None:  # another version's statement failed: say which version is there
            try:
                error = schema_moved(schema, schema_version(conn, schema), exc)
            except psycopg.Error:
                error = schema_moved(schema, 0, exc)
        raise error from exc


def _ensure_extension(conn: psycopg.Connection[TupleRow], create: bool) -> None:
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


# --- the operations -------------------------------------------------------------------------------


class Operations:
    """The store's operations as plans (see the module docstring), for one schema.

    ``clock`` is the test clock, or None to judge time on the database's
    ``clock_timestamp()``. ``retention`` reads the store's request retention
    (seconds) when a plan needs it.
    """

    def __init__(self, schema: str, clock: Clock | None, retention: Callable[[], float]) -> None:
        self.sql = Statements(schema, test_clock=clock is not None)
        self.clock = clock
        self._retention = retention

    def now_param(self) -> datetime | None:
        """The test clock's time for statements, or None to use the database clock."""
        if self.clock is None:
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

    # --- claim ----------------------------------------------------------------------------------

    def claim(self, request: ClaimRequest) -> Plan[ClaimResult]:
        targets, holder, request_id, ttl = (
            request.targets,
            request.holder,
            request.request_id,
            request.ttl,
        )
        fp = request.fingerprint if request_id is not None else None
        # One unit: one plain statement settles it unless something is in the
        # way (see Statements.claim_unit); then the claim function decides.
        shared = request.mode == "shared"
        if len(targets) == 1 and type(targets[0]) is Unit and not shared:
            granted = yield from self._claim_unit(targets[0], holder, request_id, fp, ttl)
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
            "now": self.now_param(),
            "retention": self._retention(),
            "ures": [u.resource for u in units],
            "uslot": [u.slot for u in units],
            "sres": [x.resource for x in spans] if spans else None,
            "skind": [x.kind for x in spans] if spans else None,
            "slo": [_bound(x.start) for x in spans] if spans else None,
            "shi": [_bound(x.end) for x in spans] if spans else None,
            "mode": request.mode,
            "undo": False,
        }
        try:
            # The first try takes the targets without a subtransaction; a loss
            # after it took some rolls the whole statement back (DB010), and
            # the second try, with one, decides and records it (claim_v4.sql).
            row = yield (
                self.sql.claim,
                params,
                ONE,
                lambda exc: _claim_error(exc, sent, request_id, first_try=True),
            )
        except LeaveItToTheFunction:
            params["undo"] = True
            row = yield (
                self.sql.claim,
                params,
                ONE,
                lambda exc: _claim_error(exc, sent, request_id),
            )
        outcome, taken = row[0], row[1]
        if outcome in ("granted", "replayed"):
            claim = claim_from_row(row[2:12], row[13], row[12]) if row[2] is not None else None
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
    ) -> Plan[ClaimResult | None]:
        """Claim one unit in one plain statement; None when the claim function must decide."""
        params = {
            "r": unit.resource,
            "sl": unit.slot,
            "h": holder,
            "st": "confirmed" if ttl is None else "held",
            "ttl": ttl,
            "rid": request_id,
            "fp": fp,
            "retention": self._retention(),
            "now": self.now_param(),
        }
        try:
            if request_id is None:
                row = yield (self.sql.claim_fresh, params, ONE, None)
                if row is None:  # the unit has a row: reuse it if its claim ended
                    row = yield (self.sql.claim_reuse, params, ONE, _unique_race)
            else:
                row = yield (self.sql.claim_unit, params, ONE, None)
                if row is not None and row[0] == "reuse":
                    row = yield (self.sql.claim_reuse, params, ONE, _unique_race)
        except LeaveItToTheFunction:
            return None
        if row is None:
            return None
        kind, id_, state, fence, expires_at, created, who, fp_seen, taken_over, updated, now = row
        new = kind == "new"
        if not new and (who != holder or fp_seen != fp):
            return None  # a reuse with other input: the function raises RequestConflict
        if new and fp_seen is not None:  # claim_reuse: the dead hold it took over
            # DEBUG: abandoned holds are routine (a customer walks away), so a takeover
            # is one line per claim at worst; the sweep's INFO line gives the counts.
            logger.debug("hold %s expired and was taken over", fp_seen)
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
        # A replay came from claim_unit, whose commit waited for the synchronous
        # standbys to have what it replays (REPLICATED).
        return make_result(True, claim, (), replayed=not new)

    # --- transitions on one claim ---------------------------------------------------------------

    def confirm(self, claim_id: str, holder: str, fence: int) -> Plan[Claim]:
        number = _number(claim_id, fence)
        params = {"id": number, "h": holder, "f": fence, "now": self.now_param()}
        row = yield (self.sql.confirm, params, ONE, None)
        if row is not None:
            return _unit_claim(row, claim_id, holder, fence, ClaimState.CONFIRMED)
        status, claim = yield from self._transition("confirm", number, claim_id, holder, fence)
        if status != "ok":
            raise hold_lost(claim_id, _LOST_REASONS[status], fence)
        assert claim is not None
        return claim

    def extend(self, claim_id: str, holder: str, fence: int, ttl: float) -> Plan[Claim]:
        number = _number(claim_id, fence)
        params = {"id": number, "h": holder, "f": fence, "ttl": ttl, "now": self.now_param()}
        row = yield (self.sql.extend, params, ONE, None)
        if row is not None:
            return _unit_claim(row, claim_id, holder, fence, ClaimState.HELD)
        status, claim = yield from self._transition("extend", number, claim_id, holder, fence, ttl)
        if status != "ok":
            raise hold_lost(claim_id, _LOST_REASONS[status], fence)
        assert claim is not None
        return claim

    def release(self, claim_id: str, holder: str, fence: int) -> Plan[bool]:
        number = _number(claim_id, fence)
        params = {"id": number, "h": holder, "f": fence, "now": self.now_param()}
        row = yield (self.sql.release, params, ONE, None)
        if row is not None:
            return True
        status, _ = yield from self._transition("release", number, claim_id, holder, fence)
        if status == "fence":
            raise hold_lost(claim_id, _LOST_REASONS[status], fence)
        return status == "ok"

    def _transition(
        self,
        op: str,
        number: int,
        claim_id: str,
        holder: str,
        fence: int,
        ttl: float | None = None,
    ) -> Plan[tuple[str, Claim | None]]:
        """What the plain statement could not settle: ``transition_v4`` decides, and says why."""
        params = {
            "op": op, "id": number, "h": holder, "f": fence, "ttl": ttl, "now": self.now_param()
        }  # fmt: skip
        row = yield (self.sql.transition, params, ONE, None)
        status = row[0]
        if status == "not_found":
            raise claim_not_found(claim_id)
        if status == "not_holder":
            raise not_holder(claim_id, holder)
        return status, claim_from_row(row[1:11], row[11], row[12])

    # --- reads ----------------------------------------------------------------------------------

    def get(self, claim_id: str) -> Plan[Claim | None]:
        number = parse_id(claim_id)
        if number is None:
            return None
        row = yield (self.sql.get, {"id": number, "now": self.now_param()}, ONE, None)
        return None if row is None else claim_from_row(row[:10], row[10], row[11])

    def holder_of(self, target: Unit | Span) -> Plan[str | None]:
        now = self.now_param()
        params: dict[str, Any]
        if isinstance(target, Unit):
            params = {"r": target.resource, "sl": target.slot, "now": now}
            row = yield (self.sql.holder_of_unit, params, ONE, None)
        else:
            params = {
                "r": target.resource,
                "kind": target.kind,
                "lo": _bound(target.start),
                "hi": _bound(target.end),
                "now": now,
            }
            row = yield (self.sql.holder_of_span, params, ONE, None)
        return None if row is None else str(row[0])

    def claims_of(self, holder: str) -> Plan[list[Claim]]:
        params = {"h": holder, "now": self.now_param()}
        rows = yield (self.sql.claims_of, params, ALL, None)
        return [claim_from_row(row[:10], row[10], row[11]) for row in rows]

    def now(self) -> Plan[float]:
        if self.clock is not None:
            return self.clock.now()
        (now,) = yield (b"SELECT clock_timestamp()", (), ONE, None)
        return float(now.timestamp())

    def wal_position(self) -> Plan[object]:
        """The server's WAL position: it moves on every write to the cluster (a change token)."""
        row = yield (b"SELECT pg_current_wal_lsn()::text", (), ONE, None)
        return row[0] if row else object()

    def log(self) -> Plan[list[Claim]]:
        rows = yield (self.sql.log, {}, ALL, None)
        return [claim_from_row(row[:10], _BEFORE_ANY_EXPIRY, row[10]) for row in rows]

    # --- housekeeping ---------------------------------------------------------------------------

    def sweep(self) -> Plan[SweepResult]:
        expired = purged_claims = purged_requests = 0
        while True:
            # Batches in short transactions, so a big sweep never holds many locks.
            params = {
                "now": self.now_param(),
                "retention": self._retention(),
                "batch": _SWEEP_BATCH,
            }
            e, c, r = yield (self.sql.sweep, params, ONE, None)
            expired, purged_claims, purged_requests = (
                expired + e,
                purged_claims + c,
                purged_requests + r,
            )
            if max(e, c, r) < _SWEEP_BATCH:
                return SweepResult(
                    expired=expired, purged_requests=purged_requests, purged_claims=purged_claims
                )


def _claim_error(
    exc: psycopg.Error,
    targets: tuple[Target, ...],
    request_id: str | None,
    *,
    first_try: bool = False,
) -> Exception | None:
    """The dibs error for the claim function's own SQLSTATEs, else None.

    DB010 from a first try (a group claim that lost after taking targets,
    rolled back whole) is :class:`LeaveItToTheFunction`: try again with the
    subtransaction. From the second try it would be a bug: the usual translation.
    """
    diag = exc.diag
    if exc.sqlstate == "DB010" and first_try:
        return LeaveItToTheFunction()
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


def _number(claim_id: str, fence: int) -> int:
    number = parse_id(claim_id)
    if number is None:
        raise claim_not_found(claim_id)
    if fence > _MAX_ID:  # no bigint: the statement would not even find its function
        raise InvalidInput(f"fence must fit in 64 bits, got {fence!r}", field="fence", value=fence)
    return number


def _unit_claim(
    row: Sequence[Any], claim_id: str, holder: str, fence: int, state: ClaimState
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


_BEFORE_ANY_EXPIRY = datetime.min.replace(tzinfo=UTC)
"""A "now" no hold has expired by: the claim log keeps stored states (see ClaimLog)."""


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


def claim_from_row(row: Sequence[Any], now: datetime, mode: str = "exclusive") -> Claim:
    """A claim from a row of the ``claims_v4`` columns, judged live or dead at ``now``."""
    (id_, holder, targets, state, fence, expires_at, taken_over, request_id, created, updated) = row
    created_at, updated_at = _utc(created), _utc(updated)
    assert created_at is not None and updated_at is not None
    return stored_claim(
        str(id_), holder, targets, state, fence, _utc(expires_at), request_id, created_at,
        updated_at, taken_over, dead=state == "held" and expires_at <= now, mode=mode,
    )  # fmt: skip
