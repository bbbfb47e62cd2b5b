"""Opening a store goes wrong in ways a newcomer meets first: each says what, and whether to retry.

A mistake (a wrong password, a missing database or directory, a rejected
option) is :class:`dibs.StoreMisconfigured` at once, with the driver's own
words; an outage is :class:`dibs.StoreUnavailable`, also with its cause. No
test here times anything: where "at once" matters, the store is opened with
a ``pool_timeout`` of an hour, so that waiting for the pool would trip
pytest-timeout instead of passing slowly.
"""

from __future__ import annotations

import argparse
import logging
import pickle
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest

import dibs
from dibs import InvalidInput, StoreMisconfigured, StoreUnavailable, Unit
from dibs.cli import _parser, main
from dibs.service._guard import JsonFormatter
from dibs.stores import redact
from dibs.stores.postgres._connect import connect_error
from dibs.verify.harness import PostgresServer, free_ports
from pg_fixtures import schema_url

HOUR = "pool_timeout=3600"


def _with(url: str, **parts: str) -> str:
    """``url`` with some of its pieces replaced: password, port or path."""
    u = urlsplit(url)
    user = u.username or ""
    password = parts.get("password", u.password or "")
    host = u.hostname or ""
    port = parts.get("port", str(u.port or ""))
    netloc = f"{user}:{password}@{host}" + (f":{port}" if port else "")
    path = parts.get("path", u.path)
    return urlunsplit((u.scheme, netloc, path, u.query, u.fragment))


def _sep(url: str) -> str:
    return "&" if "?" in url else "?"


@pytest.fixture
def quiet_psycopg(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    """Capture every log record, so a test can say that psycopg printed nothing."""
    with caplog.at_level(logging.DEBUG):
        yield caplog


def _psycopg_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name.startswith("psycopg")]


# --- PostgreSQL ---------------------------------------------------------------------------------


def test_a_wrong_password_is_misconfigured_at_once_with_libpq_cause(
    pg_url: str, quiet_psycopg: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    secret = "not-the-password-7c1e"
    url = _with(pg_url, password=secret)
    with pytest.raises(StoreMisconfigured) as raised:
        dibs.open(f"{url}{_sep(url)}{HOUR}")
    error = raised.value
    assert "password authentication failed" in str(error)
    assert "password authentication failed" in error.cause
    assert secret not in str(error) and secret not in error.cause
    assert not isinstance(error, StoreUnavailable | ConnectionError)
    assert isinstance(error.__cause__, psycopg.OperationalError)
    assert _psycopg_lines(quiet_psycopg) == []
    assert capfd.readouterr().err == ""


def test_a_missing_database_is_misconfigured_and_named(
    pg_url: str, quiet_psycopg: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    url = _with(pg_url, path="/no_such_database_9f2")
    with pytest.raises(StoreMisconfigured) as raised:
        dibs.open(f"{url}{_sep(url)}{HOUR}")
    assert 'database "no_such_database_9f2" does not exist' in str(raised.value)
    assert _psycopg_lines(quiet_psycopg) == []
    assert capfd.readouterr().err == ""


def test_an_option_libpq_rejects_is_misconfigured(pg_url: str) -> None:
    with pytest.raises(StoreMisconfigured, match="sslmode"):
        dibs.open(f"{pg_url}{_sep(pg_url)}sslmode=bogus&{HOUR}")


def test_a_closed_port_is_unavailable_at_once_with_the_cause(
    pg_url: str, quiet_psycopg: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    url = _with(pg_url, port=str(free_ports(1)[0]))
    with pytest.raises(StoreUnavailable) as raised:
        dibs.open(f"{url}{_sep(url)}{HOUR}")
    assert "refused" in str(raised.value).lower()
    assert "refused" in raised.value.cause.lower()  # type: ignore[attr-defined]
    assert _psycopg_lines(quiet_psycopg) == []
    assert capfd.readouterr().err == ""


@pytest.mark.parametrize(
    ("message", "mistake"),
    [
        ('connection failed: FATAL:  password authentication failed for user "a"', True),
        ('connection failed: FATAL:  role "ghost" does not exist', True),
        ('FATAL:  no pg_hba.conf entry for host "10.0.0.1", user "a", database "b"', True),
        ("connection failed: fe_sendauth: no password supplied", True),
        ('connection is bad: invalid port number: "abc"', True),
        ("connection failed: server does not support SSL, but SSL was required", True),
        ("connection failed: Connection refused\n\tIs the server running on that host?", False),
        ("connection failed: FATAL:  the database system is starting up", False),
        ('connection failed: FATAL:  too many connections for role "a"', False),
        ("connection failed: timeout expired", False),
        # A name the message quotes never decides, only libpq's own words do.
        ("failed to resolve host 'db.invalid': [Errno -2] Name or service not known", False),
        ('connection failed: FATAL:  the database system is shutting down "invalid"', False),
    ],
)
def test_connect_errors_are_told_apart_by_libpq_words(message: str, mistake: bool) -> None:
    error = connect_error(psycopg.OperationalError(message), "h:5432/db")
    assert isinstance(error, StoreMisconfigured) is mistake
    assert isinstance(error, StoreUnavailable) is not mistake
    assert "\n" not in error.cause and error.cause in str(error)


def test_store_misconfigured_pickles_with_its_cause() -> None:
    error = StoreMisconfigured("cannot open: x", cause="x")
    again = pickle.loads(pickle.dumps(error))
    assert type(again) is StoreMisconfigured and again.cause == "x" and str(again) == str(error)
    assert issubclass(StoreMisconfigured, dibs.DibsError)
    assert not issubclass(StoreMisconfigured, ConnectionError | ValueError)


def test_an_outage_logs_one_warning_and_its_end_and_names_the_cause(
    private_pg_server: PostgresServer, caplog: pytest.LogCaptureFixture
) -> None:
    url = private_pg_server.create_database("outage")
    with dibs.open(f"{url}?pool_timeout=0.5") as store:
        assert store.claim(Unit("seat", "1"), holder="alice")
        private_pg_server.stop()
        causes = []
        with caplog.at_level(logging.INFO, logger="dibs.stores.postgres"):
            for _ in range(4):  # the broken connection first, then the pool's timeouts
                with pytest.raises(StoreUnavailable) as raised:
                    store.get("1")
                causes.append(str(raised.value))
            private_pg_server.start()
            for _ in range(200):  # the pool reconnects in the background
                try:
                    store.get("1")
                    break
                except StoreUnavailable:
                    pass
            assert store.get("1") is not None
        assert any("last connection attempt failed" in c and "refused" in c for c in causes)
        ours = [r for r in caplog.records if r.name == "dibs.stores.postgres"]
        assert [r.levelno for r in ours] == [logging.WARNING, logging.INFO]
        assert "answers again" in ours[1].getMessage()


def test_exists_reads_without_creating(pg_url: str) -> None:
    url = schema_url(pg_url, "t_exists_probe")
    assert dibs.stores.postgres.PostgresStore.exists(url) is False
    with pytest.raises(StoreMisconfigured, match="no dibs store exists"):
        dibs.open(url, create=False)
    assert dibs.stores.postgres.PostgresStore.exists(url) is False  # still nothing made
    dibs.open(url).close()
    try:
        assert dibs.stores.postgres.PostgresStore.exists(url) is True
        dibs.open(url, create=False).close()
    finally:
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute('DROP SCHEMA IF EXISTS "t_exists_probe" CASCADE')


# --- SQLite -------------------------------------------------------------------------------------


def test_a_sqlite_file_in_a_missing_directory_says_so(tmp_path: Path) -> None:
    missing = tmp_path / "no" / "such" / "dir"
    with pytest.raises(StoreMisconfigured) as raised:
        dibs.open(f"sqlite:///{missing / 'dibs.db'}")
    assert "does not exist" in str(raised.value) and str(missing) in str(raised.value)
    assert isinstance(raised.value.__cause__, sqlite3.Error)
    assert not (tmp_path / "no").exists()


def test_a_sqlite_path_that_is_a_directory_says_so(tmp_path: Path) -> None:
    with pytest.raises(StoreMisconfigured, match="is a directory"):
        dibs.open(f"sqlite:///{tmp_path}")


def test_open_with_create_false_refuses_a_missing_sqlite_file(tmp_path: Path) -> None:
    path = tmp_path / "dibs.db"
    with pytest.raises(StoreMisconfigured, match="no dibs store exists"):
        dibs.open(f"sqlite:///{path}", create=False)
    assert not path.exists()
    dibs.open(f"sqlite:///{path}").close()
    with dibs.open(f"sqlite:///{path}", create=False) as store:
        assert store.sweep().expired == 0


# --- the CLI ------------------------------------------------------------------------------------


@pytest.fixture
def elsewhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh working directory and no $DIBS_URL: the default store is ./dibs.db there."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DIBS_URL", raising=False)
    return tmp_path


READ_OR_MAINTAIN = [
    ["sweep"],
    ["jobs", "list"],
    ["jobs", "show", "j-1"],
    ["jobs", "retry", "j-1"],
    ["jobs", "cancel", "j-1"],
    ["jobs", "purge"],
]
"""Every command that only reads or maintains a store (the others serve, race or run one)."""


@pytest.mark.parametrize("argv", READ_OR_MAINTAIN, ids=" ".join)
def test_read_or_maintain_without_a_store_refuses_and_creates_nothing(
    elsewhere: Path, capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "no dibs store at sqlite:///dibs.db (no --store given" in err
    assert "never creates one" in err and "create=False" not in err
    assert "Traceback" not in err
    assert list(elsewhere.iterdir()) == []


@pytest.mark.parametrize("url", ["sqlite:///typo.db", "memory://"])
def test_sweep_refuses_a_store_that_does_not_exist(
    elsewhere: Path, capsys: pytest.CaptureFixture[str], url: str
) -> None:
    assert main(["sweep", "--store", url]) == 2
    assert "never creates one" in capsys.readouterr().err
    assert list(elsewhere.iterdir()) == []


def test_sweep_refuses_a_postgres_schema_that_does_not_exist(
    pg_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    url = schema_url(pg_url, "t_no_such_schema")
    assert main(["sweep", "--store", url]) == 2
    err = capsys.readouterr().err
    assert "never creates one" in err
    assert (urlsplit(pg_url).password or "") not in err
    assert dibs.stores.postgres.PostgresStore.exists(url) is False


def test_a_misconfigured_store_is_a_usage_error_on_the_cli(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'missing' / 'x.db'}"
    assert main(["demo", "--store", url, "--no-progress"]) == 2
    assert "does not exist" in capsys.readouterr().err


def _typed_options() -> Iterator[tuple[list[str], str]]:
    """Every option of every ``dibs`` command that converts its value to a number: (command
    path, flag). "x", "-5" and "nan" are all good names, so name options are left out."""
    from dibs.tasks._cli import _name as check_name

    def walk(parser: argparse.ArgumentParser, path: list[str]) -> Iterator[tuple[list[str], str]]:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    yield from walk(sub, [*path, name])
            elif action.type not in (None, check_name) and action.option_strings:
                yield path, action.option_strings[-1]  # names are checked in test_jobs_cli

    yield from walk(_parser(), [])


TYPED = list(_typed_options())


def test_the_cli_has_typed_options_to_check() -> None:
    assert len(TYPED) >= 20  # the walk found the commands' options


@pytest.mark.parametrize(("path", "flag"), TYPED, ids=[" ".join([*p, f]) for p, f in TYPED])
@pytest.mark.parametrize("bad", ["x", "-5", "nan"])
def test_every_option_error_speaks_to_the_user(
    capsys: pytest.CaptureFixture[str], path: list[str], flag: str, bad: str
) -> None:
    argv = [*path, flag, bad]
    if path[-1] == "tasks":
        argv.append("history.db")  # the positional the subcommand needs
    if path == ["worker"]:
        argv += ["--app", "m:n"]
    try:
        main(argv)
    except SystemExit as exit_:
        assert exit_.code == 2
        err = capsys.readouterr().err
        assert f"argument {flag}: expected " in err, err
        assert "invalid" not in err and "_" not in err.splitlines()[-1].split(":", 2)[-1], err
    else:  # the value was acceptable (a seed of -5): nothing to say
        assert bad == "-5"


# --- match() and the JSON logs ------------------------------------------------------------------


@pytest.mark.parametrize("empty", [[], (), iter([])], ids=["list", "tuple", "iterator"])
def test_match_rejects_no_candidates_on_every_store(store: dibs.Store, empty: object) -> None:
    def no_sleep(seconds: float) -> None:
        raise AssertionError("match() must not retry a mistake")

    with pytest.raises(InvalidInput) as raised:
        dibs.match(store, empty, holder="alice", request_id="r1", sleep=no_sleep)  # type: ignore[arg-type]
    assert raised.value.field == "candidates"
    assert "at least one candidate" in str(raised.value)


def test_json_logs_carry_no_colour_codes() -> None:
    record = logging.makeLogRecord(
        {
            "name": "uvicorn.error",
            "msg": "Started server process [%d]",
            "args": (42,),
            "levelno": logging.INFO,
            "levelname": "INFO",
            "color_message": "Started server process [\x1b[36m%d\x1b[0m]",
            "slot": "show-1",
        }
    )
    line = JsonFormatter().format(record)
    assert "color_message" not in line and "\\u001b" not in line and "\x1b" not in line
    assert '"message": "Started server process [42]"' in line and '"slot": "show-1"' in line


@pytest.mark.parametrize(
    "argv",
    [
        ["verify", "check", "/nonexistent/history.jsonl"],
        ["serve", "--store", "memory://", "--id-secret-file", "/nonexistent/secret"],
    ],
    ids=["verify check", "serve --id-secret-file"],
)
def test_a_missing_file_on_the_command_line_is_named_without_a_traceback(
    capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"dibs: error: {argv[-1]}: No such file or directory" in err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql://u:p%40ss@h/db", "postgresql://u:***@h/db"),
        ("postgresql://u:a@b@h:5432/db?x=1", "postgresql://u:***@h:5432/db?x=1"),
        ("postgresql://u@h/db", "postgresql://u@h/db"),
        ("sqlite:///x.db", "sqlite:///x.db"),
        ("postgresql://u:secret@[::1:5432/db", "postgresql://…"),
        # libpq's other place for it: the query (an empty host stays empty).
        (
            "postgresql:///db?host=/tmp&password=s3&x=1",
            "postgresql:///db?host=/tmp&password=***&x=1",
        ),
        ("postgresql://u:p@h/db?password=s3", "postgresql://u:***@h/db?password=***"),
    ],
)
def test_one_redact_hides_every_password_for_messages_demo_and_verify(url: str, shown: str) -> None:
    from dibs.demo import _rush
    from dibs.verify import _cli

    assert redact(url) == shown
    # The demo's report and verify's histories use the same function, not copies.
    assert _rush.redact is _cli.redact is redact
