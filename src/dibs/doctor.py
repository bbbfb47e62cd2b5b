"""``dibs doctor URL``: read a store's durability settings and say what could lose a claim.

:func:`examine` connects to the store named by a URL, reads its settings and
returns a :class:`Report` of :class:`Finding`\\ s, each with the setting, its
value, what it can cost and the fix. A finding is :attr:`Severity.DANGER`
when the setting can lose an acknowledged claim (``dibs doctor`` then exits
1), :attr:`Severity.WARNING` when it costs availability or leaves no margin,
:attr:`Severity.OK` for a setting checked and found safe.

* ``postgresql://``: ``fsync``, ``full_page_writes``, ``synchronous_commit``
  (as the URL's role and database get it), ``synchronous_standby_names``
  against the standbys in ``pg_stat_replication``, and whether the server is
  a standby. The PostgreSQL store logs the same findings once at open.
* ``sqlite://``: the file's journal mode and the URL's ``synchronous``.
* ``memory://``: keeps nothing across a restart.
* ``etcd://``: member count and quorum health, over the v3 JSON gateway
  (``/v3/cluster/member/list``, then ``/v3/maintenance/status`` on each
  member), with httpx.

Raises :class:`~dibs.StoreMisconfigured` or :class:`~dibs.StoreUnavailable`
when the store cannot be read, :class:`~dibs.UnknownScheme` for a URL no
store handles.
"""

from __future__ import annotations

import enum
import logging
import os
import re
import sqlite3
import sys
import threading
from collections.abc import Collection
from dataclasses import asdict, dataclass
from typing import Any, TextIO
from urllib.parse import quote

try:
    import rich.console
    import rich.markup
except ImportError:  # the cli extra is not installed: plain text
    _RICH = False
else:
    _RICH = True

from dibs._extras import needs
from dibs.exceptions import StoreMisconfigured, StoreUnavailable
from dibs.stores import redact, store_class

__all__ = [
    "Finding",
    "Report",
    "Severity",
    "etcd_findings",
    "examine",
    "postgres_findings",
    "print_report",
    "render_text",
    "warn_once",
]

logger = logging.getLogger("dibs.stores.postgres.durability")
"""Where the PostgreSQL store logs its findings at open: a child of the store's logger, so
it can be silenced alone (a development server with fsync off)."""


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


@dataclass(frozen=True, slots=True)
class Report:
    """What :func:`examine` found for one store (``url`` has its password redacted)."""

    url: str
    store: str
    findings: tuple[Finding, ...]

    @property
    def loses_data(self) -> bool:
        """Whether any setting can lose an acknowledged claim."""
        return any(f.severity is Severity.DANGER for f in self.findings)

    def to_dict(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "store": self.store,
            "loses_data": self.loses_data,
            "findings": [{**asdict(f), "severity": str(f.severity)} for f in self.findings],
        }


def examine(url: str, *, timeout: float = 5.0) -> Report:
    """Read the durability settings of the store at ``url``; see the module docstring.

    The URL is checked first as :func:`dibs.open` checks it (the store's own
    :meth:`~dibs.Store.check_url`), so what opening refuses is refused here with
    the same :class:`~dibs.InvalidInput`, :class:`~dibs.UnknownScheme` or
    :class:`~dibs.MissingExtra`, before anything is read.
    """
    cls = store_class(url)
    cls.check_url(url)
    scheme = url.split("://", 1)[0].split("+", 1)[0].lower()
    if scheme in ("postgresql", "postgres"):
        findings = _postgres(url, timeout)
    elif scheme == "sqlite":
        findings = _sqlite(url)
    elif scheme == "memory":
        findings = [_MEMORY]
    elif scheme == "etcd":
        findings = _etcd(url, timeout)
    else:
        findings = [
            Finding(
                Severity.WARNING,
                "store",
                f"{cls.__module__}.{cls.__qualname__}",
                "dibs doctor does not know this plug-in store's durability settings",
                "read the plug-in's documentation",
            )
        ]
    return Report(redact(url), scheme, tuple(findings))


# --- memory ---------------------------------------------------------------------------------------

_MEMORY = Finding(
    Severity.DANGER,
    "store",
    "memory://",
    "the in-memory store keeps nothing across a restart: every claim is lost when the "
    "process exits",
    "use sqlite:///path?synchronous=full on one machine, or postgresql:// for many hosts",
)


# --- sqlite ---------------------------------------------------------------------------------------


def _sqlite(url: str) -> list[Finding]:
    from dibs.stores.sqlite import SQLiteStore  # noqa: PLC0415 (only for sqlite://)

    # The store's own reading of the URL (already checked by examine()): the same file,
    # percent-decoded, and the synchronous it would run with.
    path, options = SQLiteStore._split_url(url)
    synchronous = str(options.get("synchronous", "normal")).lower()  # the store's default
    if path == ":memory:":
        return [_MEMORY]
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


# --- postgresql -----------------------------------------------------------------------------------


def _postgres(url: str, timeout: float) -> list[Finding]:
    from dibs.stores.postgres._connect import (  # noqa: PLC0415 (the postgres extra)
        first_connection,
    )
    from dibs.stores.postgres._ops import split_url  # noqa: PLC0415 (the postgres extra)

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


# --- etcd -----------------------------------------------------------------------------------------


def _etcd(url: str, timeout: float) -> list[Finding]:
    with needs("etcd", "dibs doctor on an etcd:// store"):
        import httpx  # noqa: PLC0415 (only for etcd)
    from dibs.stores.etcd._keys import parse_url  # noqa: PLC0415 (only for etcd)

    endpoints = parse_url(url).endpoints  # as the store reads them: host:port, default port
    with httpx.Client(timeout=timeout) as client:
        members: list[dict[str, Any]] | None = None
        errors: list[str] = []
        for endpoint in endpoints:
            try:
                answer = client.post(f"http://{endpoint}/v3/cluster/member/list", json={})
                answer.raise_for_status()
                members = answer.json().get("members", [])
                break
            except (httpx.HTTPError, ValueError) as exc:
                errors.append(f"{endpoint}: {exc}")
        if members is None:
            raise StoreUnavailable(
                f"no etcd endpoint of {redact(url)} answered: {'; '.join(errors)}",
                cause="; ".join(errors),
            )
        statuses: dict[str, dict[str, Any] | str] = {}
        learners: set[str] = set()
        for member in members:
            name = member.get("name") or member.get("ID", "?")
            status: dict[str, Any] | str = "no client URL"
            for client_url in member.get("clientURLs", []):
                try:
                    answer = client.post(f"{client_url}/v3/maintenance/status", json={})
                    answer.raise_for_status()
                    status = answer.json()
                    break
                except (httpx.HTTPError, ValueError) as exc:
                    status = str(exc) or type(exc).__name__
            statuses[str(name)] = status
            if member.get("isLearner"):
                learners.add(str(name))
    return etcd_findings(statuses, learners=learners)


def etcd_findings(
    statuses: dict[str, dict[str, Any] | str], *, learners: Collection[str] = ()
) -> list[Finding]:
    """Findings for a cluster's members: each one's status answer, or why it gave none.

    ``learners`` names the members that replicate but do not vote
    (``etcdctl member add --learner``): the quorum and its margin count voters only.
    """
    voters = {name: s for name, s in statuses.items() if name not in learners}
    n = len(voters)
    quorum = n // 2 + 1
    up = {name: s for name, s in voters.items() if isinstance(s, dict)}
    down = {
        (f"{name} (learner)" if name in learners else name): s
        for name, s in statuses.items()
        if not isinstance(s, dict)
    }
    found: list[Finding] = []
    if n == 1:
        found.append(
            Finding(
                Severity.WARNING,
                "members",
                "1",
                "one member: its disk is the only copy, and writes stop while it is down",
                "run 3 members (or 5), on separate machines",
            )
        )
    elif n % 2 == 0:
        found.append(
            Finding(
                Severity.WARNING,
                "members",
                str(n),
                f"an even count: {n} members survive no more failures than {n - 1} "
                f"(quorum {quorum}), and a split can leave no side with a quorum",
                f"run {n - 1} or {n + 1} members",
            )
        )
    else:
        found.append(
            Finding(
                Severity.OK,
                "members",
                str(n),
                f"quorum {quorum}: survives {n - quorum} failed member(s)",
            )
        )
    margin = len(up) - quorum
    if down:
        detail = ", ".join(f"{name} ({why})" for name, why in sorted(down.items()))
        if margin < 0:
            detail = (
                f"only {len(up)} of {n} members answer, below the quorum of {quorum}: "
                f"writes stop until members come back. Unreachable: {detail}"
            )
        else:
            detail = (
                f"{len(up)} of {n} members answer; quorum {quorum}, so {margin} more "
                f"failure(s) stop writes. Unreachable: {detail}"
            )
        found.append(
            Finding(Severity.WARNING, "reachable members", f"{len(up)}/{n}", detail, "restart them")
        )
    answering = {name: s for name, s in statuses.items() if isinstance(s, dict)}
    leaders = {str(s.get("leader")) for s in answering.values() if s.get("leader")}
    if answering and len(leaders) != 1:
        found.append(
            Finding(
                Severity.WARNING,
                "leader",
                ",".join(sorted(leaders)) or "none",
                "the members do not agree on one leader: an election is under way or the "
                "cluster is split",
                "check the members' logs and network",
            )
        )
    for name, status in sorted(answering.items()):
        errors = status.get("errors")
        if errors:
            found.append(
                Finding(
                    Severity.WARNING,
                    f"member {name}",
                    "; ".join(map(str, errors)),
                    "the member reports errors (an alarm such as NOSPACE stops writes)",
                    "etcdctl alarm list; compact, defragment, then etcdctl alarm disarm",
                )
            )
    return found


# --- rendering ------------------------------------------------------------------------------------

_MARKS = {Severity.DANGER: "DANGER", Severity.WARNING: "WARN", Severity.OK: "ok"}


def print_report(report: Report, out: TextIO | None = None) -> None:
    """Print the report: with rich's colours when it is installed, else as :func:`render_text`."""
    stream = out or sys.stdout
    if not _RICH:
        print(render_text(report), file=stream)
        return
    console = rich.console.Console(file=stream, highlight=False, soft_wrap=True)
    styles = {Severity.DANGER: "bold red", Severity.WARNING: "yellow", Severity.OK: "green"}
    console.print(f"[bold]dibs doctor[/]: {rich.markup.escape(report.url)} ({report.store})")
    for f in report.findings:
        mark = f"[{styles[f.severity]}]{_MARKS[f.severity]:>6}[/]"
        text = rich.markup.escape(f"{f.setting} = {f.value}: {f.detail}")
        console.print(f"  {mark} {text}")
        if f.fix and f.severity is not Severity.OK:
            console.print(f"         [dim]fix:[/] {rich.markup.escape(f.fix)}")
    style = "bold red" if report.loses_data else "bold green"
    console.print(f"[{style}]{_verdict(report)}[/]")


def render_text(report: Report) -> str:
    """The report as plain text, one finding a paragraph."""
    lines = [f"dibs doctor: {report.url} ({report.store})"]
    for f in report.findings:
        lines.append(f"  [{_MARKS[f.severity]}] {f.setting} = {f.value}: {f.detail}")
        if f.fix and f.severity is not Severity.OK:
            lines.append(f"      fix: {f.fix}")
    lines.append(_verdict(report))
    return "\n".join(lines)


def _verdict(report: Report) -> str:
    if report.loses_data:
        return "verdict: these settings can lose an acknowledged claim"
    if any(f.severity is Severity.WARNING for f in report.findings):
        return "verdict: nothing acknowledged can be lost; see the warnings"
    return "verdict: clean"
