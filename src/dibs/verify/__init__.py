"""Jepsen-style verification of a dibs store: record a history under faults, then check it.

>>> from dibs.verify import Workload, run_workload, read_history, check_history
>>> workload = Workload("memory://", clients=4, ops=200)
>>> path = run_workload(workload, "history.jsonl")  # doctest: +SKIP
>>> report = check_history(read_history(path))  # doctest: +SKIP
>>> report.verdict  # doctest: +SKIP
'ok'

Two checkers read the history: a per-resource linearizability search against a
pure model of the claim rules (:mod:`dibs.verify._linear`), and an O(n)
replay of the store's own claim log in fence order (:mod:`dibs.verify._log`).
``dibs verify`` runs both from the command line, and
:func:`write_report` draws a checked history as one offline HTML page;
docs/reliability.md says what they prove and what they cannot.
:mod:`dibs.verify.harness` starts the throwaway PostgreSQL, Patroni and etcd
servers that ``dibs verify --cluster`` (and dibs's own tests) run on.
"""

from dibs.verify._check import Report, check_history
from dibs.verify._history import History, LogRow, Op, read_history
from dibs.verify._planted import PLANTS, REPLAY_PLANTS, open_planted
from dibs.verify._report import write_report
from dibs.verify._runner import FAULTS, run_workload
from dibs.verify._tasks import TaskReport, verify_tasks
from dibs.verify._workload import Workload

__all__ = [
    "FAULTS",
    "PLANTS",
    "REPLAY_PLANTS",
    "History",
    "LogRow",
    "Op",
    "Report",
    "TaskReport",
    "Workload",
    "check_history",
    "open_planted",
    "read_history",
    "run_workload",
    "verify_tasks",
    "write_report",
]
