"""The rate-limit check the tests share: every window that admits more than the limit."""

from __future__ import annotations

from collections.abc import Sequence


def over_limit(admitted: Sequence[Sequence[int]], limit: int, window_us: int) -> list[str]:
    """Every window ``[t, t + window_us)`` starting at an admission that holds more than ``limit``.

    ``admitted`` holds ``(created_at µs, ..., cost)`` rows. A window holding the
    most admissions can always be slid right until it starts at one, so these
    windows are the only ones to check.
    """
    rows = sorted((row[0], row[-1]) for row in admitted)
    found: list[str] = []
    total, j = 0, 0
    for i, (start, _) in enumerate(rows):
        while j < len(rows) and rows[j][0] < start + window_us:
            total += rows[j][1]
            j += 1
        if total > limit:
            found.append(f"{total} units admitted in [{start}, {start + window_us}) µs")
        total -= rows[i][1]
    return found
