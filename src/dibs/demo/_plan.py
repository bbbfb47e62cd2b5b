"""The ticket rush on paper: the venue, the customers and what each one will do.

Pure and picklable: the plan is drawn once in the parent process and handed to
the workers, so a ``--seed`` reproduces who arrives when and wants what (the
races between them are real and differ from run to run).
"""

from __future__ import annotations

import enum
import random
from dataclasses import dataclass

from dibs._model import Unit
from dibs.exceptions import InvalidInput

__all__ = ["Behaviour", "Customer", "DemoConfig", "Venue", "plan_customers"]


class Behaviour(enum.StrEnum):
    """What a customer does once a hold is granted."""

    PAY = "pay"
    """Pays (confirms) within the hold's TTL."""
    ABANDON = "abandon"
    """Walks away: the hold expires and later customers take the seats over."""
    LATE = "late"
    """Pays after the hold expired: must be refused with ``HoldLost``."""
    RETRY = "retry"
    """Sends every claim twice with one request ID (a lost response), then pays."""


@dataclass(frozen=True, slots=True)
class DemoConfig:
    """Everything that shapes one run of the demo.

    ``store=None`` means a fresh SQLite file, :data:`~dibs.demo.DEFAULT_URL`,
    deleted and recreated at the start. ``processes=0`` runs the customers as
    threads of this process (always so for ``memory://``). Raises
    :class:`~dibs.InvalidInput` for a value out of range.
    """

    store: str | None = None
    seats: int = 300
    row_size: int = 20
    customers: int = 3000
    processes: int = 4
    threads: int = 4
    ttl: float = 1.5
    tries: int = 5
    burst: float = 0.5
    window: float | None = None
    abandon: float = 0.10
    late: float = 0.06
    retry: float = 0.08
    seed: int | None = None

    def __post_init__(self) -> None:
        for name in ("seats", "row_size", "customers", "threads", "tries"):
            _require(name, getattr(self, name), getattr(self, name) >= 1, "at least 1")
        _require("processes", self.processes, self.processes >= 0, "0 or more")
        _require("ttl", self.ttl, 0 < self.ttl <= 60, "in (0, 60] seconds")
        _require("burst", self.burst, 0 <= self.burst <= 1, "a fraction in [0, 1]")
        if self.window is not None:
            _require("window", self.window, self.window >= 0, ">= 0 seconds")
        mix = (self.abandon, self.late, self.retry)
        _require(
            "abandon, late and retry",
            mix,
            all(0 <= share <= 1 for share in mix) and sum(mix) <= 1,
            "fractions summing to at most 1",
        )

    @property
    def arrival_window(self) -> float:
        """Seconds over which the customers after the opening burst arrive."""
        return 2 * self.ttl if self.window is None else self.window

    @property
    def late_delay(self) -> float:
        """How long a late payer waits after its hold was granted before paying."""
        return self.ttl + max(0.25, self.ttl / 2)


@dataclass(frozen=True, slots=True)
class Venue:
    """A hall of ``seats`` seats in rows of ``row_size``, all for one showing.

    Every seat is the unit ``("seat-<row><number>", show)``, e.g.
    ``Unit("seat-C14", "show-3fa9c1")``; a fresh show per run keeps runs apart
    on a store that outlives them.
    """

    seats: int
    row_size: int
    show: str

    @property
    def rows(self) -> int:
        """Number of rows; the last one may be short."""
        return -(-self.seats // self.row_size)

    def row_length(self, row: int) -> int:
        """Seats in row ``row`` (0-based)."""
        return min(self.row_size, self.seats - row * self.row_size)

    def seat(self, row: int, number: int) -> Unit:
        """The unit for seat ``number`` (1-based) of row ``row`` (0-based)."""
        return Unit(f"seat-{row_label(row)}{number}", self.show)

    def units(self) -> list[Unit]:
        """Every seat, front row first."""
        return [
            self.seat(row, n)
            for row in range(self.rows)
            for n in range(1, self.row_length(row) + 1)
        ]

    def pick(self, rng: random.Random, party: int) -> tuple[Unit, ...]:
        """Choose ``party`` adjacent seats in one row; front rows are the most wanted."""
        rows = self.rows
        row = rng.choices(range(rows), weights=range(rows, 0, -1))[0]
        length = self.row_length(row)
        size = min(party, length)
        first = rng.randrange(1, length - size + 2)
        return tuple(self.seat(row, n) for n in range(first, first + size))


def _require(name: str, value: object, ok: bool, what: str) -> None:
    if not ok:
        raise InvalidInput(f"{name} must be {what}, got {value!r}", field=name, value=value)


def row_label(row: int) -> str:
    """Spreadsheet-style row names: A … Z, AA, AB, …"""
    label = ""
    row += 1
    while row:
        row, rest = divmod(row - 1, 26)
        label = chr(ord("A") + rest) + label
    return label


@dataclass(frozen=True, slots=True)
class Customer:
    """One simulated customer: who, what they do, how many seats, when they arrive."""

    name: str
    behaviour: Behaviour
    party: int
    arrives: float
    seed: int


_PARTY_SIZES = (1, 2, 3, 4)
_PARTY_WEIGHTS = (55, 25, 10, 10)


def plan_customers(config: DemoConfig, rng: random.Random) -> list[Customer]:
    """Draw every customer's behaviour, party size and arrival time."""
    n = config.customers
    shares = [
        (Behaviour.ABANDON, config.abandon),
        (Behaviour.LATE, config.late),
        (Behaviour.RETRY, config.retry),
    ]
    # Exact counts rather than independent draws, so every kind shows up in small runs.
    behaviours: list[Behaviour] = []
    for behaviour, share in shares:
        behaviours += [behaviour] * max(1 if share > 0 and n >= 4 else 0, round(n * share))
    behaviours = behaviours[:n]
    behaviours += [Behaviour.PAY] * (n - len(behaviours))
    rng.shuffle(behaviours)
    burst = round(n * config.burst)
    customers = []
    for i, behaviour in enumerate(behaviours):
        arrives = 0.0 if i < burst else rng.uniform(0, config.arrival_window)
        customers.append(
            Customer(
                name=f"customer-{i + 1:05d}",
                behaviour=behaviour,
                party=rng.choices(_PARTY_SIZES, weights=_PARTY_WEIGHTS)[0],
                arrives=arrives,
                seed=rng.getrandbits(64),
            )
        )
    return customers
