"""Helpers for the sync tests: making processed jobs, reading the MySQL copy back."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import mysql.connector

from aeroqueue import keys
from aeroqueue.backends import Backend
from aeroqueue.lists import JobLists
from aeroqueue.loading import JobSpec
from aeroqueue.queue import Queue
from aeroqueue.sessions import Session
from aeroqueue.sync import SyncOptions, Target, parse_target
from aeroqueue.sync.schema import migrations, target_id
from aeroqueue.sync.write import Sink
from tests.conftest import port_open

MYSQL = {"host": "127.0.0.1", "port": 3306, "user": "root", "password": ""}
PARTITIONS = 8


def root_connection(database: str | None = None, port: int = 3306) -> Any:
    return mysql.connector.connect(**{**MYSQL, "port": port}, database=database, charset="utf8mb4", collation="utf8mb4_bin")


def options(store_url: str, target_url: str, **kw: Any) -> SyncOptions:
    kw.setdefault("partitions", PARTITIONS)
    return SyncOptions(store_url=store_url, target=parse_target(target_url), **kw)


def make_jobs(backend: Backend, name: str, *, done: int, dead: int = 0, queued: int = 0, start: int = 0) -> None:
    """Load done + dead + queued jobs into `name` and process the first done + dead:
    done ones complete with a result, dead ones fail their only attempt."""
    total = done + dead + queued
    specs = [JobSpec(f"j{i}", {"n": i, "text": f"payload é {i}"}) for i in range(start, start + total)]
    JobLists(backend).load(name, specs, max_attempts=1)
    q = Queue(backend)
    with Session.open(backend) as s:
        jobs = q.reserve(name, s, done + dead) if done + dead else []
        assert len(jobs) == done + dead
        for j in jobs[:done]:
            q.complete(j, {"ok": j.token, "list": [1, 2.5, None, True]})
        for j in jobs[done:]:
            q.fail(j, f"boom {j.token}")


def processed(backend: Backend, name: str) -> dict[str, dict[str, Any]]:
    """jid -> bins of the list's done and dead jobs, as Aerospike holds them."""
    return {job["jid"]: job for job in JobLists(backend).jobs(name) if job["state"] in ("done", "dead")}


def mysql_rows(database: str, name: str, port: int = 3306, created: int | None = None) -> list[dict[str, Any]]:
    """The list's rows; with `created`, only those of the list of that stamp (a list
    dropped and loaded again under its name is another list)."""
    conn = root_connection(database, port)
    try:
        cur = conn.cursor(dictionary=True)
        if created is None:
            cur.execute("SELECT * FROM aq_jobs WHERE list = %s", (name,))
        else:
            cur.execute("SELECT * FROM aq_jobs WHERE list = %s AND created = %s", (name, created))
        return list(cur.fetchall())
    finally:
        conn.close()


def mysql_query(database: str, sql: str, params: tuple = ()) -> list[tuple]:
    conn = root_connection(database)
    try:
        cur = conn.cursor()
        cur.execute(sql, params)
        return list(cur.fetchall())
    finally:
        conn.close()


def assert_exactly_once(backend: Backend, database: str, name: str, port: int = 3306) -> None:
    """Row by row: every processed job of the list is in MySQL once, as Aerospike
    holds it, and nothing else of the list is (rows of a list of the name dropped
    before are that list's, not this one's)."""
    want = processed(backend, name)
    rows = mysql_rows(database, name, port, created=JobLists(backend).status(name).created)
    jids = [bytes(r["jid"]).decode() for r in rows]
    assert sorted(jids) == sorted(want), "MySQL holds exactly the processed jobs"
    assert len(set(jids)) == len(jids) and len({r["token"] for r in rows}) == len(rows), "each once"
    for row, jid in zip(rows, jids, strict=True):
        job = want[jid]
        assert row["token"] == job["token"]
        assert row["state"] == job["state"]
        assert row["attempts"] == job["att"]
        assert json.loads(row["payload"]) == job["payload"]
        assert (json.loads(row["result"]) if row["result"] is not None else None) == job.get("result")
        assert row["error"] == job.get("err")
        assert row["done_at"] == job["done_at"]


def marked_target(target_url: str) -> Target:
    """The target as the sync marks it: with the id it keeps in the target (none before a sync)."""
    target = parse_target(target_url)
    with Sink(target) as sink:
        try:
            return replace(target, target_id=target_id(sink))
        except Exception as e:
            if not sink.dialect.is_error(e):
                raise
            return target  # not synced into yet


def synced_marks(backend: Backend, name: str, target_url: str) -> dict[str, int]:
    """jid -> the version (done_at) the target holds, for the list's jobs whose
    current version the target holds."""
    bin_name = marked_target(target_url).mark_bin
    return {job["jid"]: job[bin_name] for job in JobLists(backend).jobs(name)
            if bin_name in job and job[bin_name] == job.get("done_at")}


def marked_anywhere(backend: Backend, name: str) -> set[str]:
    """The list's jobs that carry a mark for any target."""
    return {job["jid"] for job in JobLists(backend).jobs(name) if any(b.startswith("sync_") for b in job)}


def job_key(name: str, token: int) -> str:
    return keys.job_name(name, token)


def mysql_port_closed() -> int:
    """A local port nothing listens on."""
    for port in range(3390, 3490):
        if not port_open("127.0.0.1", port):
            return port
    raise RuntimeError("no free port")


def schema_left_at(sink: Sink, version: int) -> None:
    """`sink`'s target as an aeroqueue of schema `version` left it: migrations 1 to
    `version` run (each statement as this database runs it) and recorded."""
    for step in migrations()[:version + 1]:
        for stmt in step.statements:
            if (here := sink.dialect.ddl(stmt)) is not None:
                sink.execute(here)
    ph = sink.dialect.placeholder
    for v in range(1, version + 1):
        sink.execute(f"INSERT INTO schema_version (version, description, applied_at) VALUES ({ph}, 'old', 0)", (v,))
