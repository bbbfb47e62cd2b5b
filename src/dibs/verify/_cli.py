"""``dibs verify``: run a workload under faults and check it; ``dibs verify check FILE``.

Exit codes: 0 when both checkers pass, 1 on any anomaly, 2 for bad
arguments (or a ``--cluster`` that cannot be installed or started), 3 when
no anomaly was found but some resource's search ran out of time
(inconclusive: never reported as a pass).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from dibs._cli_options import (
    add_store_option,
    count,
    positive_int,
    seconds,
    seconds_or_zero,
    whole_number,
)
from dibs.exceptions import InvalidInput
from dibs.stores import redact
from dibs.verify._check import Report, check_history
from dibs.verify._cluster_run import (
    CLUSTER_FAULTS,
    ClusterRun,
    outage,
    parse_cluster,
    run_on_cluster,
)
from dibs.verify._history import read_history
from dibs.verify._planted import ALL_PLANTS
from dibs.verify._report import write_report
from dibs.verify._runner import FAULTS, command_restart, run_workload
from dibs.verify._tasks import verify_tasks
from dibs.verify._tasks_unique import UNIQUE_PLANTS
from dibs.verify._workload import Workload, parse_mix
from dibs.verify.harness import REPLICATION, ServerSetupError

__all__ = ["add_verify_command"]

EXIT_OK, EXIT_ANOMALY, EXIT_SETUP, EXIT_INCONCLUSIVE = 0, 1, 2, 3

ETCD_TTL, ETCD_SPREAD = 2.0, (1.0, 2.0)
"""etcd leases are whole seconds, at least 2: holds of 2 s and 4 s."""

CLUSTER_OPS = 1_000_000
"""Operations per client on a cluster: in effect, until the fault plan ends."""


def add_verify_command(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser],
) -> None:
    """Register ``dibs verify`` (and ``dibs verify check``) on the ``dibs`` parser."""
    d = Workload("memory://")
    p = subparsers.add_parser(
        "verify",
        help="record a history under faults and check it for anomalies",
        description=(
            "Drive N clients x M operations (claims of units, groups and spans, confirms, "
            "extends, releases, retries, reads) against a store while injecting faults, "
            "record every invocation and completion, then check the history: per-resource "
            "linearizability against a model of the claim rules, and a replay of the "
            "store's claim log in fence order. Exits 1 on any anomaly, 3 if a check ran "
            "out of time. See docs/reliability.md."
        ),
    )
    add_store_option(p, "store to verify", default="memory://", default_help="memory://")
    p.add_argument("--clients", type=positive_int, default=d.clients, help="client processes")
    p.add_argument(
        "--ops",
        type=positive_int,
        default=None,
        help=f"operations per client (default {d.ops}; with --cluster, until the plan ends)",
    )
    p.add_argument(
        "--faults",
        default="",
        help=(
            f"comma-separated faults: {', '.join(FAULTS)}; with --cluster also its own: "
            + "; ".join(f"{k}: {', '.join(v)}" for k, v in CLUSTER_FAULTS.items())
            + " (default none)"
        ),
    )
    p.add_argument(
        "--ttl",
        type=seconds,
        default=None,
        help=f"base hold TTL in seconds (default {d.ttl:g}; {ETCD_TTL:g} on etcd)",
    )
    p.add_argument(
        "--ttl-spread",
        metavar="X,Y,...",
        default=None,
        help=(
            "a hold's TTL is --ttl times one of these, at random (default "
            + ",".join(f"{x:g}" for x in d.ttl_spread)
            + "; "
            + ",".join(f"{x:g}" for x in ETCD_SPREAD)
            + " on etcd, whose TTLs are whole seconds); small ones (with --mix transition=70) "
            "make confirms and extends race the expiry, e.g. 0.005,0.01"
        ),
    )
    p.add_argument(
        "--cluster",
        metavar="etcd:N|postgresql-ha",
        help=(
            "start a private cluster on 127.0.0.1 from Debian's packages, run on it with its "
            "faults, and remove it: etcd:N (N etcd members), or postgresql-ha (PostgreSQL with "
            "two standbys under Patroni over a 3-member etcd); instead of --store"
        ),
    )
    p.add_argument(
        "--replication",
        choices=REPLICATION,
        default=None,
        help="postgresql-ha: sync (the default) or async, the misconfiguration that loses claims",
    )
    p.add_argument(
        "--lag",
        type=seconds_or_zero,
        default=1.0,
        metavar="SECONDS",
        help=(
            "postgresql-ha failover: the standbys' WAL receivers are stopped this long before "
            "the primary dies, and die with it (default %(default)s; 0: not held behind)"
        ),
    )
    p.add_argument(
        "--rounds",
        type=positive_int,
        default=1,
        metavar="N",
        help="etcd: run through the cluster faults N times (default %(default)s)",
    )
    p.add_argument(
        "--after",
        type=seconds_or_zero,
        default=3.0,
        metavar="SECONDS",
        help="--cluster: seconds the clients run on after the last fault (default %(default)s)",
    )
    p.add_argument(
        "--mix",
        metavar="KIND=W,...",
        default="",
        help=(
            "relative weights of the clients' ops, replacing the defaults' "
            f"({', '.join(f'{k}={w:g}' for k, w in d.mix)})"
        ),
    )
    p.add_argument(
        "--sweep-interval",
        type=seconds_or_zero,
        default=d.sweep_interval,
        metavar="SECONDS",
        help=(
            "a sweeper calls sweep() this often, as dibs serve does "
            "(default %(default)s; 0: no sweeper)"
        ),
    )
    p.add_argument(
        "--fault-interval",
        type=seconds,
        default=d.fault_interval,
        metavar="SECONDS",
        help="seconds between fault rounds (default %(default)s)",
    )
    p.add_argument(
        "--restart-every",
        type=positive_int,
        default=d.restart_every,
        metavar="N",
        help="the restart fault restarts the server every N fault rounds (default %(default)s)",
    )
    p.add_argument("--resources", type=positive_int, default=d.resources, help="unit resources")
    p.add_argument("--seed", type=whole_number, default=0, help="seed for the clients' choices")
    p.add_argument("--history", metavar="FILE", help="keep the history here (JSON lines)")
    p.add_argument(
        "--plant",
        metavar="NAME|module:Class",
        help=(
            f"run on a deliberately broken store: {', '.join(ALL_PLANTS)}, or module:Class, "
            "any importable Store subclass with from_url(url, **options)"
        ),
    )
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr while it runs")
    p.add_argument(
        "--admin-url",
        metavar="URL",
        help="PostgreSQL role allowed to pg_terminate_backend, for the terminate fault",
    )
    p.add_argument(
        "--restart-command",
        metavar="CMD",
        help=(
            "shell command that restarts the PostgreSQL server, for the restart fault "
            "(e.g. 'sudo systemctl restart postgresql'); dibs then waits until the server "
            "accepts connections"
        ),
    )
    _check_options(p)
    p.set_defaults(run=_run_verify)
    sub = p.add_subparsers(title="subcommands", metavar="SUBCOMMAND")
    c = sub.add_parser(
        "check",
        help="check a recorded history again",
        description="Run both checkers on a history file written by dibs verify --history.",
    )
    c.add_argument("history", metavar="FILE", help="history (JSON lines)")
    _check_options(c)
    c.set_defaults(run=_run_check)
    t = sub.add_parser(
        "tasks",
        help="durable task processor: every job and occurrence done once under kills",
        description=(
            "Run durable-task workers on a fresh SQLite file (or, with --store, a PostgreSQL "
            "schema with an empty job table) while killing (kill -9) and stopping (SIGSTOP "
            "past the lease) them; then check that every one-off job is done once and every "
            "occurrence of a 100 ms schedule ran once."
        ),
    )
    t.add_argument(
        "path",
        metavar="FILE",
        help="SQLite file to create (must not exist); with --store, the ledger file to create",
    )
    add_store_option(
        t,
        "a store whose job table is empty, instead of a fresh SQLite file",
        default_help="a fresh SQLite file at FILE",
    )
    t.add_argument("--workers", type=positive_int, default=3, help="worker processes")
    t.add_argument("--jobs", type=positive_int, default=600, help="one-off jobs")
    t.add_argument("--duration", type=seconds, default=8.0, help="seconds of faults at least")
    t.add_argument("--plant", choices=UNIQUE_PLANTS, help="a planted bug the check must flag")
    t.add_argument("--json", action="store_true", help="print the figures as JSON")
    t.set_defaults(run=_run_tasks)


def _check_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--budget",
        type=seconds,
        default=10.0,
        help="seconds of search per resource before its verdict is unknown (default 10)",
    )
    p.add_argument(
        "--shrink",
        type=seconds_or_zero,
        default=10.0,
        help="seconds spent shrinking each offending sub-history (default 10)",
    )
    p.add_argument(
        "--witnesses",
        type=count,
        default=3,
        metavar="N",
        help="shrink and explain the first N non-linearizable resources (default 3)",
    )
    p.add_argument(
        "--log-anomalies",
        type=count,
        default=10,
        metavar="N",
        help="print the first N log-replay anomalies in full (default 10)",
    )
    p.add_argument(
        "--report",
        metavar="DIR",
        help="write a self-contained HTML report (timeline, witnesses, figures) into DIR",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="print the figures, anomaly kinds, witnesses and their op IDs as JSON",
    )


def _run_verify(args: argparse.Namespace) -> int:
    d = Workload("memory://")
    faults = tuple(f for f in args.faults.split(",") if f)
    cluster = None
    if args.cluster:
        if args.store != "memory://":
            raise InvalidInput(
                "give --cluster or --store, not both: the cluster is the store",
                field="cluster",
                value=args.cluster,
            )
        kind = args.cluster.partition(":")[0]
        own = CLUSTER_FAULTS.get(kind, ())
        cluster = parse_cluster(
            args.cluster,
            tuple(f for f in faults if f in own or f not in FAULTS),
            args.replication,
            lag=args.lag,
            rounds=args.rounds,
            after=args.after,
        )
        faults = tuple(f for f in faults if f in FAULTS and f not in own)
    elif args.replication is not None:
        raise InvalidInput(
            "--replication applies to --cluster postgresql-ha only",
            field="replication",
            value=args.replication,
        )
    # etcd leases are whole seconds, at least 2: on a cluster verify starts, or one given.
    on_etcd = (cluster is not None and cluster.kind == "etcd") or args.store.lower().startswith(
        "etcd://"
    )
    ttl = args.ttl if args.ttl is not None else (ETCD_TTL if on_etcd else d.ttl)
    spread_text = args.ttl_spread
    if spread_text is None:
        spread_text = ",".join(f"{x:g}" for x in (ETCD_SPREAD if on_etcd else d.ttl_spread))
    try:
        spread = tuple(float(x) for x in spread_text.split(",") if x.strip())
    except ValueError:
        spread = ()
    if not spread or not all(0 < x < float("inf") for x in spread):
        raise InvalidInput(
            "--ttl-spread takes positive numbers, e.g. 0.02,0.1,1",
            field="ttl_spread",
            value=spread_text,
        )
    ops = args.ops if args.ops is not None else (CLUSTER_OPS if cluster else d.ops)
    workload = Workload(
        store=args.store,
        clients=args.clients,
        ops=ops,
        resources=args.resources,
        ttl=ttl,
        seed=args.seed,
        faults=faults,
        plant=args.plant,
        admin_url=args.admin_url,
        fault_interval=args.fault_interval,
        restart_every=args.restart_every,
        mix=parse_mix(args.mix),
        ttl_spread=spread,
        sweep_interval=args.sweep_interval or None,
    )
    restart = None
    if args.restart_command:
        restart = command_restart(args.restart_command, args.admin_url or args.store)
    progress = None if args.quiet else _Progress(workload)
    if cluster is not None:
        return _run_cluster(cluster, workload, args, progress)
    if progress is not None:
        progress.start()
    began = time.monotonic()
    if args.history:
        path = run_workload(workload, args.history, restart=restart, progress=progress)
        return _finish(path, args, time.monotonic() - began)
    with tempfile.TemporaryDirectory() as scratch:
        path = run_workload(
            workload, Path(scratch) / "history.jsonl", restart=restart, progress=progress
        )
        return _finish(path, args, time.monotonic() - began)


def _run_cluster(
    cluster: ClusterRun, workload: Workload, args: argparse.Namespace, progress: _Progress | None
) -> int:
    if progress is not None:
        print(
            f"dibs verify: starting {cluster.describe()} on 127.0.0.1",
            file=sys.stderr,
            flush=True,
        )

    def started(url: str) -> None:
        if progress is not None:
            progress.workload = replace(workload, store=url)
            progress.began = time.monotonic()
            progress.start()
            print(
                f"dibs verify: cluster faults {','.join(cluster.faults) or 'none'}",
                file=sys.stderr,
                flush=True,
            )

    began = time.monotonic()
    with tempfile.TemporaryDirectory() as scratch:
        path = Path(args.history) if args.history else Path(scratch) / "history.jsonl"
        try:
            run_on_cluster(cluster, workload, path, progress=progress, started=started)
        except ServerSetupError as exc:
            # A missing package or a cluster that would not start: no verdict (exit 2).
            print(f"dibs: error: {exc}", file=sys.stderr)
            return EXIT_SETUP
        return _finish(path, args, time.monotonic() - began)


class _Progress:
    """Progress lines on stderr while the workload runs: at most one every few seconds."""

    def __init__(self, workload: Workload, every: float = 5.0) -> None:
        self.workload = workload
        self.every = every
        self.began = time.monotonic()
        self.last = self.began

    def start(self) -> None:
        w = self.workload
        faults = ",".join(w.faults) or "none"
        plant = f", plant {w.plant}" if w.plant else ""
        print(
            f"dibs verify: {w.clients} clients x {w.ops} ops on {redact(w.store)}{plant}, "
            f"faults {faults}, sweeper "
            + (f"every {w.sweep_interval:g} s" if w.sweep_interval else "off"),
            file=sys.stderr,
            flush=True,
        )

    def __call__(self, done: int, total: int) -> None:
        now = time.monotonic()
        if now - self.last < self.every:
            return
        self.last = now
        of = f"/{total}" if self.workload.ops < CLUSTER_OPS else ""
        print(
            f"dibs verify: {done}{of} ops invoked, {now - self.began:.0f} s",
            file=sys.stderr,
            flush=True,
        )


def _run_check(args: argparse.Namespace) -> int:
    return _finish(Path(args.history), args, None)


def _run_tasks(args: argparse.Namespace) -> int:
    if Path(args.path).exists():
        print(f"dibs: error: {args.path} exists; give a fresh file", file=sys.stderr)
        return 2
    report = verify_tasks(
        args.path,
        store_url=args.store,
        workers=args.workers,
        jobs=args.jobs,
        duration=args.duration,
        plant=args.plant,
    )
    figures = report.to_json()
    if args.json:
        print(json.dumps(figures))
    else:
        for key, value in figures.items():
            print(f"{key}: {value}")
    return EXIT_ANOMALY if report.anomalies else EXIT_OK


def _finish(path: Path, args: argparse.Namespace, run_seconds: float | None) -> int:
    if not args.json and not getattr(args, "quiet", True):
        print("dibs verify: checking the history", file=sys.stderr, flush=True)
    history = read_history(path)
    gap = outage(history) if history.header.get("cluster") else None
    report = check_history(
        history,
        budget=args.budget,
        shrink_budget=args.shrink,
        max_witnesses=max(0, args.witnesses),
    )
    if args.report:
        written = write_report(history, report, args.report)
        print(f"dibs verify: report written to {written}", file=sys.stderr)
    if args.json:
        figures = report.to_json()
        if run_seconds is not None:
            figures["run_seconds"] = round(run_seconds, 3)
            figures["ops_per_second"] = round(report.operations / run_seconds, 1)
        if history.header.get("cluster"):
            figures["cluster"] = {**history.header["cluster"], "write_outage": gap}
        print(json.dumps(figures))
    else:
        if run_seconds is not None:
            print(
                f"ran {report.operations} ops in {run_seconds:.1f} s "
                f"({report.operations / run_seconds:.0f} ops/s)"
            )
        if history.header.get("cluster"):
            print(_cluster_line(history.header["cluster"], gap))
        print(report.render(limit=max(0, args.witnesses), log_limit=max(0, args.log_anomalies)))
    return _exit_code(report)


def _cluster_line(cluster: dict[str, Any], gap: dict[str, float] | None) -> str:
    kind = cluster.get("kind")
    line = f"cluster: {kind}"
    if kind == "etcd":
        line += f":{cluster.get('members')}"
    else:
        line += f", {cluster.get('replication')} replication"
        if cluster.get("lag"):
            line += f", standbys held {cluster['lag']:g} s behind before the failover"
    line += f"; faults {','.join(cluster.get('faults') or []) or 'none'}"
    if gap is not None:
        line += (
            f"\nwrite outage: {gap['after_kill']:.1f} s from the kill to the first acknowledged "
            f"write ({gap['from_last_write']:.1f} s since the last one before it)"
        )
    return line


def _exit_code(report: Report) -> int:
    if report.verdict == "anomaly":
        return EXIT_ANOMALY
    if report.verdict == "unknown":
        print("verdict unknown: a search ran out of time (raise --budget)", file=sys.stderr)
        return EXIT_INCONCLUSIVE
    return EXIT_OK
