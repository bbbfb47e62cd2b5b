"""A claim's input as one value, checked once: what both faces hand every store.

:meth:`dibs.Store.claim` and :meth:`dibs.aio.AsyncStore.claim` check their
arguments into a :class:`ClaimRequest`, and a store's ``_claim`` takes that one
value. So a claim option is added in three places: here (its check, and its
part of the fingerprint), in each store's persistence, and on the wire; never
in the layers between, which pass the request along whole.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, NoReturn, Self

from dibs._model import (
    EXCLUSIVE,
    Target,
    Unit,
    check_holder,
    check_mode,
    check_request_id,
    check_ttl,
    fingerprint,
    is_plain_name,
    normalize_targets,
)
from dibs.limits import TTL_MAX, TTL_MIN

__all__ = ["ClaimRequest"]

_FIELDS = ("targets", "holder", "request_id", "ttl", "mode")
_new = object.__new__
_set = object.__setattr__


class ClaimRequest:
    """One claim's input, checked and normalized: targets, holder, request ID, TTL and mode.

    ``targets`` is a tuple of distinct :class:`~dibs.Unit` and
    :class:`~dibs.Span` values; ``ttl`` is None (confirmed at once) or seconds
    as a float; ``mode`` is ``"exclusive"`` or ``"shared"``, for every target.
    Two requests are equal when their input is, which is when a
    request ID may replay one for the other. Immutable. Raises
    :class:`~dibs.InvalidInput` naming the bad value.
    """

    __slots__ = ("_fingerprint", "holder", "mode", "request_id", "targets", "ttl")

    targets: tuple[Target, ...]
    holder: str
    request_id: str | None
    ttl: float | None
    mode: str
    _fingerprint: str | None

    def __init__(
        self,
        targets: Target | Iterable[Target],
        *,
        holder: str,
        request_id: str | None = None,
        ttl: float | None = None,
        mode: str = EXCLUSIVE,
    ) -> None:
        # Fast paths for the common well-formed call; the checkers raise otherwise.
        normalized = (targets,) if type(targets) is Unit else normalize_targets(targets)
        if type(holder) is not str or not holder or not is_plain_name(holder):
            holder = check_holder(holder)
        if request_id is not None and (
            type(request_id) is not str or not request_id or not is_plain_name(request_id)
        ):
            request_id = check_request_id(request_id)
        if ttl is not None and (type(ttl) is not float or not TTL_MIN <= ttl <= TTL_MAX):
            ttl = check_ttl(ttl)
        if mode is not EXCLUSIVE:
            mode = check_mode(mode)
        _set(self, "targets", normalized)
        _set(self, "holder", holder)
        _set(self, "request_id", request_id)
        _set(self, "ttl", ttl)
        _set(self, "mode", mode)
        _set(self, "_fingerprint", None)

    @classmethod
    def of(
        cls,
        targets: tuple[Target, ...],
        holder: str,
        request_id: str | None = None,
        ttl: float | None = None,
        mode: str = EXCLUSIVE,
    ) -> Self:
        """A request from values already checked and normalized (a store's own, or a replay's).

        No check runs: pass only what a :class:`ClaimRequest` held.
        """
        request = _new(cls)
        _set(request, "targets", targets)
        _set(request, "holder", holder)
        _set(request, "request_id", request_id)
        _set(request, "ttl", ttl)
        _set(request, "mode", mode)
        _set(request, "_fingerprint", None)
        return request

    @property
    def fingerprint(self) -> str:
        """A stable digest of the input a request ID replays: holder, targets, TTL and mode.

        Computed once, on first use, and the same in every process and store.
        """
        found = self._fingerprint
        if found is None:
            found = fingerprint(self.holder, self.targets, self.ttl, self.mode)
            _set(self, "_fingerprint", found)
        return found

    def replace(self, **changes: Any) -> ClaimRequest:
        """A copy with some fields changed, checked again (``request_id=None`` drops the ID)."""
        values = {**dict(zip(_FIELDS, self._key(), strict=True)), **changes}
        return ClaimRequest(values.pop("targets"), **values)

    def _key(self) -> tuple[object, ...]:
        return (self.targets, self.holder, self.request_id, self.ttl, self.mode)

    def __eq__(self, other: object) -> bool:
        if type(other) is not ClaimRequest:
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        return (
            f"ClaimRequest(targets={self.targets!r}, holder={self.holder!r}, "
            f"request_id={self.request_id!r}, ttl={self.ttl!r}, mode={self.mode!r})"
        )

    def __setattr__(self, name: str, value: object) -> NoReturn:
        raise AttributeError(f"ClaimRequest is immutable: cannot set {name!r}")

    def __delattr__(self, name: str) -> NoReturn:
        raise AttributeError(f"ClaimRequest is immutable: cannot delete {name!r}")

    def __reduce__(self) -> tuple[Any, ...]:
        return (ClaimRequest.of, self._key())
