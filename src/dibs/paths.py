"""Reserve an output path atomically: the exclusive create is the check.

Deciding a free name with ``exists()`` and then writing is check-then-act
across processes: two runs both see ``report.pdf`` missing and both write it.
:func:`reserve_path` instead opens each candidate name with
``O_CREAT | O_EXCL | O_NOFOLLOW``; the kernel creates the file only if no
entry of that name exists, so the ``open`` that succeeds *is* the reservation
(the linearization point), and a ``FileExistsError`` means "taken, try the
next name". The caller gets back the reserved path and its open file and must
use that exact path everywhere downstream (the write, the log line, the
footer that names the file), never a name recomputed later.
"""

from __future__ import annotations

import os
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Generic, Literal, NamedTuple, TypeVar, overload

from dibs.exceptions import DibsError, InvalidInput

__all__ = ["PathsExhausted", "ReservedPath", "candidate_names", "reserve_path"]

F = TypeVar("F", bound=IO[Any])

_FLAGS = (
    os.O_WRONLY
    | os.O_CREAT
    | os.O_EXCL
    | getattr(os, "O_NOFOLLOW", 0)  # refuse a planted symlink as the final component
    | getattr(os, "O_CLOEXEC", 0)
    | getattr(os, "O_BINARY", 0)
)

# Suffixes that belong to the one before them, so "logs.tar.gz" becomes
# "logs (2).tar.gz" rather than "logs.tar (2).gz".
_COMPOUND = frozenset({".tar"})


class PathsExhausted(DibsError, FileExistsError):
    """Raised when every candidate name up to ``max_tries`` already exists (``path``, ``tries``)."""

    path: str
    tries: int


class ReservedPath(NamedTuple, Generic[F]):
    """A reserved path and the file opened on it; unpack it or use it as a context manager.

    Closing the file does not give the name back: the file stays, which is what
    keeps the name reserved. Delete it yourself if the work is abandoned.
    """

    path: Path
    file: F

    def __enter__(self) -> ReservedPath[F]:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.file.close()


def candidate_names(name: str) -> tuple[str, str]:
    """Split ``name`` into the stem and suffix that ``(n)`` goes between.

    ``"report.pdf"`` → ``("report", ".pdf")``; ``"logs.tar.gz"`` →
    ``("logs", ".tar.gz")``; ``".env"`` → ``(".env", "")``.
    """
    path = Path(name)
    suffix = path.suffix
    stem = path.stem
    inner = Path(stem).suffix
    if suffix and inner.lower() in _COMPOUND:
        stem, suffix = Path(stem).stem, inner + suffix
    return stem, suffix


@overload
def reserve_path(
    path: str | os.PathLike[str],
    *,
    text: Literal[False] = False,
    encoding: None = None,
    max_tries: int = ...,
    permissions: int = ...,
) -> ReservedPath[IO[bytes]]: ...


@overload
def reserve_path(
    path: str | os.PathLike[str],
    *,
    text: Literal[True],
    encoding: str | None = None,
    max_tries: int = ...,
    permissions: int = ...,
) -> ReservedPath[IO[str]]: ...


def reserve_path(
    path: str | os.PathLike[str],
    *,
    text: bool = False,
    encoding: str | None = None,
    max_tries: int = 10_000,
    permissions: int = 0o666,
) -> ReservedPath[Any]:
    """Create the first free name of ``report.pdf``, ``report (2).pdf``, … and open it for writing.

    Returns the :class:`ReservedPath` (path and open file; binary unless
    ``text=True``). The new file gets ``permissions`` less the umask. The
    directory must exist; the name is never decided with ``exists()``.

    Raises :class:`PathsExhausted` when ``max_tries`` names are all taken,
    :class:`~dibs.InvalidInput` for a path without a file name or a bad
    ``max_tries``, and the ``OSError`` the system gives for anything but "that
    name exists" (a missing directory, no permission, a symlink in the way).
    """
    target = Path(path)
    if not target.name or target.name in (".", ".."):
        raise InvalidInput(f"path must name a file, got {str(path)!r}", field="path", value=path)
    if isinstance(max_tries, bool) or not isinstance(max_tries, int) or max_tries < 1:
        raise InvalidInput(
            f"max_tries must be a positive integer, got {max_tries!r}",
            field="max_tries",
            value=max_tries,
        )
    directory = target.parent
    stem, suffix = candidate_names(target.name)
    # Open the directory once and create relative to it, so every try lands in
    # the same directory even if its path is renamed or swapped meanwhile.
    dir_fd = _open_dir(directory)
    try:
        for n in range(1, max_tries + 1):
            name = target.name if n == 1 else f"{stem} ({n}){suffix}"
            try:
                if dir_fd is None:
                    fd = os.open(directory / name, _FLAGS, permissions)
                else:
                    fd = os.open(name, _FLAGS, permissions, dir_fd=dir_fd)
            except FileExistsError:
                continue  # taken: the failed exclusive create is the answer
            try:
                file = os.fdopen(fd, "w" if text else "wb", encoding=encoding if text else None)
            except BaseException:
                os.close(fd)
                raise
            return ReservedPath(directory / name, file)
    finally:
        if dir_fd is not None:
            os.close(dir_fd)
    raise PathsExhausted(
        f"no free name for {str(target)!r} in {max_tries} tries",
        path=str(target),
        tries=max_tries,
    )


def _open_dir(directory: Path) -> int | None:
    if os.open not in os.supports_dir_fd:
        return None
    flags = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0)
    return os.open(directory, flags)
