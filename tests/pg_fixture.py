"""A real PostgreSQL server for the tests, started once per session from Debian's package.

PostgreSQL refuses to run as root, so under root the server runs as the ``postgres``
user (``runuser``) on a data directory it owns, in a fresh folder under /tmp (pytest's
own temp root is private to root). It listens on a free loopback port only, with its
unix socket inside that folder, trust auth, and fsync off: the tests check our
transactions, not the server's crash recovery. Each test gets a fresh database.

Where PostgreSQL is not installed the tests skip, unless
``SEED_AGENTS_REQUIRE_POSTGRES=1`` (set in CI) turns the skip into a failure.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from seed_agents.serve import free_port

INITDB_GLOB = "/usr/lib/postgresql/*/bin/initdb"
REQUIRE_ENV = "SEED_AGENTS_REQUIRE_POSTGRES"


def postgres_bin_dir() -> Path:
    """The newest installed PostgreSQL's bin folder; skips (or fails in CI) when none is."""
    found = sorted(glob.glob(INITDB_GLOB), key=lambda p: int(Path(p).parts[-3]) if Path(p).parts[-3].isdigit() else 0)
    if found:
        return Path(found[-1]).parent
    reason = (f"PostgreSQL is not installed (no {INITDB_GLOB}); install Debian's `postgresql` package "
              f"to run the store suite on PostgreSQL")
    if os.environ.get(REQUIRE_ENV) == "1":
        pytest.fail(reason)
    pytest.skip(reason)


class PostgresServer:
    """A throwaway server: ``start()``, ``new_database()`` per test, ``stop()``."""

    def __init__(self, bin_dir: Path) -> None:
        self.bin_dir = bin_dir
        self.root = Path(tempfile.mkdtemp(prefix="seed-agents-pg-"))
        self.data_dir = self.root / "data"
        self.log_file = self.root / "server.log"
        self.port = free_port()

    @property
    def url(self) -> str:
        """URL of the server's default database (``postgres``)."""
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def start(self) -> None:
        if os.geteuid() == 0:
            shutil.chown(self.root, "postgres", "postgres")
        self._run("initdb", "-D", str(self.data_dir), "-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-sync")
        options = (f"-c listen_addresses=127.0.0.1 -p {self.port} -c unix_socket_directories={self.root} "
                   f"-c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=200")
        self._run("pg_ctl", "-D", str(self.data_dir), "-l", str(self.log_file), "-o", options, "-w", "-t", "60",
                  "start")

    def stop(self) -> None:
        try:
            if (self.data_dir / "postmaster.pid").exists():
                self._run("pg_ctl", "-D", str(self.data_dir), "-m", "immediate", "-w", "stop")
        finally:
            shutil.rmtree(self.root, ignore_errors=True)

    def new_database(self) -> str:
        """Create an empty database and return its store URL."""
        import psycopg

        name = f"t_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres",
                             autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return f"postgresql://postgres@127.0.0.1:{self.port}/{name}"

    def _run(self, tool: str, *args: str) -> None:
        command = [str(self.bin_dir / tool), *args]
        if os.geteuid() == 0:  # the server refuses to run as root
            command = ["runuser", "-u", "postgres", "--", *command]
        done = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=self.root)
        if done.returncode != 0:
            log = self.log_file.read_text(errors="replace")[-2000:] if self.log_file.exists() else ""
            raise RuntimeError(f"{tool} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}\n{log}")


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """A PostgreSQL server for the whole test session (~2 s to start)."""
    server = PostgresServer(postgres_bin_dir())
    try:
        server.start()
        yield server
    finally:
        server.stop()
