"""The SQLite claim tables' statements and rows as claims (schema version 3)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from dibs._model import Claim, ClaimState, Unit, make_claim
from dibs.stores.base import stored_claim

__all__ = [
    "CLAIM_COLS", "INSERT_UNIT", "INSERT_UNIT_NEW_REQUEST", "LIVE", "NEXT_FENCE", "PRIOR_REQUEST",
    "REPLACE_UNIT", "SELECT_UNIT", "UNIT_COLS", "claim_from_row", "dt", "micros", "unit_claim",
]  # fmt: skip

LIVE = "(c.state = 'confirmed' OR (c.state = 'held' AND c.expires_at > :now))"

# The next fence: one more than the highest in either table (both read off an index's
# right edge). sweep() never purges the highest, so no fence is handed out twice.
NEXT_FENCE = (
    "(SELECT max(coalesce((SELECT max(fence) FROM dibs_units_v2), 0), "
    "coalesce((SELECT max(fence) FROM dibs_claims_v2), 0)) + 1)"
)
UNIT_COLS = "fence, holder, state, expires_at, request_id, created_at, updated_at, resource, slot"
CLAIM_COLS = (
    "fence, holder, targets, state, expires_at, request_id, created_at, updated_at, taken_over, "
    "mode"
)
INSERT_UNIT = (
    "INSERT INTO dibs_units_v2 (resource, slot, fence, state, holder, expires_at, request_id, "
    f"fingerprint, created_at, updated_at) VALUES (?, ?, {NEXT_FENCE}, ?, ?, ?, ?, ?, ?, ?) "
    "ON CONFLICT DO NOTHING RETURNING fence"
)
# INSERT_UNIT for a request ID with no record within retention (?9, the cutoff): the
# check PRIOR_REQUEST makes, in the same statement. Nothing inserted: taken, or a prior.
INSERT_UNIT_NEW_REQUEST = (
    "INSERT INTO dibs_units_v2 (resource, slot, fence, state, holder, expires_at, request_id, "
    f"fingerprint, created_at, updated_at) SELECT ?1, ?2, {NEXT_FENCE}, ?3, ?4, ?5, ?6, ?7, ?8, ?8 "
    "WHERE NOT EXISTS (SELECT 1 FROM dibs_requests_v2 WHERE request_id = ?6 AND created_at > ?9) "
    "AND NOT EXISTS (SELECT 1 FROM dibs_units_v2 "
    "WHERE request_id = ?6 AND fingerprint IS NOT NULL AND created_at > ?9) "
    "ON CONFLICT DO NOTHING RETURNING fence"
)
SELECT_UNIT = (
    "SELECT fence, state, holder, expires_at, request_id, fingerprint, created_at, updated_at "
    "FROM dibs_units_v2 WHERE resource = ? AND slot = ?"
)
REPLACE_UNIT = (
    f"UPDATE dibs_units_v2 SET fence = {NEXT_FENCE}, state = ?, holder = ?, expires_at = ?, "
    "request_id = ?, fingerprint = ?, created_at = ?, updated_at = ? "
    "WHERE resource = ? AND slot = ? AND fence = ? RETURNING fence"
)
# A request's record: in dibs_requests_v2, or (a granted single-unit claim) in its unit row.
PRIOR_REQUEST = (
    "SELECT fingerprint, fence, taken FROM dibs_requests_v2 "
    "WHERE request_id = ?1 AND created_at > ?2 "
    "UNION ALL SELECT fingerprint, fence, NULL FROM dibs_units_v2 "
    "WHERE request_id = ?1 AND fingerprint IS NOT NULL AND created_at > ?2 LIMIT 1"
)


def micros(seconds: float) -> int:
    """Seconds as whole microseconds, the unit of every time column."""
    return round(seconds * 1_000_000)  # to the nearest µs, as datetime and PostgreSQL do


def dt(value: int | None) -> datetime | None:
    """A time column as an aware UTC datetime."""
    return None if value is None else datetime.fromtimestamp(value / 1_000_000, UTC)


def claim_from_row(row: tuple[Any, ...], now: int) -> Claim:
    """A claim row (``CLAIM_COLS``) as a :class:`Claim`; a held one past ``now`` reads expired."""
    fence, holder, targets, state, expires_at, request_id, created_at, updated_at, taken, mode = row
    created, updated = dt(created_at), dt(updated_at)
    assert created is not None and updated is not None
    return stored_claim(
        str(fence), holder, targets, state, fence, dt(expires_at), request_id, created, updated,
        taken, dead=state == "held" and expires_at <= now, mode=mode,
    )  # fmt: skip


def unit_claim(row: tuple[Any, ...], now: int) -> Claim:
    """A single-unit claim from its unit row (never taken over: that moves it out)."""
    fence, holder, state, expires_at, request_id, created_at, updated_at, resource, slot = row
    claim_state = ClaimState(state)
    if claim_state is ClaimState.HELD and expires_at <= now:
        claim_state = ClaimState.EXPIRED
    created, updated = dt(created_at), dt(updated_at)
    assert created is not None and updated is not None
    return make_claim(
        str(fence), holder, (Unit(resource, slot),), claim_state, fence, dt(expires_at),
        request_id, created, updated,
    )  # fmt: skip
