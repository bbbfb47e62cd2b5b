"""What a group claim's subtransaction costs on PostgreSQL: ``claim_v4`` with and without it.

Schema version 6 takes a group claim's targets without a subtransaction on
the first try; ``p_undo`` (the second try, after a loss that took targets)
takes them in one. This sends the claim statement itself, on one connection
to a private server (fsync off), in interleaved rounds of each:

* win: a granted three-unit claim with a request ID, as ``@dibs.idempotent``
  stores a result (the done unit and two result units), first try vs
  ``p_undo``;
* late loss: a two-unit claim whose second unit is held, so it loses after
  taking its first: the first try (rolled back, DB010) then ``p_undo``, as the
  store sends them, vs ``p_undo`` alone, as version 5 did.

It prints per call: wall time (median of the rounds, range), transaction IDs
assigned (subtransactions count) and WAL bytes.

    python benchmarks/bench_pg_group_subxact.py --calls 2000 --rounds 6
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import psycopg

import dibs
from dibs._model import targets_to_text
from dibs.stores.postgres._sql import Statements
from dibs.verify.harness import PostgresServer


def params(units: list[dibs.Unit], rid: str | None, undo: bool) -> dict[str, Any]:
    return {
        "holder": "h",
        "targets": targets_to_text(tuple(units)),
        "ttl": None,
        "rid": rid,
        "fp": None if rid is None else "fp",
        "now": None,
        "retention": 86400.0,
        "ures": [u.resource for u in units],
        "uslot": [u.slot for u in units],
        "sres": None,
        "skind": None,
        "slo": None,
        "shi": None,
        "mode": "exclusive",
        "undo": undo,
    }


def counters(conn: psycopg.Connection[Any]) -> tuple[int, int]:
    row = conn.execute(
        "SELECT pg_current_wal_lsn() - '0/0'::pg_lsn, "
        "pg_snapshot_xmax(pg_current_snapshot())::text::bigint"
    ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def run(conn: psycopg.Connection[Any], sql: Statements, case: str, tag: str, n: int) -> list[float]:
    """Wall µs, XIDs and WAL bytes per call of one round of ``case``."""
    cur = conn.cursor()
    wal0, xid0 = counters(conn)
    start = time.perf_counter()
    for i in range(n):
        if case.startswith("win"):
            units = [dibs.Unit(f"{tag}-{i}", s) for s in ("done", "r0", "r1")]
            cur.execute(sql.claim, params(units, f"{tag}-{i}", case == "win, p_undo"))
            assert cur.fetchone()[0] == "granted"  # type: ignore[index]
            continue
        units = [dibs.Unit(f"{tag}-{i}", "a"), dibs.Unit(f"{tag}-{i}", "b")]
        if case == "late loss, first try then p_undo":
            try:
                cur.execute(sql.claim, params(units, f"{tag}-{i}", False))
                raise AssertionError("the first try should have rolled back")
            except psycopg.Error as exc:
                assert exc.sqlstate == "DB010", exc
        cur.execute(sql.claim, params(units, f"{tag}-{i}", True))
        assert cur.fetchone()[0] == "taken"  # type: ignore[index]
    elapsed = time.perf_counter() - start
    wal1, xid1 = counters(conn)
    return [elapsed / n * 1e6, (xid1 - xid0) / n, (wal1 - wal0) / n]


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000, help="claims per round")
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()
    pairs = [
        ("win, first try", "win, p_undo"),
        ("late loss, first try then p_undo", "late loss, p_undo alone"),
    ]
    with PostgresServer() as server:
        url = server.create_database("subxact")
        dibs.open(f"{url}?schema=subxact").close()
        sql = Statements("subxact", test_clock=False)
        out: dict[str, list[list[float]]] = {c: [] for pair in pairs for c in pair}
        with psycopg.connect(url, autocommit=True) as conn:
            for r in range(args.rounds):
                for pair in pairs:
                    # The late losses' second unit, held by a claim of its own.
                    for side, case in enumerate(pair):
                        tag = f"r{r}s{side}{'w' if case.startswith('win') else 'l'}"
                        if not case.startswith("win"):
                            for i in range(args.calls):
                                b = [dibs.Unit(f"{tag}-{i}", "b")]
                                conn.execute(sql.claim, params(b, None, True)).fetchone()
                    for case in pair if r % 2 else reversed(pair):
                        side = pair.index(case)
                        tag = f"r{r}s{side}{'w' if case.startswith('win') else 'l'}"
                        out[case].append(run(conn, sql, case, tag, args.calls))
    med = statistics.median
    print(f"{args.calls} claims per round, {args.rounds} rounds interleaved, one connection")
    for this, that in pairs:
        for case in (this, that):
            wall, xids, wal = (med(x[k] for x in out[case]) for k in range(3))
            print(f"  {case:34} {wall:7.0f} µs  {xids:.2f} XIDs  {wal:5.0f} WAL bytes")
        ratios = [a[0] / b[0] for a, b in zip(out[this], out[that], strict=True)]
        print(f"  wall, {this} ÷ {that}: {med(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})")


if __name__ == "__main__":
    main()
