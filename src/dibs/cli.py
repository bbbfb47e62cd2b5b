"""The ``dibs`` command: one argparse subcommand per job (``demo``, ``sweep``, …).

Each subcommand is a ``_add_<name>(subparsers)`` function that declares its
arguments and sets ``run``, a function from the parsed arguments to an exit
code; add a command by adding one such function to :data:`_COMMANDS`. The
work itself lives in the library (``dibs.demo``, the stores); this module only
parses, dispatches and turns errors into exit codes.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence

import dibs
from dibs._cli_options import (
    STORE_DEFAULT,
    add_store_option,
    count,
    open_existing,
    positive_int,
    seconds,
    whole_number,
)
from dibs.demo import DEFAULT_URL, DemoConfig, run_demo
from dibs.demo._view import ProgressView, render_json, render_summary
from dibs.exceptions import (
    DibsError,
    InvalidInput,
    MissingExtra,
    StoreMisconfigured,
    StoreUnavailable,
)
from dibs.service._cli import add_commands as add_service_commands
from dibs.tasks._cli import add_jobs_command
from dibs.tasks._command import drain_seconds, load_app, run_worker
from dibs.verify._cli import add_verify_command

__all__ = ["main"]

EXIT_OK = 0
EXIT_FAILED = 1
"""The demo's audit failed, or the store could not do its job."""
EXIT_USAGE = 2
"""Bad arguments, a bad store URL, a store that cannot be opened as configured (a wrong
password, a missing database, directory or store), or an extra the command needs that is
not installed; argparse uses 2 as well."""


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``dibs`` command with ``argv`` (default ``sys.argv[1:]``); return the exit code."""
    parser = _parser()
    args = parser.parse_args(argv)
    run: Callable[[argparse.Namespace], int] | None = getattr(args, "run", None)
    if run is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    try:
        return run(args)
    except InvalidInput as exc:
        print(f"dibs: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except (StoreMisconfigured, MissingExtra) as exc:
        print(f"dibs: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except DibsError as exc:
        print(f"dibs: error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except OSError as exc:
        if exc.filename is None:
            raise
        # A file named on the command line (a history, a secret, a keys file): say
        # which and why, without a traceback.
        print(f"dibs: error: {exc.filename}: {exc.strerror}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("dibs: interrupted", file=sys.stderr)
        return 130


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dibs",
        description="Claim a named, indivisible thing exactly once.",
    )
    parser.add_argument("--version", action="version", version=f"dibs {dibs.__version__}")
    subparsers = parser.add_subparsers(title="commands", metavar="COMMAND")
    for add in _COMMANDS:
        add(subparsers)
    return parser


def _hold_seconds(text: str) -> float:
    value = seconds(text)
    if value > 60:
        raise argparse.ArgumentTypeError(f"expected at most 60 seconds, got {text!r}")
    return value


# --- dibs demo -----------------------------------------------------------------------------------


def _add_demo(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    d = DemoConfig()
    p = subparsers.add_parser(
        "demo",
        help="run a ticket rush against a store and audit the result",
        description=(
            "Sell a venue's seats to thousands of simulated customers racing in several "
            "processes: single seats and groups of adjacent seats, held for a short TTL, "
            "then paid, abandoned, paid too late, or retried with the same request ID. "
            "Then read everything back from the store, check that every promise held, and "
            "print the audit. Exits 1 if any audit check fails. Takes a few seconds."
        ),
        epilog=(
            f"Without --store the demo uses {DEFAULT_URL}: the file ./{DEFAULT_URL[10:]} "
            "(and its -wal/-shm files) is deleted and recreated at the start of every run, "
            "so reruns are clean. A store given with --store is never wiped: each run sells "
            "a fresh show, so earlier runs do not interfere. memory:// lives in one process, "
            "so with it the customers run as threads of this process. See docs/demo.md."
        ),
    )
    add_store_option(p, "store to rush", default_help=f"a fresh {DEFAULT_URL}")
    p.add_argument(
        "--seats",
        type=positive_int,
        default=d.seats,
        help=f"seats in the venue (default {d.seats})",
    )
    p.add_argument(
        "--row-size",
        type=positive_int,
        default=d.row_size,
        help=f"seats per row (default {d.row_size})",
    )
    p.add_argument(
        "--customers",
        type=positive_int,
        default=d.customers,
        help=f"simulated customers (default {d.customers})",
    )
    p.add_argument(
        "--processes",
        type=count,
        default=d.processes,
        help=f"worker processes (default {d.processes}); 0 runs the customers as threads "
        "in this process, as memory:// always does",
    )
    p.add_argument(
        "--threads",
        type=positive_int,
        default=d.threads,
        help=f"concurrent store calls per worker process (default {d.threads})",
    )
    p.add_argument(
        "--ttl", type=_hold_seconds, default=d.ttl, help=f"hold TTL in seconds (default {d.ttl:g})"
    )
    p.add_argument(
        "--seed", type=whole_number, help="seed for the customers' plan (races still vary)"
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON on stdout")
    p.add_argument("--no-progress", action="store_true", help="no live progress bar")
    p.set_defaults(run=_run_demo)


def _run_demo(args: argparse.Namespace) -> int:
    config = DemoConfig(
        store=args.store,
        seats=args.seats,
        row_size=args.row_size,
        customers=args.customers,
        processes=args.processes,
        threads=args.threads,
        ttl=args.ttl,
        seed=args.seed,
    )
    with ProgressView(enabled=not args.no_progress) as view:
        report = run_demo(config, observer=view)
    if args.json:
        render_json(report)
    else:
        render_summary(report)
    return EXIT_OK if report.passed else EXIT_FAILED


# --- dibs sweep ----------------------------------------------------------------------------------


def _add_sweep(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "sweep",
        help="expire dead holds and purge old request records, once",
        description=(
            "Mark holds whose TTL has passed as expired and purge request records and ended "
            "claims older than the store's retention. Safe to run at any time, alongside "
            "claims and other sweeps. Refuses (exit 2) a store that does not exist yet, "
            "rather than create an empty one."
        ),
    )
    add_store_option(p, "store to sweep")
    p.add_argument("--json", action="store_true", help="print the counts as JSON")
    p.set_defaults(run=_run_sweep)


def _run_sweep(args: argparse.Namespace) -> int:
    # Sweeping maintains a store; a URL with a typo must not make a new, empty one.
    store = open_existing(args.store, "sweep maintains")
    with store:
        result = store.sweep()
    counts = {
        "expired": result.expired,
        "purged_requests": result.purged_requests,
        "purged_claims": result.purged_claims,
    }
    if args.json:
        print(json.dumps(counts))
    else:
        print(
            f"expired {result.expired} dead holds, purged {result.purged_requests} request "
            f"records and {result.purged_claims} ended claims"
        )
    return EXIT_OK


# --- dibs doctor ---------------------------------------------------------------------------------


def _add_doctor(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "doctor",
        help="read a store's durability settings and say what could lose a claim",
        description=(
            "Connect to the store at URL, read its durability settings and print each one "
            "with what it can cost and the fix. PostgreSQL: fsync, full_page_writes, "
            "synchronous_commit, synchronous_standby_names against the streaming standbys. "
            "SQLite: journal mode and synchronous. memory://: nothing survives a restart. "
            "etcd: member count and quorum health. Exits 1 when a setting can lose an "
            "acknowledged claim, 0 otherwise (warnings included), 2 when the store cannot "
            "be read (misconfigured or unreachable)."
        ),
    )
    p.add_argument(
        "url",
        metavar="URL",
        nargs="?",
        help=f"the store's URL, as dibs.open takes it (default: {STORE_DEFAULT})",
    )
    p.add_argument(
        "--timeout",
        type=seconds,
        default=5.0,
        help="seconds to wait for each server (default 5)",
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(run=_run_doctor)


def _run_doctor(args: argparse.Namespace) -> int:
    from dibs.doctor import examine, print_report  # noqa: PLC0415 (only when asked)
    from dibs.stores import default_url  # noqa: PLC0415

    try:
        report = examine(args.url or default_url(), timeout=args.timeout)
    except StoreUnavailable as exc:
        # Nothing was read: 1 would say a setting can lose claims, which is not known.
        print(f"dibs: error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        print_report(report)
    return EXIT_FAILED if report.loses_data else EXIT_OK


# --- dibs worker ---------------------------------------------------------------------------------


def _add_worker(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "worker",
        help="run an application's task processor until SIGTERM",
        description=(
            "Import the application's dibs.tasks processor and run its workers: durable jobs "
            "and schedules on the store, and the store's expired-hold sweeper. SIGTERM or "
            "SIGINT stops taking jobs, lets running ones finish until the --timeout deadline, "
            "then cancels the rest (their jobs are taken over by other workers) and exits 0."
        ),
    )
    p.add_argument(
        "--app",
        metavar="MODULE:NAME",
        required=True,
        help="a TaskProcessor, or a function taking the store and returning one",
    )
    add_store_option(
        p, "store the workers run on, exported as $DIBS_URL before the app is imported"
    )
    p.add_argument(
        "--timeout",
        type=drain_seconds,
        default=30.0,
        help="seconds to drain running jobs after SIGTERM before cancelling them (default 30)",
    )
    p.add_argument(
        "--queue",
        dest="queues",
        action="append",
        metavar="NAME",
        help=(
            "take jobs only from this queue; repeat for several (default: the app's "
            "TaskProcessor(queues=...), else every queue)"
        ),
    )
    p.set_defaults(run=_run_worker)


def _run_worker(args: argparse.Namespace) -> int:
    run_worker(load_app(args.app, args.store, args.queues), args.timeout)
    return EXIT_OK


_COMMANDS: list[Callable[[argparse._SubParsersAction[argparse.ArgumentParser]], None]] = [
    _add_demo,
    _add_sweep,
    _add_doctor,
    _add_worker,
    add_jobs_command,  # jobs list|show|retry|cancel|purge (dibs.tasks)
    add_service_commands,  # serve, keys (dibs.service; needs the service extra only to run)
    add_verify_command,  # verify, verify check (dibs.verify)
]
