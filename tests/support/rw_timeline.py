"""The readers-and-writers races' timeline: JSON lines the holders wrote, read back."""

from __future__ import annotations

import json

from dibs import Target
from dibs._model import target_from_json


def read_timeline(path: str) -> list[tuple[int, str, str, Target]]:
    """``(step, "in"|"out", mode, target)`` events for ``check_rw_history``, in order."""
    events: list[tuple[int, str, str, Target]] = []
    steps: dict[str, int] = {}
    with open(path) as lines:
        for line in lines:
            step, what, mode, target = json.loads(line)
            events.append(
                (steps.setdefault(step, len(steps)), what, mode, target_from_json(target))
            )
    return events
