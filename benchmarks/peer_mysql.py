"""MariaDB / MySQL: the jobs-table queue with ``SELECT ... FOR UPDATE SKIP LOCKED``.

Same table and same contract as the PostgreSQL peer. MariaDB has no
``UPDATE ... RETURNING``, so the claim is the classic transaction: lock the
next queued rows (skipping rows other claimants hold), mark them claimed by
this worker, commit. The ack is one UPDATE that only succeeds while this
worker still holds the claim. Deadlocks and lock-wait timeouts are retried
with backoff. The client is mysql-connector-python, the driver aeroqueue's
MySQL sync already depends on.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any, cast
from urllib.parse import unquote, urlsplit

from aeroqueue.config import mask_url

from .harness import Peer, PeerInfo, PeerUnavailable, Prepared, Worker, check_states, with_retry

DEFAULT_URL = "mysql://root@127.0.0.1:3306/test"
LOAD_CHUNK = 1000  # rows per multi-row INSERT when loading

_SCHEMA = """
CREATE TABLE `{t}` (
    id          BIGINT      NOT NULL PRIMARY KEY,
    payload     JSON        NOT NULL,
    state       ENUM('queued', 'claimed', 'done', 'dead') NOT NULL DEFAULT 'queued',
    claimed_by  CHAR(32)    NULL,
    claimed_at  DATETIME(6) NULL,
    attempts    INT         NOT NULL DEFAULT 0,
    result      JSON        NULL,
    done_at     DATETIME(6) NULL,
    -- No partial indexes in MariaDB: (state, id) serves the claim's
    -- "WHERE state = 'queued' ORDER BY id" as an index range scan.
    KEY claim (state, id)
) ENGINE=InnoDB
"""
_CLAIM = "SELECT id, payload FROM `{t}` WHERE state = 'queued' ORDER BY id LIMIT %s FOR UPDATE SKIP LOCKED"
_MARK = "UPDATE `{t}` SET state = 'claimed', claimed_by = %s, claimed_at = NOW(6), attempts = attempts + 1 WHERE id IN ({ids})"
_ACK = "UPDATE `{t}` SET state = 'done', result = %s, done_at = NOW(6) WHERE id IN ({ids}) AND state = 'claimed' AND claimed_by = %s"
_MINE = "SELECT id FROM `{t}` WHERE id IN ({ids}) AND state = 'done' AND claimed_by = %s"

_DEADLOCK, _LOCK_WAIT_TIMEOUT = 1213, 1205
_TABLE = re.compile(r"^aq_bench_[0-9a-f]+$")


def connect_args(url: str) -> dict[str, Any]:
    """mysql://user[:password]@host[:port]/database -> mysql.connector.connect() arguments."""
    parts = urlsplit(url)
    if parts.scheme not in ("mysql", "mariadb") or not parts.hostname or not parts.path.strip("/"):
        raise PeerUnavailable(f"not a MySQL URL (mysql://user@host:3306/database): {_mask(url)}")
    args: dict[str, Any] = {
        "host": parts.hostname,
        "port": parts.port or 3306,
        "user": unquote(parts.username or "root"),
        "database": parts.path.strip("/"),
    }
    if parts.password:
        args["password"] = unquote(parts.password)
    return args


def _mask(url: str) -> str:
    return mask_url(url)  # however malformed: urlsplit finds no password in mysql//u:pw@h/db


def _own_table(prepared: Prepared) -> str:
    """The table `prepare` named: identifiers cannot be parameters, so check
    before splicing one into SQL, and never drop a table this harness did not create."""
    table = str(prepared.config["table"])
    if not _TABLE.match(table):
        raise ValueError(f"not a benchmark table: {table!r}")
    return table


def _retryable(e: BaseException) -> bool:
    return getattr(e, "errno", None) in (_DEADLOCK, _LOCK_WAIT_TIMEOUT)


def _placeholders(n: int) -> str:
    return ", ".join(["%s"] * n)


class MySQLWorker(Worker):
    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__(config)
        import mysql.connector

        self.conn = mysql.connector.connect(**config["connect"], autocommit=True)
        cur = self.conn.cursor()
        # Under REPEATABLE READ a locking read also locks the gaps of the index
        # range it scans, which serialises claimants and breeds deadlocks; the
        # claim needs no snapshot, so READ COMMITTED is what a queue runs with.
        cur.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
        cur.close()
        self.table = config["table"]
        self.me = uuid.uuid4().hex
        self.result = json.dumps("ok")

    def reserve(self, n: int) -> list[tuple[int, Any]]:
        rows = with_retry(lambda: self._claim(n), _retryable, self._retried)
        return [(int(job_id), json.loads(payload)) for job_id, payload in rows]

    def _claim(self, n: int) -> list[tuple[Any, ...]]:
        cur = self.conn.cursor()
        try:
            self.calls += 1
            self.conn.start_transaction()
            self.calls += 1
            cur.execute(_CLAIM.format(t=self.table), (n,))
            rows = cast(list[tuple[Any, ...]], cur.fetchall())
            if rows:
                self.calls += 1
                cur.execute(_MARK.format(t=self.table, ids=_placeholders(len(rows))), (self.me, *(r[0] for r in rows)))
            self.calls += 1
            self.conn.commit()
            return rows
        except BaseException:
            # InnoDB has already rolled back a deadlock victim; this ends the
            # transaction on the client side too, for any other error.
            self.conn.rollback()
            raise
        finally:
            cur.close()

    def ack(self, jobs: list[tuple[int, Any]]) -> list[int]:
        ids = [number for number, _ in jobs]
        done = with_retry(lambda: self._ack(ids), _retryable, self._retried)
        if done == len(ids):
            return ids
        # Some claims were lost (rare): ask which rows this worker completed.
        self.calls += 1
        cur = self.conn.cursor()
        try:
            cur.execute(_MINE.format(t=self.table, ids=_placeholders(len(ids))), (*ids, self.me))
            mine = [int(r[0]) for r in cast(list[tuple[Any, ...]], cur.fetchall())]
        finally:
            cur.close()
        self.lost += len(ids) - len(mine)
        return mine

    def _ack(self, ids: list[int]) -> int:
        self.calls += 1
        cur = self.conn.cursor()
        try:
            cur.execute(_ACK.format(t=self.table, ids=_placeholders(len(ids))), (self.result, *ids, self.me))
            return int(cur.rowcount)
        finally:
            cur.close()

    def _retried(self) -> None:
        self.retries += 1

    def close(self) -> None:
        self.conn.close()


class MySQLPeer(Peer):
    name = "mysql"
    batch_form = "LIMIT 100 in the same claim; ack with id IN (...)"

    def __init__(self, url: str = DEFAULT_URL) -> None:
        self.url = url
        self.conn: Any = None

    def start(self) -> PeerInfo:
        args = connect_args(self.url)
        try:
            import mysql.connector
        except ImportError:
            raise PeerUnavailable("the mysql-connector-python package is not installed") from None
        try:
            self.conn = mysql.connector.connect(**args, autocommit=True, connection_timeout=3)
        except mysql.connector.Error as e:
            raise PeerUnavailable(f"cannot connect to MySQL at {_mask(self.url)}: {e}") from None
        variables = self._variables(
            "version", "version_comment", "innodb_flush_log_at_trx_commit", "sync_binlog", "log_bin"
        )
        flush = variables.get("innodb_flush_log_at_trx_commit", "?")
        meaning = {
            "1": "redo log flushed to disk at every commit",
            "2": "redo log written at commit, flushed about once a second",
            "0": "redo log written and flushed about once a second",
        }.get(flush, "")
        binlog = f", binlog on (sync_binlog={variables.get('sync_binlog')})" if variables.get("log_bin") == "ON" else ", binlog off"
        return PeerInfo(
            name=self.name,
            version=(
                f"{variables.get('version_comment', 'MySQL')} {variables.get('version', '?')}, "
                f"mysql-connector-python {mysql.connector.__version__}"
                + ("" if getattr(mysql.connector, "HAVE_CEXT", False) else " (pure Python)")
            ),
            target=_mask(self.url),
            recipe=(
                "transaction: SELECT ... FOR UPDATE SKIP LOCKED on (state, id), UPDATE claimed_by, COMMIT "
                "(READ COMMITTED); ack = UPDATE ... WHERE claimed_by = me AND state = 'claimed'; "
                "deadlocks retried; a dead worker's jobs need a reaper on claimed_at"
            ),
            durability=f"innodb_flush_log_at_trx_commit={flush}" + (f": {meaning}" if meaning else "") + binlog,
        )

    def _variables(self, *names: str) -> dict[str, str]:
        cur = self.conn.cursor()
        try:
            cur.execute(f"SHOW VARIABLES WHERE Variable_name IN ({_placeholders(len(names))})", names)
            return {str(k): str(v) for k, v in cur.fetchall()}
        finally:
            cur.close()

    def _run(self, statement: str, params: Any = ()) -> list[tuple[Any, ...]]:
        cur = self.conn.cursor()
        try:
            cur.execute(statement, params)
            return cur.fetchall() if cur.with_rows else []
        finally:
            cur.close()

    def prepare(self, n_jobs: int) -> Prepared:
        name = f"aq_bench_{uuid.uuid4().hex[:10]}"
        self._run(_SCHEMA.format(t=name))
        cur = self.conn.cursor()
        try:
            insert = f"INSERT INTO `{name}` (id, payload) VALUES (%s, %s)"
            for lo in range(0, n_jobs, LOAD_CHUNK):
                # executemany turns an INSERT into one multi-row statement per chunk.
                self.conn.start_transaction()
                cur.executemany(insert, [(i, json.dumps({"i": i})) for i in range(lo, min(lo + LOAD_CHUNK, n_jobs))])
                self.conn.commit()
        finally:
            cur.close()
        self._run(f"ANALYZE TABLE `{name}`")
        return Prepared(MySQLWorker, {"connect": connect_args(self.url), "table": name}, n_jobs)

    def verify(self, prepared: Prepared, acked: int) -> str | None:
        table = _own_table(prepared)
        rows = self._run(f"SELECT state, COUNT(*) FROM `{table}` GROUP BY state")
        return check_states({str(s): int(c) for s, c in rows}, acked)

    def discard(self, prepared: Prepared) -> None:
        table = _own_table(prepared)
        self._run(f"DROP TABLE IF EXISTS `{table}`")

    def stop(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None
