"""The etcd store's rules, once: each operation is a plan that both drivers run.

A plan is a generator that yields :class:`Call` (one gateway request) and
receives its decoded JSON answer; it raises the store's typed errors and
returns the result. :class:`~dibs.stores.etcd.EtcdStore` runs plans on a
blocking ``httpx.Client``, :class:`~dibs.stores.etcd.AsyncEtcdStore` awaits
them on an ``httpx.AsyncClient``: one set of rules, two thin drivers. A
driver throws :class:`LeaseGone` into a plan whose transaction named a lease
etcd no longer has; every other failure ends the plan with
:class:`~dibs.StoreUnavailable` in the driver.

Linearization points (docs/stores.md, "etcd://"):

* A grant is its claim transaction: it compares every target's unit key
  (absent, or unchanged since a read that found its claim dead), the span
  guard of each resource with spans, and the request key, and writes them all
  with the record and the live key. Its header revision is the fence (the
  record's ``create_revision``).
* A refusal is a read at one revision (the failed transaction's ranges, or a
  read-only transaction of the same ranges) whose blockers were all live then;
  a blocker's claim is read afterwards, and live afterwards implies live at
  the earlier read, since a live key never comes back once gone.
* Confirm, extend and release are transactions comparing the live key's
  ``create_revision`` with the fence (the claim is live and is this one) and
  the record's ``mod_revision`` with the one read.
* ``holder_of`` and ``claims_of`` are reads at one revision: the one their
  first read found the candidate claims at; every later read is pinned to it.
"""

from __future__ import annotations

import json
import logging
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, TypeVar

from dibs._clock import Clock
from dibs._model import (
    EXCLUSIVE,
    SHARED,
    Claim,
    ClaimResult,
    ClaimState,
    Span,
    SweepResult,
    Target,
    Unit,
    conflicts,
    make_result,
    targets_from_text,
)
from dibs._request import ClaimRequest
from dibs.exceptions import HoldLost, HoldLostReason, InvalidInput, RequestConflict
from dibs.stores.base import (
    claim_not_found,
    hold_lost,
    lost_reason,
    not_holder,
    span_kind_mismatch,
)
from dibs.stores.etcd._keys import (
    KV,
    Keys,
    Settings,
    absent,
    b64,
    created_at,
    delete,
    delete_prefix,
    encoded_size,
    entry_value,
    get,
    get_prefix,
    get_range,
    kvs,
    lease_seconds,
    nested,
    owner_value,
    parse_entry,
    parse_owner,
    put,
    range_empty,
    range_unchanged,
    responses,
    revision,
    scan,
    targets_value,
    unchanged,
    value_is,
)
from dibs.stores.etcd._parts import (
    Blocker,
    Call,
    ClaimPlan,
    LeaseGone,
    Plan,
    Record,
    View,
    read_call,
    txn_call,
)

logger = logging.getLogger("dibs.stores.etcd")

__all__ = ["Call", "LeaseGone", "Operations", "Plan"]  # Call, LeaseGone, Plan: from _parts

_T = TypeVar("_T")

_HELD = ClaimState.HELD
_CONFIRMED = ClaimState.CONFIRMED
_RELEASED = ClaimState.RELEASED
_EXPIRED = ClaimState.EXPIRED
_PAGE = 500
LEASE_SLACK = 1
"""Seconds a hold's lease runs past its ``expires_at``: room for the round trips between
the lease grant and the transaction that uses it."""
_HINTED_UNITS = 8  # claims of up to this many units read their units' last owners with the view
_OWNERS_MAX = 65536


class Operations:
    """The plans of one store: its keys, its clock (a test clock replaces leases), its limits."""

    def __init__(
        self, settings: Settings, clock: Clock | None, retention: Callable[[], float]
    ) -> None:
        self.keys = Keys(settings.prefix)
        self.max_ops = settings.max_txn_ops
        self.max_bytes = settings.max_request_bytes
        self._test_clock = clock
        self._retention = retention
        self._now: Callable[[], float] = clock.now if clock is not None else time.time
        self._owners: dict[bytes, tuple[str, str]] = {}
        """Unit key -> (holder, claim ID) last seen on it: a hint, never trusted. A claim
        reads the hinted owners' live keys with its view, at the same revision, so a
        refusal by a claim seen before takes one round trip, not two. Plain dict steps
        (atomic under the GIL), cleared when it grows past _OWNERS_MAX."""

    @property
    def leases(self) -> bool:
        """Whether holds are etcd leases (no test clock judging expiry instead)."""
        return self._test_clock is None

    def now_us(self) -> int:
        return round(self._now() * 1_000_000)

    # --- liveness ------------------------------------------------------------------------------

    def _live(self, record: Record, live_key: bool) -> bool:
        """Whether a claim is live: its live key exists (and under a test clock, unexpired)."""
        if record.state not in (_HELD, _CONFIRMED) or not live_key:
            return False
        if record.state is _HELD and not self.leases:
            return record.expires is not None and record.expires > self.now_us()
        return True

    def _snapshot(self, record: Record, live_key: bool) -> Claim:
        dead = record.state is _HELD and not self._live(record, live_key)
        return record.claim(_EXPIRED if dead else record.state)

    def _read_claims(
        self, ids: Sequence[tuple[str, str | None]], at: int | None = None
    ) -> Plan[dict[str, Blocker]]:
        """Each claim's record and live key, in as few reads as the limits allow.

        ``ids`` pairs a claim ID with its holder when known (so its live key is read
        in the same request); otherwise the live key is read after the record.
        ``at``: read at that revision (the one the IDs were found at), so that a
        read built of several round trips answers for one moment.
        """
        found: dict[str, Blocker] = {}
        pending = list(dict.fromkeys(ids))
        while pending:
            batch, pending = pending[: self.max_ops // 2], pending[self.max_ops // 2 :]
            ops = []
            for claim_id, holder in batch:
                ops.append(get(self.keys.record(claim_id)))
                if holder is not None:
                    ops.append(get(self.keys.live(holder, claim_id)))
            if at is not None:
                for op in ops:
                    op["request_range"]["revision"] = at
            answers = responses((yield read_call(ops)))
            i = 0
            late: list[tuple[str, str]] = []
            for claim_id, holder in batch:
                record_kvs = kvs(answers[i])
                i += 1
                record = Record.of(record_kvs[0], claim_id) if record_kvs else None
                if holder is None:
                    if record is not None and record.state in (_HELD, _CONFIRMED):
                        late.append((claim_id, record.holder))
                    found[claim_id] = Blocker(record, False)
                    continue
                live_key = bool(kvs(answers[i]))
                i += 1
                if record is not None and record.holder != holder:
                    live_key = False
                found[claim_id] = Blocker(
                    record, record is not None and self._live(record, live_key)
                )
            if late:
                pending.extend((claim_id, holder) for claim_id, holder in late)
        return found

    # --- claim ---------------------------------------------------------------------------------

    def claim(self, request: ClaimRequest) -> Plan[ClaimResult]:
        """Claim every target or none; see the module docstring for the linearization."""
        targets = request.targets
        units = [t for t in targets if isinstance(t, Unit)]
        spans = [t for t in targets if isinstance(t, Span)]
        p = ClaimPlan(
            targets=targets,
            holder=request.holder,
            request_id=request.request_id,
            ttl=request.ttl,
            units=units,
            spans=spans,
            resources=sorted({s.resource for s in spans}),
            unit_keys=[self.keys.unit(u) for u in units],
            request_key=(
                self.keys.request(request.request_id) if request.request_id is not None else None
            ),
            fingerprint=request.fingerprint if request.request_id is not None else None,
            claim_id=secrets.token_hex(12),
            shared=request.mode == SHARED,
        )
        self._check_limits(p)
        try:
            result = yield from self._claim_rounds(p)
        except (RequestConflict, InvalidInput):
            if p.lease:
                yield from self._revoke(p.lease)
            raise
        if p.lease and not (result.granted and not result.replayed):
            yield from self._revoke(p.lease)
        return result

    def _claim_rounds(self, p: ClaimPlan) -> Plan[ClaimResult]:
        # A unit-only claim goes straight to its transaction, betting every unit is
        # free; span claims (and every later round) start from a read.
        view = (yield self._view_call(p)) if p.spans else None
        state = self._view_of(p, view) if view is not None else None
        while True:
            marks: list[Record] = []
            if state is not None:
                if state.request is not None and self._fresh(state.request):
                    return (yield from self._replay(p, state.request))
                verdict = yield from self._judge(p, state)
                if isinstance(verdict, ClaimResult):
                    recorded = yield from self._record_outcome(p, state, verdict)
                    if recorded is not None:
                        return recorded
                    state = self._view_of(p, (yield self._view_call(p)))
                    continue
                if verdict is None:  # a blocker died since the view: look again
                    state = self._view_of(p, (yield self._view_call(p)))
                    continue
                marks = verdict
            if p.ttl is not None and self.leases:
                if p.lease and not self._lasts(p.lease_from):
                    # Rounds of contention used the lease up: the hold would live less
                    # than its TTL from now, so take a fresh one.
                    yield from self._revoke(p.lease)
                    p.lease = 0
                if not p.lease:
                    p.lease_from = self.now_us()
                    p.lease = yield from self._grant(lease_seconds(p.ttl) + LEASE_SLACK)
            call, record, late_marks = self._grant_call(p, state, marks)
            try:
                answer = yield call
            except LeaseGone:
                p.lease = 0
                continue
            if answer.get("succeeded"):
                record.fence = record.mod = revision(answer)
                for old in marks:
                    # DEBUG, as on every store: abandoned holds are routine.
                    logger.debug("hold %s expired and was taken over", old.id)
                for old in late_marks:
                    yield from self._mark_dead(old, taken_over=True)
                return make_result(True, record.claim(record.state))
            state = self._view_of(p, answer)

    def _view_ops(self, p: ClaimPlan) -> list[dict[str, Any]]:
        # An exclusive claim reads each unit key with its readers' keys (one range); a
        # shared one, the unit key alone: readers never block a reader.
        end = self.keys.unit_end
        ops = [get(k) if p.shared else get_range(k, end(k)) for k in p.unit_keys]
        if p.request_key is not None:
            ops.append(get(p.request_key))
        for resource in p.resources:
            ops.append(get(self.keys.guard(resource)))
            ops.append(get_prefix(self.keys.resource_spans(resource)))
        p.hints = []
        if len(p.unit_keys) <= _HINTED_UNITS and not p.spans:
            hints = {self._owners.get(k) for k in p.unit_keys} - {None}
            for owner, claim_id in sorted(h for h in hints if h is not None):
                p.hints.append((claim_id, owner))
                ops.append(get(self.keys.record(claim_id)))
                ops.append(get(self.keys.live(owner, claim_id)))
        return ops

    def _view_call(self, p: ClaimPlan) -> Call:
        return read_call(self._view_ops(p))

    def _view_of(self, p: ClaimPlan, answer: dict[str, Any]) -> View:
        answers = [kvs(a) for a in responses(answer)]
        i = len(p.unit_keys)
        units: list[KV | None] = []
        readers: list[list[KV]] = []
        for key, found in zip(p.unit_keys, answers[:i], strict=True):
            if found and found[0].key == key:
                units.append(found[0])
                readers.append(found[1:])
            else:
                units.append(None)
                readers.append(found)
        request = None
        if p.request_key is not None:
            request = answers[i][0] if answers[i] else None
            i += 1
        guards: dict[str, KV | None] = {}
        entries: dict[str, list[KV]] = {}
        for resource in p.resources:
            guards[resource] = answers[i][0] if answers[i] else None
            entries[resource] = answers[i + 1]
            i += 2
        known: dict[str, Blocker] = {}
        for claim_id, owner in p.hints:
            record = Record.of(answers[i][0], claim_id) if answers[i] else None
            live_key = bool(answers[i + 1]) and record is not None and record.holder == owner
            known[claim_id] = Blocker(record, record is not None and self._live(record, live_key))
            i += 2
        if len(self._owners) > _OWNERS_MAX:
            self._owners.clear()
        for key, kv in zip(p.unit_keys, units, strict=True):
            if kv is not None:
                self._owners[key] = parse_owner(kv.value)
        return View(units, readers, revision(answer), request, guards, entries, known)

    def _judge(self, p: ClaimPlan, view: View) -> Plan[ClaimResult | list[Record] | None]:
        """Decide from a view: a refusal (or natural-key replay), the dead holds to take over,
        or None when a blocker died after the view (so the view cannot decide either way)."""
        # Each target's candidate blockers: (view key, mod, claim ID, holder, span of the entry).
        found: list[list[tuple[bytes, int, str, str, Span | None]]] = []
        mode = SHARED if p.shared else EXCLUSIVE
        for unit_key, kv, readers in zip(p.unit_keys, view.units, view.readers, strict=True):
            hits: list[tuple[bytes, int, str, str, Span | None]] = []
            if kv is not None:
                owner, claim_id = parse_owner(kv.value)
                hits.append((kv.key, kv.mod, claim_id, owner, None))
            for reader in readers:  # an exclusive claim's view only
                claim_id = self.keys.reader_id(unit_key, reader.key)
                hits.append((reader.key, reader.mod, claim_id, reader.value.decode(), None))
            found.append(hits)
        for span in p.spans:
            hits = []
            for kv in view.entries[span.resource]:
                owner, theirs, shared = parse_entry(span.resource, kv.value)
                if theirs.kind != span.kind or (
                    theirs.overlaps(span) and conflicts(mode, SHARED if shared else EXCLUSIVE)
                ):
                    hits.append((kv.key, kv.mod, self.keys.claim_of_entry(kv.key), owner, theirs))
            found.append(hits)
        ids = [(c[2], c[3]) for hits in found for c in hits if c[2] not in view.known]
        if not ids and not view.known:
            return []
        blockers = dict(view.known)
        if ids:
            blockers.update((yield from self._read_claims(ids)))
        targets: list[Target] = [*p.units, *p.spans]
        taken: list[Target] = []
        live_ids: set[str] = set()
        fresh_dead = False
        dead: dict[str, Record] = {}
        for target, hits in zip(targets, found, strict=True):
            for key, mod, claim_id, _owner, entry in hits:
                blocker = blockers[claim_id]
                if blocker.live:
                    if (
                        isinstance(entry, Span)
                        and isinstance(target, Span)
                        and entry.kind != target.kind
                    ):
                        raise span_kind_mismatch(target, entry.kind)
                    if target not in taken:
                        taken.append(target)
                    live_ids.add(claim_id)
                else:
                    # Dead at the view's own revision (a hinted owner), or seen dead
                    # before with the key unchanged: free at the view. Otherwise it may
                    # have died after the view.
                    if claim_id not in view.known and (key, mod) not in p.known_dead:
                        fresh_dead = True
                    p.known_dead.add((key, mod))
                    record = blocker.record
                    if record is not None and (
                        record.state is _HELD
                        or (record.state is _EXPIRED and not record.taken_over)
                    ):
                        dead[claim_id] = record
        if not taken:
            return list(dead.values())
        if fresh_dead:
            # Dead now, but perhaps live at the view: the refusal would mix two moments.
            return None
        order = {t: i for i, t in enumerate(p.targets)}
        taken.sort(key=order.__getitem__)
        if len(live_ids) == 1:
            (mine,) = live_ids
            record = blockers[mine].record
            assert record is not None
            if (
                not p.shared
                and record.mode != SHARED
                and record.holder == p.holder
                and targets_from_text(record.targets) == p.targets
            ):
                return make_result(True, record.claim(record.state), (), replayed=True)
        return make_result(False, None, tuple(taken))

    def _record_outcome(
        self, p: ClaimPlan, view: View, verdict: ClaimResult
    ) -> Plan[ClaimResult | None]:
        """Write the request record of a refusal or a natural-key replay; None if one came first."""
        if p.request_key is None:
            return verdict
        assert p.fingerprint is not None
        record = {
            "f": p.fingerprint,
            "c": verdict.claim.id if verdict.claim is not None else None,
            "t": targets_value(verdict.taken),
            "a": self.now_us(),
        }
        seen = view.request.mod if view.request is not None else 0
        answer = yield txn_call(
            [unchanged(p.request_key, seen)],
            [put(p.request_key, json.dumps(record, ensure_ascii=False).encode())],
            [],
        )
        return verdict if answer.get("succeeded") else None

    def _fresh(self, request: KV) -> bool:
        created = json.loads(request.value)["a"]
        return bool(created + round(self._retention() * 1_000_000) > self.now_us())

    def _replay(self, p: ClaimPlan, request: KV) -> Plan[ClaimResult]:
        prior = json.loads(request.value)
        if prior["f"] != p.fingerprint:
            raise RequestConflict(
                f"request ID {p.request_id!r} was already used with different input",
                request_id=p.request_id,
            )
        if prior["c"] is None:
            return make_result(False, None, targets_from_text(prior["t"]), replayed=True)
        found = yield from self._read_claims([(prior["c"], None)])
        blocker = found[prior["c"]]
        claim = None
        if blocker.record is not None:
            claim = self._snapshot(blocker.record, blocker.live)
        return make_result(True, claim, (), replayed=True)

    def _grant_call(
        self, p: ClaimPlan, view: View | None, marks: list[Record]
    ) -> tuple[Call, Record, list[Record]]:
        """The claim transaction, the record it writes, and the dead holds left to mark after."""
        now = self.now_us()
        keys = self.keys
        ttl = p.ttl
        if ttl is None:
            expires = None
        elif self.leases:
            # The lease is LEASE_SLACK seconds longer than this, and was asked for less
            # than that long ago (see _lasts): the hold lasts at least until expires_at.
            expires = now + lease_seconds(ttl) * 1_000_000
        else:
            expires = now + round(ttl * 1_000_000)
        record = Record(
            p.claim_id, 0, 0, p.holder, targets_value(p.targets),
            _CONFIRMED if ttl is None else _HELD, p.request_id, now, now, expires, False, p.lease,
            SHARED if p.shared else EXCLUSIVE,
        )  # fmt: skip
        compare = []
        success = []
        owner = owner_value(p.holder, p.claim_id)
        gone: list[dict[str, Any]] = []
        if p.shared:
            # A reader: no live writer on the unit key (absent, or unchanged since a view
            # that found its claim dead); other readers' keys are not its business.
            holder = p.holder.encode()
            for i, key in enumerate(p.unit_keys):
                seen = view.units[i] if view is not None else None
                compare.append(unchanged(key, seen.mod if seen is not None else 0))
                success.append(put(keys.reader(key, p.claim_id), holder))
        else:
            # A writer: no key in the unit's range (the unit key and its readers' keys)
            # written since the view, whose every claim there was dead; or, with no view,
            # none at all. The dead readers' keys it saw go with the grant, as room allows.
            for i, key in enumerate(p.unit_keys):
                end = keys.unit_end(key)
                if view is None:
                    compare.append(range_empty(key, end))
                else:
                    compare.append(range_unchanged(key, end, view.revision))
                    gone.extend(delete(r.key) for r in view.readers[i])
                success.append(put(key, owner))
        per_resource: dict[str, int] = {}
        for span in p.spans:
            index = per_resource.get(span.resource, 0)
            per_resource[span.resource] = index + 1
            success.append(
                put(
                    keys.span(span.resource, p.claim_id, index),
                    entry_value(p.holder, span, p.shared),
                )
            )
        for resource in p.resources:
            guard = view.guards[resource] if view is not None else None
            compare.append(unchanged(keys.guard(resource), guard.mod if guard is not None else 0))
            success.append(put(keys.guard(resource), b""))
        success.append(put(keys.record(p.claim_id), record.value()))
        success.append(put(keys.live(p.holder, p.claim_id), b"", p.lease))
        if p.request_key is not None:
            seen_request = view.request if view is not None else None
            compare.append(unchanged(p.request_key, seen_request.mod if seen_request else 0))
            request = {"f": p.fingerprint, "c": p.claim_id, "t": "[]", "a": now}
            success.append(put(p.request_key, json.dumps(request).encode()))
        body = {"compare": compare, "success": success, "failure": self._view_ops(p)}
        size = encoded_size(body)
        late: list[Record] = []
        for old in marks:
            # Taking over a dead hold marks it in the same transaction while etcd's
            # limits allow; the rest are marked right after the grant (see docs/stores.md).
            extra_compare = unchanged(keys.record(old.id), old.mod)
            extra = self._dead_ops(old, taken_over=True, now=now)
            extra_size = encoded_size({"compare": [extra_compare], "success": extra})
            if (
                len(success) + len(extra) <= self.max_ops
                and len(compare) < self.max_ops
                and size + extra_size <= self.max_bytes - 1024
            ):
                compare.append(extra_compare)
                success.extend(extra)
                size += extra_size
            else:
                late.append(old)
        for op in gone:
            # A dead reader's key left behind costs later writers a read, never a wrong
            # answer: its claim is dead for good, and a purge removes the key.
            op_size = encoded_size({"success": [op]})
            if len(success) < self.max_ops and size + op_size <= self.max_bytes - 1024:
                success.append(op)
                size += op_size
        return txn_call(compare, success, body["failure"]), record, late

    def _dead_ops(self, old: Record, *, taken_over: bool, now: int) -> list[dict[str, Any]]:
        marked = Record(
            old.id, old.fence, old.mod, old.holder, old.targets, _EXPIRED, old.request_id,
            old.created, now, old.expires, old.taken_over or taken_over, old.lease, old.mode,
        )  # fmt: skip
        ops = [put(self.keys.record(old.id), marked.value())]
        if not self.leases:
            # Under a test clock the live key has no lease: killing the hold removes it,
            # so a confirm that read the hold live cannot win after this.
            ops.append(delete(self.keys.live(old.holder, old.id)))
        return ops

    def _mark_dead(self, old: Record, *, taken_over: bool) -> Plan[bool]:
        """Mark a dead hold expired (and taken over); False if it is already marked so."""
        while True:
            compare = [unchanged(self.keys.record(old.id), old.mod)]
            if self.leases:
                compare.append(absent(self.keys.live(old.holder, old.id)))
            answer = yield txn_call(
                compare,
                self._dead_ops(old, taken_over=taken_over, now=self.now_us()),
                [get(self.keys.record(old.id))],
            )
            if answer.get("succeeded"):
                return True
            found = kvs(responses(answer)[0])
            if not found:
                return False
            old = Record.of(found[0], old.id)
            if not (
                old.state is _HELD or (old.state is _EXPIRED and taken_over and not old.taken_over)
            ):
                return False
            if old.state is _HELD:
                live = yield from self._read_claims([(old.id, old.holder)])
                if live[old.id].live:
                    return False

    def _lasts(self, lease_from: int) -> bool:
        """Whether a lease asked for at ``lease_from`` outlives a hold that starts now.

        Rounds of contention (or a stall) may use its slack up; then the caller takes a
        fresh lease rather than promise an expiry the lease would not keep.
        """
        return self.now_us() - lease_from <= LEASE_SLACK * 1_000_000

    def _grant(self, seconds: int) -> Plan[int]:
        answer = yield Call("grant", "/v3/lease/grant", {"TTL": seconds})
        return int(answer["ID"])

    def _revoke(self, lease: int) -> Plan[None]:
        yield Call("revoke", "/v3/lease/revoke", {"ID": str(lease)})

    def _check_limits(self, p: ClaimPlan) -> None:
        """Refuse a claim etcd would refuse, before sending it (docs/stores.md, etcd limits)."""
        writes = len(p.units) + len(p.spans) + len(p.resources) + 2 + (p.request_key is not None)
        if writes > self.max_ops:
            raise InvalidInput(
                f"an etcd claim writes each target, once more each resource with spans, its "
                f"record, its live key and its request ID in one transaction, at most "
                f"{self.max_ops} writes (etcd's --max-txn-ops); these {len(p.targets)} targets "
                f"need {writes}",
                field="targets",
                value=len(p.targets),
                limit=self.max_ops,
            )
        call, _, _ = self._grant_call(p, None, [])
        size = encoded_size(call.body)
        if size > self.max_bytes - 1024:
            raise InvalidInput(
                f"this claim's etcd transaction is about {size:,} bytes; etcd accepts "
                f"{self.max_bytes:,} (--max-request-bytes): claim fewer or shorter targets",
                field="targets",
                value=len(p.targets),
                limit=self.max_bytes,
            )

    # --- transitions ---------------------------------------------------------------------------

    def _owned(self, claim_id: str, holder: str) -> Plan[tuple[Record, bool]]:
        """The claim's record and whether its live key exists; raises if not this holder's."""
        keys = [get(self.keys.record(claim_id)), get(self.keys.live(holder, claim_id))]
        answers = responses((yield read_call(keys)))
        found = kvs(answers[0])
        if not found:
            raise claim_not_found(claim_id)
        record = Record.of(found[0], claim_id)
        if record.holder != holder:
            raise not_holder(claim_id, holder)
        return record, bool(kvs(answers[1]))

    def _require_live(self, record: Record, live_key: bool, fence: int) -> None:
        reason = lost_reason(
            real_fence=record.fence,
            fence=fence,
            state=record.state,
            dead=record.state is _HELD and not self._live(record, live_key),
            taken_over=record.taken_over,
        )
        if reason is not None:
            raise hold_lost(record.id, reason, fence)

    def _change(
        self, record: Record, changed: Record, fence: int, extra: list[dict[str, Any]]
    ) -> Call:
        live = self.keys.live(record.holder, record.id)
        return txn_call(
            [created_at(live, fence), unchanged(self.keys.record(record.id), record.mod)],
            [put(self.keys.record(record.id), changed.value()), *extra],
            [],
        )

    def confirm(self, claim_id: str, holder: str, fence: int) -> Plan[Claim]:
        while True:
            record, live_key = yield from self._owned(claim_id, holder)
            self._require_live(record, live_key, fence)
            if record.state is _CONFIRMED:
                return record.claim(_CONFIRMED)
            changed = replace(
                record, state=_CONFIRMED, expires=None, lease=0, updated=self.now_us()
            )
            # The live key loses its lease: a confirmed claim never expires.
            live = put(self.keys.live(holder, claim_id), b"")
            answer = yield self._change(record, changed, fence, [live])
            if answer.get("succeeded"):
                changed.mod = revision(answer)
                if record.lease:
                    yield from self._revoke(record.lease)
                return changed.claim(_CONFIRMED)

    def extend(self, claim_id: str, holder: str, fence: int, ttl: float) -> Plan[Claim]:
        lease = lease_from = 0
        while True:
            record, live_key = yield from self._owned(claim_id, holder)
            try:
                self._require_live(record, live_key, fence)
            except HoldLost:
                if lease:
                    yield from self._revoke(lease)
                raise
            if record.state is _CONFIRMED:
                return record.claim(_CONFIRMED)
            if self.leases:
                # A lease's TTL cannot change: the live key moves to a new lease.
                if lease and not self._lasts(lease_from):
                    yield from self._revoke(lease)
                    lease = 0
                if not lease:
                    lease_from = self.now_us()
                    lease = yield from self._grant(lease_seconds(ttl) + LEASE_SLACK)
                now = self.now_us()
                expires = now + lease_seconds(ttl) * 1_000_000
            else:
                now = self.now_us()
                expires = now + round(ttl * 1_000_000)
            changed = replace(record, expires=expires, lease=lease, updated=now)
            live = put(self.keys.live(holder, claim_id), b"", lease)
            try:
                answer = yield self._change(record, changed, fence, [live])
            except LeaseGone:
                lease = 0
                continue
            if answer.get("succeeded"):
                changed.mod = revision(answer)
                if record.lease:
                    yield from self._revoke(record.lease)
                return changed.claim(_HELD)

    def release(self, claim_id: str, holder: str, fence: int) -> Plan[bool]:
        while True:
            record, live_key = yield from self._owned(claim_id, holder)
            if not (record.fence == fence and self._live(record, live_key)):
                try:
                    self._require_live(record, live_key, fence)
                except HoldLost as lost:
                    if lost.reason is HoldLostReason.FENCE:
                        raise
                return False
            changed = replace(record, state=_RELEASED, expires=None, lease=0, updated=self.now_us())
            ops = [delete(self.keys.live(holder, claim_id))]
            if record.mode == SHARED:
                keys = self.keys
                ops += [delete(keys.reader(keys.unit(u), claim_id)) for u in record.unit_list]
            else:
                ops += [delete(self.keys.unit(u)) for u in record.unit_list]
            ops += [
                delete_prefix(self.keys.claim_spans(r, claim_id)) for r in record.span_resources
            ]
            answer = yield self._change(record, changed, fence, ops)
            if answer.get("succeeded"):
                if record.lease:
                    yield from self._revoke(record.lease)
                return True

    # --- reads ---------------------------------------------------------------------------------

    def get(self, claim_id: str) -> Plan[Claim | None]:
        found = yield from self._read_claims([(claim_id, None)])
        blocker = found[claim_id]
        if blocker.record is None:
            return None
        return self._snapshot(blocker.record, blocker.live)

    def holder_of(self, target: Unit | Span) -> Plan[str | None]:
        # The claims are read at the revision their entries were found at: read
        # later, a span's every candidate could be gone while one granted in between
        # (not among them) held it all along, and the answer None fit no moment.
        if isinstance(target, Unit):
            key = self.keys.unit(target)
            answer = yield Call(
                "read", "/v3/kv/range", get_range(key, self.keys.unit_end(key))["request_range"]
            )
            candidates = []
            for kv in kvs(answer):  # the unit key (a writer's) first, then its readers'
                if kv.key == key:
                    owner, claim_id = parse_owner(kv.value)
                    candidates.append((claim_id, owner))
                else:
                    candidates.append((self.keys.reader_id(key, kv.key), kv.value.decode()))
        else:
            prefix = self.keys.resource_spans(target.resource)
            answer = yield Call("read", "/v3/kv/range", get_prefix(prefix)["request_range"])
            candidates = []
            for kv in kvs(answer):
                owner, span, _shared = parse_entry(target.resource, kv.value)
                if span.overlaps(target):
                    candidates.append((self.keys.claim_of_entry(kv.key), owner))
        if not candidates:
            return None
        blockers = yield from self._read_claims(candidates, at=revision(answer))
        # The oldest live claim answers, as on every store (a unit's writer, else its
        # oldest reader: a reader's key orders by claim ID, not by fence).
        live = [
            (record.fence, owner)
            for claim_id, owner in candidates
            if blockers[claim_id].live and (record := blockers[claim_id].record) is not None
        ]
        return min(live)[1] if live else None

    def claims_of(self, holder: str) -> Plan[list[Claim]]:
        # One revision for the scan's pages and the claims' records: the answer is
        # that moment's (see holder_of).
        lives, at = yield from self._scan_at(self.keys.holder_lives(holder), keys_only=True)
        ids = [(self.keys.id_of_live(kv.key), holder) for kv in lives]
        blockers = yield from self._read_claims(ids, at=at)
        claims = [
            b.record.claim(b.record.state)
            for b in blockers.values()
            if b.live and b.record is not None
        ]
        claims.sort(key=lambda c: c.fence)
        return claims

    def _scan_at(self, prefix: bytes, *, keys_only: bool = False) -> Plan[tuple[list[KV], int]]:
        """Every key under ``prefix``, every page read at the first page's revision, and it."""
        found: list[KV] = []
        after = None
        at: int | None = None
        while True:
            body = scan(prefix, after, _PAGE, keys_only=keys_only)
            if at is not None:
                body["revision"] = at
            answer = yield Call("read", "/v3/kv/range", body)
            if at is None:
                at = revision(answer)
            page = kvs(answer)
            found.extend(page)
            if not answer.get("more") or not page:
                return found, at
            after = page[-1].key

    def _scan(self, prefix: bytes, *, keys_only: bool = False) -> Plan[list[KV]]:
        found: list[KV] = []
        after = None
        while True:
            answer = yield Call(
                "read", "/v3/kv/range", scan(prefix, after, _PAGE, keys_only=keys_only)
            )
            page = kvs(answer)
            found.extend(page)
            if not answer.get("more") or not page:
                return found
            after = page[-1].key

    def log(self) -> Plan[list[Claim]]:
        """Every claim record as stored (held, not derived), in fence order."""
        records = yield from self._scan(self.keys.records)
        claims = [Record.of(kv, kv.key[len(self.keys.records) :].decode()) for kv in records]
        return sorted((r.claim(r.state) for r in claims), key=lambda c: c.fence)

    def token(self) -> Plan[object]:
        """The cluster's revision: it moves on every write (ours and others')."""
        answer = yield Call(
            "read", "/v3/kv/range", {"key": b64(self.keys.root), "count_only": True}
        )
        return revision(answer)

    # --- sweep ---------------------------------------------------------------------------------

    def sweep(self) -> Plan[SweepResult]:
        expired = purged_claims = purged_requests = 0
        # Records first, live keys after: a record seen with no live key read later
        # is dead for good (a live key is written with its record and never again).
        records = yield from self._scan(self.keys.records)
        lives = yield from self._scan(self.keys.lives, keys_only=True)
        live_ids = {self.keys.id_of_live(kv.key) for kv in lives}
        now = self.now_us()
        retention = round(self._retention() * 1_000_000)
        # Like every store, keep the newest claim (etcd never reuses a revision anyway).
        newest = max((kv.create for kv in records), default=0)
        for kv in records:
            record = Record.of(kv, kv.key[len(self.keys.records) :].decode())
            if record.state is _HELD and not self._live(record, record.id in live_ids):
                expired += yield from self._mark_dead(record, taken_over=False)
            elif (
                record.state in (_RELEASED, _EXPIRED)
                and record.updated + retention <= now
                and record.fence != newest
            ):
                purged_claims += yield from self._purge(record)
        for kv in (yield from self._scan(self.keys.requests)):
            if json.loads(kv.value)["a"] + retention <= now:
                answer = yield txn_call([unchanged(kv.key, kv.mod)], [delete(kv.key)], [])
                if answer.get("succeeded"):
                    purged_requests += 1
        return SweepResult(
            expired=expired, purged_requests=purged_requests, purged_claims=purged_claims
        )

    def _purge(self, record: Record) -> Plan[bool]:
        owner = owner_value(record.holder, record.id)
        ops = [
            delete(self.keys.record(record.id)),
            delete(self.keys.live(record.holder, record.id)),
        ]
        for unit in record.unit_list:
            # A unit key still naming this claim goes with it; one a later claim took stays.
            key = self.keys.unit(unit)
            if record.mode == SHARED:
                ops.append(delete(self.keys.reader(key, record.id)))
            else:
                ops.append(nested([value_is(key, owner)], [delete(key)]))
        for resource in record.span_resources:
            ops.append(delete_prefix(self.keys.claim_spans(resource, record.id)))
        answer = yield txn_call([unchanged(self.keys.record(record.id), record.mod)], ops, [])
        return bool(answer.get("succeeded"))
