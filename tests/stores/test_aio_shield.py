"""``to_the_end`` (src/dibs/_shield.py): shielded work finishes, and a cancellation is never lost.

A step that must not stop halfway (storing a result whose function ran, ending a run
hold) runs to its end when its caller is cancelled; the caller then sees the
cancellation. The hard moment is a cancel that lands as the shielded work ends: the
caller's await is answered with ``CancelledError`` while the work is already done, and
that cancellation must still reach the caller. Here each store call of an async
``@dibs.idempotent`` call cancels its caller just before or just after it runs (every
await point), on every async store; and the asyncio bookkeeping (``cancelling()``,
``asyncio.timeout``) is checked on its own.
"""

from __future__ import annotations

import asyncio
import inspect
from typing import Any

import pytest

import dibs
import dibs.aio
from dibs._shield import to_the_end


class _CancelAt:
    """An async store whose ``n``-th call cancels ``task`` just before or just after it runs."""

    def __init__(self, store: Any, n: int, when: str) -> None:
        self._store, self._n, self._when = store, n, when
        self.calls = 0
        self.task: asyncio.Task[Any] | None = None
        self.fired = False

    def _fire(self) -> None:
        assert self.task is not None
        self.task.cancel()
        self.fired = True

    def __getattr__(self, name: str) -> Any:
        inner = getattr(self._store, name)
        if not inspect.iscoroutinefunction(inner):
            return inner

        async def call(*args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            armed = self.calls == self._n and self.task is not None
            if armed and self._when == "before":
                self._fire()
            answer = await inner(*args, **kwargs)
            if armed and self._when == "after":
                self._fire()
            return answer

        return call


def test_a_cancel_at_any_store_call_of_an_idempotent_call_reaches_its_caller(
    aio_url: str,
) -> None:
    """Cancel the caller at each store call (before it, after it) of an idempotent call:
    whenever a cancel was asked for, the caller ends with ``CancelledError``, never with
    the value; the retry replays or runs, and the function ran to its end once per key."""
    ran: dict[str, int] = {}

    async def main() -> None:
        store = dibs.aio.open(aio_url)
        try:
            await rounds(store)
        finally:
            await store.close()

    async def rounds(store: Any) -> None:
        plain = _CancelAt(store, 0, "after")

        async def body(key: str) -> str:
            await asyncio.sleep(0)
            ran[key] = ran.get(key, 0) + 1  # ran to its end
            return f"done {key}"

        # How many store calls one whole call makes, to cancel at each of them.
        plain.task = asyncio.current_task()
        await dibs.idempotent(plain, key="key", ttl=3600)(body)("probe")
        total = plain.calls
        assert total >= 2  # at least the run hold and the stored result
        lost: list[tuple[int, str]] = []
        for n in range(1, total + 1):
            for when in ("before", "after"):
                key = f"k{n}{when}"
                proxy = _CancelAt(store, n, when)
                work = dibs.idempotent(proxy, key="key", ttl=3600)(body)
                task = asyncio.ensure_future(work(key))
                proxy.task = task
                try:
                    await task
                except asyncio.CancelledError:
                    pass
                else:
                    if proxy.fired:
                        lost.append((n, when))
                assert proxy.fired, (n, when)
                again = dibs.idempotent(store, key="key", ttl=3600)(body)
                assert await again(key) == f"done {key}", (n, when)
                assert ran[key] == 1, (n, when, ran[key])
        assert lost == [], f"cancellations swallowed at (store call, when): {lost}"

    asyncio.run(main())


# --- the asyncio bookkeeping, without a store -------------------------------------------


def test_a_cancel_landing_as_the_work_ends_is_re_raised() -> None:
    """The work cancels its caller as its last step: the work's effect stays, the caller
    sees ``CancelledError``, and its ``cancelling()`` count says one cancel is pending."""

    async def main() -> None:
        done: list[str] = []
        caller: asyncio.Task[Any] | None = None

        async def work() -> str:
            await asyncio.sleep(0)
            assert caller is not None
            caller.cancel()
            done.append("stored")
            return "value"

        async def call() -> str:
            return await to_the_end(work())

        caller = asyncio.ensure_future(call())
        with pytest.raises(asyncio.CancelledError):
            await caller
        assert done == ["stored"]

        async def counted() -> int:
            me = asyncio.current_task()
            assert me is not None
            nonlocal caller
            caller = me
            try:
                await to_the_end(work())
            except asyncio.CancelledError:
                return me.cancelling()
            return -1

        assert await asyncio.ensure_future(counted()) == 1

    asyncio.run(main())


@pytest.mark.parametrize("steps", range(6))
def test_a_cancel_after_any_number_of_loop_steps_is_re_raised(steps: int) -> None:
    """Cancelled after 0..5 loop turns: the work always ends, and the caller is
    cancelled unless the work was done before the cancel came."""

    async def main() -> None:
        done: list[int] = []

        async def work() -> int:
            for _ in range(3):
                await asyncio.sleep(0)
            done.append(1)
            return 7

        async def call() -> int:
            return await to_the_end(work())

        task = asyncio.ensure_future(call())
        for _ in range(steps):
            await asyncio.sleep(0)
        finished_first = task.done()
        task.cancel()
        try:
            value: int | None = await task
        except asyncio.CancelledError:
            value = None
        assert (value == 7) is finished_first
        await asyncio.sleep(0.01)
        assert done == ([] if steps == 0 else [1])  # at 0 the call never started

    asyncio.run(main())


def test_a_timeout_around_shielded_work_still_ends_as_timeout_error() -> None:
    """``asyncio.timeout`` cancels the caller; ``to_the_end`` re-raises that, so the
    timeout turns it into ``TimeoutError`` and the count goes back to 0."""

    async def main() -> None:
        finished = asyncio.Event()

        async def work() -> None:
            await asyncio.sleep(0.05)
            finished.set()

        me = asyncio.current_task()
        assert me is not None
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.001):
                await to_the_end(work())
        assert finished.is_set()
        assert me.cancelling() == 0

    asyncio.run(main())


def test_the_work_s_own_outcome_passes_through_when_nobody_cancels() -> None:
    """Not cancelled: the work's value, its error, or its own cancellation."""

    async def main() -> None:
        async def fails() -> None:
            await asyncio.sleep(0)
            raise ValueError("boom")

        async def value() -> int:
            return 3

        assert await to_the_end(value()) == 3
        with pytest.raises(ValueError, match="boom"):
            await to_the_end(fails())

        async def cancels_itself() -> None:
            me = asyncio.current_task()
            assert me is not None
            me.cancel()
            await asyncio.sleep(0)

        me = asyncio.current_task()
        assert me is not None
        with pytest.raises(asyncio.CancelledError):
            await to_the_end(cancels_itself())
        assert me.cancelling() == 0

    asyncio.run(main())
