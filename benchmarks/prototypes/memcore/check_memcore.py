"""The C core against the pure MemoryStore: random operation sequences must answer alike.

    PYTHONPATH=src python benchmarks/prototypes/memcore/check_memcore.py [--sequences 2000]
        [--core DIR]

Both run on one FakeClock, and the core takes the pure store's claim ID prefix, so
every answer must be equal: a ClaimResult or Claim equal field by field (the
dataclass ``==``, which reads the datetimes from the micro-second fields) and
with the same ``__dict__`` (the ten record keys, ``_ttl`` and the ``_*_us`` times
included), a bool, or the same exception (type, message, facts). Operations:
claim (3 units, 2 holders, request IDs or none, confirmed at once or holds of
several TTLs, int and float), group claims of 2 or 3 units out of 4 that overlap
those (``_claim_checked(units, holder)`` as dibs.Lot makes them, and ``claim`` of
a list in any order, duplicates included, with request IDs and TTLs too),
confirm and release (with the right or a wrong holder or fence, or an unknown
ID), get, holder_of, and the clock moving on (past TTLs and past the request
retention). Builds the module first if it is missing (into ``--core DIR`` when
given, else beside this file).
"""

from __future__ import annotations

import argparse
import gc
import importlib
import logging
import random
import sys
import sysconfig
import threading
from pathlib import Path
from typing import Any

import dibs
from dibs._clock import FakeClock
from dibs.stores.memory import MemoryStore

HERE = Path(__file__).resolve().parent
_memcore: Any = None  # the module, once load() found or built it


def load(where: Path = HERE) -> Any:
    """``_memcore`` from ``where``, built there first if it is not (or is older than its source)."""
    global _memcore
    built = where / f"_memcore{sysconfig.get_config_var('EXT_SUFFIX')}"
    if not built.exists() or built.stat().st_mtime < (HERE / "_memcore.c").stat().st_mtime:
        sys.path.insert(0, str(HERE))
        from build import build  # type: ignore[import-not-found]

        where.mkdir(parents=True, exist_ok=True)
        build(where)
    sys.path.insert(0, str(where))
    _memcore = importlib.import_module("_memcore")
    if Path(_memcore.__file__).parent != where.resolve():
        raise RuntimeError(f"_memcore came from {_memcore.__file__}, not {where}")
    return _memcore


_LAZY = ("expires_at", "created_at", "updated_at")  # cached datetimes, made on first read
RETENTION = 60.0
OPS = (
    *("claim", "claim", "claim", "group", "group"),
    *("confirm", "release", "get", "holder_of", "advance"),
)


def _shape(value: Any) -> Any:
    """What must match: the object's type, its fields and its stored dict."""
    if isinstance(value, BaseException):
        facts = {k: v for k, v in vars(value).items() if k != "__traceback__"}
        return ("raised", type(value), str(value), facts)
    if isinstance(value, dibs.ClaimResult):
        return ("result", value, _shape(value.claim))
    if isinstance(value, dibs.Claim):
        stored = {k: v for k, v in vars(value).items() if k not in _LAZY}
        return ("claim", value, stored)
    return ("value", type(value), value)


def _call(fn: Any, *args: Any, **kwargs: Any) -> Any:
    try:
        return fn(*args, **kwargs)
    except Exception as exc:  # every answer is compared, errors included
        return exc


def _kind(value: Any) -> str:
    """The outcome's kind, to show what the sequences covered."""
    if isinstance(value, BaseException):
        return f"{type(value).__name__}:{getattr(value, 'reason', '')}"
    if isinstance(value, dibs.ClaimResult):
        claim = value.claim
        if claim is None:
            return f"result:{value.granted}:{'replayed' if value.replayed else 'new'}"
        state = f":{claim.state}{':taken over' if claim.taken_over else ''}"
        return f"result:{value.granted}:{'replayed' if value.replayed else 'new'}{state}"
    if isinstance(value, dibs.Claim):
        return f"claim:{value.state}"
    return f"{type(value).__name__}:{value}"


def _taken_over(pure: MemoryStore) -> int:
    """How many of the pure store's claims a takeover ended (to show what was covered)."""
    return sum(1 for record in pure._claims.values() if record.get("taken_over"))


def run(seed: int, steps: int, seen: dict[str, int]) -> int:
    """One random sequence; returns the number of operations compared."""
    rng = random.Random(seed)
    clock = FakeClock()
    pure = MemoryStore(clock=clock, request_retention=RETENTION)
    core = _memcore.Core(prefix=pure._id_prefix, clock=clock.now, request_retention=RETENTION)
    units = [dibs.Unit("hall", str(i)) for i in range(3)]
    pool = [*units, dibs.Unit("hall", "3")]  # group claims: 2 or 3 of these
    holders = ["alice", "bob"]
    known: list[tuple[str, int, str]] = [("nope-1", 1, "alice")]  # (id, fence, holder)
    for step in range(steps):
        op = rng.choice(OPS)
        if op == "advance":
            clock.advance(rng.choice((0, 0.5, 4, 7, 30, 61)))
            continue
        taken_over = _taken_over(pure) if op in ("claim", "group") else 0
        if op == "group":
            holder = rng.choice(holders)
            group = rng.sample(pool, rng.choice((2, 3)))
            if rng.random() < 0.5:  # as dibs.Lot claims: sorted, checked, confirmed at once
                checked = tuple(sorted(group))
                a = _call(pure._claim_checked, checked, holder)
                b = _call(core._claim_checked, checked, holder)
            else:  # the public claim of a list or tuple: any order, duplicates
                kwargs = {"holder": holder}
                rid = rng.choice((None, None, "r1", "r4"))
                if rid is not None:
                    kwargs["request_id"] = rid
                ttl = rng.choice((None, None, 5, 0.25, 300))
                if ttl is not None:
                    kwargs["ttl"] = ttl
                if rng.random() < 0.3:
                    group.append(group[0])
                given: Any = group if rng.random() < 0.5 else tuple(group)
                a = _call(pure.claim, given, **kwargs)
                b = _call(core.claim, given, **kwargs)
            if isinstance(a, dibs.ClaimResult) and a.claim is not None:
                known.append((a.claim.id, a.claim.fence, a.claim.holder))
        elif op == "holder_of":
            unit = rng.choice(pool)
            a = _call(pure.holder_of, unit)
            b = _call(core.holder_of, unit)
        elif op == "claim":
            kwargs: dict[str, Any] = {"holder": rng.choice(holders)}
            rid = rng.choice((None, None, "r1", "r2", "r3"))
            if rid is not None:
                kwargs["request_id"] = rid
            ttl = rng.choice((None, 5, 10.5, 300, 0.25))
            if ttl is not None:
                kwargs["ttl"] = ttl
            unit = rng.choice(units)
            a = _call(pure.claim, unit, **kwargs)
            b = _call(core.claim, unit, **kwargs)
            if isinstance(a, dibs.ClaimResult) and a.claim is not None:
                known.append((a.claim.id, a.claim.fence, a.claim.holder))
        elif op == "get":
            claim_id = rng.choice(known)[0]
            a = _call(pure.get, claim_id)
            b = _call(core.get, claim_id)
        else:
            claim_id, fence, holder = rng.choice(known)
            if rng.random() < 0.15:
                holder = "carol"
            if rng.random() < 0.15:
                fence += 1
            a = _call(getattr(pure, op), claim_id, holder=holder, fence=fence)
            b = _call(getattr(core, op), claim_id, holder=holder, fence=fence)
        if op in ("claim", "group") and isinstance(a, dibs.ClaimResult):
            if op == "group" and not a.granted:
                op = f"group of {len(a.taken)} taken"
            elif _taken_over(pure) > taken_over:
                op = f"{op} taking over a dead hold"
        seen[f"{op} -> {_kind(a)}"] = seen.get(f"{op} -> {_kind(a)}", 0) + 1
        if _shape(a) != _shape(b):
            raise AssertionError(
                f"seed {seed}, step {step}, {op}: pure {_shape(a)!r}\n  core {_shape(b)!r}"
            )
    return steps


def race(threads: int = 8, seats: int = 1000) -> None:
    """Threads each try every unit, confirmed at once: each unit goes to exactly one."""
    core = _memcore.Core()
    units = [dibs.Unit("hall", str(i)) for i in range(seats)]
    won = [0] * threads
    barrier = threading.Barrier(threads)

    def work(t: int) -> None:
        order = random.Random(t).sample(units, seats)
        barrier.wait()
        won[t] = sum(core.claim(u, holder=f"t{t}").granted for u in order)

    pool = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    for p in pool:
        p.start()
    for p in pool:
        p.join()
    if sum(won) != seats:
        raise AssertionError(f"{sum(won)} granted of {seats}: {won}")
    print(f"race: {threads} threads over {seats} units, each granted once {won}")


def group_race(threads: int = 8, slots: int = 16, rounds: int = 300) -> None:
    """Threads claim overlapping runs of 1-3 slots, each keeping its run a while: no overlap."""
    core = _memcore.Core()
    units = [dibs.Unit("row", f"{i:02d}") for i in range(slots)]
    owner: list[str | None] = [None] * slots
    errors: list[str] = []
    granted = [0] * threads
    barrier = threading.Barrier(threads)

    def work(t: int) -> None:
        rng = random.Random(t)
        held: tuple[Any, str, int, int] | None = None  # (claim, holder, start, length)
        barrier.wait()
        for i in range(rounds + 1):
            if held is not None:  # free the run taken last time round
                claim, me, start, length = held
                for s in range(start, start + length):
                    if owner[s] != me:
                        errors.append(f"slot {s}: {owner[s]} while {me} holds it")
                    owner[s] = None
                if not core.release(claim.id, holder=me, fence=claim.fence):
                    errors.append(f"{me}: release of a live group claim answered False")
                held = None
            if i == rounds:
                break
            start, length = rng.randrange(slots - 2), rng.choice((1, 2, 3))
            me = f"t{t}-{i}"
            result = core._claim_checked(tuple(units[start : start + length]), me)
            if not result.granted:
                continue
            granted[t] += 1
            for s in range(start, start + length):
                if owner[s] is not None:
                    errors.append(f"slot {s}: {owner[s]} and {me}")
                owner[s] = me
            held = (result.claim, me, start, length)

    pool = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    for p in pool:
        p.start()
    for p in pool:
        p.join()
    counts = core.counts()
    if errors or counts["units"] or counts["holders"]:
        raise AssertionError(f"group race: {errors[:5]}, left behind {counts}")
    print(
        f"group race: {threads} threads, {sum(granted)} of {threads * rounds} group claims "
        "granted, no slot in two, all freed"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--sequences", type=int, default=2000)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--gc-stress", action="store_true", help="collect at every allocation")
    parser.add_argument("--races", type=int, default=5, help="8-thread races after the sequences")
    parser.add_argument("--core", type=Path, default=HERE, help="directory of _memcore")
    args = parser.parse_args()
    load(args.core)
    logging.disable(logging.CRITICAL)  # the pure store logs lost holds
    if args.gc_stress:
        gc.set_threshold(1)  # shakes out a missing reference in the C code
    seen: dict[str, int] = {}
    done = sum(run(seed, args.steps, seen) for seed in range(args.sequences))
    for kind, count in sorted(seen.items()):
        print(f"{count:8,}  {kind}")
    print(f"{args.sequences} sequences, {done} operations: the C core answered as MemoryStore")
    gc.set_threshold(700)
    sys.setswitchinterval(1e-6)  # switch threads as often as the interpreter can
    for _ in range(args.races):
        race()
        group_race()


if __name__ == "__main__":
    main()
