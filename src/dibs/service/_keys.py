"""API keys: bearer tokens that name a holder, kept only as SHA-256 digests in a JSON file.

A key looks like ``dibs_<id>_<secret>``: ``id`` finds the record, the digest of
the whole token proves it. The secret is 32 random bytes, so a plain SHA-256 is
enough (a slow password hash guards low-entropy secrets; these are not). The
file is rewritten whole through a temporary file and ``os.replace`` under an
``flock`` on a lock file beside it, so concurrent ``dibs keys create`` calls
never lose a key, and a running service picks up changes by the file's mtime.

Locking: ``KeyRing._lock`` guards ``_records`` and ``_stamp`` (the loaded
file's identity); it is never held while another lock is taken.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import hmac
import json
import os
import secrets
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

from dibs.exceptions import InvalidInput

__all__ = ["ApiKey", "KeyRing"]

_PREFIX = "dibs_"


@dataclass(frozen=True)
class ApiKey:
    """One key's record: never the token, only its digest."""

    id: str
    holder: str
    sha256: str
    created_at: str
    name: str = ""


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def check_holder_name(holder: object) -> str:
    """Return ``holder`` or raise :class:`~dibs.InvalidInput` for a bad holder name."""
    if (
        not isinstance(holder, str)
        or not holder
        or not holder.isprintable()
        or len(holder.encode("utf-8", "surrogatepass")) > 200
        or holder != holder.strip()
        # The service's own holders (parked vehicles) start with "dibs.".
        or holder.startswith("dibs.")
    ):
        raise InvalidInput(
            "holder must be 1-200 bytes of printable UTF-8 without surrounding spaces, "
            f"not starting with 'dibs.', got {holder!r}",
            field="holder",
            value=holder,
        )
    return holder


class KeyRing:
    """The API keys a service accepts, in ``path`` (or only in memory when ``path`` is None)."""

    def __init__(self, path: Path | str | None) -> None:
        self.path = None if path is None else Path(path)
        self._lock = threading.Lock()
        self._records: dict[str, ApiKey] = {}
        self._stamp: tuple[int, int, int] | None = None

    # --- writing (the ``dibs keys`` command) ------------------------------------------------------

    def create(self, holder: str, *, name: str = "") -> tuple[str, ApiKey]:
        """Make a new key for ``holder``; return ``(token, record)``. The token is shown once.

        Raises :class:`~dibs.InvalidInput` for a bad holder name.
        """
        check_holder_name(holder)
        key_id = secrets.token_hex(6)
        token = f"{_PREFIX}{key_id}_{secrets.token_urlsafe(32)}"
        record = ApiKey(
            id=key_id,
            holder=holder,
            sha256=_digest(token),
            created_at=datetime.now(UTC).isoformat(timespec="seconds"),
            name=name,
        )
        with self._editing() as records:
            records[key_id] = record
        return token, record

    def revoke(self, key_id: str) -> bool:
        """Delete the key with this ID; True if it existed."""
        with self._editing() as records:
            return records.pop(key_id, None) is not None

    def list(self) -> list[ApiKey]:
        """Every key record, oldest first."""
        self._refresh()
        with self._lock:
            return sorted(self._records.values(), key=lambda k: (k.created_at, k.id))

    # --- reading (every request) ------------------------------------------------------------------

    def authenticate(self, token: str) -> ApiKey | None:
        """Return the key record this bearer token proves, or None."""
        if not token.startswith(_PREFIX) or len(token) > 200:
            return None
        key_id, sep, _ = token[len(_PREFIX) :].partition("_")
        if not sep:
            return None
        self._refresh()
        with self._lock:
            record = self._records.get(key_id)
        if record is None:
            return None
        # Constant-time on the digest: timing tells nothing about a near miss.
        return record if hmac.compare_digest(record.sha256, _digest(token)) else None

    def _refresh(self) -> None:
        if self.path is None:
            return
        try:
            st = self.path.stat()
        except FileNotFoundError:
            with self._lock:
                self._records, self._stamp = {}, None
            return
        stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
        with self._lock:
            if stamp == self._stamp:
                return
        records = self._read()
        with self._lock:
            self._records, self._stamp = records, stamp

    def _read(self) -> dict[str, ApiKey]:
        assert self.path is not None
        try:
            doc = json.loads(self.path.read_text())
        except FileNotFoundError:
            return {}
        return {item["id"]: ApiKey(**item) for item in doc.get("keys", [])}

    @contextlib.contextmanager
    def _editing(self) -> Iterator[dict[str, ApiKey]]:
        if self.path is None:
            with self._lock:
                yield self._records
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        lock_path = self.path.with_name(self.path.name + ".lock")
        with open(lock_path, "a") as lock_file:
            fcntl.flock(lock_file, fcntl.LOCK_EX)
            records = self._read()
            yield records
            doc = {"version": 1, "keys": [asdict(r) for r in records.values()]}
            fd, tmp = tempfile.mkstemp(prefix=self.path.name, dir=self.path.parent)
            try:
                with os.fdopen(fd, "w") as out:
                    json.dump(doc, out, indent=1)
                os.chmod(tmp, 0o600)
                os.replace(tmp, self.path)
            except BaseException:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)
                raise
        with self._lock:
            self._stamp = None
