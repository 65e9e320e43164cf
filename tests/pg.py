"""A real PostgreSQL server for tests, started by the tests themselves: initdb into a fresh
temporary folder, then `pg_ctl start` on 127.0.0.1 (a free port) and a unix socket in that
folder. Debian's server binaries (postgresql-15, installed by scripts/setup.sh test); as
root, the server runs as the unprivileged `postgres` user (initdb refuses root). Password
authentication (scram-sha-256), so the URLs the tests use carry a password as real ones do."""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

BIN = Path("/usr/lib/postgresql/15/bin")
USER = "stockade"
PASSWORD = "s3cret-pw-never-logged"
RUN_AS = "postgres"


@dataclass(frozen=True)
class PgServer:
    folder: Path
    port: int

    @property
    def url(self) -> str:
        """The superuser's URL to the `postgres` database."""
        return self.url_of("postgres")

    def url_of(self, database: str) -> str:
        return f"postgresql://{USER}:{PASSWORD}@127.0.0.1:{self.port}/{database}"

    def stop(self) -> None:
        """Stop the server at once (as a crash or a lost database would)."""
        args = [str(BIN / "pg_ctl"), "-D", str(self.folder / "data"), "-m", "immediate", "stop"]
        subprocess.run(_as_server_user(args), check=True, capture_output=True, timeout=60)

    def create_database(self, name: str) -> str:
        """A fresh database; its URL."""
        import psycopg

        with psycopg.connect(self.url, autocommit=True) as db:
            db.execute(f'CREATE DATABASE "{name}"')
        return self.url_of(name)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _as_server_user(args: list[str]) -> list[str]:
    if os.geteuid() != 0:
        return args
    return ["runuser", "-u", RUN_AS, "--", *args]


@contextmanager
def postgres_server() -> Iterator[PgServer]:
    """A running server for the duration of the block; stopped and deleted after."""
    if not (BIN / "postgres").exists():
        pytest.skip(f"PostgreSQL server binaries missing ({BIN}): run scripts/setup.sh test")
    folder = Path(tempfile.mkdtemp(prefix="stkpg", dir="/tmp"))
    data = folder / "data"
    if os.geteuid() == 0:
        entry = pwd.getpwnam(RUN_AS)
        os.chown(folder, entry.pw_uid, entry.pw_gid)
    pwfile = folder / "pw"
    pwfile.write_text(PASSWORD + "\n")
    if os.geteuid() == 0:
        os.chown(pwfile, entry.pw_uid, entry.pw_gid)
    pwfile.chmod(0o600)
    port = _free_port()
    run = dict(check=True, capture_output=True, timeout=120)
    subprocess.run(
        _as_server_user(
            [
                str(BIN / "initdb"),
                "-D",
                str(data),
                "-U",
                USER,
                f"--pwfile={pwfile}",
                "-A",
                "scram-sha-256",
                "-E",
                "UTF8",
                "--no-sync",
            ]
        ),
        **run,  # type: ignore[call-overload]
    )
    options = (
        f"-c listen_addresses=127.0.0.1 -c port={port} -c unix_socket_directories={folder} "
        "-c fsync=off -c max_connections=100 -c shared_buffers=16MB"
    )
    subprocess.run(
        _as_server_user(
            [
                str(BIN / "pg_ctl"),
                "-D",
                str(data),
                "-l",
                str(folder / "server.log"),
                "-o",
                options,
                "-w",
                "-t",
                "60",
                "start",
            ]
        ),
        **run,  # type: ignore[call-overload]
    )
    try:
        yield PgServer(folder, port)
    finally:
        with contextlib.suppress(subprocess.SubprocessError):
            subprocess.run(
                _as_server_user(
                    [str(BIN / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop"]
                ),
                **run,  # type: ignore[call-overload]
            )
        shutil.rmtree(folder, ignore_errors=True)
