"""Entry point of one client process: ``python -m dibs.verify._client CONFIG INDEX INC COUNT PATH``.

``INDEX`` -1 is the sweeper: it sweeps until the file ``PATH.stop`` exists.
Kept apart from the runner so that the runner is never imported as ``__main__``.
"""

from __future__ import annotations

import json
import os
import random
import sys
import threading
import time
from typing import Any

from dibs.exceptions import StoreUnavailable
from dibs.stores.base import Store
from dibs.verify._planted import open_planted, rate_limit_class
from dibs.verify._workload import (
    Client,
    Sweeper,
    Workload,
    client_skew,
    mark_pool_logs,
    open_events,
)

__all__ = ["client_process", "workload_from_json"]


def _open_when_reachable(workload: Workload, skew: float, patience: float = 60.0) -> Store:
    """Open the store, waiting out an outage (a client restarted mid server restart)."""
    deadline = time.monotonic() + patience
    delay = 0.05
    while True:
        try:
            return open_planted(workload.store, workload.plant, skew=skew)
        except StoreUnavailable:
            if time.monotonic() + delay > deadline:
                raise
            time.sleep(random.uniform(0, delay))  # full jitter
            delay = min(delay * 2, 1.0)


def workload_from_json(config: dict[str, Any]) -> Workload:
    """The workload back from ``dataclasses.asdict`` sent as JSON (tuples came back lists)."""
    config = dict(config)
    config["faults"] = tuple(config["faults"])
    config["mix"] = tuple((str(k), float(w)) for k, w in config["mix"])
    config["ttl_spread"] = tuple(config["ttl_spread"])
    return Workload(**config)


def client_process(
    config: dict[str, Any], index: int, incarnation: int, count: int, path: str
) -> None:
    """Body of one client process (``python -m dibs.verify._client CONFIG INDEX ...``)."""
    parent = os.getppid()

    def orphaned() -> None:
        # Die with the runner: a client left behind would keep writing to the store.
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=orphaned, daemon=True).start()
    mark_pool_logs()
    workload = workload_from_json(config)
    if index < 0:
        store = _open_when_reachable(workload, 0.0)
        fd = open_events(path)
        try:
            stop = path + ".stop"
            Sweeper(workload, store, fd, incarnation).run(lambda: os.path.exists(stop))
        finally:
            os.close(fd)
            store.close()
        return
    skew = client_skew(workload, index)
    store = _open_when_reachable(workload, skew)
    fd = open_events(path)
    stop = os.path.join(os.path.dirname(path), "stop")  # the runner's STOP_FILE
    try:
        Client(
            workload,
            index,
            incarnation,
            store,
            fd,
            skew=skew if "skew" in workload.faults else 0.0,
            rate_limit=rate_limit_class(workload.plant),
        ).run(count, lambda: os.path.exists(stop))
    finally:
        os.close(fd)
        store.close()


if __name__ == "__main__":
    client_process(
        json.loads(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
    )
