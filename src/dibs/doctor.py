"""``dibs doctor URL``: read a store's durability settings and say what could lose a claim.

:func:`examine` connects to the store named by a URL, reads its settings and
returns a :class:`Report` of :class:`Finding`\\ s, each with the setting, its
value, what it can cost and the fix. A finding is :attr:`Severity.DANGER`
when the setting can lose an acknowledged claim (``dibs doctor`` then exits
1), :attr:`Severity.WARNING` when it costs availability or leaves no margin,
:attr:`Severity.OK` for a setting checked and found safe.

Each store reads its own settings (:meth:`dibs.Store.durability`, in its
package); this module asks and prints:

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

import sys
from dataclasses import asdict, dataclass
from typing import Any, TextIO

try:
    import rich.console
    import rich.markup
except ImportError:  # the cli extra is not installed: plain text
    _RICH = False
else:
    _RICH = True

from dibs._compiled import describe as describe_core
from dibs.stores import redact, store_class
from dibs.stores.durability import Finding, Severity

__all__ = [
    "Finding",
    "Report",
    "Severity",
    "examine",
    "print_report",
    "render_text",
]


def __getattr__(name: str) -> Any:
    # Each store's checks need its extra: imported when first asked for.
    if name in ("postgres_findings", "warn_once"):
        from dibs.stores.postgres._durability import (  # noqa: PLC0415
            postgres_findings,
            warn_once,
        )

        return {"postgres_findings": postgres_findings, "warn_once": warn_once}[name]
    if name == "etcd_findings":
        from dibs.stores.etcd._durability import etcd_findings  # noqa: PLC0415

        return etcd_findings
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@dataclass(frozen=True, slots=True)
class Report:
    """What :func:`examine` found for one store (``url`` has its password redacted).

    ``core`` says whether this process runs dibs's claim path compiled
    (``"compiled (mypyc): <modules>"``) or as ``"pure Python"``.
    """

    url: str
    store: str
    findings: tuple[Finding, ...]
    core: str = "pure Python"

    @property
    def loses_data(self) -> bool:
        """Whether any setting can lose an acknowledged claim."""
        return any(f.severity is Severity.DANGER for f in self.findings)

    def to_dict(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "store": self.store,
            "loses_data": self.loses_data,
            "core": self.core,
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
    found = cls.durability(url, timeout=timeout)
    if found is None:
        found = [
            Finding(
                Severity.WARNING,
                "store",
                f"{cls.__module__}.{cls.__qualname__}",
                "dibs doctor does not know this plug-in store's durability settings",
                "read the plug-in's documentation",
            )
        ]
    return Report(redact(url), scheme, tuple(found), describe_core())


# --- memory ---------------------------------------------------------------------------------------

# --- sqlite ---------------------------------------------------------------------------------------


# --- postgresql -----------------------------------------------------------------------------------


# --- etcd -----------------------------------------------------------------------------------------


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
    console.print(f"  [dim]core:[/] {rich.markup.escape(report.core)}")
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
    lines = [f"dibs doctor: {report.url} ({report.store})", f"  core: {report.core}"]
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
