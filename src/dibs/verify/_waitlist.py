"""``dibs verify`` for :class:`dibs.Waitlist`: the workload's ``waitlist`` ops and their check.

Each client joins the run's one list (``<run>-wl``) under a holder unique to the
join, frees seats of a small pool through the list, accepts or declines the offers
made to its holders, and sweeps. Every op records what it saw: a join its entry's
number, an offer-making op the offers (holder, seat) it made. The check
(:func:`waitlist_anomalies`) flags:

* **an offer past the head**: an offer to holder H while an entry K with a lower
  number was surely on the list for the whole op (K's join had ended before the op
  began, and nothing that removed K — an offer to K, K's leave — began before the op
  ended). Among live entries a lower number means an earlier join, so K was ahead.
* **two offers for one entry**: each join's holder is unique, so any holder offered
  twice got two units for one place in line.

Plants (``--plant``): ``waitlist-skips-head`` offers to the second in line,
``waitlist-double-offer`` offers without using the head's entry up.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from dibs._model import Unit
from dibs._queue import QCall
from dibs.exceptions import DibsError
from dibs.stores.base import Store
from dibs.verify._history import OK, Op
from dibs.waitlist import Offer, Waitlist

__all__ = ["WAITLIST_PLANTS", "waitlist_anomalies", "waitlist_op", "waitlist_resources"]

WAITLIST_PLANTS = ("waitlist-skips-head", "waitlist-double-offer")
"""Plants in the waiting list above the store (the store is the real one)."""

SEATS = 3
"""Seats in the run's pool, ``(<run>-wl-seat, "0")``..."""


@dataclass
class _State:
    joined: list[str] = field(default_factory=list)
    joins: int = 0


_states: dict[tuple[str, str, int], _State] = {}  # by run, client and incarnation


def waitlist_resources(resource: str) -> bool:
    """Whether a store-log row's resource is a pattern's queue (the waiting list's, fair
    waiters' tickets) or the list's seats: the patterns' claims, left out of the log replay."""
    return resource.startswith("dibs.queue-") or resource.endswith("-wl-seat")


def _list_class(plant: str | None) -> type[Waitlist]:
    if plant == "waitlist-skips-head":
        return _SkipsHead
    if plant == "waitlist-double-offer":
        return _DoubleOffer
    return Waitlist


def waitlist_op(client: Any) -> tuple[str, dict[str, Any], Callable[[], dict[str, Any]]]:
    """The client's next waitlist op: its name, its recorded arguments, and the call."""
    w, rng, store = client.workload, client.rng, client.store
    state = _states.setdefault((w.run, client.name, client.incarnation), _State())
    wl = _list_class(w.plant)(store, f"{w.run}-wl", offer_ttl=max(0.05, w.ttl))
    res = f"{w.run}-wl"
    action = rng.choices(("join", "free", "answer", "sweep"), (4, 3, 3, 1))[0]
    if action == "join" or (action == "answer" and not state.joined):
        state.joins += 1
        holder = f"{client.name}.{client.incarnation}-wl{state.joins}"

        def join() -> dict[str, Any]:
            entry = wl.join(holder)
            state.joined.append(holder)
            return {"action": "join", "holder": holder, "number": entry.number}

        return "waitlist", {"res": res, "action": "join", "holder": holder}, join
    if action == "free":
        seat = Unit(f"{w.run}-wl-seat", str(rng.randrange(SEATS)))
        return "waitlist", {"res": res, "action": "free"}, lambda: _free(store, wl, seat, client)
    if action == "answer":
        holder = rng.choice(state.joined[-4:])
        accept = rng.random() < 0.5
        return (
            "waitlist",
            {"res": res, "action": "answer", "holder": holder},
            lambda: _answer(wl, holder, accept),
        )
    return "waitlist", {"res": res, "action": "sweep"}, lambda: {"offers": _made(wl.sweep())}


def _made(offers: Sequence[Offer]) -> list[list[str]]:
    return [[offer.holder, offer.unit.slot] for offer in offers]


def _free(store: Store, wl: Waitlist, seat: Unit, client: Any) -> dict[str, Any]:
    """Take the seat (if free) for a moment, then free it through the list."""
    taken = store.claim(seat, holder=f"{client.name}-buyer")
    claim = taken.claim
    if not taken or claim is None or claim.holder != f"{client.name}-buyer":
        return {"offers": []}
    return {"offers": _made(wl.release(claim.id, holder=claim.holder, fence=claim.fence))}


def _answer(wl: Waitlist, holder: str, accept: bool) -> dict[str, Any]:
    made: list[list[str]] = []
    for offer in wl.offers(holder):
        try:
            if accept:
                wl.accept(offer)
            else:
                following = wl.decline(offer)
                if following is not None:
                    made.extend(_made([following]))
        except DibsError:
            pass  # lapsed meanwhile: a sweep passes it on
    return {"offers": made}


def waitlist_anomalies(ops: Sequence[Op]) -> list[str]:
    """Offers past the head of the list, and entries offered twice, as report lines."""
    found: list[str] = []
    joins: dict[str, Op] = {}
    offered: dict[str, list[Op]] = {}
    for op in ops:
        if op.fn != "waitlist" or op.status != OK:
            continue
        if op.value.get("action") == "join":
            joins[str(op.value["holder"])] = op
        for holder, _seat in op.value.get("offers", ()):
            offered.setdefault(str(holder), []).append(op)
    for holder, ops_offering in sorted(offered.items()):
        if len(ops_offering) > 1:
            names = ", ".join(op.id for op in ops_offering)
            found.append(
                f"WAITLIST: entry {holder!r} was offered {len(ops_offering)} units ({names})"
            )
    unsure = [  # ops that may have made offers no one saw: their entries may be gone
        op.start
        for op in ops
        if op.fn == "waitlist" and op.status != OK and op.args.get("action") != "join"
    ]
    for holder, ops_offering in sorted(offered.items()):
        mine = joins.get(holder)
        if mine is None:
            continue
        for op in ops_offering:
            for other, join in joins.items():
                if other == holder or join.value["number"] >= mine.value["number"]:
                    continue
                if join.end >= op.start:
                    continue  # not surely on the list when the offer began
                removed = [o.start for o in offered.get(other, ())]
                if any(start < op.end for start in removed):
                    continue  # perhaps offered (used up) before this offer
                if _left_before(ops, other, op.end) or any(t < op.end for t in unsure):
                    continue
                found.append(
                    f"WAITLIST: {op.id} offered a unit to {holder!r} (entry"
                    f" {mine.value['number']}) while {other!r} (entry {join.value['number']})"
                    " was ahead of it on the list"
                )
                break
    return found


def _left_before(ops: Sequence[Op], holder: str, moment: float) -> bool:
    """Whether ``holder`` may have left the list before ``moment`` (the workload never leaves)."""
    return any(
        op.fn == "waitlist"
        and op.args.get("action") == "leave"
        and op.args.get("holder") == holder
        and op.start < moment
        for op in ops
    )


# --- plants ---------------------------------------------------------------------------


class _SkipsHead(Waitlist):
    """``waitlist-skips-head``: offers go to the second in line when there is one."""

    def _entries_rule(self) -> Any:
        entries = yield from super()._entries_rule()
        if len(entries) > 1 and self._offering:
            return entries[1:]
        return entries

    _offering = False

    def _offer_rule(self, unit: object) -> Any:
        self._offering = True
        try:
            return (yield from super()._offer_rule(unit))
        finally:
            self._offering = False


class _DoubleOffer(Waitlist):
    """``waitlist-double-offer``: an offer does not use the head's entry up."""

    def _offer_rule(self, unit: object) -> Any:
        entries = yield from self._entries_rule()
        if not entries:
            return None
        head = entries[0]
        request_id = f"{self._offer_prefix}{uuid.uuid4().hex}"
        result = yield QCall(
            "claim",
            (unit,),
            {"holder": head.holder, "ttl": self.offer_ttl, "request_id": request_id},
        )
        hold = result.claim
        if not result or hold is None:
            return None
        return Offer(
            hold.targets[0], head.holder, hold
        )  # BUG: the head's entry stays, for more offers
