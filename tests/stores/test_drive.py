"""dibs._drive: the one driver every rule written as steps runs on, on both faces."""

from __future__ import annotations

import asyncio
from collections.abc import Generator
from typing import Any

import pytest

from dibs._drive import adrive, drive


class Decided(Exception):
    pass


def rule(log: list[str]) -> Generator[str, Any, str]:
    """Asks twice; decides on a Decided error from the second step; cleans up when closed."""
    try:
        first = yield "a"
        log.append(f"got {first}")
        try:
            yield "fail"
        except Decided:
            log.append("decided")
        last = yield "b"
        return f"done {last}"
    finally:
        log.append("closed")


def perform(step: str) -> str:
    if step == "fail":
        raise Decided
    if step == "boom":
        raise KeyError(step)
    return step.upper()


async def aperform(step: str) -> str:
    await asyncio.sleep(0)
    return perform(step)


def test_answers_go_back_in_and_decided_errors_are_thrown_in() -> None:
    log: list[str] = []
    assert drive(rule(log), perform, Decided) == "done B"
    assert log == ["got A", "decided", "closed"]
    log.clear()
    assert asyncio.run(adrive(rule(log), aperform, Decided)) == "done B"
    assert log == ["got A", "decided", "closed"]


def test_other_errors_close_the_rule_and_propagate() -> None:
    log: list[str] = []
    with pytest.raises(Decided):
        drive(rule(log), perform)  # Decided not among the errors it decides on
    assert log == ["got A", "closed"]


def test_a_started_rule_continues_from_its_first_step() -> None:
    log: list[str] = []
    steps = rule(log)
    first = next(steps)
    assert drive(steps, perform, Decided, first=first) == "done B"


def test_a_rule_that_yields_nothing_returns_at_once() -> None:
    def nothing() -> Generator[str, Any, int]:
        return 7
        yield "never"

    assert drive(nothing(), perform) == 7
    assert asyncio.run(adrive(nothing(), aperform)) == 7


def test_a_cancellation_closes_the_rule() -> None:
    log: list[str] = []

    async def main() -> None:
        performing = asyncio.Event()

        async def slow(step: str) -> str:
            performing.set()
            await asyncio.sleep(3600)  # held until cancelled
            return step

        task = asyncio.ensure_future(adrive(rule(log), slow))
        await performing.wait()  # the rule is mid-step: cancelling must close it
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert log == ["closed"]
