"""dibs.observe.instrument(): spans and metrics around every store call, on every store.

Checked with the OpenTelemetry SDK's in-memory exporter and reader; the
instrumented store must answer exactly as the store it wraps, errors included.
"""

from __future__ import annotations

import asyncio
import pickle
import re
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

import dibs
import dibs.aio
from dibs import FakeClock, HoldLost, InvalidInput, NotHolder, Span, Unit
from dibs.observe import InstrumentedAsyncStore, InstrumentedStore, instrument
from layout import DOCS


class Telemetry:
    def __init__(self) -> None:
        self.spans = InMemorySpanExporter()
        self.tracer_provider = TracerProvider()
        self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.spans))
        self.reader = InMemoryMetricReader()
        self.meter_provider = MeterProvider(metric_readers=[self.reader])

    def finished(self) -> list[ReadableSpan]:
        return list(self.spans.get_finished_spans())

    def points(self, name: str) -> dict[tuple[tuple[str, Any], ...], Any]:
        """The data points of metric ``name``, by their sorted attributes."""
        data = self.reader.get_metrics_data()
        found: dict[tuple[tuple[str, Any], ...], Any] = {}
        assert data is not None
        for resource in data.resource_metrics:
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    if metric.name == name:
                        for point in metric.data.data_points:
                            found[tuple(sorted(point.attributes.items()))] = point
        return found


@pytest.fixture
def telemetry() -> Iterator[Telemetry]:
    t = Telemetry()
    yield t
    t.tracer_provider.shutdown()
    t.meter_provider.shutdown()


@pytest.fixture
def traced(store: dibs.Store, telemetry: Telemetry) -> InstrumentedStore:
    return instrument(
        store,
        tracer_provider=telemetry.tracer_provider,
        meter_provider=telemetry.meter_provider,
    )


SECRETS = ("alice-pii", "bob-pii", "seat-pii", "show-pii", "req-pii")


def test_every_call_is_one_span_with_its_outcome_and_no_names(
    traced: InstrumentedStore, telemetry: Telemetry, clock: FakeClock
) -> None:
    unit = Unit("seat-pii", "show-pii")
    won = traced.claim(unit, holder="alice-pii", ttl=30, request_id="req-pii")
    assert won and won.claim is not None
    assert not traced.claim([unit, Unit("seat-2")], holder="bob-pii")
    assert traced.claim(unit, holder="alice-pii", ttl=30, request_id="req-pii").replayed
    traced.extend(won.claim.id, holder="alice-pii", fence=won.claim.fence, ttl=60)
    traced.confirm(won.claim.id, holder="alice-pii", fence=won.claim.fence)
    assert traced.get(won.claim.id) is not None
    assert traced.holder_of(unit) == "alice-pii"
    assert len(traced.claims_of("alice-pii")) == 1
    assert traced.release(won.claim.id, holder="alice-pii", fence=won.claim.fence)
    traced.sweep()

    spans = telemetry.finished()
    summary = [(s.name, s.attributes["dibs.outcome"]) for s in spans]  # type: ignore[index]
    assert summary == [
        ("dibs.claim", "granted"),
        ("dibs.claim", "taken"),
        ("dibs.claim", "replayed"),
        ("dibs.extend", "ok"),
        ("dibs.confirm", "ok"),
        ("dibs.get", "ok"),
        ("dibs.holder_of", "ok"),
        ("dibs.claims_of", "ok"),
        ("dibs.release", "ok"),
        ("dibs.sweep", "ok"),
    ]
    for span in spans:
        assert span.kind is SpanKind.CLIENT
        assert span.attributes is not None
        assert span.attributes["dibs.store"] == traced.store.scheme
        assert span.attributes["dibs.operation"] == span.name.removeprefix("dibs.")
        assert span.status.status_code is StatusCode.UNSET
        text = repr(dict(span.attributes)) + repr(span.events) + span.name
        assert not any(secret in text for secret in SECRETS), text
    assert spans[1].attributes is not None and spans[1].attributes["dibs.targets"] == 2


def test_errors_are_spans_with_their_type_and_no_message(
    traced: InstrumentedStore, telemetry: Telemetry, clock: FakeClock
) -> None:
    won = traced.claim(Unit("seat-pii"), holder="alice-pii", ttl=5).claim
    assert won is not None
    with pytest.raises(NotHolder):
        traced.confirm(won.id, holder="bob-pii", fence=won.fence)
    clock.advance(10)
    with pytest.raises(HoldLost):
        traced.confirm(won.id, holder="alice-pii", fence=won.fence)
    with pytest.raises(InvalidInput):
        traced.claim([], holder="alice-pii")
    failed = telemetry.finished()[1:]
    assert [s.attributes["error.type"] for s in failed] == [  # type: ignore[index]
        "NotHolder",
        "HoldLost",
        "InvalidInput",
    ]
    for span in failed:
        assert span.status.status_code is StatusCode.ERROR
        assert span.status.description is None and span.events == ()  # no message, no PII
        assert span.attributes is not None and span.attributes["dibs.outcome"] == "error"


def test_claims_are_counted_by_outcome_and_calls_timed(
    traced: InstrumentedStore, telemetry: Telemetry
) -> None:
    for i in range(5):
        traced.claim(Unit(f"seat-{i % 3}"), holder="alice", ttl=None)
    with pytest.raises(InvalidInput):
        traced.claim(Unit("seat-1"), holder="", ttl=None)
    traced.sweep()
    scheme = traced.store.scheme
    claims = {k: p.value for k, p in telemetry.points("dibs.claims").items()}
    # The holder re-claiming exactly what it holds gets its claim back, replayed.
    assert claims == {
        (("dibs.outcome", "granted"), ("dibs.store", scheme)): 3,
        (("dibs.outcome", "replayed"), ("dibs.store", scheme)): 2,
        (("dibs.outcome", "error"), ("dibs.store", scheme)): 1,
    }
    durations = {k: p.count for k, p in telemetry.points("dibs.operation.duration").items()}
    assert durations == {
        (("dibs.operation", "claim"), ("dibs.outcome", "granted"), ("dibs.store", scheme)): 3,
        (("dibs.operation", "claim"), ("dibs.outcome", "replayed"), ("dibs.store", scheme)): 2,
        (("dibs.operation", "claim"), ("dibs.outcome", "error"), ("dibs.store", scheme)): 1,
        (("dibs.operation", "sweep"), ("dibs.outcome", "ok"), ("dibs.store", scheme)): 1,
    }


def test_the_instrumented_store_is_the_store(
    store: dibs.Store, traced: InstrumentedStore, telemetry: Telemetry
) -> None:
    assert isinstance(traced, dibs.Store)
    assert traced.scheme == store.scheme and type(traced).in_process == type(store).in_process
    assert instrument(traced) is traced
    assert traced.job_table() is store.job_table()
    assert traced.now().tzinfo is not None
    assert traced.claim_log() is not None or store.claim_log() is None
    # The patterns run on it unchanged, and their store calls are traced.
    found = dibs.match(traced, ["driver-1", "driver-2"], holder="rider", request_id="ride-1")
    assert found.candidate == Unit("driver-1")
    assert {s.name for s in telemetry.finished()} >= {"dibs.claims_of", "dibs.claim"}
    traced.close()
    assert traced.closed and store.closed
    with pytest.raises(dibs.StoreClosed):
        store.claim(Unit("x"), holder="a")


def test_spans_nest_under_the_callers_span(traced: InstrumentedStore, telemetry: Telemetry) -> None:
    tracer = telemetry.tracer_provider.get_tracer("app")
    with tracer.start_as_current_span("checkout"):
        traced.claim(Span("room", 0, 5), holder="a")
    claim, checkout = telemetry.finished()
    assert claim.parent is not None and claim.parent.span_id == checkout.context.span_id


def test_instrument_refuses_what_is_not_a_store() -> None:
    with pytest.raises(InvalidInput) as raised:
        instrument("memory://")  # type: ignore[arg-type]
    assert raised.value.field == "store"


def test_errors_through_the_instrumented_store_still_pickle(
    traced: InstrumentedStore,
) -> None:
    with pytest.raises(InvalidInput) as raised:
        traced.claim(Unit("x"), holder="", ttl=None)
    assert pickle.loads(pickle.dumps(raised.value)).field == "holder"


def test_nothing_imports_opentelemetry_until_asked() -> None:
    code = (
        "import sys, dibs, dibs.cli\n"
        "s = dibs.open('memory://'); s.claim(dibs.Unit('a'), holder='h'); s.sweep()\n"
        "assert not [m for m in sys.modules if m.startswith('opentelemetry')], 'imported'\n"
        "import dibs.observe\n"
        "assert not [m for m in sys.modules if m.startswith('opentelemetry')], 'on import'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


@pytest.mark.parametrize("index", [0, 1, 2, 3])
def test_the_observability_page_runs_as_pasted(index: int) -> None:
    page = (DOCS / "observability.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", page, re.S)
    assert len(blocks) == 4
    done = subprocess.run(
        [sys.executable, "-c", blocks[index]],
        check=True,
        timeout=60,
        capture_output=True,
        text=True,
    )
    if index == 0:  # the DEBUG lines its comments show
        assert "taken over" in done.stderr and "hold lost (taken_over)" in done.stderr
    if index == 3:  # the async example prints what its comment says
        assert done.stdout.splitlines() == ["['granted', 'taken']"]


# --- the async stores (dibs.aio) ------------------------------------------------------------------


def test_an_async_store_makes_the_same_spans_and_metrics(
    aio_url: str, telemetry: Telemetry
) -> None:
    clock = FakeClock()

    async def main() -> None:
        opened = dibs.aio.open(aio_url, clock=clock)
        store = instrument(
            opened,
            tracer_provider=telemetry.tracer_provider,
            meter_provider=telemetry.meter_provider,
        )
        assert isinstance(store, InstrumentedAsyncStore) and isinstance(store, dibs.aio.AsyncStore)
        assert instrument(store) is store and store.store is opened
        async with store:
            unit = Unit("seat-pii", "show-pii")
            won = await store.claim(unit, holder="alice-pii", ttl=30, request_id="req-pii")
            assert won and won.claim is not None
            assert not await store.claim([unit, Unit("seat-2")], holder="bob-pii")
            assert (
                await store.claim(unit, holder="alice-pii", ttl=30, request_id="req-pii")
            ).replayed
            c = won.claim
            await store.extend(c.id, holder="alice-pii", fence=c.fence, ttl=60)
            await store.confirm(c.id, holder="alice-pii", fence=c.fence)
            assert await store.get(c.id) is not None
            assert await store.holder_of(unit) == "alice-pii"
            assert len(await store.claims_of("alice-pii")) == 1
            assert await store.release(c.id, holder="alice-pii", fence=c.fence)
            await store.sweep()
            with pytest.raises(NotHolder):
                await store.confirm(c.id, holder="bob-pii", fence=c.fence)
            with pytest.raises(InvalidInput):
                await store.claim([], holder="alice-pii")
            assert store.request_retention == opened.request_retention  # type: ignore[attr-defined]
        assert store.closed and opened.closed
        with pytest.raises(dibs.StoreClosed):
            await opened.claim(Unit("x"), holder="a")

    asyncio.run(main())
    spans = telemetry.finished()
    summary = [(s.name, s.attributes["dibs.outcome"]) for s in spans]  # type: ignore[index]
    assert summary == [
        ("dibs.claim", "granted"),
        ("dibs.claim", "taken"),
        ("dibs.claim", "replayed"),
        ("dibs.extend", "ok"),
        ("dibs.confirm", "ok"),
        ("dibs.get", "ok"),
        ("dibs.holder_of", "ok"),
        ("dibs.claims_of", "ok"),
        ("dibs.release", "ok"),
        ("dibs.sweep", "ok"),
        ("dibs.confirm", "error"),
        ("dibs.claim", "error"),
    ]
    scheme = urlsplit(aio_url).scheme
    for span in spans:
        assert span.kind is SpanKind.CLIENT and span.attributes is not None
        assert span.attributes["dibs.store"] == scheme
        text = repr(dict(span.attributes)) + repr(span.events) + span.name
        assert not any(secret in text for secret in SECRETS), text
    assert [s.attributes["error.type"] for s in spans[-2:]] == ["NotHolder", "InvalidInput"]  # type: ignore[index]
    claims = {k: p.value for k, p in telemetry.points("dibs.claims").items()}
    assert claims == {
        (("dibs.outcome", outcome), ("dibs.store", scheme)): 1
        for outcome in ("granted", "taken", "replayed", "error")
    }
    durations = telemetry.points("dibs.operation.duration")
    assert sum(p.count for p in durations.values()) == len(spans)


def test_async_spans_nest_under_their_tasks_span_only(telemetry: Telemetry) -> None:
    tracer = telemetry.tracer_provider.get_tracer("app")

    async def checkout(store: InstrumentedAsyncStore, name: str) -> None:
        with tracer.start_as_current_span(name):
            await asyncio.sleep(0)
            await store.claim(Unit(name), holder=name)
            await asyncio.sleep(0)
            await store.holder_of(Unit(name))

    async def main() -> None:
        async with instrument(
            dibs.aio.open("memory://"),
            tracer_provider=telemetry.tracer_provider,
            meter_provider=telemetry.meter_provider,
        ) as store:
            await asyncio.gather(*(checkout(store, f"task-{i}") for i in range(8)))

    asyncio.run(main())
    spans = telemetry.finished()
    parents = {s.context.span_id: s.name for s in spans if s.name.startswith("task-")}
    calls = [s for s in spans if s.name.startswith("dibs.")]
    assert len(parents) == 8 and len(calls) == 16
    for call in calls:
        assert call.parent is not None
        owner = parents[call.parent.span_id]
        # The claim's targets are the task's own: it nested under its own task's span.
        assert call.attributes is not None and call.attributes["dibs.operation"] in (
            "claim",
            "holder_of",
        )
        assert sum(1 for c in calls if c.parent and parents[c.parent.span_id] == owner) == 2


def test_the_async_patterns_and_a_lease_run_on_an_instrumented_async_store(
    telemetry: Telemetry, tmp_path: Path
) -> None:
    async def main() -> None:
        async with instrument(
            dibs.aio.open(f"sqlite:///{tmp_path / 'dibs.db'}"),
            tracer_provider=telemetry.tracer_provider,
            meter_provider=telemetry.meter_provider,
        ) as store:
            found = await dibs.aio.match(
                store, ["driver-1", "driver-2"], holder="rider", request_id="ride-1"
            )
            assert found.candidate == Unit("driver-1")
            async with store.lease(Unit("report"), holder="cron", ttl=30) as lease:
                assert lease.fence > 0
            assert await store.holder_of(Unit("report")) is None

    asyncio.run(main())
    names = [s.name for s in telemetry.finished()]
    assert {"dibs.claim", "dibs.release", "dibs.holder_of"} <= set(names)


def test_a_cancelled_async_call_is_an_error_span(telemetry: Telemetry, tmp_path: Path) -> None:
    path = tmp_path / "dibs.db"

    async def main() -> None:
        async with instrument(
            dibs.aio.open(f"sqlite:///{path}?busy_timeout=600"),
            tracer_provider=telemetry.tracer_provider,
            meter_provider=telemetry.meter_provider,
        ) as store:
            await store.sweep()  # opened: the file and its tables exist
            blocker = sqlite3.connect(path, isolation_level=None)
            blocker.execute("BEGIN EXCLUSIVE")  # the claim waits on its worker
            call = asyncio.ensure_future(store.claim(Unit("a"), holder="h", request_id="r"))
            await asyncio.sleep(0.05)  # not a timing claim: cancelled queued or running alike
            call.cancel()
            with pytest.raises(asyncio.CancelledError):
                await call
            blocker.execute("ROLLBACK")
            blocker.close()
            assert await store.claim(Unit("a"), holder="h", request_id="r")

    asyncio.run(main())
    swept, cancelled, retried = telemetry.finished()
    assert swept.name == "dibs.sweep"
    assert cancelled.attributes is not None and retried.attributes is not None
    assert cancelled.attributes["dibs.outcome"] == "error"
    assert cancelled.attributes["error.type"] == "CancelledError"
    assert cancelled.status.status_code is StatusCode.ERROR
    assert retried.attributes["dibs.outcome"] in ("granted", "replayed")


def test_idempotent_functions_run_on_an_instrumented_async_store(
    telemetry: Telemetry, tmp_path: Path
) -> None:
    async def main() -> None:
        opened = dibs.aio.open(f"sqlite:///{tmp_path / 'dibs.db'}", request_retention=120)
        async with instrument(opened, tracer_provider=telemetry.tracer_provider) as store:

            @dibs.idempotent(store, key="k")
            async def work(k: str) -> str:
                return k * 2

            assert await work("a") == await work("a") == "aa"
            assert store.request_retention == 120  # type: ignore[attr-defined]  # the store's

    asyncio.run(main())
    outcomes = [(s.name, s.attributes["dibs.outcome"]) for s in telemetry.finished()]  # type: ignore[index]
    assert outcomes.count(("dibs.claim", "granted")) == 2  # the run hold, then the result
