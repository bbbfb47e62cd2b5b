"""Prometheus metrics of one service instance, on a registry of its own."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.metrics import MetricWrapperBase

__all__ = ["Metrics"]

_LATENCY_BUCKETS = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip


class Metrics:
    """The counters and histograms ``/metrics`` exposes.

    A registry per instance (not the global one) so several apps in one process,
    as in the tests, count separately.
    """

    def __init__(self, store_kind: str) -> None:
        self.registry = CollectorRegistry()
        self.store_kind = store_kind
        self.claims = Counter(
            "dibs_claims",
            "Claims answered, by outcome: granted, taken (lost the race), replayed.",
            ["outcome"],
            registry=self.registry,
        )
        self.holds_expired = Counter(
            "dibs_holds_expired",
            "Dead holds the sweeper marked expired.",
            registry=self.registry,
        )
        self.holds_taken_over = Counter(
            "dibs_holds_taken_over",
            "Confirms, extends and releases that found their hold taken over by another claim.",
            registry=self.registry,
        )
        self.hold_lost = Counter(
            "dibs_hold_lost",
            "Confirm, extend and release calls that lost their hold, by operation and reason.",
            ["operation", "reason"],
            registry=self.registry,
        )
        self.store_latency = Histogram(
            "dibs_store_operation_seconds",
            "Time of one store call, by operation and store kind.",
            ["operation", "store"],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.http_requests = Counter(
            "dibs_http_requests",
            "HTTP requests answered, by route and status code.",
            ["route", "status"],
            registry=self.registry,
        )
        self.http_latency = Histogram(
            "dibs_http_request_seconds",
            "Time to answer an HTTP request, by route.",
            ["route"],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.rate_limited = Counter(
            "dibs_rate_limited",
            "Requests refused with 429 because the key's rate limit was exceeded.",
            registry=self.registry,
        )
        self.idempotency_waits = Counter(
            "dibs_idempotency_waits",
            "Requests that waited for an in-flight duplicate Idempotency-Key, by outcome.",
            ["outcome"],
            registry=self.registry,
        )
        # Labelled children by (metric, labels): ``labels()`` validates and
        # locks on every call, a few microseconds each on the hot path; every
        # label set here is bounded (routes, statuses, outcomes, operations).
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}

    def _child(self, metric: MetricWrapperBase, *labels: str) -> Any:
        key = (id(metric), labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child

    def observe_store(self, operation: str, seconds: float) -> None:
        """Record one store call's duration."""
        self._child(self.store_latency, operation, self.store_kind).observe(seconds)

    def observe_http(self, route: str, status: int, seconds: float) -> None:
        """Count one answered HTTP request and record its duration."""
        self._child(self.http_requests, route, str(status)).inc()
        self._child(self.http_latency, route).observe(seconds)

    def claimed(self, outcome: str) -> None:
        """Count one claim answered: ``granted``, ``taken`` or ``replayed``."""
        self._child(self.claims, outcome).inc()

    def render(self) -> bytes:
        """The Prometheus text exposition of every metric."""
        return generate_latest(self.registry)
