"""reserve_path: the exclusive create decides; concurrent processes never share a path."""

from __future__ import annotations

import multiprocessing
import os
import threading
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest

from dibs import DibsError, InvalidInput, PathsExhausted, reserve_path
from dibs.paths import candidate_names

QUICK = True  # in `pytest -m quick` (conftest.is_quick: not slow, no server)


def test_names_count_up_from_two(tmp_path: Path) -> None:
    got = []
    for _ in range(4):
        with reserve_path(tmp_path / "report.pdf") as reserved:
            reserved.file.write(b"%PDF")
            got.append(reserved.path.name)
    assert got == ["report.pdf", "report (2).pdf", "report (3).pdf", "report (4).pdf"]
    assert (tmp_path / "report (3).pdf").read_bytes() == b"%PDF"


def test_returns_path_and_open_file_for_unpacking(tmp_path: Path) -> None:
    path, file = reserve_path(tmp_path / "notes.txt", text=True, encoding="utf-8")
    with file:
        file.write(f"saved as {path.name}\n")
    assert path.read_text(encoding="utf-8") == "saved as notes.txt\n"


def test_a_gap_is_reused(tmp_path: Path) -> None:
    for _ in range(3):
        reserve_path(tmp_path / "a.csv").file.close()
    (tmp_path / "a (2).csv").unlink()
    with reserve_path(tmp_path / "a.csv") as reserved:
        assert reserved.path.name == "a (2).csv"


@pytest.mark.parametrize(
    ("name", "stem", "suffix"),
    [
        ("report.pdf", "report", ".pdf"),
        ("logs.tar.gz", "logs", ".tar.gz"),
        ("v1.2.report.pdf", "v1.2.report", ".pdf"),
        (".env", ".env", ""),
        ("README", "README", ""),
    ],
)
def test_candidate_names(name: str, stem: str, suffix: str) -> None:
    assert candidate_names(name) == (stem, suffix)


def test_compound_suffix_keeps_together(tmp_path: Path) -> None:
    reserve_path(tmp_path / "logs.tar.gz").file.close()
    with reserve_path(tmp_path / "logs.tar.gz") as reserved:
        assert reserved.path.name == "logs (2).tar.gz"


@pytest.mark.parametrize("dangling", [False, True])
def test_a_symlink_in_the_way_is_never_followed(tmp_path: Path, dangling: bool) -> None:
    victim = tmp_path / "victim.txt"
    if not dangling:
        victim.write_text("precious")
    (tmp_path / "out.txt").symlink_to(victim)
    with reserve_path(tmp_path / "out.txt") as reserved:
        reserved.file.write(b"new")
    assert reserved.path.name == "out (2).txt"
    if dangling:
        assert not victim.exists()
    else:
        assert victim.read_text() == "precious"


def test_missing_directory_raises_instead_of_looping(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        reserve_path(tmp_path / "nope" / "report.pdf")


def test_exhausted_names_raise_a_typed_error(tmp_path: Path) -> None:
    for _ in range(3):
        reserve_path(tmp_path / "x.bin", max_tries=3).file.close()
    with pytest.raises(PathsExhausted) as info:
        reserve_path(tmp_path / "x.bin", max_tries=3)
    err = info.value
    assert isinstance(err, DibsError) and isinstance(err, FileExistsError)
    assert err.tries == 3 and err.path.endswith("x.bin")


@pytest.mark.parametrize("bad", ["", ".", "..", "dir/.."])
def test_a_path_must_name_a_file(bad: str) -> None:
    with pytest.raises(InvalidInput):
        reserve_path(bad)


@pytest.mark.parametrize("tries", [0, -1, True, 1.5])
def test_bad_max_tries(tmp_path: Path, tries: object) -> None:
    with pytest.raises(InvalidInput):
        reserve_path(tmp_path / "a", max_tries=tries)  # type: ignore[arg-type]


def test_threads_never_share_a_path(tmp_path: Path) -> None:
    paths: list[Path] = []
    lock = threading.Lock()

    def worker() -> None:
        for _ in range(60):
            with reserve_path(tmp_path / "t.log") as reserved:
                reserved.file.write(str(threading.get_ident()).encode())
                with lock:
                    paths.append(reserved.path)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(paths) == len(set(paths)) == 480


def _reserve_many(directory: str, worker: int, count: int) -> list[str]:
    got = []
    for i in range(count):
        # Spread over a few names so the test stays quick while every name is contested.
        name = ("report.pdf", "data.tar.gz", "out", "r.csv")[i % 4]
        with reserve_path(Path(directory) / name) as reserved:
            reserved.file.write(f"{worker}:{i}".encode())
            got.append(f"{reserved.path}|{worker}:{i}")
    return got


@pytest.mark.slow  # processes: left out of the quick subset
def test_processes_never_share_a_path(tmp_path: Path) -> None:
    workers, count = 8, 250
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(workers, mp_context=context) as pool:
        futures = [pool.submit(_reserve_many, str(tmp_path), w, count) for w in range(workers)]
        results = [line for f in futures for line in f.result()]
    paths = [line.split("|")[0] for line in results]
    assert len(paths) == len(set(paths)) == workers * count
    assert len(os.listdir(tmp_path)) == workers * count
    for line in results:
        path, token = line.split("|")
        # Each file holds exactly what its reserver wrote: nobody else opened it.
        assert Path(path).read_text() == token
