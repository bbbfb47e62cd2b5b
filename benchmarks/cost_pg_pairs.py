"""Where a PostgreSQL hold+confirm pair's cost goes, counted (not timed) on both sides.

The ``pairs`` workload of ``bench_peers_postgres.py`` (``store.claim(Unit,
holder, ttl=300)`` then ``store.confirm``), run by 1 and 8 processes on a
private durable server (fsync on, ``synchronous_commit`` on) with
``pg_stat_statements``, ``track_functions = all`` and ``track_wal_io_timing``,
and per pair:

* statements the client sent (psycopg ``Cursor.execute`` calls, counted in
  each worker) and statements the server ran (``pg_stat_statements`` calls);
* transactions committed (``pg_stat_database.xact_commit``) and PL/pgSQL
  function calls (``pg_stat_user_functions``);
* WAL records, full-page images, bytes, writes and fsyncs (``pg_stat_wal``),
  the heap's inserts, updates and HOT updates on ``units_v4``, and its index
  entries read (``pg_stat_user_indexes``: scans of the holder index, say);
* server time: the executor's and the planner's (``pg_stat_statements``);
* CPU: the workers' own (client), their backends' (``/proc/PID/schedstat`` of
  each session's server process) and the whole cluster's (every postgres
  process, the WAL writer and checkpointer included).

Counts hardly move with the machine's load; the CPU figures are medians over
rounds. ``--redis`` also runs the same pairs on Redis with AOF and ``appendfsync
always`` (``SET NX PX`` then the confirming Lua script, as the peers benchmark
does): client CPU, ``redis-server``'s CPU and pairs/s per pair. ``--base SRC``
also runs the dibs in another checkout's ``src``, alternating with this one
round by round, for an A/B in one command::

    mkdir -p /tmp/base && git archive main src | tar -x -C /tmp/base
    python benchmarks/cost_pg_pairs.py --procs 1 8 --pairs 300 --rounds 3 --base /tmp/base/src

``--explain`` also prints ``EXPLAIN (ANALYZE, BUFFERS, WAL)`` of the pair's two statements.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import os
import secrets
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import psycopg

from dibs.verify.harness import PostgresServer

_spawn = multiprocessing.get_context("spawn")


def _cpu_of(pid: int) -> float:
    """CPU seconds process ``pid``'s threads have run so far, in ns (0 once it is gone)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").glob("*/schedstat"):
        try:
            total += int(task.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue
    return total / 1e9


def _cluster_pids(postmaster: int) -> list[int]:
    pids = [postmaster]
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            if ppid == postmaster:
                pids.append(int(entry.name))
    return pids


def _worker(src: str, url: str, schema: str, n: int, pairs: int, barrier: Any, out: Any) -> None:
    if src:  # this module's import of the harness loaded dibs from PYTHONPATH: drop it
        for name in [m for m in sys.modules if m == "dibs" or m.startswith("dibs.")]:
            del sys.modules[name]
        sys.path.insert(0, src)
    import dibs

    assert not src or dibs.__file__.startswith(src), dibs.__file__
    sent = [0]
    execute = psycopg.Cursor.execute

    def counting(self: Any, *args: Any, **kwargs: Any) -> Any:
        sent[0] += 1
        return execute(self, *args, **kwargs)

    psycopg.Cursor.execute = counting  # type: ignore[method-assign]
    store = dibs.open(f"{url}?schema={schema}&pool_min=1&pool_max=1")
    for i in range(20):  # warm: the pool's connection, psycopg's prepared statements
        c = store.claim(dibs.Unit(f"warm-{n}", str(i)), holder=f"h{n}", ttl=300).claim
        store.confirm(c.id, holder=f"h{n}", fence=c.fence)
    with store._pool.connection() as conn:  # a benchmark: its backend's pid
        backend = conn.info.backend_pid
        conn.execute("SELECT pg_stat_force_next_flush()")  # the warm-up's counters, now
    sent[0] = 0
    barrier.wait()  # warmed up: the parent reads the counters
    barrier.wait()  # go
    cpu0, server0, wall0 = time.process_time(), _cpu_of(backend), time.perf_counter()
    for i in range(pairs):
        claim = store.claim(dibs.Unit(f"seat-{n}", str(i)), holder=f"h{n}", ttl=300).claim
        assert claim is not None
        store.confirm(claim.id, holder=f"h{n}", fence=claim.fence)
    wall = time.perf_counter() - wall0
    out.put((sent[0], time.process_time() - cpu0, _cpu_of(backend) - server0, wall))
    barrier.wait()  # the parent has read the cluster's CPU while this session lives
    store.close()


_STATS_STATEMENTS = 7
"""Statements (autocommit: transactions) of one :func:`_stats`."""


def _redis_worker(url: str, n: int, pairs: int, barrier: Any, out: Any) -> None:
    """The same pairs on Redis, as ``bench_peers_postgres.py`` runs them."""
    from bench_peers_postgres import _redis_pairs

    tag = secrets.token_hex(3)
    op = _redis_pairs(url, f"warm{tag}", n, 20)
    for i in range(20):
        op(i)
    op = _redis_pairs(url, tag, n, pairs)
    barrier.wait()
    barrier.wait()
    cpu0, wall0 = time.process_time(), time.perf_counter()
    for i in range(pairs):
        op(i)
    wall = time.perf_counter() - wall0
    out.put((2 * pairs, time.process_time() - cpu0, 0.0, wall))
    barrier.wait()


def redis_round(url: str, server_pid: int, procs: int, pairs: int) -> dict[str, float]:
    barrier = _spawn.Barrier(procs + 1)
    out = _spawn.Queue()
    workers = [
        _spawn.Process(target=_redis_worker, args=(url, n, pairs, barrier, out))
        for n in range(procs)
    ]
    for w in workers:
        w.start()
    barrier.wait()
    cpu0 = _cpu_of(server_pid)
    barrier.wait()
    results = [out.get() for _ in workers]
    cpu1 = _cpu_of(server_pid)
    barrier.wait()
    for w in workers:
        w.join()
    n = procs * pairs
    return {
        "sent": sum(r[0] for r in results) / n,
        "client_us": sum(r[1] for r in results) / n * 1e6,
        "cluster_us": (cpu1 - cpu0) / n * 1e6,
        "pairs_s": n / max(r[3] for r in results),
    }


def _stats(url: str, schema: str) -> dict[str, float]:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT pg_stat_clear_snapshot()")
        wal = conn.execute(
            "SELECT wal_records, wal_fpi, wal_bytes, wal_write, wal_sync, wal_sync_time "
            "FROM pg_stat_wal"
        ).fetchone()
        xact = conn.execute(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
        ).fetchone()
        tup = conn.execute(
            "SELECT coalesce(sum(n_tup_ins), 0), coalesce(sum(n_tup_upd), 0), "
            "coalesce(sum(n_tup_hot_upd), 0) FROM pg_stat_user_tables WHERE relname = 'units_v4' "
            "AND schemaname = %s",
            (schema,),
        ).fetchone()
        idx = conn.execute(
            "SELECT coalesce(sum(idx_scan) FILTER (WHERE indexrelname LIKE '%%by_holder'), 0), "
            "coalesce(sum(idx_tup_read), 0) FROM pg_stat_user_indexes "
            "WHERE relname = 'units_v4' AND schemaname = %s",
            (schema,),
        ).fetchone()
        fn = conn.execute(
            "SELECT coalesce(sum(calls), 0), coalesce(sum(self_time), 0) "
            "FROM pg_stat_user_functions WHERE schemaname = %s",
            (schema,),
        ).fetchone()
        st = conn.execute(
            "SELECT coalesce(sum(calls), 0), coalesce(sum(total_exec_time), 0), "
            "coalesce(sum(plans), 0), coalesce(sum(total_plan_time), 0) "
            "FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid "
            "WHERE d.datname = current_database() AND s.query NOT LIKE '%%pg_stat%%'"
        ).fetchone()
    assert wal and xact and tup and idx and fn and st
    names = ["wal_records", "wal_fpi", "wal_bytes", "wal_write", "wal_sync", "wal_sync_ms"]
    row = dict(zip(names, map(float, wal), strict=True))
    row.update(commits=float(xact[0]), ins=float(tup[0]), upd=float(tup[1]), hot=float(tup[2]))
    row.update(by_holder=float(idx[0]), tup_read=float(idx[1]))
    row.update(fn_calls=float(fn[0]), fn_ms=float(fn[1]), statements=float(st[0]))
    row["statement_ms"] = float(st[1])
    row["plans"], row["plan_ms"] = float(st[2]), float(st[3])
    return row


def one_round(
    src: str, url: str, postmaster: int, procs: int, pairs: int, admin: str
) -> dict[str, float]:
    schema = f"cost_{secrets.token_hex(3)}"
    barrier = _spawn.Barrier(procs + 1)
    out = _spawn.Queue()
    workers = [
        _spawn.Process(target=_worker, args=(src, url, schema, n, pairs, barrier, out))
        for n in range(procs)
    ]
    for w in workers:
        w.start()
    barrier.wait()  # warmed up
    time.sleep(0.2)  # the warm-ups' counters reach the stats (forced: see _worker)
    pids = _cluster_pids(postmaster)
    before = _stats(admin, schema)
    cluster0 = sum(_cpu_of(p) for p in pids)
    barrier.wait()  # go
    results = [out.get() for _ in workers]
    cluster1 = sum(_cpu_of(p) for p in pids)
    barrier.wait()  # done: the sessions close
    for w in workers:
        w.join()
    time.sleep(1.1)  # the walwriter and ended sessions report within a second
    after = _stats(admin, schema)
    n = procs * pairs
    row = {k: (after[k] - before[k]) / n for k in after}
    row["commits"] -= _STATS_STATEMENTS / n  # the first _stats's own, flushed as it closed
    row["sent"] = sum(r[0] for r in results) / n
    row["client_us"] = sum(r[1] for r in results) / n * 1e6
    row["backend_us"] = sum(r[2] for r in results) / n * 1e6
    row["cluster_us"] = (cluster1 - cluster0) / n * 1e6
    row["pairs_s"] = n / max(r[3] for r in results)
    return row


def explain(url: str) -> None:
    import dibs
    from dibs.stores.postgres._sql import Statements

    schema = f"cost_{secrets.token_hex(3)}"
    with dibs.open(f"{url}?schema={schema}&pool_min=1&pool_max=1") as store:
        claim = store.claim(dibs.Unit("x", "0"), holder="h", ttl=300).claim
        assert claim is not None
    sql = Statements(schema, test_clock=False)
    with psycopg.connect(url) as conn:
        for name, text, params in (
            ("hold (claim_fresh)", sql.claim_fresh,
             {"r": "x", "sl": "1", "h": "h", "st": "held", "ttl": 300.0, "now": None}),
            ("confirm", sql.confirm, {"id": int(claim.id), "h": "h", "f": claim.fence,
                                      "now": None}),
        ):  # fmt: skip
            rows = conn.execute(
                b"EXPLAIN (ANALYZE, BUFFERS, WAL, COSTS OFF) " + text, params
            ).fetchall()
            print(f"--- {name}")
            print("\n".join(r[0] for r in rows))
        conn.rollback()


FIELDS = [
    ("sent", "statements sent", "{:.2f}"),
    ("statements", "statements run (pg_stat_statements)", "{:.2f}"),
    ("commits", "transactions committed", "{:.2f}"),
    ("by_holder", "scans of units_v4_by_holder", "{:.2f}"),
    ("tup_read", "index entries read on units_v4", "{:.2f}"),
    ("fn_calls", "PL/pgSQL calls", "{:.2f}"),
    ("wal_records", "WAL records", "{:.2f}"),
    ("wal_fpi", "WAL full-page images", "{:.3f}"),
    ("wal_bytes", "WAL bytes", "{:.0f}"),
    ("wal_write", "WAL writes", "{:.2f}"),
    ("wal_sync", "WAL fsyncs", "{:.2f}"),
    ("wal_sync_ms", "WAL fsync ms", "{:.2f}"),
    ("ins", "units_v4 inserts", "{:.2f}"),
    ("upd", "units_v4 updates", "{:.2f}"),
    ("hot", "of them HOT", "{:.2f}"),
    ("statement_ms", "server executor ms (pg_stat_statements)", "{:.3f}"),
    ("plans", "plans made", "{:.2f}"),
    ("plan_ms", "planner ms", "{:.3f}"),
    ("client_us", "client CPU µs", "{:.0f}"),
    ("backend_us", "its backend's CPU µs", "{:.0f}"),
    ("cluster_us", "the whole cluster's CPU µs", "{:.0f}"),
    ("pairs_s", "pairs/s (wall, load-dependent)", "{:.0f}"),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--procs", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--pairs", type=int, default=300, help="pairs per process per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--base", metavar="SRC", help="also run the dibs in this src, alternating")
    parser.add_argument("--explain", action="store_true")
    parser.add_argument(
        "--redis", action="store_true", help="also run the pairs on Redis (AOF, fsync always)"
    )
    args = parser.parse_args()
    here = str(Path(__file__).resolve().parent.parent / "src")
    versions = {"this": here} | ({"base": str(Path(args.base).resolve())} if args.base else {})
    settings = {
        "max_connections": "100",
        "shared_preload_libraries": "'pg_stat_statements'",
        "track_functions": "'all'",
        "track_wal_io_timing": "on",
        "pg_stat_statements.track": "'all'",
        "pg_stat_statements.track_planning": "on",
    }
    with PostgresServer(durable=True, settings=settings) as server:
        url = server.create_database("dibs_cost")
        admin = server.url("dibs_cost")
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        postmaster = server.pid()
        assert postmaster is not None
        if args.explain:
            explain(url)
        os.system("uptime")  # the load behind the CPU and wall figures
        with contextlib.ExitStack() as stack:
            if args.redis:
                from bench_peers_postgres import redis_server

                rurl = stack.enter_context(redis_server())
                versions["redis"] = "redis"
            for procs in args.procs:
                rounds(versions, url, postmaster, procs, args, admin, rurl if args.redis else "")
        os.system("uptime")


def rounds(
    versions: dict[str, str], url: str, postmaster: int, procs: int, args: Any, admin: str,
    rurl: str,
) -> None:  # fmt: skip
    """``args.rounds`` rounds of each version (and Redis), alternating; prints the table."""
    got: dict[str, list[dict[str, float]]] = {v: [] for v in versions}
    rpid = 0
    if rurl:
        import redis

        rpid = int(redis.Redis.from_url(rurl).info()["process_id"])
    for r in range(args.rounds):
        order = list(versions) if r % 2 == 0 else list(reversed(versions))
        for v in order:
            if v == "redis":
                got[v].append(redis_round(rurl, rpid, procs, args.pairs))
            else:
                got[v].append(one_round(versions[v], url, postmaster, procs, args.pairs, admin))
    print(f"\n{procs} process(es), {args.pairs} pairs each, {args.rounds} rounds; "
          f"per pair, median (range); load average {os.getloadavg()[0]:.1f}")  # fmt: skip
    print(f"{'':>42} | " + " | ".join(f"{v:>22}" for v in versions))
    for key, label, fmt in FIELDS:
        cells = []
        for v in versions:
            xs = [row[key] for row in got[v] if key in row]
            if not xs:
                cells.append("")
                continue
            m = fmt.format(statistics.median(xs))
            cells.append(f"{m} ({fmt.format(min(xs))}-{fmt.format(max(xs))})")
        print(f"{label:>42} | " + " | ".join(f"{c:>22}" for c in cells))


if __name__ == "__main__":
    main()
