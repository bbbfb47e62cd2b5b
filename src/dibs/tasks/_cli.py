"""``dibs jobs``: list, show, retry, cancel and purge the durable jobs of a store.

Every subcommand only reads or maintains a store, so each refuses a store
that does not exist rather than create an empty one. The work is the job
table's (:mod:`dibs.stores.jobs`); this module parses, prints and picks the
exit code.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

import dibs
from dibs._cli_options import add_store_option, open_existing
from dibs._model import shown
from dibs.exceptions import InvalidInput
from dibs.stores import default_url
from dibs.stores.jobs import FINISHED_STATES, LIVE_STATES, Job, JobTable
from dibs.tasks._jobs import job_table
from dibs.tasks._options import check_id, check_limit

__all__ = ["add_jobs_command"]

STATES = (*LIVE_STATES, *FINISHED_STATES)
EXIT_OK, EXIT_FAILED = 0, 1


def add_jobs_command(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``dibs jobs`` and its subcommands to the ``dibs`` parser."""
    jobs = subparsers.add_parser(
        "jobs",
        help="list, show, retry, cancel and purge durable jobs",
        description=(
            "Inspect and maintain the durable jobs (dibs.tasks) of a SQLite or PostgreSQL "
            "store. Each subcommand refuses a store that does not exist."
        ),
    )
    commands = jobs.add_subparsers(title="subcommands", metavar="SUBCOMMAND")

    p = commands.add_parser("list", help="list jobs, filtered by state, queue and task")
    _common(p)
    p.add_argument("--state", action="append", choices=STATES, help="only this state (repeat)")
    p.add_argument(
        "--queue", action="append", type=_name, metavar="NAME", help="only this queue (repeat)"
    )
    p.add_argument("--task", type=_name, metavar="NAME", help="only jobs of this task")
    p.add_argument(
        "--limit", type=_limit, default=100, metavar="N", help="at most N jobs, earliest due "
        "first: N from 1 to 2**63 - 1, or 'all' (default 100)",
    )  # fmt: skip
    p.set_defaults(run=_run_list)

    p = commands.add_parser("show", help="show one job with its attempts")
    _common(p)
    p.add_argument("job_id", type=_name, metavar="JOB_ID")
    p.set_defaults(run=_run_show)

    p = commands.add_parser(
        "retry", help="run failed or cancelled jobs again",
        description="Make failed or cancelled jobs pending again, due now, with their "
        "retries restored. Exits 1 if any job was not failed or cancelled.",
    )  # fmt: skip
    _common(p)
    p.add_argument("job_ids", type=_name, metavar="JOB_ID", nargs="+")
    p.set_defaults(run=_run_retry)

    p = commands.add_parser(
        "cancel", help="cancel pending jobs, ask running ones to stop",
        description="A pending job is cancelled and never runs; a running one has its "
        "cancellation requested, which its worker sees at its next heartbeat. Exits 1 if "
        "any job had already finished or does not exist.",
    )  # fmt: skip
    _common(p)
    p.add_argument("job_ids", type=_name, metavar="JOB_ID", nargs="+")
    p.set_defaults(run=_run_cancel)

    p = commands.add_parser(
        "purge", help="delete finished jobs",
        description="Delete finished jobs (done, failed, cancelled) and their results: the "
        "ones given, or else every finished job older than --older-than seconds (default: "
        "each job's own retention, else the store's request retention). Pending and "
        "running jobs are never deleted.",
    )  # fmt: skip
    _common(p)
    p.add_argument("job_ids", type=_name, metavar="JOB_ID", nargs="*")
    p.add_argument("--older-than", type=_seconds, metavar="SECONDS", help="finished longer ago")
    p.add_argument(
        "--state", action="append", choices=FINISHED_STATES, help="only this state (repeat)"
    )
    p.add_argument(
        "--queue", action="append", type=_name, metavar="NAME", help="only this queue (repeat)"
    )
    p.set_defaults(run=_run_purge)

    jobs.set_defaults(run=lambda args: _usage(jobs))


def _common(p: argparse.ArgumentParser) -> None:
    add_store_option(p, "store whose jobs to read or maintain (must exist)")
    p.add_argument("--json", action="store_true", help="print JSON")


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help()
    return 2


def _limit(text: str) -> int | None:
    """``--limit``: what ``jobs(limit=)`` takes, with its message; ``all`` for None."""
    if text.strip().lower() == "all":
        return None
    try:
        value: object = int(text)
    except ValueError:
        value = text
    try:
        return check_limit(value)
    except InvalidInput:
        raise argparse.ArgumentTypeError(
            f"expected a whole number from 1 to 2**63 - 1, or all, got {shown(text)}"
        ) from None


def _name(text: str) -> str:
    """A queue, task or job name as the API takes it (non-empty, at most the store's length)."""
    try:
        return check_id(text, "name")
    except InvalidInput as exc:
        shown = text if len(text) <= 40 else text[:40] + "..."
        raise argparse.ArgumentTypeError(f"bad name {shown!r}: {exc.args[0]}") from None


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 <= value < math.inf:
        raise argparse.ArgumentTypeError(f"expected seconds >= 0, got {text!r}")
    return value


# --- opening only a store that exists --------------------------------------------------------


@contextmanager
def _existing_table(url: str | None) -> Iterator[tuple[dibs.Store, JobTable]]:
    """The store at ``url`` and its job table; refuses a store that does not exist.

    Raises :class:`~dibs.InvalidInput` for memory:// (it holds no other
    process's jobs) and :class:`~dibs.StoreMisconfigured` where no store exists.
    """
    if (url or default_url()).partition(":")[0].lower() == "memory":
        raise InvalidInput(
            "memory:// lives inside one process and holds no jobs another can see; "
            "give --store a sqlite:// or postgresql:// URL",
            field="store", value=url or default_url(),
        )  # fmt: skip
    store = open_existing(url, "dibs jobs reads and maintains")
    try:
        yield store, job_table(store)
    finally:
        store.close()


# --- the subcommands -------------------------------------------------------------------------


def _run_list(args: argparse.Namespace) -> int:
    with _existing_table(args.store) as (_, table):
        rows = table.find(states=args.state, queues=args.queue, name=args.task, limit=args.limit)
    if args.json:
        print(json.dumps([_summary(job) for job in rows], indent=2))
        return EXIT_OK
    header = ("ID", "TASK", "QUEUE", "PRI", "STATE", "ATTEMPT", "DUE / FINISHED (UTC)")
    lines = [
        (job.id, job.name, job.queue, str(job.priority), job.state,
         f"{job.attempt}/{job.max_attempts}", _iso(job.finished_at or job.run_at))
        for job in rows
    ]  # fmt: skip
    _table([header, *lines])
    print(f"{len(rows)} job(s)")
    return EXIT_OK


def _run_show(args: argparse.Namespace) -> int:
    with _existing_table(args.store) as (_, table):
        job = table.get(args.job_id)
    if job is None:
        print(f"dibs: error: no job {args.job_id!r} (never added, or purged)", file=sys.stderr)
        return EXIT_FAILED
    detail = _detail(job)
    if args.json:
        print(json.dumps(detail, indent=2))
        return EXIT_OK
    for name, value in detail.items():
        if name not in ("attempts", "error", "result"):
            print(f"{name + ':':<19}{'' if value is None else value}")
    print(f"{'result:':<19}{json.dumps(detail['result'])}")
    print("attempts:")
    rows: list[tuple[str, ...]] = [("#", "HOLDER", "STARTED (UTC)", "ENDED (UTC)", "OUTCOME")]
    for attempt in detail["attempts"]:
        rows.append(
            (str(attempt["attempt"]), attempt["holder"] or "", attempt["started_at"] or "",
             attempt["ended_at"], attempt["outcome"])
        )  # fmt: skip
    if job.state == "running":
        rows.append((str(job.attempt), job.holder or "", _iso(job.started_at), "", "running"))
    _table(rows, indent="  ")
    if detail["error"]:
        print("last error:")
        print("  " + detail["error"].rstrip().replace("\n", "\n  "))
    return EXIT_OK


def _run_retry(args: argparse.Namespace) -> int:
    return _each(args, lambda table, job_id: table.retry(job_id), "retried", "not failed or "
                 "cancelled (or no such job)")  # fmt: skip


def _run_cancel(args: argparse.Namespace) -> int:
    return _each(args, lambda table, job_id: table.cancel(job_id), "cancelled or asked to stop",
                 "already finished (or no such job)")  # fmt: skip


def _each(args: argparse.Namespace, act: Callable[[JobTable, str], bool], yes: str, no: str) -> int:
    with _existing_table(args.store) as (_, table):
        done = {job_id: act(table, job_id) for job_id in args.job_ids}
    if args.json:
        print(json.dumps(done))
    else:
        for job_id, ok in done.items():
            print(f"{job_id}: {yes if ok else no}")
    return EXIT_OK if all(done.values()) else EXIT_FAILED


def _run_purge(args: argparse.Namespace) -> int:
    with _existing_table(args.store) as (store, table):
        if args.job_ids:
            if args.older_than is not None or args.state or args.queue:
                raise InvalidInput(
                    "give job IDs or filters (--older-than, --state, --queue), not both",
                    field="job_ids", value=args.job_ids,
                )  # fmt: skip
            deleted = table.delete(args.job_ids)
        elif args.older_than is not None:
            # An explicit age wins over each job's own retention: purge by finished_at only.
            now = store.now().timestamp()
            deleted = _purge_older(table, now - args.older_than, args.state, args.queue)
        else:
            deleted = table.purge(store.request_retention, states=args.state, queues=args.queue)
    if args.json:
        print(json.dumps({"deleted": deleted}))
    else:
        print(f"deleted {deleted} finished job(s)")
    return EXIT_OK


def _purge_older(
    table: JobTable, before: float, states: Sequence[str] | None, queues: Sequence[str] | None
) -> int:
    """Delete finished jobs that finished before ``before`` (the store's clock)."""
    finished = table.find(states=states or FINISHED_STATES, queues=queues)
    # delete() re-checks that each is finished: a job retried meanwhile is kept.
    old = [j.id for j in finished if j.finished_at is not None and j.finished_at < before]
    return table.delete(old) if old else 0


# --- printing --------------------------------------------------------------------------------


def _iso(epoch: float | None) -> str:
    if epoch is None:
        return ""
    return datetime.fromtimestamp(epoch, UTC).isoformat(timespec="milliseconds")


def _summary(job: Job) -> dict[str, Any]:
    return {
        "id": job.id, "task": job.name, "queue": job.queue, "priority": job.priority,
        "state": job.state, "attempt": job.attempt, "max_attempts": job.max_attempts,
        "run_at": _iso(job.run_at), "finished_at": _iso(job.finished_at) or None,
    }  # fmt: skip


def _detail(job: Job) -> dict[str, Any]:
    try:
        args, kwargs = json.loads(job.args)
    except (TypeError, ValueError):
        args, kwargs = job.args, None
    result = None
    if job.state == "done" and job.outcome is not None:
        result = json.loads(job.outcome)
    return {
        **_summary(job),
        "key": job.key, "lock_key": job.lock_key, "schedule": job.schedule_id,
        "args": json.dumps(args), "kwargs": json.dumps(kwargs),
        "enqueued_at": _iso(job.enqueued_at) or None,
        "holder": job.holder, "cancel_requested": job.cancel_requested,
        "retention": job.retention,
        "result": result,
        "error": job.outcome if job.outcome_kind == "error" else None,
        "attempts": [
            {"attempt": a.attempt, "holder": a.holder, "started_at": _iso(a.started_at) or None,
             "ended_at": _iso(a.ended_at), "outcome": a.outcome_kind}
            for a in job.attempts
        ],
    }  # fmt: skip


def _table(rows: list[tuple[str, ...]], indent: str = "") -> None:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print(
            indent + "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        )
