"""Run the rush: start the workers, feed the progress view, sweep, then audit.

The parent process owns the store's lifecycle and the audit; the customers
run elsewhere — in spawned worker processes, each with its own connection, or
for ``memory://`` (which lives in one process) in a thread of this one. Every
worker reports on one events queue: ``ready``, one ``customer`` per finished
customer, ``failed`` for a crash, and ``done`` with its timings.
"""

from __future__ import annotations

import contextlib
import dataclasses
import multiprocessing
import queue
import random
import secrets
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import dibs
from dibs._model import SweepResult
from dibs.demo._audit import Check, audit_rush
from dibs.demo._customers import Outcome, Timings, serve_customers, work_in_process
from dibs.demo._plan import Customer, DemoConfig, Venue, plan_customers
from dibs.stores import redact
from dibs.stores.base import Store

__all__ = ["DEFAULT_FILE", "DEFAULT_URL", "DemoReport", "Observer", "run_demo"]

DEFAULT_FILE = "dibs-demo.db"
DEFAULT_URL = f"sqlite:///{DEFAULT_FILE}"
"""The demo's own store: a SQLite file in the working directory, recreated on every run."""


class Observer(Protocol):
    """Watches a run: the progress view implements it."""

    def phase(self, text: str) -> None:
        """The run moved to a new phase (starting workers, selling, auditing)."""

    def started(self, customers: int, venue: Venue) -> None:
        """The doors opened."""

    def customer_done(self, outcome: Outcome) -> None:
        """One customer finished."""


class _Quiet:
    def phase(self, text: str) -> None:
        pass

    def started(self, customers: int, venue: Venue) -> None:
        pass

    def customer_done(self, outcome: Outcome) -> None:
        pass


@dataclass(frozen=True, slots=True)
class DemoReport:
    """The result of one run: what was sold, how fast, and the audit."""

    store: str
    mode: str
    config: DemoConfig
    venue: Venue
    seconds: float
    counts: dict[str, int]
    throughput: dict[str, float]
    checks: list[Check]

    @property
    def passed(self) -> bool:
        """Whether every audit check passed."""
        return all(check.passed for check in self.checks)

    def to_json(self) -> dict[str, Any]:
        """The report as JSON-able data."""
        return {
            "passed": self.passed,
            "store": self.store,
            "mode": self.mode,
            "show": self.venue.show,
            "config": dataclasses.asdict(self.config),
            "seconds": round(self.seconds, 3),
            "counts": self.counts,
            "throughput": {k: round(v, 2) for k, v in self.throughput.items()},
            "checks": [dataclasses.asdict(check) for check in self.checks],
        }


@dataclass(slots=True)
class _Rush:
    outcomes: list[Outcome]
    timings: list[Timings]
    failures: list[str]
    began: float
    ended: float
    swept: int


def run_demo(
    config: DemoConfig, *, store: Store | None = None, observer: Observer | None = None
) -> DemoReport:
    """Run one ticket rush and audit it; the report says whether the audit passed.

    With ``store`` given, the customers run as threads against that store
    object (the caller keeps it open); otherwise the demo opens
    ``config.store`` (default: a fresh :data:`DEFAULT_URL`). Raises what
    :func:`dibs.open` raises for a bad URL or an unreachable store.
    """
    watch = observer if observer is not None else _Quiet()
    url = config.store or DEFAULT_URL
    owned = store is None
    if store is None:
        if config.store is None:
            _remove_default_file()
        store = dibs.open(url)
    try:
        in_process = not owned or config.processes == 0 or store.in_process
        rng = random.Random(config.seed)
        venue = Venue(config.seats, config.row_size, f"show-{secrets.token_hex(3)}")
        customers = plan_customers(config, rng)
        if in_process:
            callers = config.threads * max(1, config.processes)
            mode = f"{callers} threads in one process"
            rush = _in_threads(
                store, dataclasses.replace(config, threads=callers), venue, customers, watch
            )
        else:
            n = min(config.processes, len(customers))
            mode = f"{n} processes x {config.threads} threads"
            rush = _in_processes(store, url, config, venue, customers, watch)
        watch.phase("waiting for the last holds to expire")
        _wait_for_expiry(store, rush.outcomes)
        watch.phase("sweeping and auditing")
        final = store.sweep()
        checks, counts = audit_rush(store, venue, rush.outcomes, final, rush.failures)
        counts["swept_during_rush"] = rush.swept
        return DemoReport(
            store=redact(url if owned else f"{store.scheme}://"),
            mode=mode,
            config=config,
            venue=venue,
            seconds=rush.ended - rush.began,
            counts=counts,
            throughput=_throughput(rush),
            checks=checks,
        )
    finally:
        if owned:
            store.close()


def _remove_default_file() -> None:
    for suffix in ("", "-wal", "-shm", "-journal"):
        with contextlib.suppress(FileNotFoundError):
            Path(DEFAULT_FILE + suffix).unlink()


# --- the two ways to run the customers -----------------------------------------------------------


def _in_threads(
    store: Store, config: DemoConfig, venue: Venue, customers: list[Customer], watch: Observer
) -> _Rush:
    events: queue.Queue[tuple[Any, ...]] = queue.Queue()
    go = threading.Event()
    start = [0.0]

    def wait_for_start() -> float:
        go.wait()
        return start[0]

    def work() -> None:
        timings = Timings()
        try:
            timings = serve_customers(store, customers, config, venue, events, wait_for_start)
        except Exception:
            events.put(("failed", "customers", traceback.format_exc()))
        finally:
            events.put(("done", "customers", timings))

    thread = threading.Thread(target=work, name="dibs-demo-customers", daemon=True)
    thread.start()
    events.put(("ready", "customers"))

    def set_start(at: float) -> None:
        start[0] = at

    try:
        return _collect(
            store, config, events, 1, customers, venue, watch, go, set_start, thread.is_alive
        )
    finally:
        go.set()
        thread.join()


def _in_processes(
    store: Store,
    url: str,
    config: DemoConfig,
    venue: Venue,
    customers: list[Customer],
    watch: Observer,
) -> _Rush:
    ctx = multiprocessing.get_context("spawn")
    events = ctx.Queue()
    go = ctx.Event()
    start = ctx.Value("d", 0.0)
    n = min(config.processes, len(customers))
    workers = [
        ctx.Process(
            target=work_in_process,
            args=(url, customers[i::n], config, venue, events, go, start),
            name=f"dibs-demo-{i + 1}",
            daemon=True,
        )
        for i in range(n)
    ]
    watch.phase(f"starting {n} worker processes")
    for worker in workers:
        worker.start()

    def set_start(at: float) -> None:
        start.value = at

    try:
        return _collect(
            store,
            config,
            events,
            n,
            customers,
            venue,
            watch,
            go,
            set_start,
            lambda: any(w.is_alive() for w in workers),
        )
    finally:
        go.set()
        for worker in workers:
            worker.join(timeout=30)
            if worker.is_alive():
                worker.kill()
                worker.join()
        events.close()
        events.join_thread()


def _collect(
    store: Store,
    config: DemoConfig,
    events: Any,
    workers: int,
    customers: list[Customer],
    venue: Venue,
    watch: Observer,
    go: Any,
    set_start: Callable[[float], None],
    alive: Callable[[], bool],
) -> _Rush:
    """Open the doors once every worker is ready, then gather events until all are done."""
    outcomes: list[Outcome] = []
    timings: list[Timings] = []
    failures: list[str] = []
    ready = done = 0
    began = ended = time.time()
    sweeper: _Sweeper | None = None
    try:
        while done < workers:
            try:
                kind, *rest = events.get(timeout=0.25)
            except queue.Empty:
                if not alive():
                    failures.append(f"{workers - done} worker(s) exited without reporting")
                    break
                continue
            if kind == "customer":
                outcomes.append(rest[0])
                watch.customer_done(rest[0])
            elif kind == "ready":
                ready += 1
            elif kind == "failed":
                failures.append(f"{rest[0]}: {rest[1]}")
            elif kind == "done":
                done += 1
                timings.append(rest[1])
            if not go.is_set() and ready + done >= workers:
                # A short head start so every worker sees the doors open at one instant.
                began = time.time() + 0.05
                set_start(began)
                go.set()
                sweeper = _Sweeper(store, max(0.2, config.ttl / 2))
                watch.started(len(customers), venue)
                watch.phase("selling")
        ended = time.time()
    finally:
        swept = sweeper.stop(failures) if sweeper is not None else 0
    return _Rush(outcomes, timings, failures, began, ended, swept)


class _Sweeper:
    """Sweeps on a timer while customers claim, as a deployment would: both are safe together."""

    def __init__(self, store: Store, interval: float) -> None:
        self.store = store
        self.interval = interval
        self.expired = 0
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="dibs-demo-sweeper", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                result: SweepResult = self.store.sweep()
            except Exception as exc:
                self.errors.append(f"sweeper: {type(exc).__name__}: {exc}")
                return
            self.expired += result.expired

    def stop(self, failures: list[str]) -> int:
        self._stop.set()
        self._thread.join()
        failures.extend(self.errors)
        return self.expired


def _wait_for_expiry(store: Store, outcomes: list[Outcome]) -> None:
    """Sleep until every unpaid hold of the rush has expired on the store's clock."""
    pending = [o.expires_at for o in outcomes if o.expires_at is not None and not o.paid]
    if pending:
        wait = max(pending) - store.now().timestamp() + 0.05
        time.sleep(min(max(0.0, wait), 120.0))


def _throughput(rush: _Rush) -> dict[str, float]:
    finished = sorted(t for timing in rush.timings for t in timing.finished)
    latencies = sorted(x for timing in rush.timings for x in timing.latencies)
    seconds = max(rush.ended - rush.began, 1e-9)
    peak = _busiest_second(finished)
    return {
        "claims_per_second": len(finished) / seconds,
        "peak_claims_per_second": float(peak),
        "claim_p50_ms": _quantile(latencies, 0.50) * 1000,
        "claim_p99_ms": _quantile(latencies, 0.99) * 1000,
    }


def _busiest_second(times: list[float]) -> int:
    best = lo = 0
    for hi, t in enumerate(times):
        while times[lo] <= t - 1.0:
            lo += 1
        best = max(best, hi - lo + 1)
    return best


def _quantile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    return values[min(len(values) - 1, int(q * len(values)))]
