"""Version-1 SQLite claim files of any size, written set-based in one transaction.

Shared by tests/stores/test_migrations.py (the upgrade's cost per claim) and
benchmarks/bench_upgrade.py (its time per 10k claims). Claim ``i`` (its fence)
is, by ``i % 20``: a held group of two units with a request ID (0), a confirmed
span (1), a released unit claim with a request ID (2), an expired hold taken
over (3) by the confirmed claim on the same unit (4), a dead hold no sweep
marked (5), and a single-unit claim, confirmed or held, otherwise; every sixth
fence also leaves a lost request record.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from layout import SCHEMAS

__all__ = ["build_v1"]

FROZEN = SCHEMAS / "sqlite_claims_v1.sql"
T0_US = 1_800_000_000_000_000

_CLAIMS = """
WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < :claims)
INSERT INTO dibs_claims (fence, holder, targets, state, expires_at, taken_over, request_id,
                         created_at, updated_at)
SELECT i, 'holder-' || (i % 97),
       CASE i % 20
           WHEN 0 THEN json_array(json_array('u', 'row', i || 'a'),
                                  json_array('u', 'row', i || 'b'))
           WHEN 1 THEN json_array(json_array('n', 'room-' || i, 0, 10))
           WHEN 4 THEN json_array(json_array('u', 'seat', CAST(i - 1 AS TEXT)))
           ELSE json_array(json_array('u', 'seat', CAST(i AS TEXT)))
       END,
       CASE
           WHEN i % 20 IN (0, 5) THEN 'held'
           WHEN i % 20 = 2 THEN 'released'
           WHEN i % 20 = 3 THEN 'expired'
           WHEN i % 20 IN (1, 4) THEN 'confirmed'
           WHEN i % 2 = 0 THEN 'held'
           ELSE 'confirmed'
       END,
       CASE
           WHEN i % 20 IN (0, 5) OR (i % 20 NOT IN (1, 2, 3, 4) AND i % 2 = 0)
               THEN T0 + CASE WHEN i % 20 = 5 THEN 10 ELSE 300 END * 1000000
           WHEN i % 20 = 3 THEN T0 + 5000000
       END,
       i % 20 = 3,
       CASE WHEN i % 3 = 0 OR i % 20 IN (0, 2) THEN 'r-' || i END,
       T0 + i, T0 + i
FROM n, (SELECT :t0 AS T0)
"""

_ROWS = (
    # The unit rows of live and dead-but-not-taken-over claims: never released or taken over.
    """INSERT INTO dibs_units (resource, slot, fence)
       SELECT json_extract(t.value, '$[1]'), json_extract(t.value, '$[2]'), c.fence
       FROM dibs_claims c, json_each(c.targets) t
       WHERE json_extract(t.value, '$[0]') = 'u' AND c.state != 'released' AND NOT c.taken_over""",
    """INSERT INTO dibs_spans (resource, lo, hi, kind, fence)
       SELECT 'room-' || fence, 0, 10, 'number', fence FROM dibs_claims WHERE fence % 20 = 1""",
    """INSERT INTO dibs_requests (request_id, fingerprint, fence, taken, created_at)
       SELECT request_id, 'fp-' || fence, fence, NULL, created_at
       FROM dibs_claims WHERE request_id IS NOT NULL""",
    """INSERT INTO dibs_requests (request_id, fingerprint, fence, taken, created_at)
       SELECT 'lost-' || fence, 'fp-lost-' || fence, NULL, targets, created_at
       FROM dibs_claims WHERE fence % 6 = 0""",
)


def build_v1(path: Path | str, claims: int) -> None:
    """Write a version-1 claim file of ``claims`` claims at ``path`` (which must not exist)."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode = WAL")  # as version-1 dibs left its files
        conn.executescript(FROZEN.read_text())
        conn.execute("BEGIN")
        conn.execute("INSERT INTO dibs_meta (key, value) VALUES ('schema_version', '1')")
        conn.execute(_CLAIMS, {"claims": claims, "t0": T0_US})
        for statement in _ROWS:
            conn.execute(statement)
        conn.execute("COMMIT")
    finally:
        conn.close()
