"""``@dibs.idempotent`` on every store: replays, conflicts, crashes, duplicates at once."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import pickle
import random
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dibs
import dibs.aio
from _race import race
from conftest import SHARED_STORE_KINDS, StoreMaker
from dibs import FakeClock, IdempotencyInProgress, InvalidInput, RequestConflict, Store
from dibs.idempotency import RESULT_MAX_BYTES
from dibs.testing.strategies import names
from eventually import eventually
from layout import DOCS, PLUGIN_DIR

START = 1_800_000_000.0


def test_runs_once_then_replays_the_stored_result(store: Store) -> None:
    calls: list[str] = []

    @dibs.idempotent(store, key="order_id")
    def charge(order_id: str, amount: int) -> dict[str, Any]:
        calls.append(order_id)
        return {"order": order_id, "charged": amount}

    assert charge("o-1", 5) == {"order": "o-1", "charged": 5}
    assert charge("o-1", 5) == {"order": "o-1", "charged": 5}
    assert charge(amount=5, order_id="o-1") == {"order": "o-1", "charged": 5}
    assert charge("o-2", 5) == {"order": "o-2", "charged": 5}
    assert calls == ["o-1", "o-2"]


def test_same_key_other_payload_raises_request_conflict(store: Store) -> None:
    @dibs.idempotent(store, key="order_id")
    def charge(order_id: str, amount: int) -> int:
        if amount == 7:
            with pytest.raises(RequestConflict) as running:
                charge(order_id, 8)  # while the first call is in progress
            assert running.value.key == order_id
        return amount

    assert charge("o-1", 7) == 7
    with pytest.raises(RequestConflict) as done:
        charge("o-1", 9)
    assert done.value.key == "o-1" and done.value.request_id == "o-1"
    assert "o-1" in str(done.value)


def test_a_duplicate_while_in_progress_raises_and_names_the_expiry(
    store: Store, clock: FakeClock
) -> None:
    seen: list[IdempotencyInProgress] = []

    @dibs.idempotent(store, key="k", ttl=30)
    def work(k: str) -> str:
        with pytest.raises(IdempotencyInProgress) as info:
            work(k)
        seen.append(info.value)
        return "ok"

    assert work("a") == "ok"
    (error,) = seen
    assert error.key == "a" and error.name.endswith("work")
    assert error.expires_at == datetime.fromtimestamp(clock.now() + 30, UTC)
    assert isinstance(error, dibs.DibsError) and isinstance(error, RuntimeError)


def test_a_call_that_raises_stores_nothing(store: Store) -> None:
    attempts: list[int] = []

    @dibs.idempotent(store, key="k")
    def flaky(k: str) -> int:
        attempts.append(1)
        if len(attempts) == 1:
            raise OSError("the card network is down")
        return len(attempts)

    with pytest.raises(OSError, match="card network"):
        flaky("a")
    assert flaky("a") == 2
    assert flaky("a") == 2


def test_an_in_progress_call_can_be_taken_over_after_its_ttl(
    store: Store, clock: FakeClock
) -> None:
    runs: list[str] = []

    @dibs.idempotent(store, key="k", ttl=10)
    def slow(k: str) -> str:
        runs.append("outer" if not runs else "inner")
        if len(runs) == 1:
            clock.advance(11)  # this call "hangs" past its TTL: a duplicate runs it again
            assert slow(k) == "inner"
        return runs[-1] if len(runs) == 2 and runs[-1] == "inner" else "outer"

    # The late first call still answers its own caller, but the result stored
    # first (the takeover's) is the one replayed.
    assert slow("a") == "inner"
    assert slow("a") == "inner"
    assert runs == ["outer", "inner"]


def test_results_are_kept_for_the_store_retention(make_store: StoreMaker, clock: FakeClock) -> None:
    store = make_store(clock, request_retention=3600)
    runs: list[int] = []

    @dibs.idempotent(store, key="k")
    def work(k: str) -> int:
        runs.append(1)
        return len(runs)

    assert work("a") == 1
    clock.advance(3599)
    assert work("a") == 1
    clock.advance(2)
    store.sweep()
    assert work("a") == 2


def test_keep_overrides_the_retention(store: Store, clock: FakeClock) -> None:
    runs: list[int] = []

    @dibs.idempotent(store, key="k", keep=60)
    def work(k: str) -> int:
        runs.append(1)
        return len(runs)

    assert work("a") == work("a") == 1
    clock.advance(61)
    assert work("a") == 2


def test_pickle_and_custom_serializers_and_binary_results_that_span_many_units(
    store: Store,
) -> None:
    big = bytes(range(256)) * 40  # not text: stored in base64, over many units

    @dibs.idempotent(store, key="k", serializer="pickle")
    def pickled(k: str) -> tuple[bytes, datetime]:
        return big, datetime(2026, 1, 2, tzinfo=UTC)

    assert pickled("a") == pickled("a") == (big, datetime(2026, 1, 2, tzinfo=UTC))

    class Upper:
        def dumps(self, value: Any) -> bytes:
            return str(value).upper().encode()

        def loads(self, data: bytes) -> Any:
            return data.decode()

    @dibs.idempotent(store, key="k", serializer=Upper())
    def shout(k: str) -> str:
        return "hello"

    assert shout("a") == "hello"
    assert shout("a") == "HELLO"  # the replay comes through the serializer


def test_async_functions_on_every_store(store: Store) -> None:
    runs: list[str] = []

    @dibs.idempotent(store, key="k")
    async def work(k: str) -> list[str]:
        runs.append(k)
        await asyncio.sleep(0)
        return [k]

    async def main() -> None:
        assert await work("a") == ["a"]
        assert await work("a") == ["a"]
        outcomes = await asyncio.gather(*(work("b") for _ in range(8)), return_exceptions=True)
        assert ["b"] in outcomes
        assert all(o == ["b"] or isinstance(o, IdempotencyInProgress) for o in outcomes)

    asyncio.run(main())
    assert runs == ["a", "b"]


def test_async_functions_that_raise_store_nothing(store: Store) -> None:
    @dibs.idempotent(store, key="k")
    async def fail(k: str) -> None:
        raise KeyError(k)

    async def main() -> None:
        for _ in range(2):
            with pytest.raises(KeyError):
                await fail("a")

    asyncio.run(main())


def test_a_native_async_store_is_awaited() -> None:
    class AsyncFacade:
        """What a dibs.aio store will look like to the decorator: coroutine methods."""

        def __init__(self, store: Store) -> None:
            self.store = store  # no request_retention: the decorator's default applies
            self.awaited: Counter[str] = Counter()

        def __getattr__(self, name: str) -> Any:
            if name not in ("claim", "release", "holder_of", "claims_of"):
                raise AttributeError(name)
            method = getattr(self.store, name)

            async def call(*args: Any, **kwargs: Any) -> Any:
                self.awaited[name] += 1
                return method(*args, **kwargs)

            return call

    with dibs.open("memory://") as store:
        facade = AsyncFacade(store)

        @dibs.idempotent(facade, key="k")
        async def work(k: str) -> str:
            return k * 2

        assert asyncio.run(work("a")) == asyncio.run(work("a")) == "aa"
        # The first call: look, the run hold, look under it, the result; the replay: one read.
        assert facade.awaited == Counter(claims_of=2, claim=2, holder_of=1)

        with pytest.raises(InvalidInput) as info:  # its coroutines cannot be called blocking

            @dibs.idempotent(facade, key="k")
            def blocking(k: str) -> str:
                return k

        assert info.value.field == "store"


def test_results_that_cannot_be_stored_raise_and_store_nothing(store: Store) -> None:
    runs: list[int] = []

    @dibs.idempotent(store, key="k")
    def unserializable(k: str) -> object:
        runs.append(1)
        return object() if len(runs) == 1 else "fine"

    with pytest.raises(InvalidInput) as info:
        unserializable("a")
    assert info.value.field == "result"
    assert unserializable("a") == "fine"

    @dibs.idempotent(store, key="k")
    def huge(k: str) -> str:
        return "x" * RESULT_MAX_BYTES

    with pytest.raises(InvalidInput, match="bytes serialized") as big:
        huge("a")
    assert big.value.field == "result"


def test_bad_options_and_inputs_name_the_field() -> None:
    with dibs.open("memory://") as store:
        for options, field in [
            ({"ttl": 0}, "ttl"),
            ({"ttl": float("nan")}, "ttl"),
            ({"keep": -1}, "keep"),
            ({"serializer": "yaml"}, "serializer"),
            ({"serializer": object()}, "serializer"),
            ({"key": 3}, "key"),
            ({"payload": "amount"}, "payload"),
            ({"name": ""}, "name"),
            ({"name": "x" * 1024}, "name"),
        ]:
            with pytest.raises(InvalidInput) as info:
                dibs.idempotent(store, **options)(lambda k: k)
            assert info.value.field == field, options

        with pytest.raises(InvalidInput) as missing:
            dibs.idempotent(store, key="order")(lambda k: k)
        assert missing.value.field == "key" and "order" in str(missing.value)

        @dibs.idempotent(store, key="k")
        def work(k: object, extra: object = None) -> int:
            return 1

        for bad in ("", "a\x00b", "x" * 1025, None, 1.5):
            with pytest.raises(InvalidInput) as info:
                work(bad)
            assert info.value.field == "key"
        assert work(12) == 1  # an int key is its decimal text
        with pytest.raises(InvalidInput) as payload:
            work("a", extra=object())
        assert payload.value.field == "payload"


def test_payload_chooses_what_must_match(store: Store) -> None:
    @dibs.idempotent(store, key="order_id", payload=lambda order_id, amount, trace: amount)
    def charge(order_id: str, amount: int, trace: object) -> int:
        return amount

    assert charge("o-1", 5, object()) == 5
    assert charge("o-1", 5, object()) == 5  # trace is not part of the payload
    with pytest.raises(RequestConflict):
        charge("o-1", 6, None)


def test_without_a_key_the_payload_is_the_key(store: Store) -> None:
    runs: list[int] = []

    @dibs.idempotent(store)
    def add(a: int, b: int) -> int:
        runs.append(1)
        return a + b

    assert add(1, 2) == add(1, b=2) == 3
    assert add(2, 2) == 4
    assert len(runs) == 2


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    key=names(),
    value=st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(),
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
        max_leaves=20,
    ),
)
def test_any_key_in_the_domain_and_any_json_value_round_trip(key: str, value: Any) -> None:
    with dibs.open("memory://") as store:

        @dibs.idempotent(store, key="k", name="roundtrip")
        def work(k: str) -> Any:
            return value

        assert work(key) == value
        assert work(key) == value


# --- concurrent duplicates ------------------------------------------------------------------------

THREADS = 8


def _until_done(fn: Any, *args: Any) -> Any:
    while True:
        try:
            return fn(*args)
        except IdempotencyInProgress:
            time.sleep(0)  # a yield, not a wait: let the running duplicate finish


@pytest.mark.timeout(300)
@pytest.mark.usefixtures("fine_switching")
def test_concurrent_duplicates_run_the_function_once(store: Store, store_kind: str) -> None:
    rounds = {"memory": 150, "sqlite": 30, "postgresql": 30, "etcd": 30}[store_kind]
    runs: Counter[str] = Counter()
    lock = threading.Lock()

    # Every thread sends the same payload: the thread number is not part of it.
    @dibs.idempotent(store, key="k", payload=lambda k, thread: k)
    def work(k: str, thread: int) -> str:
        with lock:
            runs[k] += 1
        return f"{k} by {thread}"

    for r in range(rounds):
        key = f"k{r}"
        answers = race(THREADS, lambda thread, key=key: _until_done(work, key, thread))
        assert runs[key] == 1, (key, runs[key])
        assert len(set(answers)) == 1, answers


# --- processes: duplicates at once, and a first call killed mid-way ------------------------------

_WORKER = """
import os, sys, time
import dibs
url, log, keys = sys.argv[1], sys.argv[2], int(sys.argv[3])
store = dibs.open(url)

@dibs.idempotent(store, key="k", name="by-processes")
def work(k):
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    os.write(fd, (k + "\\n").encode())
    os.close(fd)
    return k + " by " + str(os.getpid())

while not os.path.exists(log + ".go"):  # start together: a poll on the go file
    time.sleep(0.001)
answers = []
for r in range(keys):
    while True:
        try:
            answers.append(work(f"k{r}"))
            break
        except dibs.IdempotencyInProgress:
            time.sleep(0)
print("\\n".join(answers))
"""

PROCESSES = 6


def _python(*args: str) -> list[str]:
    return [sys.executable, "-c", *args]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("store_kind", SHARED_STORE_KINDS)
def test_concurrent_duplicates_in_processes_run_once(
    make_store: StoreMaker, tmp_path: Path
) -> None:
    make_store().close()  # create the schema before the processes race to
    log = tmp_path / "runs.log"
    keys = 20 if make_store.kind == "etcd" else 60  # etcd: CI time
    procs = [
        subprocess.Popen(
            _python(_WORKER, make_store.url, str(log), str(keys)),
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(PROCESSES)
    ]
    Path(f"{log}.go").touch()
    outputs = [p.communicate()[0].split("\n") for p in procs]
    assert all(p.returncode == 0 for p in procs)
    runs = Counter(log.read_text().split())
    assert runs == Counter({f"k{r}": 1 for r in range(keys)})
    for r in range(keys):
        assert len({out[r] for out in outputs}) == 1  # every process got the one result


_CRASHER = """
import sys, time
import dibs
url, started = sys.argv[1], sys.argv[2]
store = dibs.open(url, clock=dibs.FakeClock({start}))

@dibs.idempotent(store, key="k", name="crashy", ttl=30)
def work(k):
    open(started, "w").close()
    time.sleep(3600)  # killed here, mid-call
    return "never"

work("order-1")
"""


@pytest.mark.timeout(300)
@pytest.mark.parametrize("store_kind", SHARED_STORE_KINDS)
def test_a_first_call_killed_mid_way_blocks_until_its_ttl_then_runs_again(
    make_store: StoreMaker, tmp_path: Path
) -> None:
    make_store().close()
    started = tmp_path / "started"
    child = subprocess.Popen(_python(_CRASHER.format(start=START), make_store.url, str(started)))
    try:
        eventually(lambda: started.exists() or child.poll() is not None, "the first call starts")
        assert child.poll() is None, "the first call died before it started"
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
    assert child.returncode == -signal.SIGKILL

    clock = FakeClock(START)
    store = make_store(clock)
    runs: list[str] = []

    @dibs.idempotent(store, key="k", name="crashy", ttl=30)
    def work(k: str) -> str:
        runs.append(k)
        return "second"

    with pytest.raises(IdempotencyInProgress) as info:
        work("order-1")  # before the TTL: the killed call is still "in progress"
    assert info.value.expires_at == datetime.fromtimestamp(START + 30, UTC)
    clock.advance(29)
    with pytest.raises(IdempotencyInProgress):
        work("order-1")
    clock.advance(2)
    assert work("order-1") == "second"  # after it: run again, once
    assert work("order-1") == "second"
    assert runs == ["order-1"]


# --- the docs and a plug-in store ----------------------------------------------------------------

DOC = DOCS / "idempotent.md"
BLOCKS = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)


@pytest.mark.parametrize("block", range(len(BLOCKS)))
def test_every_example_in_the_docs_runs_as_pasted(block: int, tmp_path: Path) -> None:
    done = subprocess.run(
        _python(BLOCKS[block]), cwd=tmp_path, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr


def test_a_plugin_store_needs_only_the_claim_contract(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(PLUGIN_DIR))
    runs: list[str] = []
    with dibs.open("toy://") as store:

        @dibs.idempotent(store, key="k")
        def work(k: str) -> str:
            runs.append(k)
            return k.upper()

        assert work("a") == work("a") == "A"
    assert runs == ["a"]


def test_a_method_payload_leaves_out_the_instance(store: Store) -> None:
    class Billing:
        def __init__(self) -> None:
            self.charged: list[str] = []

        @dibs.idempotent(store, key="order_id")
        def charge(self, order_id: str, cents: int) -> int:
            self.charged.append(order_id)
            return cents

    one, two = Billing(), Billing()
    assert one.charge("o-1", 5) == two.charge("o-1", 5) == 5
    assert one.charged == ["o-1"] and two.charged == []
    with pytest.raises(RequestConflict):
        two.charge("o-1", 6)


class _LosesAnswers:
    """A store whose first answer to each claim matching ``which`` is lost after the write."""

    def __init__(self, store: Store, which: str, times: int = 1) -> None:
        self.store, self.which, self.left = store, which, times
        self.request_retention = store.request_retention

    def claim(self, *args: Any, **kwargs: Any) -> Any:
        result = self.store.claim(*args, **kwargs)
        if self.left and str(kwargs.get("request_id", "")).endswith(self.which):
            self.left -= 1
            raise dibs.StoreUnavailable("the answer was lost on the way back")
        return result

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)


@pytest.mark.parametrize("which", [".run.0", ".done"])
def test_a_lost_answer_is_replayed_by_its_request_id(store: Store, which: str) -> None:
    flaky = _LosesAnswers(store, which)
    runs: list[str] = []

    @dibs.idempotent(flaky, key="k")
    def work(k: str) -> str:
        runs.append(k)
        return k * 2

    assert work("a") == "aa"  # the claim was written; its replay answered
    assert work("a") == "aa"
    assert runs == ["a"] and flaky.left == 0


def test_a_store_that_stays_down_raises_store_unavailable(store: Store) -> None:
    flaky = _LosesAnswers(store, ".done", times=99)
    runs: list[str] = []

    @dibs.idempotent(flaky, key="k", ttl=5)
    def work(k: str) -> str:
        runs.append(k)
        return k

    with pytest.raises(dibs.StoreUnavailable):
        work("a")
    # The result did land (only its answers were lost): a retry replays it.
    assert work("a") == "a" and runs == ["a"]


def test_the_in_progress_error_pickles_with_its_facts() -> None:
    error = IdempotencyInProgress(
        "running", key="k", name="n", expires_at=datetime(2026, 1, 1, tzinfo=UTC)
    )
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is IdempotencyInProgress and IdempotencyInProgress.__module__ == "dibs"
    assert (copy.key, copy.name, copy.expires_at, str(copy)) == (
        "k",
        "n",
        datetime(2026, 1, 1, tzinfo=UTC),
        "running",
    )


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=8,
)


@settings(max_examples=80, deadline=None)
@given(first=_json_values, second=_json_values)
def test_a_replay_needs_an_equal_payload(first: Any, second: Any) -> None:
    with dibs.open("memory://") as store:

        @dibs.idempotent(store, key="k", name="payloads")
        def work(k: str, body: Any) -> str:
            return "ran"

        assert work("key", first) == "ran"
        if json.dumps(first, sort_keys=True) == json.dumps(second, sort_keys=True):
            assert work("key", second) == "ran"
        else:
            with pytest.raises(RequestConflict):
                work("key", second)


# --- wait=: a duplicate waits for the running call instead of raising ----------------------------


class _Watched:
    """A store that sets ``polled`` once someone has looked at a run hold ``times`` times."""

    def __init__(self, store: Store, times: int) -> None:
        self.store, self.left = store, times
        self.polled = threading.Event()
        self.request_retention = store.request_retention

    def holder_of(self, target: Any) -> Any:
        if target.resource.startswith("dibs.idempotent.run:"):
            self.left -= 1
            if self.left <= 0:
                self.polled.set()
        return self.store.holder_of(target)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)


def test_with_wait_a_duplicate_gets_the_running_calls_result(store: Store) -> None:
    watched = _Watched(store, times=3)  # the duplicate has polled a few times
    runs: list[str] = []

    running = threading.Event()

    @dibs.idempotent(watched, key="k", wait=120)
    def slow(k: str, who: str) -> str:
        runs.append(who)
        running.set()
        assert watched.polled.wait(60)
        return f"done by {who}"

    first = threading.Thread(target=slow, args=("a", "first"))
    first.start()
    assert running.wait(60)
    with pytest.raises(RequestConflict):
        slow("a", "second")  # "who" is part of the payload here: no waiting for a conflict
    answers = race(2, lambda i: slow("a", "first"))
    first.join()
    assert answers == ["done by first", "done by first"] and runs == ["first"]


def test_with_wait_a_duplicate_gives_up_after_it(store: Store) -> None:
    started, release = threading.Event(), threading.Event()

    @dibs.idempotent(store, key="k", ttl=300)
    def stuck(k: str) -> str:
        started.set()
        assert release.wait(60)
        return "late"

    first = threading.Thread(target=stuck, args=("a",))
    first.start()
    assert started.wait(60)
    try:
        waiting = dibs.idempotent(store, key="k", ttl=300, wait=0.05, name=_name_of(stuck))

        @waiting
        def stuck_again(k: str) -> str:
            return "never"

        with pytest.raises(IdempotencyInProgress) as info:
            stuck_again("a")
        assert info.value.expires_at is not None
    finally:
        release.set()
        first.join()


def _name_of(fn: Any) -> str:
    return f"{fn.__module__}.{fn.__qualname__}"


@pytest.mark.timeout(300)
def test_with_wait_concurrent_duplicates_all_get_the_one_result(
    store: Store, store_kind: str
) -> None:
    rounds = {"memory": 50, "sqlite": 10, "postgresql": 10, "etcd": 10}[store_kind]
    runs: Counter[str] = Counter()
    lock = threading.Lock()

    @dibs.idempotent(store, key="k", payload=lambda k, thread: k, wait=120)
    def work(k: str, thread: int) -> str:
        with lock:
            runs[k] += 1
        return f"{k} by {thread}"

    for r in range(rounds):
        answers = race(THREADS, lambda thread, key=f"k{r}": work(key, thread))
        assert runs[f"k{r}"] == 1 and len(set(answers)) == 1, answers


def test_wait_must_be_a_number_of_seconds() -> None:
    with dibs.open("memory://") as store:
        for bad in (-1, float("nan"), "1"):
            with pytest.raises(InvalidInput) as info:
                dibs.idempotent(store, wait=bad)  # type: ignore[arg-type]
            assert info.value.field == "wait"


class _CannotRelease:
    """A store that cannot be reached for any release."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.request_retention = store.request_retention
        self.releases = 0

    def release(self, *args: Any, **kwargs: Any) -> Any:
        self.releases += 1
        raise dibs.StoreUnavailable("the store went away before the release")

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)


def test_a_stored_result_is_returned_even_when_ending_the_run_hold_fails(store: Store) -> None:
    flaky = _CannotRelease(store)
    runs: list[str] = []

    # A result kept shorter than the run hold: the hold is ended once it is stored.
    @dibs.idempotent(flaky, key="k", ttl=5, keep=2)
    def work(k: str) -> str:
        runs.append(k)
        return k * 2

    assert work("a") == "aa"  # the function ran and its result was stored: no error
    assert flaky.releases == 1
    assert work("a") == "aa"  # the run hold is still live, yet the result is replayed
    assert runs == ["a"]


# --- the limits of a stored result ---------------------------------------------------------------


def _stored_result_slots(store: Store, name: str, key: str) -> list[str]:
    holder = store.holder_of(dibs.Unit(f"dibs.idempotent.done:{name}", key))
    assert holder is not None
    (claim,) = [c for c in store.claims_of(holder) if len(c.targets) > 1]
    return [u.slot for u in claim.units if u.resource == f"dibs.idempotent.result:{name}"]


ETCD_RESULT_UNITS = 124
"""docs/stores.md: an etcd claim takes at most 125 units with a request ID, so a stored
result (the done unit and its slots, one claim) has 124 slots there: about 120 kB."""


def test_the_largest_result_round_trips_on_every_store_in_full_size_names(
    store: Store, store_kind: str
) -> None:
    # JSON of "x" * n is n + 2 bytes: this is RESULT_MAX_BYTES serialized, the most kept.
    longest = "x" * (RESULT_MAX_BYTES - 2)
    if store_kind == "etcd":  # one claim holds fewer units: the documented limit, a typed error
        _etcd_refuses_a_result_over_its_limit_and_runs_the_next_call(store, longest)
        return

    @dibs.idempotent(store, key="k", name="limits.largest")
    def largest(k: str) -> str:
        return longest

    assert largest("a") == longest
    assert largest("a") == longest  # the replay, read back from every unit in order
    slots = _stored_result_slots(store, "limits.largest", "a")
    sizes = [len(s.encode()) for s in slots]
    assert max(sizes) == dibs.limits.NAME_MAX_BYTES  # the units are as long as a name may be
    # One more byte (a tag: text or base64) is stored with it, and 40 bytes of each name number it.
    assert len(slots) == -(-(RESULT_MAX_BYTES + 1) // (dibs.limits.NAME_MAX_BYTES - 40)) == 267

    @dibs.idempotent(store, key="k", name="limits.one_over")
    def one_over(k: str) -> str:
        return longest + "x"

    with pytest.raises(InvalidInput, match=f"{RESULT_MAX_BYTES + 1} bytes") as info:
        one_over("a")
    assert info.value.field == "result"
    assert store.holder_of(dibs.Unit("dibs.idempotent.done:limits.one_over", "a")) is None


def _etcd_refuses_a_result_over_its_limit_and_runs_the_next_call(store: Store, big: str) -> None:
    runs: list[int] = []

    @dibs.idempotent(store, key="k", name="limits.etcd", ttl=300)
    def result(k: str, size: int) -> str:
        runs.append(size)
        return big[:size]

    # What fits: each slot keeps NAME_MAX_BYTES - 40 bytes, one of them the tag.
    fits = ETCD_RESULT_UNITS * (dibs.limits.NAME_MAX_BYTES - 40) - 1 - 2
    assert result("a", fits) == big[:fits]
    assert result("a", fits) == big[:fits]  # replayed from 124 slots
    assert len(_stored_result_slots(store, "limits.etcd", "a")) == ETCD_RESULT_UNITS
    for size in (fits + 1, len(big)):  # one byte over, and the most any store keeps
        with pytest.raises(InvalidInput, match="more than one claim on EtcdStore takes") as info:
            result(f"b{size}", size)
        slots = -(-(size + 3) // (dibs.limits.NAME_MAX_BYTES - 40))  # JSON quotes, the tag
        assert info.value.field == "result" and info.value.value == slots > ETCD_RESULT_UNITS
        assert store.holder_of(dibs.Unit("dibs.idempotent.done:limits.etcd", f"b{size}")) is None
        # Nothing was stored and the run hold was let go: the next call runs again, at once.
        with pytest.raises(InvalidInput):
            result(f"b{size}", size)
    assert runs == [fits, fits + 1, fits + 1, len(big), len(big)]


class _Raw:
    """A serializer for bytes as they are: the stored form is all the decorator's."""

    def dumps(self, value: bytes) -> bytes:
        return value

    def loads(self, data: bytes) -> bytes:
        return data


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    data=st.binary(max_size=3000)
    | st.text(st.characters(max_codepoint=127), max_size=3000).map(str.encode)
    | st.text(max_size=1500).map(str.encode)
)
def test_any_bytes_round_trip_whatever_the_serializer_makes(data: bytes) -> None:
    # Printable ASCII is stored as text, anything else (control characters,
    # UTF-8, binary) in base64: every kind comes back byte for byte.
    with dibs.open("memory://") as store:

        @dibs.idempotent(store, key="k", name="raw", serializer=_Raw())
        def work(k: str) -> bytes:
            return data

        assert work("a") == data
        assert work("a") == data


# --- async: duplicates at once, and a call cancelled mid-way --------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.usefixtures("fine_switching")
def test_async_concurrent_duplicates_run_the_function_once(store: Store, store_kind: str) -> None:
    rounds = {"memory": 800, "sqlite": 30, "postgresql": 30, "etcd": 30}[store_kind]
    runs: Counter[str] = Counter()

    @dibs.idempotent(store, key="k", payload=lambda k, task: k, wait=60)
    async def work(k: str, task: int) -> str:
        runs[k] += 1
        await asyncio.sleep(random.random() * 0.001)
        return f"{k} by {task}"

    async def staggered(key: str, task: int) -> str:
        # Arrivals spread over the first call's run, so some land as it finishes.
        await asyncio.sleep(random.random() * 0.004)
        return await work(key, task)

    async def main() -> None:
        for r in range(rounds):
            key = f"k{r}"
            answers = await asyncio.gather(*(staggered(key, task) for task in range(THREADS)))
            assert runs[key] == 1, (key, runs[key])
            assert len(set(answers)) == 1, answers

    asyncio.run(main())


def test_an_async_call_cancelled_mid_way_stores_nothing_and_frees_the_key(store: Store) -> None:
    runs: list[str] = []
    cancel_it = [True]

    # A ttl of an hour: only the release on cancellation can free the key in time.
    @dibs.idempotent(store, key="k", ttl=3600, payload=lambda k, gate: k)
    async def work(k: str, gate: asyncio.Event) -> str:
        runs.append(k)
        gate.set()
        if cancel_it[0]:
            await asyncio.sleep(3600)  # the call a client gives up on
        return k

    async def main() -> None:
        gate = asyncio.Event()
        task = asyncio.create_task(work("a", gate))
        await gate.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        cancel_it[0] = False
        assert await work("a", asyncio.Event()) == "a"  # runs again: nothing was stored
        assert await work("a", asyncio.Event()) == "a"  # and now replays

    asyncio.run(main())
    assert runs == ["a", "a"]


# --- dibs.aio stores: the decorator awaits their coroutines ---------------------------------------
#
# The tests above run async functions on sync stores (their calls go to a worker
# thread). These run them on the async stores themselves: dibs.aio.open() on
# memory:// (inline), SQLite (the store's own workers) and PostgreSQL (native).

# aio_url: tests/conftest.py.


def test_on_an_async_store_runs_once_replays_conflicts_and_forgets_failures(aio_url: str) -> None:
    runs: list[str] = []

    async def main() -> None:
        async with dibs.aio.open(aio_url) as store:

            @dibs.idempotent(store, key="order", ttl=30)
            async def charge(order: str, cents: int) -> dict[str, Any]:
                runs.append(order)
                if cents < 0:
                    raise ValueError("refund")
                return {"order": order, "cents": cents}

            assert await charge("o-1", 500) == {"order": "o-1", "cents": 500}
            assert await charge("o-1", 500) == {"order": "o-1", "cents": 500}  # replayed
            with pytest.raises(RequestConflict):
                await charge("o-1", 501)
            for _ in range(2):  # a call that raises stores nothing: the next one runs again
                with pytest.raises(ValueError):
                    await charge("o-2", -1)

            with pytest.raises(InvalidInput) as refused:  # its coroutines cannot be called blocking

                @dibs.idempotent(store, key="k")
                def blocking(k: str) -> str:
                    return k

            assert refused.value.field == "store"

    asyncio.run(main())
    assert runs == ["o-1", "o-2", "o-2"]


def test_on_async_etcd_a_result_over_its_limit_is_refused_and_frees_the_key(
    aio_url: str,
) -> None:
    runs: list[int] = []
    over = (ETCD_RESULT_UNITS * (dibs.limits.NAME_MAX_BYTES - 40) - 3) + 1  # one byte over

    async def main() -> None:
        async with dibs.aio.open(aio_url) as store:

            @dibs.idempotent(store, key="k", ttl=300)
            async def work(k: str) -> str:
                runs.append(len(runs))
                return "x" * over

            if not aio_url.startswith("etcd://"):
                assert await work("a") == "x" * over  # the other stores keep 256 kB
                return
            for _ in range(2):  # nothing stored, the run hold let go: it runs again at once
                with pytest.raises(InvalidInput, match="more than one claim") as info:
                    await work("a")
                assert info.value.field == "result"

    asyncio.run(main())
    assert len(runs) == (2 if aio_url.startswith("etcd://") else 1)


def test_on_an_async_store_a_duplicate_raises_while_the_first_runs(aio_url: str) -> None:
    clock = FakeClock(START)

    async def main() -> None:
        async with dibs.aio.open(aio_url, clock=clock) as store:
            started, finish = asyncio.Event(), asyncio.Event()

            @dibs.idempotent(store, key="k", ttl=30, payload=lambda k, *_: k)
            async def slow(k: str, go: asyncio.Event, done: asyncio.Event) -> str:
                go.set()
                await done.wait()
                return k.upper()

            first = asyncio.create_task(slow("a", started, finish))
            await started.wait()
            with pytest.raises(IdempotencyInProgress) as info:
                await slow("a", asyncio.Event(), asyncio.Event())
            assert info.value.expires_at == datetime.fromtimestamp(START + 30, UTC)

            finish.set()
            assert await first == "A"
            assert await slow("a", asyncio.Event(), asyncio.Event()) == "A"

    asyncio.run(main())


def test_on_an_async_store_results_are_kept_for_its_retention(aio_url: str) -> None:
    clock = FakeClock(START)
    runs: list[str] = []

    async def main() -> None:
        async with dibs.aio.open(aio_url, clock=clock, request_retention=120) as store:

            @dibs.idempotent(store, key="k")
            async def work(k: str) -> str:
                runs.append(k)
                return f"{k}-{len(runs)}"

            assert await work("a") == "a-1"
            clock.advance(119)
            await store.sweep()
            assert await work("a") == "a-1"  # kept for the store's 120 s, not the default day
            clock.advance(2)
            await store.sweep()
            assert await work("a") == "a-2"  # forgotten: it runs again

    asyncio.run(main())
    assert runs == ["a", "a"]


def test_on_an_async_store_a_crashed_call_blocks_until_its_ttl(aio_url: str) -> None:
    clock = FakeClock(START)
    runs: list[str] = []

    async def main() -> None:
        async with dibs.aio.open(aio_url, clock=clock) as store:
            # A crash that skips the decorator's clean-up: the run hold stays, as
            # after a killed process (below, in a real one).
            record = dibs.Unit("dibs.idempotent.run:crashy", "k1")
            fingerprint = hashlib.sha256(b'{"k":"k1"}').hexdigest()
            holder = f"dibs.idempotent.{fingerprint}.{'0' * 32}"
            assert await store.claim(record, holder=holder, ttl=30)

            @dibs.idempotent(store, key="k", name="crashy", ttl=30)
            async def work(k: str) -> str:
                runs.append(k)
                return "second"

            with pytest.raises(IdempotencyInProgress):
                await work("k1")
            clock.advance(31)
            assert await work("k1") == "second"
            assert await work("k1") == "second"

    asyncio.run(main())
    assert runs == ["k1"]


def test_on_an_async_store_a_cancelled_call_stores_nothing_and_frees_the_key(
    aio_url: str,
) -> None:
    runs: list[str] = []
    cancel_it = [True]

    async def main() -> None:
        async with dibs.aio.open(aio_url) as store:

            @dibs.idempotent(store, key="k", ttl=3600, payload=lambda k, gate: k)
            async def work(k: str, gate: asyncio.Event) -> str:
                runs.append(k)
                gate.set()
                if cancel_it[0]:
                    await asyncio.sleep(3600)  # the call a client gives up on
                return k

            gate = asyncio.Event()
            task = asyncio.create_task(work("a", gate))
            await gate.wait()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            cancel_it[0] = False
            assert await work("a", asyncio.Event()) == "a"  # runs again: nothing was stored
            assert await work("a", asyncio.Event()) == "a"  # and now replays

    asyncio.run(main())
    assert runs == ["a", "a"]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_on_an_async_store_concurrent_duplicates_run_the_function_once(aio_url: str) -> None:
    # Planting the classic bug (the winner of the run hold does not look for a result
    # stored meanwhile) fails this on SQLite and PostgreSQL every run. memory:// runs
    # its calls inline, so no other task can run between a read and a claim there.
    # Results are kept shorter than the ttl, so each finisher ends its run hold as it
    # stores (with the default keep the hold stays to its ttl and shuts that window).
    # etcd waits out real round trips: fewer rounds there keeps CI time (16 tasks each).
    rounds = 300 if aio_url == "memory://" else 5 if aio_url.startswith("etcd://") else 25
    tasks = 16
    runs: Counter[str] = Counter()

    async def main() -> None:
        async with dibs.aio.open(aio_url) as store:

            @dibs.idempotent(store, key="k", payload=lambda k, task: k, wait=120, ttl=600, keep=300)
            async def work(k: str, task: int) -> str:
                runs[k] += 1
                await asyncio.sleep(random.random() * 0.002)
                return f"{k} by {task}"

            async def staggered(key: str, task: int) -> str:
                # Arrivals spread over the first call's run, so some land as it finishes.
                await asyncio.sleep(random.random() * 0.004)
                return await work(key, task)

            for r in range(rounds):
                key = f"k{r}"
                answers = await asyncio.gather(*(staggered(key, t) for t in range(tasks)))
                assert runs[key] == 1, (key, runs[key])
                assert len(set(answers)) == 1, answers

    asyncio.run(main())


_AIO_CRASHER = """
import asyncio, sys
import dibs, dibs.aio
url, started = sys.argv[1], sys.argv[2]

async def main():
    async with dibs.aio.open(url, clock=dibs.FakeClock({start})) as store:

        @dibs.idempotent(store, key="k", name="crashy", ttl=30)
        async def work(k):
            open(started, "w").close()
            await asyncio.sleep(3600)  # killed here, mid-call
            return "never"

        await work("order-1")

asyncio.run(main())
"""


@pytest.mark.timeout(300)
@pytest.mark.parametrize("aio_url", ["sqlite", "postgresql"], indirect=True)
def test_on_an_async_store_a_process_killed_mid_call_blocks_until_its_ttl(
    aio_url: str, tmp_path: Path
) -> None:
    started = tmp_path / "started"
    child = subprocess.Popen(_python(_AIO_CRASHER.format(start=START), aio_url, str(started)))
    try:
        eventually(lambda: started.exists() or child.poll() is not None, "the first call starts")
        assert child.poll() is None, "the first call died before it started"
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
    assert child.returncode == -signal.SIGKILL
    clock = FakeClock(START)
    runs: list[str] = []

    async def main() -> None:
        async with dibs.aio.open(aio_url, clock=clock) as store:

            @dibs.idempotent(store, key="k", name="crashy", ttl=30)
            async def work(k: str) -> str:
                runs.append(k)
                return "second"

            with pytest.raises(IdempotencyInProgress) as info:
                await work("order-1")  # before the TTL: the killed call is still "in progress"
            assert info.value.expires_at == datetime.fromtimestamp(START + 30, UTC)
            clock.advance(31)
            assert await work("order-1") == "second"  # after it: run again, once
            assert await work("order-1") == "second"

    asyncio.run(main())
    assert runs == ["order-1"]
