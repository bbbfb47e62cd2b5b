"""What ``dibs doctor`` reports about a store's settings: findings, and how bad each is.

A store says what could lose an acknowledged claim through the classmethod
:meth:`dibs.Store.durability`; each built-in store reads its own settings in
its package (``dibs.stores.<store>._durability``), and :mod:`dibs.doctor`
only asks and prints.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = ["IN_MEMORY", "Finding", "Severity"]


class Severity(enum.StrEnum):
    """How bad a finding is."""

    DANGER = "danger"
    """The setting can lose an acknowledged claim."""
    WARNING = "warning"
    """The setting costs availability, or leaves no margin; nothing acknowledged is lost."""
    OK = "ok"
    """Checked and safe."""


@dataclass(frozen=True, slots=True)
class Finding:
    """One setting as found: what it is, what it can cost, and the fix."""

    severity: Severity
    setting: str
    value: str
    detail: str
    fix: str = ""


IN_MEMORY = Finding(
    Severity.DANGER,
    "store",
    "memory://",
    "the in-memory store keeps nothing across a restart: every claim is lost when the "
    "process exits",
    "use sqlite:///path?synchronous=full on one machine, or postgresql:// for many hosts",
)
"""The in-memory store's one finding: it keeps nothing."""
