"""The planted bugs of :mod:`dibs.verify._planted` on PostgreSQL (needs psycopg).

Kept apart so that ``dibs.verify`` imports without the PostgreSQL extra.
"""

from __future__ import annotations

import time
from typing import Any

import psycopg

from dibs._model import Claim, ClaimResult, Unit
from dibs._request import ClaimRequest
from dibs.stores.base import claim_not_found, not_holder
from dibs.stores.postgres import PostgresStore, parse_id
from dibs.stores.postgres._sql import CLAIMS
from dibs.verify._workload import RACE_WINDOW

__all__ = ["CheckThenActPostgres", "ReaderBesideWriterPostgres", "UnfencedPostgres"]


def _table(store: PostgresStore, name: str) -> str:
    return '"' + store.schema.replace('"', '""') + '".' + name


class CheckThenActPostgres(PostgresStore):
    """Reads "is it free?" in one statement, then clears the units blindly in another."""

    def _claim(self, request: ClaimRequest) -> ClaimResult:
        targets = request.targets
        units = [t for t in targets if isinstance(t, Unit)]
        if len(units) == len(targets) and all(self._holder_of(t) is None for t in units):
            time.sleep(RACE_WINDOW)
            delete = f"DELETE FROM {_table(self, 'units_v4')} WHERE resource = %s AND slot = %s "
            for u in units:  # BUG: act on a stale check, dropping whoever came in between
                self._call((delete + "RETURNING 1").encode(), (u.resource, u.slot))
        return super()._claim(request)


class UnfencedPostgres(PostgresStore):
    """Confirms without the fence, state or expiry condition."""

    def _confirm(self, claim_id: str, holder: str, fence: int) -> Claim:
        key = parse_id(claim_id)
        if key is None:
            raise claim_not_found(claim_id)
        query = (
            f"SELECT holder FROM {_table(self, 'units_v4')} WHERE id = %s "
            "AND state IN ('held', 'confirmed', 'released', 'expired') "
            f"UNION ALL SELECT holder FROM {_table(self, 'claims_v4')} WHERE id = %s LIMIT 1"
        )
        row = self._call(query.encode(), (key, key))
        if row is None:
            raise claim_not_found(claim_id)
        if row[0] != holder:
            raise not_holder(claim_id, holder)
        # BUG: no fence, state or expiry condition.
        for table, only in (
            ("units_v4", " AND state IN ('held', 'confirmed', 'released', 'expired')"),
            ("claims_v4", ""),
        ):
            update = (
                f"UPDATE {_table(self, table)} SET state = 'confirmed', expires_at = NULL, "
                f"updated_at = clock_timestamp() WHERE id = %s{only} RETURNING 1"
            )
            self._call(update.encode(), (key,))
        claim = self._get(claim_id)
        if claim is None:
            raise claim_not_found(claim_id)
        return claim


_READER_CHECK = """        ELSIF v_o.state IN ('held', 'confirmed', 'member')
              AND (v_o.expires_at IS NULL OR v_o.expires_at > p_now) THEN"""


class ReaderBesideWriterPostgres(PostgresStore):
    """Readers join a unit without looking at its writer (``reader-beside-writer``).

    It replaces its schema's ``take_reader_v5`` with one whose check of the
    unit's row consults only the readers: a live writer's row is taken over
    as if it were dead, the way a plausible bug would.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        (script,) = (f for f in CLAIMS.functions if _READER_CHECK in f)
        assert script.count(_READER_CHECK) == 1
        # BUG: a live writer in the reader's way is never "taken".
        broken = script.replace(_READER_CHECK, "        ELSIF false THEN")
        schema = '"' + self.schema.replace('"', '""') + '"'
        # Every client (and the sweeper) opens the plant at once: one at a time, or
        # concurrent CREATE OR REPLACE of one function fails ("tuple concurrently updated").
        with psycopg.connect(self._conninfo) as conn:
            conn.execute(b"SELECT pg_advisory_xact_lock(hashtext('dibs-plant'))")
            conn.execute(broken.replace("{s}", schema).encode())
