"""The SQLite store's durability settings, as ``dibs doctor`` reports them."""

from __future__ import annotations

import os
import sqlite3
from urllib.parse import quote

from dibs.exceptions import StoreMisconfigured
from dibs.stores.durability import IN_MEMORY, Finding, Severity

__all__ = ["findings"]


def findings(path: str, synchronous: str) -> list[Finding]:
    """The journal mode of the file at ``path``, and ``synchronous`` as the store would run."""
    if path == ":memory:":
        return [IN_MEMORY]
    if not os.path.isfile(path):
        raise StoreMisconfigured(f"no SQLite store at {path!r}", cause="the file does not exist")
    try:
        conn = sqlite3.connect(f"file:{quote(path)}?mode=ro", uri=True)
        try:
            journal = str(conn.execute("PRAGMA journal_mode").fetchone()[0]).lower()
        finally:
            conn.close()
    except sqlite3.Error as exc:
        raise StoreMisconfigured(
            f"cannot read the SQLite file {path!r}: {exc}", cause=str(exc)
        ) from exc
    return [_sqlite_journal(journal), _sqlite_synchronous(journal, synchronous)]


def _sqlite_journal(journal: str) -> Finding:
    if journal == "wal":
        return Finding(Severity.OK, "journal_mode", journal, "write-ahead log, as dibs sets it")
    if journal in ("off", "memory"):
        return Finding(
            Severity.DANGER,
            "journal_mode",
            journal,
            "no journal on disk: a crash in the middle of a commit can corrupt the file",
            "open the store with dibs, which sets journal_mode=WAL",
        )
    return Finding(
        Severity.WARNING,
        "journal_mode",
        journal,
        "a rollback journal: readers block the writer; dibs sets WAL when it opens the file",
        "open the store with dibs, which sets journal_mode=WAL",
    )


def _sqlite_synchronous(journal: str, synchronous: str) -> Finding:
    fix = "add ?synchronous=full to the URL (and ?group_commit=1 to share each disk wait)"
    if synchronous in ("full", "extra"):
        return Finding(Severity.OK, "synchronous", synchronous, "every commit waits for the disk")
    if synchronous == "off":
        return Finding(
            Severity.DANGER,
            "synchronous",
            synchronous,
            "commits never wait for the disk: a power cut or an OS crash can lose committed "
            "claims and may corrupt the file",
            fix,
        )
    if journal == "wal":
        return Finding(
            Severity.DANGER,
            "synchronous",
            synchronous,
            "in WAL mode, NORMAL survives kill -9 of every process, but a power cut or an OS "
            "crash can lose the claims committed since the last checkpoint",
            fix,
        )
    return Finding(
        Severity.DANGER,
        "synchronous",
        synchronous,
        "with a rollback journal, NORMAL can corrupt the file on a power cut",
        fix,
    )
