"""``dibs verify --report DIR``: one self-contained HTML page of a checked history.

Like Jepsen's and Porcupine's timelines: per resource, one lane per client,
each operation a bar from its invocation to its completion, coloured by
outcome (acknowledged, definite failure, unknown); faults drawn as bands
across the lanes; the offending sub-history of a non-linearizable resource
drawn again on its own, with the impossible operation marked, followed by the
model's possible states just before it; then the figures. The page needs no
network: its SVG, CSS and the few lines of JavaScript are inline.
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dibs.verify._check import BOOKKEEPING, Report, partition
from dibs.verify._history import FAIL, OK, History, Op
from dibs.verify._linear import ANOMALY, PartitionResult, describe_ops, describe_states

__all__ = ["write_report"]

MAX_BARS = 3000
"""Bars drawn per resource timeline; a longer history shows its first ones (the page says so)."""

WIDTH = 1100
LANE = 18
LEFT = 90

COLOURS = {OK: "#2e7d32", FAIL: "#ef8f00", "unknown": "#9e9e9e"}

_CSS = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 24px; color: #222; background: #fff; }
h1 { font-size: 22px; } h2 { font-size: 18px; margin-top: 32px; } h3 { font-size: 15px; }
.verdict-ok { color: #2e7d32; } .verdict-anomaly { color: #c62828; }
.verdict-unknown { color: #ef8f00; }
table { border-collapse: collapse; margin: 8px 0; }
td, th { border: 1px solid #ccc; padding: 3px 8px; text-align: left; }
pre { background: #f6f6f6; padding: 8px; font-size: 12px; white-space: pre-wrap;
      overflow-wrap: anywhere; }
svg.timeline { border: 1px solid #ddd; background: #fff; display: block; margin: 6px 0; }
svg.timeline text { font: 11px monospace; fill: #333; }
.legend span { display: inline-block; margin-right: 14px; }
.swatch { display: inline-block; width: 12px; height: 12px; vertical-align: middle;
          margin-right: 4px; }
#detail { position: sticky; top: 0; background: #fffbe6; border: 1px solid #e0c060;
          padding: 6px; font: 12px monospace; min-height: 1.4em; white-space: pre-wrap; }
"""

_JS = """
document.querySelectorAll('svg.timeline rect.op').forEach(function (r) {
  r.addEventListener('click', function () {
    document.getElementById('detail').textContent = r.querySelector('title').textContent;
  });
});
"""


def write_report(history: History, report: Report, directory: str | Path) -> Path:
    """Write ``index.html`` (and ``figures.json``) into ``directory``; return the page's path."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    page = out / "index.html"
    page.write_text(render_html(history, report), encoding="utf-8")
    (out / "figures.json").write_text(json.dumps(report.to_json(), indent=2), encoding="utf-8")
    return page


def render_html(history: History, report: Report) -> str:
    """The report page as one HTML string."""
    figures = report.to_json()
    origin = report.origin
    parts = partition(history.ops)
    verdicts = {p.resource: p for p in report.partitions}
    # Only a local store's clock is this machine's: elsewhere a tick would need the offset.
    local = bool(history.header.get("local_clock", False))
    body: list[str] = []
    verdict = report.verdict
    body.append(f"<h1>dibs verify: <span class='verdict-{verdict}'>{verdict.upper()}</span></h1>")
    store = html.escape(str(history.header.get("store", "?")))
    plant = history.header.get("plant")
    body.append(
        f"<p>store <code>{store}</code>"
        + (f", planted bug <code>{html.escape(str(plant))}</code>" if plant else "")
        + f"; {report.operations} operations, {report.anomalies} anomalies.</p>"
    )
    body.append(_legend())
    body.append("<div id='detail'>Click a bar to see its operation.</div>")
    body.append(_figures_table(figures, report))
    end = max((op.end for op in history.ops if not math.isinf(op.end)), default=origin + 1)
    span = (origin, max(end, origin + 1e-3))
    # Anomalous resources first: they are what the reader came for.
    order = sorted(parts, key=lambda r: (verdicts.get(r) is None, _rank(verdicts.get(r)), r))
    for resource in order:
        result = verdicts.get(resource)
        ops = parts[resource]
        state = result.verdict if result is not None else "ok"
        body.append(
            f"<h2 id='res-{html.escape(resource)}'>resource {html.escape(resource)}: "
            f"<span class='verdict-{state}'>{state}</span> ({len(ops)} ops)</h2>"
        )
        shrunk = result is not None and result.verdict == ANOMALY and bool(result.witness)
        body.append(
            _timeline(
                ops,
                history.nemesis,
                span,
                origin,
                report.origin_us,
                {op.id for op in result.witness} if result is not None and shrunk else set(),
                result.impossible if result is not None else None,
                resource,
                local=local,
            )
        )
        if result is not None and result.verdict == ANOMALY:
            if result.witness:
                body.append("<h3>offending sub-history (zoomed; the rest faded)</h3>")
                witness = {op.id for op in result.witness}
                body.append(
                    _timeline(
                        ops,
                        history.nemesis,
                        span,
                        origin,
                        report.origin_us,
                        witness,
                        result.impossible,
                        resource,
                        zoom=True,
                        local=local,
                    )
                )
            body.append(_witness_section(result, report, origin))
    sweeps = [op for op in history.ops if op.fn == "sweep"]
    if sweeps:
        body.append(f"<h2>sweeper ({len(sweeps)} sweeps, every resource)</h2>")
        body.append(
            _timeline(sweeps, history.nemesis, span, origin, report.origin_us, set(), None, "*")
        )
    if report.log_anomalies:
        body.append(f"<h2>log replay: {len(report.log_anomalies)} anomalies</h2>")
        for a in report.log_anomalies[:50]:
            body.append(f"<h3>{html.escape(a.kind)}</h3><p>{html.escape(a.message)}</p>")
            lines = describe_ops(a.ops[-8:], report.origin_us)
            body.append(f"<pre>{html.escape(chr(10).join(lines))}</pre>")
    if report.fence_anomalies:
        body.append(f"<h2>fences acknowledged: {len(report.fence_anomalies)} anomalies</h2>")
        for a in report.fence_anomalies[:50]:
            body.append(f"<h3>{html.escape(a.kind)}</h3><p>{html.escape(a.message)}</p>")
            lines = describe_ops(a.ops, report.origin_us)
            body.append(f"<pre>{html.escape(chr(10).join(lines))}</pre>")
    for msg in report.other_anomalies:
        body.append(f"<pre>{html.escape(msg)}</pre>")
    title = f"dibs verify report: {verdict}"
    return (
        "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
        f"<title>{html.escape(title)}</title><style>{_CSS}</style></head><body>"
        + "\n".join(body)
        + f"<script>{_JS}</script></body></html>\n"
    )


def _rank(result: PartitionResult | None) -> int:
    if result is None:
        return 3
    return {"anomaly": 0, "unknown": 1}.get(result.verdict, 2)


def _legend() -> str:
    items = [
        (COLOURS[OK], "acknowledged (ok)"),
        (COLOURS[FAIL], "definite failure"),
        (COLOURS["unknown"], "unknown outcome"),
        ("#c62828", "impossible operation"),
        ("rgba(198,40,40,0.15)", "fault (kill, pause, restart, ...)"),
        ("#000", "tick: the store time the result reported"),
    ]
    spans = "".join(
        f"<span><i class='swatch' style='background:{c}'></i>{html.escape(t)}</span>"
        for c, t in items
    )
    return (
        f"<p class='legend'>{spans}<br>Bars run from invocation to completion; a bar that "
        "runs to the right edge never completed. In an anomalous resource the offending "
        "sub-history is outlined in blue, boxed, and zoomed below the whole timeline, "
        "where the rest is faded.</p>"
    )


def _figures_table(figures: dict[str, Any], report: Report) -> str:
    lin = figures["linearizability"]
    log = figures["log"]
    rows = [
        ("verdict", figures["verdict"]),
        ("operations", figures["operations"]),
        ("acknowledged (of which definite failures)", f"{report.acknowledged} ({report.failed})"),
        ("unknown outcome", figures["unknown"]),
        ("by kind", ", ".join(f"{k} {v}" for k, v in sorted(report.kinds.items()))),
        ("expiry races", figures["expiry_races"]),
        (
            "linearizability",
            f"{lin['resources']} resources: {lin['ok']} ok, {lin['anomaly']} anomalous, "
            f"{lin['unknown']} out of search budget",
        ),
        (
            "log replay",
            "not run" if log is None else f"{log['rows']} claims, {log['anomalies']} anomalies",
        ),
        (
            "faults",
            ", ".join(f"{k} {v}" for k, v in sorted(report.faults.items()) if k not in BOOKKEEPING)
            or "none",
        ),
        ("anomaly kinds", ", ".join(f"{k} {v}" for k, v in figures["anomaly_kinds"].items())),
        ("check time", f"{report.seconds:.1f} s"),
    ]
    cells = "".join(
        f"<tr><th>{html.escape(k)}</th><td>{html.escape(str(v))}</td></tr>" for k, v in rows
    )
    return f"<table class='figures'>{cells}</table>"


def _timeline(
    ops: Sequence[Op],
    nemesis: Sequence[dict[str, Any]],
    span: tuple[float, float],
    origin: float,
    origin_us: float,
    witness: set[str],
    bad: Op | None,
    resource: str,
    *,
    zoom: bool = False,
    local: bool = True,
) -> str:
    """An SVG: one lane per client, a bar per op, fault bands behind them.

    The ``witness`` ops are outlined and ``bad`` is drawn red; ``zoom`` shows
    only the time the witness spans, the other ops faded and each witness bar
    labelled. A tick on a bar marks the store time its result reported (a
    grant's ``created_at``, a confirm's or extend's ``updated_at``) on stores
    that share this machine's clock.
    """
    drawn = list(ops[:MAX_BARS])
    lo, hi = span
    mine = [op for op in ops if op.id in witness]
    if mine:
        w_lo = min(op.start for op in mine)
        w_hi = max(op.end if not math.isinf(op.end) else op.start for op in mine)
        pad = max((w_hi - w_lo) * 0.05, 1e-4)
        w_lo, w_hi = w_lo - pad, w_hi + pad
    if zoom and mine:
        lo, hi = w_lo, w_hi
        drawn = [op for op in ops if op.start <= hi and op.end >= lo][:MAX_BARS]
    clients = sorted({op.client for op in drawn}, key=_client_order)
    lanes = {c: i for i, c in enumerate(clients)}
    height = LANE * max(1, len(clients)) + 30
    scale = (WIDTH - LEFT - 10) / max(hi - lo, 1e-6)

    def x(t: float) -> float:
        return LEFT + (min(max(t, lo), hi) - lo) * scale

    out = [
        f"<svg class='timeline' data-resource='{html.escape(resource)}' "
        f"xmlns='http://www.w3.org/2000/svg' width='{WIDTH}' height='{height}'>"
    ]
    for c, i in lanes.items():
        y = i * LANE + 4
        out.append(f"<text x='4' y='{y + 12}'>{html.escape(c)}</text>")
        out.append(
            f"<line x1='{LEFT}' x2='{WIDTH - 10}' y1='{y + LANE - 2}' y2='{y + LANE - 2}' "
            "stroke='#eee'/>"
        )
    out.extend(_fault_bands(nemesis, lanes, x, lo, hi, height))
    if mine and not zoom:
        out.append(
            f"<rect class='zoom' x='{x(w_lo) - 2:.1f}' y='0' width='{x(w_hi) - x(w_lo) + 4:.1f}' "
            f"height='{height - 20}' fill='none' stroke='#1565c0' stroke-dasharray='3,2'>"
            "<title>the offending sub-history (zoomed below)</title></rect>"
        )
    for op in drawn:
        lane = lanes[op.client]
        x0, x1 = x(op.start), x(op.end if not math.isinf(op.end) else hi)
        y = lane * LANE + 5
        colour = COLOURS.get(op.status, COLOURS["unknown"])
        attrs = ""
        if bad is not None and op.id == bad.id:
            colour = "#c62828"
            attrs = " stroke='#000' stroke-width='1.5'"
        elif zoom and op.id not in witness:
            attrs = " opacity='0.25'"
        elif op.id in witness:
            attrs = " stroke='#0d47a1' stroke-width='1'"
        text = html.escape(describe_ops([op], origin_us)[0].strip(), quote=True)
        out.append(
            f"<rect class='op' data-id='{html.escape(op.id)}' data-status='{op.status}' "
            f"x='{x0:.1f}' y='{y}' width='{max(x1 - x0, 1.5):.1f}' "
            f"height='{LANE - 7}' fill='{colour}'{attrs}><title>{text}</title></rect>"
        )
        tick = _store_tick(op, origin_us) if local else None
        if tick is not None and lo <= tick <= hi:
            out.append(
                f"<line class='tick' x1='{x(tick):.1f}' x2='{x(tick):.1f}' y1='{y - 2}' "
                # Not a click target, nor the label below: a click on a bar reaches the bar.
                f"y2='{y + LANE - 5}' stroke='#000' stroke-width='1.5' pointer-events='none'/>"
            )
        if zoom and op.id in witness and x1 - x0 > 40:
            label = html.escape(_label(op))
            out.append(
                f"<text class='label' x='{x0 + 3:.1f}' y='{y + 9}' pointer-events='none' "
                f"style='fill:#fff;font-size:9px'>{label}</text>"
            )
    ms_lo, ms_hi = (lo - origin) * 1000, (hi - origin) * 1000
    out.append(f"<text x='{LEFT}' y='{height - 6}'>{ms_lo:.1f} ms</text>")
    out.append(f"<text x='{WIDTH - 10}' y='{height - 6}' text-anchor='end'>{ms_hi:.1f} ms</text>")
    out.append("</svg>")
    if len(ops) > len(drawn) and not zoom:
        out.append(f"<p>first {len(drawn)} of {len(ops)} ops drawn</p>")
    return "".join(out)


def _store_tick(op: Op, origin_us: float) -> float | None:
    """The monotonic time of the store step a result reported, if it reported one."""
    v = op.value
    if op.status != OK:
        return None
    if op.fn == "claim" and v.get("granted") and not v.get("replayed"):
        at = v.get("created_at")
    elif op.fn in ("confirm", "extend"):
        at = v.get("updated_at")
    else:
        return None
    if not isinstance(at, int):
        return None
    return op.start + (at - op.wall_start) / 1_000_000


def _label(op: Op) -> str:
    """A few words for a bar: the op and what came back."""
    v = op.value
    if op.fn == "claim":
        what = "granted" if v.get("granted") else "taken" if "granted" in v else op.status
        if v.get("replayed"):
            what += " (replay)"
        return f"claim -> {what}" + (f" f={v['fence']}" if "fence" in v else "")
    if op.status == FAIL:
        return f"{op.fn} -> {v.get('error')} {v.get('reason', '')}".rstrip()
    return f"{op.fn} -> {op.status}"


def _client_order(name: str) -> tuple[int, str]:
    digits = name[1:]
    return (int(digits), name) if name.startswith("c") and digits.isdigit() else (10**9, name)


def _fault_bands(
    nemesis: Sequence[dict[str, Any]],
    lanes: dict[str, int],
    x: Any,
    lo: float,
    hi: float,
    height: int,
) -> list[str]:
    out = []
    stopped: dict[str, float] = {}
    for event in sorted(nemesis, key=lambda e: e.get("t", 0.0)):
        kind, t = event.get("f"), float(event.get("t", 0.0))
        client = event.get("c")
        if kind == "stop" and client:
            stopped[client] = t
            continue
        if kind == "cont" and client in stopped:
            start = stopped.pop(client)
            out.extend(_band(x, start, t, lanes.get(client), height, "pause", lo, hi))
            continue
        if kind in BOOKKEEPING:
            continue
        width = 0.002 if kind != "pause" else 0.0
        lane = lanes.get(client) if client else None
        out.extend(_band(x, t, t + width, lane, height, str(kind), lo, hi))
    return out


def _band(
    x: Any,
    start: float,
    end: float,
    lane: int | None,
    height: int,
    label: str,
    lo: float,
    hi: float,
) -> list[str]:
    if end < lo or start > hi:
        return []
    x0, x1 = x(start), x(end)
    y, h = (0, height - 20) if lane is None else (lane * LANE + 2, LANE)
    return [
        f"<rect class='fault' x='{x0:.1f}' y='{y}' width='{max(x1 - x0, 2):.1f}' height='{h}' "
        f"fill='rgba(198,40,40,0.15)'><title>{html.escape(label)}</title></rect>"
    ]


def _witness_section(result: PartitionResult, report: Report, origin: float) -> str:
    if not result.witness:
        return "<p>Not shrunk: only the first anomalies are (raise --witnesses).</p>"
    lines = [f"Offending sub-history ({result.witness_note}):"]
    lines.extend(describe_ops(result.witness, report.origin_us))
    if result.impossible is not None:
        bad = describe_ops([result.impossible], report.origin_us)[0].strip()
        lines.append("")
        lines.append(f"Impossible: {bad}")
        lines.append("The model's possible states just before it:")
        described = describe_states(result.before, report.origin_us, result.impossible)
        for i, state in enumerate(described, 1):
            lines.append(f"  state {i} (claims on its targets):")
            lines.extend("    " + s for s in state)
    return f"<pre class='witness'>{html.escape(chr(10).join(lines))}</pre>"
