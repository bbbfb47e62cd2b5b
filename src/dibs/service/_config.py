"""What a running service is configured with: its store, keys, limits and showings."""

from __future__ import annotations

import string
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from dibs.exceptions import InvalidInput

__all__ = ["LotSpec", "ServiceConfig", "Showing"]

_ROWS = string.ascii_uppercase


@dataclass(frozen=True)
class Showing:
    """A venue's seats for one showing: ``rows`` x ``cols`` units ``seat-A1``... on ``slot``.

    Raises :class:`~dibs.InvalidInput` for an empty slot or a grid outside 1-26 x 1-60.
    """

    slot: str
    rows: int = 8
    cols: int = 12

    def __post_init__(self) -> None:
        if not isinstance(self.slot, str) or not self.slot or len(self.slot) > 200:
            raise InvalidInput(f"bad showing slot {self.slot!r}", field="slot", value=self.slot)
        if not 1 <= self.rows <= len(_ROWS) or not 1 <= self.cols <= 60:
            raise InvalidInput(
                f"a showing has 1-26 rows and 1-60 seats per row, got {self.rows}x{self.cols}",
                field="rows",
                value=(self.rows, self.cols),
            )

    @property
    def seats(self) -> tuple[str, ...]:
        """Seat resource names in row-major order: ``seat-A1``, ``seat-A2``, …"""
        return tuple(f"seat-{_ROWS[r]}{c + 1}" for r in range(self.rows) for c in range(self.cols))

    @classmethod
    def parse(cls, text: str) -> Showing:
        """Parse ``SLOT`` or ``SLOT:ROWSxCOLS`` (e.g. ``show-42:8x12``).

        Raises :class:`~dibs.InvalidInput` for a malformed text.
        """
        slot, _, grid = text.partition(":")
        if not grid:
            return cls(slot)
        rows, sep, cols = grid.lower().partition("x")
        if not sep or not rows.isdigit() or not cols.isdigit():
            raise InvalidInput(
                f"showing must look like SLOT or SLOT:ROWSxCOLS, got {text!r}",
                field="showing",
                value=text,
            )
        return cls(slot, int(rows), int(cols))


@dataclass(frozen=True)
class LotSpec:
    """A parking row served under ``/v1/lots/{name}``: ``size`` slots, ``fit`` policy.

    Every instance serving a lot must give it the same size. Raises
    :class:`~dibs.InvalidInput` for a bad name or size.
    """

    name: str
    size: int
    fit: Literal["first", "best"] = "first"

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name or len(self.name) > 200:
            raise InvalidInput(f"bad lot name {self.name!r}", field="lot", value=self.name)
        if not 1 <= self.size <= 100_000:
            raise InvalidInput(
                f"a lot has 1-100000 slots, got {self.size}", field="size", value=self.size
            )

    @classmethod
    def parse(cls, text: str) -> LotSpec:
        """Parse ``NAME:SIZE`` or ``NAME:SIZE:best``."""
        name, _, rest = text.partition(":")
        size, _, fit = rest.partition(":")
        if not size.isdigit() or fit not in ("", "first", "best"):
            raise InvalidInput(
                f"lot must look like NAME:SIZE[:first|best], got {text!r}", field="lot", value=text
            )
        return cls(name, int(size), "best" if fit == "best" else "first")


@dataclass(frozen=True)
class ServiceConfig:
    """Settings of one service instance; every limit applies per instance.

    ``rate`` and ``burst`` are the token bucket each API key gets (requests per
    second, and the most that may arrive at once). ``request_timeout`` bounds a
    store call, ``body_timeout`` the reading of a request body, and
    ``idempotency_wait`` how long a duplicate of an in-flight Idempotency-Key
    waits for the first request before it is answered ``409``. ``id_secret``
    keys the permutation that makes claim IDs opaque on the wire; when None,
    the secret kept in the store (made by the first instance), so every
    instance on one store, and every restart, agrees on claim IDs.
    """

    store_url: str = "sqlite:///dibs.db"
    keys_file: Path | None = Path("dibs-keys.json")
    showings: tuple[Showing, ...] = (Showing("show-1"),)
    lots: tuple[LotSpec, ...] = (LotSpec("lot-1", 40),)
    rate: float = 50.0
    burst: int = 100
    max_body: int = 64 * 1024
    max_targets: int = 100
    request_timeout: float = 10.0
    body_timeout: float = 10.0
    idempotency_wait: float = 5.0
    sweep_interval: float = 30.0
    poll_interval: float = 0.2
    threads: int = 32
    public_map: bool = True
    id_secret: bytes | None = None

    def __post_init__(self) -> None:
        if self.id_secret is not None and len(self.id_secret) < 16:
            raise InvalidInput(
                "id_secret must have at least 16 bytes", field="id_secret", value=None
            )
