"""Bad input outside the claim calls: URLs, store options, the fake clock."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

import dibs
from dibs.stores.memory import MemoryStore
from dibs.stores.sqlite import SQLiteStore

QUICK = True  # in `pytest -m quick` (conftest.is_quick: not slow, no server)


@pytest.mark.parametrize("url", [5, b"memory://", "", "memory", "://x"])
def test_open_rejects_what_is_not_a_store_url(url: Any) -> None:
    with pytest.raises(dibs.InvalidInput) as raised:
        dibs.open(url)
    assert raised.value.field == "url"


def test_unknown_scheme_lists_the_known_ones() -> None:
    with pytest.raises(dibs.UnknownScheme) as raised:
        dibs.open("redis://localhost/0")
    message = str(raised.value)
    assert "'redis'" in message and "memory" in message and "sqlite" in message
    assert isinstance(raised.value, ValueError)


@pytest.mark.parametrize("retention", [0, -1, math.nan, math.inf, "1d", None, True])
@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_bad_request_retention(kind: str, retention: Any, tmp_path: Path) -> None:
    url = "memory://" if kind == "memory" else f"sqlite:///{tmp_path / 'r.db'}"
    with pytest.raises(dibs.InvalidInput) as raised:
        dibs.open(url, request_retention=retention)
    assert raised.value.field == "request_retention"
    assert repr(retention) in str(raised.value)


@pytest.mark.parametrize("stripes", [0, -3, 1.5, True, "8"])
def test_bad_stripe_count(stripes: Any) -> None:
    with pytest.raises(dibs.InvalidInput) as raised:
        MemoryStore(stripes=stripes)
    assert raised.value.field == "stripes"


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"synchronous": "sometimes"}, "synchronous"),
        ({"busy_timeout": 0}, "busy_timeout"),
        ({"busy_timeout": math.inf}, "busy_timeout"),
        ({"busy_timeout": "5"}, "busy_timeout"),
    ],
)
def test_bad_sqlite_options(options: dict[str, Any], field: str, tmp_path: Path) -> None:
    with pytest.raises(dibs.InvalidInput) as raised:
        SQLiteStore(tmp_path / "o.db", **options)
    assert raised.value.field == field


def test_unknown_option_is_a_type_error_naming_it() -> None:
    with pytest.raises(TypeError, match="colour"):
        dibs.open("memory://", colour="blue")


@pytest.mark.parametrize("seconds", [-1, math.nan, math.inf, "1", True])
def test_fake_clock_never_goes_backwards(seconds: Any) -> None:
    clock = dibs.FakeClock(100.0)
    with pytest.raises(dibs.InvalidInput):
        clock.advance(seconds)
    assert clock.now() == 100.0
    assert clock.advance(0.5) == 100.5


def test_every_error_is_importable_from_dibs_and_rooted_at_dibs_error() -> None:
    names = [
        "InvalidInput",
        "UnknownScheme",
        "SpanKindMismatch",
        "RequestConflict",
        "ClaimNotFound",
        "NotHolder",
        "HoldLost",
        "StoreClosed",
        "SchemaError",
        "StoreUnavailable",
    ]
    for name in names:
        cls = getattr(dibs, name)
        assert issubclass(cls, dibs.DibsError), name
    assert issubclass(dibs.StoreUnavailable, ConnectionError)
    assert issubclass(dibs.NotHolder, PermissionError)
    assert issubclass(dibs.ClaimNotFound, LookupError)
