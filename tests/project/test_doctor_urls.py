"""``dibs doctor`` refuses what ``dibs.open`` refuses, with the same message, exit 2.

Every store kind, through the store's own ``check_url`` (the checks its
``from_url`` runs before any I/O): no traceback, no "clean" verdict on a URL
the store would never open, and nothing created or contacted.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

import dibs
import dibs.aio
from dibs.cli import main

PG = "postgresql://127.0.0.1:1/db"  # nothing listens: a check that connected would say so
ETCD = "etcd://127.0.0.1:1"

BAD = [
    f"{PG}?synchronous_commit=off",  # a server setting, not a libpq URL parameter
    f"{PG}?bogus=1",
    f"{PG}?schema=Bad-Name",
    f"{PG}?schema=",
    f"{PG}?pool_max=0",
    f"{PG}?pool_min=5&pool_max=2",
    f"{PG}?pool_timeout=-1",
    f"{PG}?max_retries=x",
    f"{PG}?request_retention=0",
    "postgres://127.0.0.1:1/db?sslmode=sometimes",
    "sqlite:///{tmp}/s.db?bogus=1",
    "sqlite:///{tmp}/s.db?synchronous=sometimes",
    "sqlite:///{tmp}/s.db?busy_timeout=-1",
    "sqlite:///{tmp}/s.db?busy_timeout=abc",
    "sqlite:///{tmp}/s.db?request_retention=-5",
    "sqlite:///{tmp}/s.db?group_commit=maybe",
    "sqlite://elsewhere/s.db",
    "sqlite://",
    "memory://?x=1",
    "memory://somewhere",
    f"{ETCD}?bogus=1",
    f"{ETCD}?timeout=-1",
    f"{ETCD}?request_retention=0",
    "etcd://",
    "etcd://host:99999",
    "nope://x",
    "no-scheme-at-all",
]


# What opening refuses as a mistake: bad input, or an option only libpq rejects (sslmode).
_MISTAKES = (dibs.InvalidInput, dibs.StoreMisconfigured)


def _refusal(url: str) -> str:
    with pytest.raises(_MISTAKES) as raised:
        dibs.open(url)
    return str(raised.value)


@pytest.mark.parametrize("template", BAD)
def test_doctor_refuses_what_open_refuses_with_its_message(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], template: str
) -> None:
    url = template.format(tmp=tmp_path)
    message = _refusal(url)
    capsys.readouterr()
    assert main(["doctor", url, "--timeout", "1"]) == 2
    out, err = capsys.readouterr()
    assert (out, err) == ("", f"dibs: error: {message}\n")
    assert main(["doctor", url, "--json"]) == 2
    assert capsys.readouterr().err == f"dibs: error: {message}\n"
    assert list(tmp_path.iterdir()) == []  # nothing created


@pytest.mark.parametrize("template", BAD)
def test_the_async_face_refuses_the_same_urls_alike(tmp_path: Path, template: str) -> None:
    url = template.format(tmp=tmp_path)
    message = _refusal(url)

    async def open_it() -> None:
        async with dibs.aio.open(url):
            pass

    with pytest.raises(_MISTAKES) as raised:
        asyncio.run(open_it())
    assert str(raised.value) == message


@pytest.mark.parametrize("template", BAD)
def test_what_only_reads_a_store_refuses_the_same_urls_alike(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], template: str
) -> None:
    # create=False asks exists() first: it must not judge a URL opening would refuse.
    url = template.format(tmp=tmp_path)
    message = _refusal(url)
    with pytest.raises(_MISTAKES) as raised:
        dibs.open(url, create=False)
    assert str(raised.value) == message
    commands = [["sweep", "--store", url]]
    if not url.startswith("memory"):  # dibs jobs refuses memory:// whatever its URL
        commands.append(["jobs", "list", "--store", url])
    for command in commands:
        capsys.readouterr()
        assert main(command) == 2, command
        assert capsys.readouterr().err == f"dibs: error: {message}\n", command
    assert list(tmp_path.iterdir()) == []


def test_check_url_passes_every_url_open_takes(tmp_path: Path) -> None:
    for url in (
        PG,
        f"{PG}?schema=app&pool_min=0&pool_max=3&sslmode=disable&request_retention=60",
        f"sqlite:///{tmp_path}/s.db?synchronous=full&busy_timeout=5&group_commit=1",
        "sqlite:///:memory:",
        "memory://",
        f"{ETCD},127.0.0.1:2/prefix?timeout=2&request_retention=60",
    ):
        dibs.stores.store_class(url).check_url(url)
