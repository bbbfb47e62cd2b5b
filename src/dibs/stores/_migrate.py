"""One migration runner for every schema dibs owns, read from ``.sql`` files.

A schema is a directory of package data (``stores/<store>/sql/<name>/``):

* numbered steps, ``0001_tables.sql``, ``0002_….sql``, …: step ``n`` takes the
  schema from version ``n - 1`` to ``n``, and the highest number is the
  version this code writes. A step changes tables and data; a step that only
  changes functions holds just a comment saying why.
* ``functions/*.sql``: each server-side function as it is now, ``CREATE OR
  REPLACE``. After any step ran they are all recreated from these files, so a
  function is written once, never copied into each version that changed it.

The caller runs :meth:`Migrations.upgrade` inside one transaction that holds
the schema's lock (SQLite: ``BEGIN IMMEDIATE``; PostgreSQL: an advisory
lock), reads and writes the version where its store keeps it, and supplies how
to run a script. ``{s}`` in a file stands for the store's PostgreSQL schema.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from importlib.resources import files
from importlib.resources.abc import Traversable

from dibs.exceptions import SchemaError

__all__ = ["Migrations", "sql_statements"]

_STEP = re.compile(r"^(\d{4})_[a-z0-9_]+\.sql$")


def sql_statements(script: str) -> list[str]:
    """Split a script into statements, comments dropped (for drivers that run one at a time).

    Splits on ``;``; for scripts without procedural bodies (SQLite's).
    """
    statements = []
    for part in script.split(";"):
        lines = [line for line in part.splitlines() if not line.lstrip().startswith("--")]
        text = "\n".join(lines).strip()
        if text:
            statements.append(text)
    return statements


@dataclass(frozen=True)
class Migrations:
    """The steps and functions of one schema, read from ``package``'s ``sql/<name>`` directory."""

    package: str
    name: str

    @cached_property
    def _dir(self) -> Traversable:
        return files(self.package).joinpath("sql", self.name)

    @cached_property
    def steps(self) -> tuple[str, ...]:
        """``steps[n - 1]`` is the script of step ``n``."""
        found = sorted(
            (entry.name, entry.read_text(encoding="utf-8"))
            for entry in self._dir.iterdir()
            if _STEP.match(entry.name)
        )
        numbers = [int(name[:4]) for name, _ in found]
        if numbers != list(range(1, len(found) + 1)):
            raise AssertionError(f"{self.package} {self.name}: steps must be 1..n, got {numbers}")
        return tuple(text for _, text in found)

    @cached_property
    def functions(self) -> tuple[str, ...]:
        """Every function's current script, in file-name order."""
        where = self._dir.joinpath("functions")
        if not where.is_dir():
            return ()
        return tuple(
            entry.read_text(encoding="utf-8")
            for entry in sorted(where.iterdir(), key=lambda e: e.name)
            if entry.name.endswith(".sql")
        )

    @property
    def version(self) -> int:
        """The version this code writes and understands: the number of the last step."""
        return len(self.steps)

    def check(self, found: int, where: str) -> None:
        """Raise :class:`~dibs.SchemaError` if ``found`` is newer than :attr:`version`."""
        if found > self.version:
            raise SchemaError(
                f"{where} has dibs {self.name} schema version {found}, newer than this dibs "
                f"understands ({self.version}); upgrade dibs",
                found=found,
                supported=self.version,
            )

    def upgrade(self, found: int, run: Callable[[str], None], where: str) -> bool:
        """Bring a schema at version ``found`` (0: absent) to :attr:`version` with ``run``.

        Runs each missing step in order, then recreates every function. Returns
        whether anything ran; the caller then records :attr:`version`. Raises
        :class:`~dibs.SchemaError` for a schema newer than this code.
        """
        self.check(found, where)
        if found == self.version:
            return False
        for script in self.steps[found:]:
            if sql_statements(script):  # a comment-only step changed functions only
                run(script)
        for script in self.functions:
            run(script)
        return True
