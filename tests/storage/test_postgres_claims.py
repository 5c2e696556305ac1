"""PostgreSQL's claims under the table's real life: rows claimed and released by the
thousand, so that its statistics, taken whenever autovacuum comes by, say little about
what it holds when the next statement runs."""

from __future__ import annotations

from urllib.parse import urlsplit

import psycopg

from instantml.storage.postgres.engine import PgEngine
from instantml.storage.postgres.ledger import PgLedger
from tests.engines import Engines


def _batch(n: int, hi: int) -> set[tuple[int, int, int]]:
    return {(1, hi, lo) for lo in range(n)}


def test_a_large_release_after_small_ones_on_a_churned_table(engines: Engines) -> None:
    url = engines.postgres().new_database()
    engine = PgEngine(url)
    engine.migrate()
    ledger = PgLedger(engine)
    for hi in range(10):  # the table's pages stay after its rows go
        ledger.claim(_batch(10_000, hi), owner=hi)
        ledger.release(owner=hi)
    ledger.claim({(1, -1, 0)}, owner=-1)
    with psycopg.connect(url, autocommit=True) as con:
        con.execute("ANALYZE claims")  # one row in 700-odd pages: "about one row"
        # A statement that scans the table once per released key is cut short, not waited
        # for: a large release takes a fraction of a second when planned for its size.
        con.execute(f"ALTER DATABASE {urlsplit(url).path[1:]} SET statement_timeout = '10s'")
    engine.close()
    engine = PgEngine(url)  # connections that take the timeout
    ledger = PgLedger(engine)
    for hi in range(100, 110):  # were plans cached, they would be small releases' plans
        ledger.claim(_batch(1, hi), owner=hi)
        ledger.release(owner=hi)
    big = _batch(20_000, 200)
    assert ledger.claim(big, owner=200) == set()
    ledger.release(owner=200)
    assert ledger.claim(big, owner=201) == set()  # released: claimable again
    engine.close()
