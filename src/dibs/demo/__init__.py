"""``dibs demo``: a ticket rush against a real store, then an audit of what everyone was told.

Thousands of simulated customers race for a few hundred seats — single seats
and groups of adjacent seats claimed all-or-nothing — hold them with a short
TTL, then pay, walk away, pay too late, or retry a request whose answer they
never saw. The audit reads the store back and checks every promise dibs makes;
:func:`run_demo` returns the report and ``dibs demo`` exits non-zero if any
check failed. See ``docs/demo.md``.
"""

from dibs.demo._audit import Check
from dibs.demo._customers import Outcome
from dibs.demo._plan import Behaviour, DemoConfig, Venue
from dibs.demo._rush import DEFAULT_FILE, DEFAULT_URL, DemoReport, Observer, run_demo

__all__ = [
    "DEFAULT_FILE",
    "DEFAULT_URL",
    "Behaviour",
    "Check",
    "DemoConfig",
    "DemoReport",
    "Observer",
    "Outcome",
    "Venue",
    "run_demo",
]
