"""The trace-store suite on a real PostgreSQL server (Debian's package, started per session).

Every test gets a fresh database on the one server; see tests/pg_fixture.py for how the
server runs (as the ``postgres`` user, loopback only) and when the module skips.
"""

from __future__ import annotations

import pytest

from seed_agents.store import TraceStore
from tests.pg_fixture import PostgresServer, postgres_server  # noqa: F401 - the session fixture
from tests.store_suite import StoreSuite

pytestmark = pytest.mark.integration


class TestPostgresStore(StoreSuite):
    @pytest.fixture
    def store_url(self, postgres_server: PostgresServer) -> str:  # noqa: F811 - the imported fixture
        return postgres_server.new_database()


def test_postgres_urls_use_psycopg3(postgres_server: PostgresServer) -> None:  # noqa: F811
    with TraceStore.open(postgres_server.new_database().replace("postgresql://", "postgres://")) as store:
        assert store.dialect == "postgresql"
        assert store._engine.url.drivername == "postgresql+psycopg"  # noqa: SLF001 - the point of the test
