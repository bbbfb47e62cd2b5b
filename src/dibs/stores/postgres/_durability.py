"""The PostgreSQL store's durability settings: what ``dibs doctor`` reports, and what the
store logs once when it opens a server whose settings can lose an acknowledged claim."""

from __future__ import annotations

import logging
import re
import threading
from typing import Any

from dibs.stores.durability import Finding, Severity
from dibs.stores.postgres._connect import first_connection
from dibs.stores.postgres._ops import split_url

__all__ = ["findings", "logger", "postgres_findings", "warn_once"]

logger = logging.getLogger("dibs.stores.postgres.durability")
"""Where the PostgreSQL store logs its findings at open: a child of the store's logger, so
it can be silenced alone (a development server with fsync off)."""


def findings(url: str, timeout: float) -> list[Finding]:
    """The findings for the server at ``url``, read on one connection of its own."""

    conninfo, _ = split_url(url)
    with first_connection(conninfo, timeout) as conn:
        return postgres_findings(conn)


_SYNC_NAMES = re.compile(r"^\s*(?:(FIRST|ANY)\s+)?(?:(\d+)\s*)?\((.*)\)\s*$", re.IGNORECASE)


def _sync_standbys(names: str) -> tuple[int, list[str]]:
    """``synchronous_standby_names`` as (how many must confirm, the candidates)."""
    m = _SYNC_NAMES.match(names)
    if m:
        num = int(m.group(2) or 1)
        listed = m.group(3)
    else:  # a plain list: FIRST 1 of them
        num, listed = 1, names
    return num, [n.strip().strip('"') for n in listed.split(",") if n.strip()]


def postgres_findings(conn: Any) -> list[Finding]:
    """The findings for the server behind ``conn`` (an autocommit psycopg connection)."""
    rows = conn.execute(
        "SELECT name, setting FROM pg_settings WHERE name IN "
        "('fsync', 'full_page_writes', 'synchronous_commit', 'synchronous_standby_names')"
    ).fetchall()
    settings = {name: value for name, value in rows}
    (in_recovery,) = conn.execute("SELECT pg_is_in_recovery()").fetchone()
    # Rows are visible to every role, their details (sync_state) only with pg_read_all_stats.
    # A logical walsender (a CDC reader, a subscription) is no standby: a failover never
    # lands on it. Its slot says so, and pg_replication_slots is readable by every role.
    standbys, eligible, detailed = conn.execute(
        "SELECT count(*), count(*) FILTER (WHERE r.sync_state IN ('sync', 'quorum', "
        "'potential')), count(r.sync_state) FROM pg_stat_replication r "
        "WHERE NOT EXISTS (SELECT 1 FROM pg_replication_slots s "
        "WHERE s.active_pid = r.pid AND s.slot_type = 'logical')"
    ).fetchone()
    found: list[Finding] = []
    if in_recovery:
        found.append(
            Finding(
                Severity.WARNING,
                "pg_is_in_recovery()",
                "true",
                "this server is a read-only standby: every write raises StoreUnavailable",
                "point the URL at the primary, or list every host with "
                "?target_session_attrs=read-write",
            )
        )
    fsync = settings.get("fsync", "on")
    found.append(
        Finding(Severity.OK, "fsync", fsync, "commits reach the disk")
        if fsync == "on"
        else Finding(
            Severity.DANGER,
            "fsync",
            fsync,
            "commits are never forced to disk: a power cut or an OS crash can lose "
            "acknowledged claims, or corrupt the cluster",
            "set fsync = on in postgresql.conf and reload",
        )
    )
    fpw = settings.get("full_page_writes", "on")
    found.append(
        Finding(Severity.OK, "full_page_writes", fpw, "torn pages are repaired from the WAL")
        if fpw == "on"
        else Finding(
            Severity.DANGER,
            "full_page_writes",
            fpw,
            "a power cut can leave torn pages that recovery cannot repair",
            "set full_page_writes = on in postgresql.conf and reload",
        )
    )
    commit = settings.get("synchronous_commit", "on")
    names = settings.get("synchronous_standby_names", "").strip()
    num, candidates = _sync_standbys(names) if names else (0, [])
    waits_for_standbys = bool(names) and commit in ("on", "remote_apply")
    if commit == "off":
        found.append(
            Finding(
                Severity.DANGER,
                "synchronous_commit",
                commit,
                "commits are acknowledged before they reach the WAL on disk: a server crash "
                "loses the last acknowledged claims",
                "ALTER ROLE <role> SET synchronous_commit = on (or set it in postgresql.conf)",
            )
        )
    elif names and commit in ("local", "remote_write"):
        detail = (
            "commits do not wait for the synchronous standbys: a failover loses acknowledged claims"
            if commit == "local"
            else "the standbys acknowledge commits held in memory only: a failover after "
            "the standby's machine crashed too loses acknowledged claims"
        )
        found.append(
            Finding(
                Severity.DANGER,
                "synchronous_commit",
                commit,
                detail,
                "ALTER ROLE <role> SET synchronous_commit = on (or remote_apply)",
            )
        )
    else:
        found.append(Finding(Severity.OK, "synchronous_commit", commit, "commits wait as set"))
    if standbys and not names:
        found.append(
            Finding(
                Severity.DANGER,
                "synchronous_standby_names",
                "''",
                f"{standbys} standby(s) stream from this server asynchronously: a failover to "
                "one that is behind loses acknowledged claims and issues their fences again",
                "set synchronous_standby_names = 'ANY 1 (s1, s2)' with two standbys",
            )
        )
    elif names:
        # The standbys that can confirm: those the names match, when the role may see
        # which (sync_state); else at most the streaming ones, and at most those named.
        if not detailed or detailed < standbys:
            eligible = standbys if candidates == ["*"] else min(standbys, len(candidates))
        spare = eligible - num
        if waits_for_standbys and eligible < num:
            found.append(
                Finding(
                    Severity.WARNING,
                    "synchronous_standby_names",
                    names,
                    f"{num} synchronous standby(s) must confirm, {eligible} stream(s): every "
                    "commit waits until enough come back (statement_timeout does not bound "
                    "the wait)",
                    "bring the standbys back, or change synchronous_standby_names",
                )
            )
        elif waits_for_standbys and spare <= 0:
            found.append(
                Finding(
                    Severity.WARNING,
                    "synchronous_standby_names",
                    names,
                    "no spare synchronous standby: losing one stops every write",
                    "run two standbys and set synchronous_standby_names = 'ANY 1 (s1, s2)'",
                )
            )
        else:
            found.append(
                Finding(
                    Severity.OK,
                    "synchronous_standby_names",
                    names,
                    f"commits wait for {num} of the standbys",
                )
            )
    return found


_warned: set[str] = set()
_warned_lock = threading.Lock()  # guards _warned


def warn_once(conn: Any, where: str) -> None:
    """Log the findings for ``where`` as one WARNING, the first time a store opens it.

    A failure to read the settings is logged at DEBUG and otherwise ignored:
    this is advice, never a reason to refuse to open.
    """
    with _warned_lock:
        if where in _warned:
            return
        _warned.add(where)
    try:
        findings = postgres_findings(conn)
    except Exception as exc:  # advice only: opening must not fail for it
        logger.debug("could not read the durability settings at %s: %s", where, exc)
        return
    danger = [f for f in findings if f.severity is Severity.DANGER]
    advice = [f for f in findings if f.severity is Severity.WARNING]
    if not danger and not advice:
        return
    parts = [f"{f.setting} = {f.value}: {f.detail} (fix: {f.fix})" for f in danger + advice]
    lead = "settings that can lose an acknowledged claim" if danger else "settings to look at"
    logger.warning(
        "PostgreSQL store at %s: %s: %s. Run `dibs doctor URL` for the full report",
        where,
        lead,
        "; ".join(parts),
    )
