"""What ``dibs demo`` shows: a live progress bar while the rush runs, then the summary.

Uses ``rich`` (the ``cli`` extra) when it is installed and stderr is a
terminal; otherwise prints plain text. The summary goes to stdout, the
progress to stderr, so ``dibs demo --json > audit.json`` stays clean.
"""

from __future__ import annotations

import json
import sys
from types import TracebackType
from typing import Any, Self, TextIO

try:
    import rich.console
    import rich.progress
    import rich.table
except ImportError:  # the cli extra is not installed: plain text, no live bar
    _RICH = False
else:
    _RICH = True

from dibs.demo._customers import Outcome
from dibs.demo._plan import Venue
from dibs.demo._rush import DemoReport

__all__ = ["ProgressView", "render_json", "render_summary"]


class ProgressView:
    """An :class:`~dibs.demo.Observer` drawing a live progress bar on stderr."""

    def __init__(self, *, enabled: bool = True) -> None:
        self._progress: Any = None
        self._task: Any = None
        self._seats = 0
        self.sold = self.holds = self.taken = self.late = self.replays = self.served = 0
        if not enabled or not _RICH:
            return
        console = rich.console.Console(stderr=True)
        if not console.is_terminal:
            return
        columns = rich.progress
        self._progress = columns.Progress(
            columns.SpinnerColumn(),
            columns.TextColumn("[bold]{task.description}"),
            columns.BarColumn(),
            columns.MofNCompleteColumn(),
            columns.TextColumn("customers"),
            columns.TimeElapsedColumn(),
            columns.TextColumn("{task.fields[stats]}"),
            console=console,
            transient=True,
        )
        self._task = self._progress.add_task("starting", total=None, stats="")

    def __enter__(self) -> Self:
        if self._progress is not None:
            self._progress.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._progress is not None:
            self._progress.stop()

    def phase(self, text: str) -> None:
        """Show the phase the run is in."""
        if self._progress is not None:
            self._progress.update(self._task, description=text)

    def started(self, customers: int, venue: Venue) -> None:
        """The doors opened: the bar now counts customers."""
        self._seats = venue.seats
        if self._progress is not None:
            self._progress.update(self._task, total=customers, completed=0)

    def customer_done(self, outcome: Outcome) -> None:
        """Count one finished customer."""
        self.served += 1
        self.holds += outcome.granted
        self.taken += outcome.taken
        self.replays += outcome.replayed
        self.late += outcome.refused is not None and outcome.behaviour == "late"
        if outcome.paid:
            self.sold += len(outcome.seats)
        if self._progress is not None:
            stats = (
                f"sold [green]{self.sold}[/]/{self._seats} · holds {self.holds} · "
                f"taken {self.taken} · replays {self.replays} · late refused {self.late}"
            )
            self._progress.update(self._task, completed=self.served, stats=stats)


def render_json(report: DemoReport, out: TextIO | None = None) -> None:
    """Print the report as JSON."""
    print(json.dumps(report.to_json(), indent=2), file=out or sys.stdout)


def _rush_rows(report: DemoReport) -> list[tuple[str, str]]:
    c, t = report.counts, report.throughput
    dead = c["holds_taken_over"] + c["holds_expired"]
    return [
        ("seats sold", f"{c['seats_sold']} / {c['seats']}"),
        ("customers", f"{c['customers']}: {c['paid']} paid, {c['turned_away']} found it sold out"),
        ("holds granted", f"{c['granted']}, {c['group_holds']} of them groups of 2-4 seats"),
        ("claims lost", f"{c['taken']} answered 'taken'"),
        ("retries", f"{c['replayed']} replayed: same request ID, same answer"),
        ("holds abandoned", str(c["abandoned"])),
        ("dead holds", f"{dead}: {c['holds_taken_over']} taken over, {c['holds_expired']} swept"),
        ("late payers", f"{c['late_refused']} refused with HoldLost"),
        ("slow payers refused", str(c["slow_payers_refused"])),
        (
            "throughput",
            f"{t['claims_per_second']:,.0f} claims/s ({c['claim_calls']} claims in "
            f"{report.seconds:.1f} s; busiest second {t['peak_claims_per_second']:,.0f})",
        ),
        ("claim latency", f"p50 {_ms(t['claim_p50_ms'])}, p99 {_ms(t['claim_p99_ms'])}"),
    ]


def _ms(value: float) -> str:
    return f"{value:.2f} ms" if value < 10 else f"{value:.0f} ms"


def _headline(report: DemoReport) -> str:
    cfg, venue = report.config, report.venue
    return (
        f"Ticket rush on {report.store} ({report.mode}): {cfg.customers} customers, "
        f"{venue.seats} seats in {venue.rows} rows, holds of {cfg.ttl:g} s, {venue.show}"
    )


def _verdict(report: DemoReport) -> str:
    failed = sum(not check.passed for check in report.checks)
    if failed:
        return f"AUDIT FAILED: {failed} of {len(report.checks)} checks failed"
    return f"Audit passed: all {len(report.checks)} checks held"


def render_summary(report: DemoReport, out: TextIO | None = None) -> None:
    """Print the summary tables, with rich when it is installed."""
    stream = out or sys.stdout
    if not _RICH:
        _render_plain(report, stream)
        return
    console = rich.console.Console(file=stream, highlight=False)
    console.print(f"[bold]{_headline(report)}[/]")
    rush = rich.table.Table(title="The rush", title_justify="left", show_header=False, box=None)
    rush.add_column(style="dim")
    rush.add_column()
    for label, value in _rush_rows(report):
        rush.add_row(label, value)
    console.print(rush)
    audit = rich.table.Table(
        title="Audit, read back from the store after a sweep", title_justify="left"
    )
    audit.add_column("")
    audit.add_column("promise")
    audit.add_column("what the store says")
    for check in report.checks:
        mark = "[green]PASS[/]" if check.passed else "[bold red]FAIL[/]"
        detail = "\n".join([check.detail, *(f"  e.g. {e}" for e in check.examples)])
        audit.add_row(mark, check.promise, detail)
    console.print(audit)
    style = "bold green" if report.passed else "bold red"
    console.print(f"[{style}]{_verdict(report)}[/]")


def _render_plain(report: DemoReport, out: TextIO) -> None:
    lines = [_headline(report), "", "The rush"]
    lines += [f"  {label:<26}{value}" for label, value in _rush_rows(report)]
    lines += ["", "Audit, read back from the store after a sweep"]
    for check in report.checks:
        lines.append(f"  {'PASS' if check.passed else 'FAIL'}  {check.promise}: {check.detail}")
        lines += [f"          e.g. {e}" for e in check.examples]
    lines += ["", _verdict(report)]
    print("\n".join(lines), file=out)
