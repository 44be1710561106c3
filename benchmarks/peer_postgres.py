"""PostgreSQL: the jobs-table queue with ``FOR UPDATE SKIP LOCKED``.

The table keeps every job and its outcome (as aeroqueue's job records do);
a partial index on the queued jobs makes the claim an index range scan that
shrinks as the queue drains. The claim is one statement (a CTE locks the
next queued rows, skipping those other claimants hold, and the UPDATE marks
them claimed by this worker); the ack is one UPDATE that only succeeds while
this worker still holds the claim. Deadlocks and serialization failures are
retried with backoff, as a production worker would.
"""

from __future__ import annotations

import uuid
from typing import Any

from .harness import Peer, PeerInfo, PeerUnavailable, Prepared, Worker, check_states, with_retry

DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/test"

_SCHEMA = """
CREATE TABLE {t} (
    id          bigint      PRIMARY KEY,
    payload     jsonb       NOT NULL,
    state       text        NOT NULL DEFAULT 'queued' CHECK (state IN ('queued', 'claimed', 'done', 'dead')),
    claimed_by  text,
    claimed_at  timestamptz,
    attempts    integer     NOT NULL DEFAULT 0,
    result      jsonb,
    done_at     timestamptz
)
"""
# Only queued rows are in the index: the claim's scan starts at the first
# claimable job instead of stepping over everything already processed.
_INDEX = "CREATE INDEX {i} ON {t} (id) WHERE state = 'queued'"

_CLAIM = """
WITH next AS (
    SELECT id FROM {t} WHERE state = 'queued' ORDER BY id LIMIT %(n)s FOR UPDATE SKIP LOCKED
)
UPDATE {t} AS j
   SET state = 'claimed', claimed_by = %(me)s, claimed_at = now(), attempts = j.attempts + 1
  FROM next
 WHERE j.id = next.id
RETURNING j.id, j.payload
"""
_ACK = """
UPDATE {t} SET state = 'done', result = %(result)s, done_at = now()
 WHERE id = ANY(%(ids)s) AND state = 'claimed' AND claimed_by = %(me)s
RETURNING id
"""


def _retryable(e: BaseException) -> bool:
    from psycopg import errors

    return isinstance(e, (errors.DeadlockDetected, errors.SerializationFailure))


class PostgresWorker(Worker):
    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__(config)
        import psycopg
        from psycopg import sql
        from psycopg.types.json import Jsonb

        # Autocommit: each statement is its own transaction, so a claim holds
        # its row locks only for the duration of the claiming UPDATE.
        self.conn = psycopg.connect(config["dsn"], autocommit=True)
        table = sql.Identifier(config["table"])
        self.claim_sql = sql.SQL(_CLAIM).format(t=table)
        self.ack_sql = sql.SQL(_ACK).format(t=table)
        self.me = uuid.uuid4().hex  # the claimant's identity, checked again at ack time
        self.result = Jsonb("ok")

    def reserve(self, n: int) -> list[tuple[int, Any]]:
        rows = with_retry(lambda: self._execute(self.claim_sql, {"n": n, "me": self.me}), _retryable, self._retried)
        # jsonb comes back decoded: the payload is what a worker would process.
        return [(int(job_id), payload) for job_id, payload in rows]

    def ack(self, jobs: list[tuple[int, Any]]) -> list[int]:
        ids = [number for number, _ in jobs]
        rows = with_retry(
            lambda: self._execute(self.ack_sql, {"result": self.result, "ids": ids, "me": self.me}),
            _retryable,
            self._retried,
        )
        accepted = [int(job_id) for (job_id,) in rows]
        self.lost += len(ids) - len(accepted)
        return accepted

    def _execute(self, statement: Any, params: dict[str, Any]) -> list[tuple[Any, ...]]:
        self.calls += 1
        with self.conn.cursor() as cur:
            cur.execute(statement, params)
            return cur.fetchall()

    def _retried(self) -> None:
        self.retries += 1

    def close(self) -> None:
        self.conn.close()


class PostgresPeer(Peer):
    name = "postgres"
    batch_form = "LIMIT 100 in the same claim; ack with id = ANY(ids)"

    def __init__(self, dsn: str = DEFAULT_DSN) -> None:
        self.dsn = dsn
        self.conn: Any = None

    def start(self) -> PeerInfo:
        try:
            import psycopg
        except ImportError:
            raise PeerUnavailable("the psycopg package is not installed (pip install 'psycopg[binary]')") from None
        try:
            self.conn = psycopg.connect(self.dsn, autocommit=True, connect_timeout=3)
        except psycopg.Error as e:
            raise PeerUnavailable(f"cannot connect to PostgreSQL at {self.target()}: {_first_line(e)}") from None
        version = self._show("server_version")
        durability = (
            f"fsync={self._show('fsync')}, synchronous_commit={self._show('synchronous_commit')}"
            + (": WAL flushed to disk at every commit" if self._show("synchronous_commit") == "on" else "")
        )
        return PeerInfo(
            name=self.name,
            version=f"PostgreSQL {version}, psycopg {psycopg.__version__} ({psycopg.pq.__impl__})",
            target=self.target(),
            recipe=(
                "UPDATE ... WHERE id IN (SELECT ... FOR UPDATE SKIP LOCKED) RETURNING, on a partial index "
                "of queued jobs; ack = UPDATE ... WHERE claimed_by = me AND state = 'claimed'; "
                "deadlocks retried; a dead worker's jobs need a reaper on claimed_at"
            ),
            durability=durability,
        )

    def target(self) -> str:
        from psycopg.conninfo import conninfo_to_dict

        try:
            info = conninfo_to_dict(self.dsn)
        except Exception:
            return "PostgreSQL (unparsable DSN)"
        return f"{info.get('user', '')}@{info.get('host', 'localhost')}:{info.get('port', 5432)}/{info.get('dbname', '')}"

    def _show(self, setting: str) -> str:
        row = self.conn.execute(f"SHOW {setting}").fetchone()  # a fixed setting name, not input
        return str(row[0]) if row else "?"

    def prepare(self, n_jobs: int) -> Prepared:
        from psycopg import sql
        from psycopg.types.json import Jsonb

        name = f"aq_bench_{uuid.uuid4().hex[:10]}"
        table = sql.Identifier(name)
        self.conn.execute(sql.SQL(_SCHEMA).format(t=table))
        self.conn.execute(sql.SQL(_INDEX).format(i=sql.Identifier(name + "_claim"), t=table))
        # COPY: how a user loads a large list into PostgreSQL.
        with self.conn.cursor() as cur, cur.copy(sql.SQL("COPY {t} (id, payload) FROM STDIN").format(t=table)) as copy:
            for i in range(n_jobs):
                copy.write_row((i, Jsonb({"i": i})))
        # Autovacuum would get there eventually; without statistics the planner
        # may not pick the partial index for the first claims.
        self.conn.execute(sql.SQL("ANALYZE {t}").format(t=table))
        return Prepared(PostgresWorker, {"dsn": self.dsn, "table": name}, n_jobs)

    def verify(self, prepared: Prepared, acked: int) -> str | None:
        from psycopg import sql

        rows = self.conn.execute(
            sql.SQL("SELECT state, count(*) FROM {t} GROUP BY state").format(t=sql.Identifier(prepared.config["table"]))
        ).fetchall()
        return check_states(dict(rows), acked)

    def discard(self, prepared: Prepared) -> None:
        from psycopg import sql

        self.conn.execute(sql.SQL("DROP TABLE IF EXISTS {t}").format(t=sql.Identifier(prepared.config["table"])))

    def stop(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]
