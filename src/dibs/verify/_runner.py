"""Run a workload: N clients x M ops against a store URL, with a nemesis, into one history.

memory:// clients are threads of this process sharing one store; every
other store gets one OS process per client (started with ``spawn``), each
with its own connection, writing its own event file. The nemesis runs here:

* ``kill`` — ``kill -9`` a random client process (memory://: the client
  thread dies in the middle of an op), record its op in flight as unknown,
  and restart it (a new incarnation, same holder name, no memory of its
  claims) with the ops it has left. On a server the dead client's backends
  are terminated and awaited first (found by their ``application_name``), so
  that the history says when its op in flight could last have taken effect;
* ``pause`` — ``SIGSTOP`` a random client for three hold TTLs, then
  ``SIGCONT`` (memory://: the thread stalls between invoking an op and
  reaching the store);
* ``skew`` — every client's own clock is off by ± ``skew`` seconds: it then
  believes holds live that are dead, and the reverse; the store must not care;
* ``integrity`` (SQLite) — after each kill, ``PRAGMA integrity_check``;
* ``terminate`` (PostgreSQL) — ``pg_terminate_backend`` every connection of
  the store's database but the runner's (needs ``admin_url``);
* ``restart`` (PostgreSQL) — restart the server, through a callable the
  caller passes (the runner cannot restart a server it does not run;
  :func:`command_restart` makes one from a shell command).

A ``plan`` (``dibs verify --cluster``, :mod:`dibs.verify._cluster_run`)
is a fault plan of its own, run on a thread beside the clients: it injects
faults into the cluster the store runs on and records them; when it returns,
the clients stop (each after its op in flight).

Afterwards the store's claims are dumped into the history for the log replay.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, quote, unquote, urlencode, urlsplit, urlunsplit

from dibs._extras import needs
from dibs.exceptions import InvalidInput, StoreUnavailable
from dibs.stores import store_class
from dibs.stores.base import Store
from dibs.verify._history import iter_events, write_events
from dibs.verify._log import dump_log
from dibs.verify._planted import (
    ALL_PLANTS,
    SkewedClock,
    open_planted,
    plant_class,
    rate_limit_class,
)
from dibs.verify._workload import (
    DRIVER_LOGGER,
    POOL_PREFIX,
    Client,
    Sweeper,
    Workload,
    client_skew,
    open_events,
)

__all__ = ["FAULTS", "command_restart", "run_workload"]

FAULTS = ("kill", "pause", "skew", "integrity", "terminate", "restart")

Progress = Callable[[int, int], None]

Record = Callable[[dict[str, Any]], None]
"""Records one nemesis event (``{"f": kind, ...}``); the runner stamps it."""

Plan = Callable[[Record, Callable[[], int]], None]
"""A fault plan: injects faults, records each, returns when the run should end.

Its second argument counts the ops the clients have invoked so far."""

STOP_FILE = "stop"
"""Created in the clients' directory when a plan ends: each client stops after its op."""


def _check(workload: Workload) -> type[Store]:
    cls = store_class(workload.store)
    unknown = set(workload.faults) - set(FAULTS)
    if unknown:
        raise InvalidInput(
            f"unknown fault(s) {sorted(unknown)}; faults: {', '.join(FAULTS)}",
            field="faults",
            value=workload.faults,
        )
    if (
        workload.plant is not None
        and workload.plant not in ALL_PLANTS
        and ":" not in workload.plant
    ):
        raise InvalidInput(
            f"unknown plant {workload.plant!r}; plants: {', '.join(ALL_PLANTS)}, "
            "or module:Class (a Store subclass with from_url)",
            field="plant",
            value=workload.plant,
        )
    if workload.plant is not None and ":" in workload.plant:
        plant_class(workload.plant)  # fail here, not in every client
    # The store says which faults beyond these apply to it (Store.verify_faults).
    allowed = {"kill", "pause", "skew"} | cls.verify_faults
    misplaced = set(workload.faults) - allowed
    if misplaced:
        raise InvalidInput(
            f"fault(s) {sorted(misplaced)} do not apply to {cls.scheme}:// "
            f"(it takes {', '.join(sorted(allowed))})",
            field="faults",
            value=workload.faults,
        )
    if "terminate" in workload.faults and not workload.admin_url:
        raise InvalidInput(
            "the terminate fault needs admin_url (--admin-url)", field="faults", value="terminate"
        )
    if workload.clients < 1 or workload.ops < 1:
        raise InvalidInput("clients and ops must be at least 1", field="clients", value=workload)
    if not workload.ttl_spread or workload.ttl * min(workload.ttl_spread) < 0.001:
        raise InvalidInput(
            "the shortest hold, ttl x min(ttl_spread), must be at least 0.001 s (the least TTL)",
            field="ttl_spread",
            value=workload.ttl_spread,
        )
    shortest = workload.ttl * min(workload.ttl_spread)
    if shortest + 1e-9 < cls.least_hold:
        raise InvalidInput(
            f"the shortest hold, ttl x min(ttl_spread) = {shortest:g} s, is below the "
            f"{cls.least_hold:g} s that {cls.scheme}:// keeps a hold at least (it would hold "
            f"longer than the history says); raise ttl (dibs verify uses ttl=2, "
            f"ttl_spread=(1, 2) there)",
            field="ttl",
            value=workload.ttl,
        )
    if workload.slots > 10:
        raise InvalidInput("at most 10 slots per resource", field="slots", value=workload.slots)
    return cls


def run_workload(
    workload: Workload,
    history: str | Path,
    *,
    progress: Progress | None = None,
    restart: Callable[[], None] | None = None,
    plan: Plan | None = None,
    header: dict[str, Any] | None = None,
) -> Path:
    """Run the workload and write its history (JSON lines) to ``history``; return the path.

    ``restart`` restarts the store's server, for the ``restart`` fault.
    ``plan`` runs beside the clients (see the module's text), and the run ends
    when it returns (or when the clients have done their ops, whichever is
    later). ``header`` adds fields to the history's header.
    Raises :class:`~dibs.InvalidInput` for bad settings, and
    :class:`RuntimeError` if a client process failed for a reason other than
    the nemesis (a harness failure, not a verdict).
    """
    cls = _check(workload)
    if "restart" in workload.faults and restart is None:
        raise InvalidInput(
            "the restart fault needs a way to restart the server: run_workload(restart=...), "
            "or --restart-command on the command line",
            field="faults",
            value="restart",
        )
    history = Path(history)
    scratch = history.with_name(history.name + ".clients")
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    nemesis: list[dict[str, Any]] = []
    pool_logger = logging.getLogger(DRIVER_LOGGER)
    counted = _PoolCount()
    pool_logger.addHandler(counted)
    propagate, pool_logger.propagate = pool_logger.propagate, False
    try:
        log: list[Any] | None
        if cls.in_process:  # memory://: clients are threads
            store = open_planted(workload.store, workload.plant)
            try:
                _run_threads(workload, store, scratch, nemesis, progress)
                log = _dump(store, workload.run)
            finally:
                store.close()
        else:
            # The schema is created once here, before the clients race to open it.
            plant = workload.plant if workload.plant and ":" in workload.plant else None
            with open_planted(workload.store, plant) as store:
                _run_processes(workload, store, scratch, nemesis, progress, restart, cls, plan)
                log = _dump(store, workload.run)
        notes = _client_logs(scratch, counted)
        _merge(workload, cls, scratch, nemesis, log, history, notes, header or {})
    finally:
        pool_logger.removeHandler(counted)
        pool_logger.propagate = propagate
        shutil.rmtree(scratch, ignore_errors=True)
    return history


class _PoolCount(logging.Handler):
    """Counts psycopg's warnings in the runner (a connection cut by a fault)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(f"{record.levelname} {record.getMessage()}")


def _client_logs(scratch: Path, counted: _PoolCount) -> list[dict[str, Any]]:
    """Summarise psycopg's lines of every process; pass any other stderr line through.

    The pool, and a connection whose rollback found it cut, log a warning each
    time a fault cuts a connection: hundreds per run, and expected. The history
    keeps their count and a few examples.
    """
    pool = list(counted.lines)
    for path in sorted(scratch.glob("*.err")):
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith(POOL_PREFIX):
                    pool.append(line[len(POOL_PREFIX) :].rstrip("\n"))
                elif line.strip():
                    sys.stderr.write(f"{path.stem}: {line}")
    if not pool:
        return []
    examples = list(dict.fromkeys(line[:200] for line in pool))[:3]
    return [{"e": "note", "about": "psycopg", "count": len(pool), "examples": examples}]


def _dump(store: Store, run: str) -> list[Any] | None:
    """This run's rows of the store's claim log, or None for a store whose log this
    module cannot read.

    Every name a run uses carries its ``run`` prefix; rows without it are an
    earlier run's (or real claims) and would read as claims nobody made.
    """
    try:
        rows = dump_log(store)
    except TypeError:
        return None
    mark = f"{run}-"
    return [row for row in rows if any(mark in str(target[1]) for target in row.targets)]


def _merge(
    workload: Workload,
    cls: type[Store],
    scratch: Path,
    nemesis: list[dict[str, Any]],
    log: list[Any] | None,
    history: Path,
    notes: list[dict[str, Any]],
    extra: dict[str, Any],
) -> None:
    with open(history, "w", encoding="utf-8") as out:
        header = {
            "e": "run",
            **workload.to_json(),
            "errors_settle": _errors_settle(workload, cls),
            "local_clock": cls.local_clock,
            "holds_outlive_ttl": cls.holds_outlive_ttl,
            "client_stamps": cls.client_stamps,
            **extra,
        }
        write_events(out, [header])
        for path in sorted(scratch.glob("*.jsonl")):
            with open(path, encoding="utf-8") as f:
                for line in f:
                    if line.endswith("\n"):  # a torn last line: the client died writing it
                        out.write(line)
        write_events(out, nemesis)
        write_events(out, notes)
        if log is not None:
            write_events(out, [row.to_json() for row in log] or [{"e": "log-empty"}])


def _errors_settle(workload: Workload, cls: type[Store]) -> bool:
    """Whether an error a client saw means the store had finished with its op.

    True for local stores (the client process does the writes) and for a
    server on this machine: the loopback never drops a connection, so an
    error there means the server closed it, and a PostgreSQL backend has
    committed or rolled back before it closes its connection. Across a
    network a connection can break while the server carries on.
    """
    if cls.local_clock:
        return True
    if "terminate" not in cls.verify_faults:
        return False  # the argument below is for servers whose sessions verify can end
    parts = urlsplit(workload.store)
    hosts = [h for k, v in parse_qsl(parts.query) if k == "host" for h in v.split(",")]
    hosts.append(parts.hostname or "")
    return all(h in ("", "localhost", "::1") or h.startswith(("/", "@", "127.")) for h in hosts)


def command_restart(command: str, url: str, patience: float = 120.0) -> Callable[[], None]:
    """A ``restart`` for the restart fault: run a shell command, then wait for the server.

    ``command`` restarts the server the store at ``url`` lives on (``systemctl
    restart postgresql``, say); afterwards the restart waits until ``url``
    accepts connections again. Raises :class:`~dibs.StoreUnavailable` if the
    command fails or the server does not come back within ``patience`` seconds.
    """

    def restart() -> None:
        with needs("postgres", "dibs verify on PostgreSQL"):
            import psycopg  # noqa: PLC0415 (the postgres extra)

        from dibs.stores.postgres import split_url  # noqa: PLC0415

        try:
            done = subprocess.run(
                command, shell=True, capture_output=True, text=True, timeout=patience, check=False
            )
        except subprocess.TimeoutExpired:
            raise StoreUnavailable(
                f"restart command {command!r} still running after {patience:g} s"
            ) from None
        if done.returncode != 0:
            raise StoreUnavailable(
                f"restart command {command!r} exited with {done.returncode}: "
                f"{(done.stderr or done.stdout).strip()[-500:]}"
            )
        conninfo = split_url(url)[0]
        deadline = time.monotonic() + patience
        while True:
            try:
                with psycopg.connect(conninfo, connect_timeout=5):
                    return
            except psycopg.OperationalError as exc:
                if time.monotonic() > deadline:
                    raise StoreUnavailable(
                        f"the server did not accept connections within {patience:g} s "
                        f"of the restart command: {exc}"
                    ) from exc
                time.sleep(0.1)

    return restart


def _stamp(event: dict[str, Any]) -> dict[str, Any]:
    event["t"] = time.monotonic()
    event["w"] = time.time()
    return event


# --- memory://: threads --------------------------------------------------------------------------


def _run_threads(
    workload: Workload,
    store: Store,
    scratch: Path,
    nemesis: list[dict[str, Any]],
    progress: Progress | None,
) -> None:
    crashes = [threading.Event() for _ in range(workload.clients)]
    pauses = [threading.Event() for _ in range(workload.clients)]
    done = [0] * workload.clients
    errors: list[BaseException] = []

    def client(index: int) -> None:
        fd = open_events(str(scratch / f"c{index}.jsonl"))
        if isinstance(store.clock, SkewedClock):
            store.clock.set_thread_skew(client_skew(workload, index))
        skew = client_skew(workload, index) if "skew" in workload.faults else 0.0
        incarnation = 0
        try:
            while done[index] < workload.ops:
                c = Client(
                    workload,
                    index,
                    incarnation,
                    store,
                    fd,
                    skew=skew,
                    crash=crashes[index],
                    pause=pauses[index],
                    rate_limit=rate_limit_class(workload.plant),
                )
                while done[index] < workload.ops:
                    alive = c.step()
                    done[index] += 1
                    if not alive:
                        break
                incarnation += 1
        except BaseException as exc:
            errors.append(exc)
        finally:
            os.close(fd)

    threads = [
        threading.Thread(target=client, args=(i,), daemon=True) for i in range(workload.clients)
    ]
    for t in threads:
        t.start()
    sweeper = None
    if workload.sweep_interval:
        sweeper = threading.Thread(
            target=_sweep_thread,
            args=(workload, store, scratch, lambda: not any(t.is_alive() for t in threads), errors),
            daemon=True,
        )
        sweeper.start()
    rng = random.Random(workload.seed)
    next_fault = time.monotonic() + workload.fault_interval
    while any(t.is_alive() for t in threads):
        time.sleep(0.02)
        if progress is not None:
            progress(sum(done), workload.clients * workload.ops)
        if time.monotonic() < next_fault:
            continue
        next_fault += workload.fault_interval
        victim = rng.randrange(workload.clients)
        if "kill" in workload.faults:
            crashes[victim].set()
            nemesis.append(_stamp({"e": "nemesis", "f": "kill", "c": f"c{victim}"}))
        if "pause" in workload.faults:
            other = rng.randrange(workload.clients)
            pauses[other].set()
            nemesis.append(_stamp({"e": "nemesis", "f": "pause", "c": f"c{other}"}))
    for t in threads:
        t.join()
    if sweeper is not None:
        sweeper.join()
    if errors:
        raise RuntimeError(f"a client thread failed: {errors[0]!r}") from errors[0]


def _sweep_thread(
    workload: Workload,
    store: Store,
    scratch: Path,
    stopped: Callable[[], bool],
    errors: list[BaseException],
) -> None:
    fd = open_events(str(scratch / "sweeper.jsonl"))
    try:
        Sweeper(workload, store, fd).run(stopped)
    except BaseException as exc:
        errors.append(exc)
    finally:
        os.close(fd)


# --- other stores: processes ---------------------------------------------------------------------


class _Slot:
    """One client across its incarnations: the live process and its event files."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.incarnation = 0
        self.process: subprocess.Popen[bytes] | None = None
        self.files: list[Path] = []
        self.started = 0.0

    def ripe(self) -> bool:
        """Alive and past its start-up: faults on a client still importing would starve it."""
        if self.process is None or self.process.poll() is not None or not self.files:
            return False
        path = self.files[-1]
        return path.exists() and path.stat().st_size > 0

    def invoked(self) -> int:
        return sum(
            1 for path in self.files if path.exists() for e in iter_events(path) if e["e"] == "i"
        )


def _run_processes(
    workload: Workload,
    store: Store,
    scratch: Path,
    nemesis: list[dict[str, Any]],
    progress: Progress | None,
    restart: Callable[[], None] | None,
    cls: type[Store],
    plan: Plan | None = None,
) -> None:
    settings = {**asdict(workload), "admin_url": None}
    slots = [_Slot(i) for i in range(workload.clients)]
    planner = None if plan is None else _Planner(plan, nemesis, scratch)

    def start(slot: _Slot, count: int) -> None:
        path = scratch / f"c{slot.index}.{slot.incarnation}.jsonl"
        slot.files.append(path)
        slot.started = time.monotonic()
        # A fresh interpreter per client: no state inherited, and kill -9 kills only it.
        # Its connections to a server carry its name, so that its backends can be found.
        with open(path.with_suffix(".err"), "wb") as err:
            slot.process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "dibs.verify._client",
                    json.dumps({**settings, "store": _client_url(workload, slot, cls)}),
                    str(slot.index),
                    str(slot.incarnation),
                    str(count),
                    str(path),
                ],
                stderr=err,
            )

    for slot in slots:
        start(slot, workload.ops)
    sweeper: subprocess.Popen[bytes] | None = None
    sweeper_path = scratch / "sweeper.jsonl"
    if workload.sweep_interval:
        # Not a target of the nemesis: it stands for the server's own sweeper.
        config = json.dumps({**settings, "store": workload.store})
        argv = [sys.executable, "-m", "dibs.verify._client", config, "-1", "0", "0"]
        with open(sweeper_path.with_suffix(".err"), "wb") as err:
            sweeper = subprocess.Popen([*argv, str(sweeper_path)], stderr=err)
    counter = _Counter()
    rng = random.Random(workload.seed)
    next_fault = time.monotonic() + workload.fault_interval
    rounds = 0
    if planner is not None:
        planner.start()
    try:
        while True:
            if planner is not None:
                planner.check()
            for s in slots:
                p = s.process
                if p is not None and p.poll() not in (0, None):
                    raise RuntimeError(f"client c{s.index} exited with {p.returncode}")
            alive = [s for s in slots if s.process is not None and s.process.poll() is None]
            if not alive:
                break
            time.sleep(0.02)
            if progress is not None:
                progress(counter.count(scratch), workload.clients * workload.ops)
            if time.monotonic() < next_fault:
                continue
            next_fault += workload.fault_interval
            ripe = [s for s in alive if s.ripe()]
            if "kill" in workload.faults and ripe:
                _kill(rng.choice(ripe), workload, nemesis, store, start, cls)
            ripe = [s for s in slots if s.ripe()]
            if "pause" in workload.faults and ripe:
                _pause(rng.choice(ripe), workload, nemesis)
            if "terminate" in workload.faults and workload.admin_url:
                _terminate(workload.admin_url, workload.store, nemesis)
            rounds += 1
            every = max(1, workload.restart_every)
            if "restart" in workload.faults and restart is not None and rounds % every == 0:
                restart()
                nemesis.append(_stamp({"e": "nemesis", "f": "restart"}))
        if planner is not None:
            planner.join()
        if sweeper is not None:
            Path(str(sweeper_path) + ".stop").touch()
            with contextlib.suppress(subprocess.TimeoutExpired):
                sweeper.wait(timeout=60)
            if sweeper.returncode not in (0, None):
                raise RuntimeError(f"the sweeper exited with {sweeper.returncode}")
    finally:
        if planner is not None:
            planner.stop.touch()
        for s in slots:
            if s.process is not None and s.process.poll() is None:
                s.process.send_signal(signal.SIGCONT)
                s.process.kill()
                s.process.wait()
        if sweeper is not None and sweeper.poll() is None:
            sweeper.kill()
            sweeper.wait()
            if sweeper_path.exists():
                _close_in_flight(sweeper_path, _stamp({}))


class _Planner:
    """A fault plan on a thread; when it returns, the clients are told to stop."""

    def __init__(self, plan: Plan, nemesis: list[dict[str, Any]], scratch: Path) -> None:
        self.plan = plan
        self.nemesis = nemesis
        self.scratch = scratch
        self.stop = scratch / STOP_FILE
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="dibs-verify-plan", daemon=True)

    def _run(self) -> None:
        try:
            counter = _Counter()  # its own: the main loop's is not shared across threads
            self.plan(
                lambda event: self.nemesis.append(_stamp({"e": "nemesis", **event})),
                lambda: counter.count(self.scratch),
            )
        except BaseException as exc:
            self.error = exc
        finally:
            self.stop.touch()

    def start(self) -> None:
        self.thread.start()

    def check(self) -> None:
        if self.error is not None:
            raise RuntimeError(f"the fault plan failed: {self.error!r}") from self.error

    def join(self) -> None:
        self.thread.join()
        self.check()


class _Counter:
    """Counts the invocations in the clients' event files, reading only what is new."""

    def __init__(self) -> None:
        self.offsets: dict[Path, int] = {}
        self.total = 0

    def count(self, scratch: Path) -> int:
        for path in scratch.glob("c*.jsonl"):
            offset = self.offsets.get(path, 0)
            try:
                with open(path, "rb") as f:
                    f.seek(offset)
                    chunk = f.read()
            except OSError:
                continue
            # Count whole lines only; a torn one is counted when it is complete.
            chunk = chunk[: chunk.rfind(b"\n") + 1]
            self.offsets[path] = offset + len(chunk)
            self.total += chunk.count(b'"e":"i"')
        return self.total


def _kill(
    slot: _Slot,
    workload: Workload,
    nemesis: list[dict[str, Any]],
    store: Store,
    start: Callable[[_Slot, int], None],
    cls: type[Store],
) -> None:
    process = slot.process
    assert process is not None
    process.kill()  # SIGKILL
    process.wait()
    killed = _stamp({"e": "nemesis", "f": "kill", "c": f"c{slot.index}"})
    nemesis.append(killed)
    # The op in flight (invoked, never completed) is unknown from the moment of
    # death: a local store's writes die with the process. A server may still be
    # running it, so the op stays open until the client's backends are gone.
    settled = None
    if "terminate" in cls.verify_faults:  # the server may still run the op: end its session
        settled = _settle(workload, _app_name(workload, slot), nemesis)
    path = slot.files[-1]
    if path.exists():
        _close_in_flight(path, killed if settled is None else settled, settled is not None)
    if "integrity" in workload.faults:
        result = store.integrity_check() or "not supported"
        nemesis.append(_stamp({"e": "nemesis", "f": "integrity_check", "result": result}))
    slot.process = None
    left = workload.ops - slot.invoked()
    if left > 0:
        slot.incarnation += 1
        start(slot, left)


def _app_name(workload: Workload, slot: _Slot) -> str:
    return f"dibs-verify-{workload.run}-c{slot.index}.{slot.incarnation}"


def _client_url(workload: Workload, slot: _Slot, cls: type[Store]) -> str:
    """The store URL one client incarnation opens: on PostgreSQL, named after it."""
    if "terminate" not in cls.verify_faults:
        return workload.store  # another store's URL may not take application_name
    parts = urlsplit(workload.store)
    query = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True)]
    query = [(k, v) for k, v in query if k != "application_name"]
    query.append(("application_name", _app_name(workload, slot)))
    return urlunsplit(parts._replace(query=urlencode(query, quote_via=quote)))


def _settle(
    workload: Workload, app_name: str, nemesis: list[dict[str, Any]], patience: float = 30.0
) -> dict[str, Any] | None:
    """End the server side of a killed client: terminate its backends, wait until they are gone.

    Afterwards nothing the client sent can still take effect, which bounds
    the window of its op in flight. Returns the stamped ``settle`` event, or
    None if that could not be established (the op then stays open to the end).
    """
    with needs("postgres", "dibs verify on PostgreSQL"):
        import psycopg  # noqa: PLC0415 (the postgres extra)

    from dibs.stores.postgres import split_url  # noqa: PLC0415

    conninfo = workload.admin_url or split_url(workload.store)[0]
    deadline = time.monotonic() + patience
    terminated: int | None = None
    try:
        with psycopg.connect(conninfo, autocommit=True) as conn:
            while time.monotonic() < deadline:
                (left,) = conn.execute(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                    "WHERE application_name = %s AND pid <> pg_backend_pid()",
                    (app_name,),
                ).fetchone() or (0,)
                if terminated is None:
                    terminated = int(left)
                if left == 0:
                    event = _stamp(
                        {
                            "e": "nemesis",
                            "f": "settle",
                            "application_name": app_name,
                            "terminated": terminated,
                        }
                    )
                    nemesis.append(event)
                    return event
                time.sleep(0.005)
    except psycopg.Error:
        pass  # no right to terminate, or the server is down: leave the op open
    return None


def _close_in_flight(path: Path, killed: dict[str, Any], settled: bool = False) -> None:
    open_ids: dict[str, None] = {}
    with open(path, encoding="utf-8") as f:
        text = f.read()
    if text and not text.endswith("\n"):
        # Drop the torn line so the file stays valid JSON lines.
        text = text[: text.rfind("\n") + 1]
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
    for line in text.splitlines():
        event = json.loads(line)
        if event["e"] == "i":
            open_ids[event["id"]] = None
        else:
            open_ids.pop(event["id"], None)
    with open(path, "a", encoding="utf-8") as f:
        write_events(
            f,
            [
                {
                    "e": "unknown",
                    "id": op_id,
                    "v": {"error": "killed", "settled": True} if settled else {"error": "killed"},
                    "t": killed["t"],
                    "w": killed["w"],
                }
                for op_id in open_ids
            ],
        )


def _pause(slot: _Slot, workload: Workload, nemesis: list[dict[str, Any]]) -> None:
    process = slot.process
    assert process is not None
    process.send_signal(signal.SIGSTOP)
    nemesis.append(_stamp({"e": "nemesis", "f": "stop", "c": f"c{slot.index}"}))
    time.sleep(workload.ttl * 3)  # longer than any hold's TTL
    process.send_signal(signal.SIGCONT)
    nemesis.append(_stamp({"e": "nemesis", "f": "cont", "c": f"c{slot.index}"}))


def _terminate(admin_url: str, store_url: str, nemesis: list[dict[str, Any]]) -> None:
    """Cut every client connection to the store's database (PostgreSQL)."""
    with needs("postgres", "dibs verify on PostgreSQL"):
        import psycopg  # noqa: PLC0415 (the postgres extra)

    dbname = unquote(urlsplit(store_url).path.lstrip("/"))
    with psycopg.connect(admin_url, autocommit=True) as admin:
        rows = admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = %s AND pid <> pg_backend_pid() AND backend_type = 'client backend'",
            (dbname,),
        ).fetchall()
    nemesis.append(_stamp({"e": "nemesis", "f": "terminate", "connections": len(rows)}))
