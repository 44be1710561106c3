"""What `aeroqueue load` takes and refuses (issue 17's loading items, issue 19's
bounded checking): standard input, byte-order marks, the record-size limit,
values MySQL cannot store, extra columns, empty input, a repeated sealed load."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from aeroqueue import keys, loading, udfs
from aeroqueue.backends import open_backend
from aeroqueue.errors import ListModeMismatch, LoadError
from aeroqueue.lists import JobLists, max_payload
from aeroqueue.loading import IdDigests, JobSpec, read_file, validate
from tests.lists.loadcli import assert_no_list, cli, jobs_of, registered


@pytest.fixture
def url(store_url: str) -> str:
    return registered(store_url)


@pytest.fixture
def jl(url):
    b = open_backend(url)
    udfs.ensure(b)
    yield JobLists(b)
    b.close()


# -- standard input ---------------------------------------------------------------


def test_stdin_loads_with_dash(url, list_name):
    csv_text = "id,email\n" + "".join(f"c{i},u{i}@example.com\n" for i in range(25))
    out = cli(url, "load", list_name, "-", input=csv_text)
    assert out.exit_code == 0, out.output
    assert "25 loaded" in out.output
    assert jobs_of(url, list_name)["c7"] == {"email": "u7@example.com"}
    jsonl = "".join(json.dumps({"id": f"j{i}", "payload": {"n": i}}) + "\n" for i in range(5))
    other = f"{list_name}-j"
    out = cli(url, "load", other, "-", input=jsonl)  # JSON Lines told apart by its first '{'
    assert out.exit_code == 0, out.output
    assert jobs_of(url, other) == {f"j{i}": {"n": i} for i in range(5)}


def test_stdin_is_checked_whole_before_writing(url, list_name):
    text = "id,x\n" + "".join(f"{i},a\n" for i in range(3000)) + "7,dup\n"
    out = cli(url, "load", list_name, "-", input=text)
    assert out.exit_code == 1
    assert "<stdin>, line 3002, field 'id'" in out.output and "duplicate job id '7'" in out.output
    assert_no_list(url, list_name)


def test_a_real_pipe(tmp_path):
    url = f"embedded://{tmp_path / 's.db'}"
    data = "id,v\n" + "".join(f"p{i},{i}\n" for i in range(300))
    done = subprocess.run(
        [sys.executable, "-m", "aeroqueue", "--url", url, "--create", "load", "piped", "-", "--json"],
        input=data.encode(), capture_output=True, timeout=120,
    )
    assert done.returncode == 0, done.stderr.decode()
    summary = json.loads(done.stdout)
    assert (summary["jobs"], summary["loaded"], summary["source"]) == (300, 300, "<stdin>")


# -- encodings and sizes -------------------------------------------------------------


def test_csv_with_a_byte_order_mark(url, list_name, tmp_path):
    path = tmp_path / "excel.csv"
    path.write_bytes("\ufeffid,name\r\nx1,Zoë\r\nx2,Åsa\r\n".encode())
    out = cli(url, "load", list_name, str(path))
    assert out.exit_code == 0, out.output
    assert jobs_of(url, list_name) == {"x1": {"name": "Zoë"}, "x2": {"name": "Åsa"}}


def test_field_limit_follows_the_record_limit_not_128_kib(url, list_name, tmp_path):
    path = tmp_path / "big.csv"
    path.write_text("id,blob\nb1," + "x" * 300_000 + "\nb2,small\n")
    out = cli(url, "load", list_name, str(path))
    assert out.exit_code == 0, out.output
    assert len(jobs_of(url, list_name)["b1"]["blob"]) == 300_000


def test_the_limit_is_read_from_the_store(url, tmp_path):
    backend = open_backend(url)
    try:
        assert backend.max_record_size() == 1024 * 1024  # the server's (and the stand-in's) default
        assert max_payload(backend) == 1024 * 1024 - loading.RECORD_OVERHEAD
    finally:
        backend.close()
    small = open_backend(f"embedded://{tmp_path / 'small.db'}?max_record_size=131072")
    assert max_payload(small) == 131072 - loading.RECORD_OVERHEAD  # the least the store may have: half of it
    small.close()


def test_on_the_smallest_store_a_job_of_the_largest_payload_records_every_failure_and_goes_dead(tmp_path):
    """The README's promise at the least max-record-size aeroqueue takes: room beside the
    payload for the last error and ten before (4,000 bytes each). Below 256 KiB a
    quarter of the record was kept instead: at 128 KiB the 8th failure of such a job
    was refused as too big, and the job could never go dead (a helper's audit)."""
    from aeroqueue.queue import Queue
    from aeroqueue.sessions import Session

    backend = open_backend(f"embedded://{tmp_path / 'small.db'}?max_record_size=131072")
    udfs.register(backend)
    lists, queue = JobLists(backend), Queue(backend)
    payload = {"blob": ""}
    payload["blob"] = "x" * (max_payload(backend) - len(json.dumps(payload)) - 64)
    lists.load("big", [JobSpec("a", payload)], seal=True, max_attempts=12, backoff_s=0)
    session = Session.open(backend, heartbeat=False)
    outcomes = []
    for attempt in range(12):
        job, = queue.reserve("big", session, 1)
        outcomes.append(queue.fail(job, f"failure {attempt} " + "e" * 5000))
    session.close()
    assert outcomes == ["retry"] * 11 + ["dead"], outcomes
    st = lists.status("big")
    assert (st.dead, st.complete) == (1, True), st
    backend.close()


def test_a_store_whose_records_are_too_small_for_aeroqueue_is_refused_by_name(tmp_path):
    """A server may be set to a max-record-size down to 64 bytes: below what aeroqueue
    needs, an ack wrote the job done and not its bit, and the list was never complete.
    Refused at the first use that reads it, naming the size, and nothing is created."""
    from aeroqueue.errors import ConfigError

    backend = open_backend(f"embedded://{tmp_path / 'tiny.db'}", max_record_size=100_000)
    udfs.register(backend)
    with pytest.raises(ConfigError, match="its max-record-size is 100,000 bytes; aeroqueue needs at least 131,072"):
        JobLists(backend).load("L", [JobSpec("a", {})])
    assert backend.get(keys.LIST_SET, "L") is None
    backend.close()


def test_a_load_the_store_fails_part_way_says_what_was_loaded_and_that_a_rerun_finishes_it(tmp_path, monkeypatch):
    """A store that fails mid-load (a disk full, a frozen node) left the first ranges'
    jobs reservable, and the error said only what failed (a helper's audit): now it
    says how many were loaded, that the list is not sealed, and to run the load again."""
    from aeroqueue.errors import BackendTimeout

    url = f"embedded://{tmp_path / 's.db'}"
    path = tmp_path / "jobs.jsonl"
    path.write_text("".join(f'{{"id": "j{i}"}}\n' for i in range(10)))
    write = JobLists._batch_write
    calls = []

    def failing(self, writes, what, *args, **kw):
        if what == "write jobs":
            calls.append(len(writes))
            if len(calls) == 2:
                raise BackendTimeout("batch_write (write jobs) on [5 records] failed: timeout", code=9)
        return write(self, writes, what, *args, **kw)

    monkeypatch.setattr(JobLists, "_batch_write", failing)
    out = cli(url, "load", "L", str(path), "--chunk-size", "5", "--workers", "1", "--seal")
    assert out.exit_code == 1, out.output
    assert ("5 of 10 jobs were loaded into L before it failed, and the list is not sealed; once the store answers, "
            "run the same load again to finish it") in " ".join(out.output.split()), out.output
    monkeypatch.setattr(JobLists, "_batch_write", write)
    backend = open_backend(url)
    st = JobLists(backend).status("L")
    assert (st.total, st.reservable, st.sealed) == (5, 5, False), st
    out = cli(url, "load", "L", str(path), "--chunk-size", "5", "--workers", "1", "--seal")
    assert out.exit_code == 0, out.output
    st = JobLists(backend).status("L")
    assert (st.total, st.reservable, st.sealed) == (10, 10, True), st
    backend.close()


def test_a_load_the_store_fails_before_it_writes_does_not_say_jobs_were_loaded(tmp_path, monkeypatch):
    """A failure before the writing began (the list's policy read) wrote nothing: the
    load's 'N jobs were loaded ... run the same load again to finish it' is not said
    there (a second read found it said of a list that did not exist)."""
    from aeroqueue.cli import load_cmd
    from aeroqueue.errors import BackendTimeout

    def failing(*args, **kw):
        raise BackendTimeout("get on aq_list/L failed: timeout", code=9)

    monkeypatch.setattr(load_cmd, "check_new_list_policy", failing)
    path = tmp_path / "jobs.jsonl"
    path.write_text('{"id": "a"}\n')
    out = cli(f"embedded://{tmp_path / 's.db'}", "load", "L", str(path), "--seal")
    assert out.exit_code == 1 and "get on aq_list/L failed: timeout" in out.output, out.output
    assert "were loaded" not in out.output and "not sealed" not in out.output, out.output


def test_an_ack_whose_result_is_too_big_for_a_small_store_fails_the_job_with_that_reason(tmp_path):
    """The least record size aeroqueue takes is refused at load only: an ack's too-big
    check reads the size too, and raised that refusal instead of RecordTooBig (the
    worker then gave the job back to run again, not failed with the reason)."""
    from aeroqueue.errors import RecordTooBig
    from aeroqueue.queue import Queue
    from aeroqueue.sessions import Session

    url = f"embedded://{tmp_path / 's.db'}"
    backend = open_backend(url)
    udfs.register(backend)
    JobLists(backend).load("L", [JobSpec("a", {})], seal=True)
    backend.close()
    small = open_backend(url, max_record_size=100_000)  # as a server's limit lowered since
    queue, session = Queue(small), Session.open(small, heartbeat=False)
    job, = queue.reserve("L", session, 1)
    with pytest.raises(RecordTooBig, match="too big"):
        queue.complete(job, "x" * 150_000)
    session.close()
    small.close()


def test_a_field_over_the_stores_limit_names_its_line(tmp_path):
    url = f"embedded://{tmp_path / 's.db'}?max_record_size=131072"
    path = tmp_path / "big.csv"
    path.write_text("id,blob\nok,1\nb1," + "x" * 70_000 + "\n")
    out = cli(url, "load", "L", str(path))
    assert out.exit_code == 1
    assert "big.csv, line 3" in out.output and "limit" in out.output and "over the" in out.output


# -- values MySQL cannot store ----------------------------------------------------------

BAD_VALUES = [
    ("nan.jsonl", '{"id": "a", "payload": {"x": 1}}\n{"id": "b", "payload": {"score": NaN}}\n', 2, "payload", "NaN"),
    ("inf.jsonl", '{"id": "a", "score": Infinity}\n', 1, "score", "Infinity"),
    ("neginf.jsonl", '{"id": "a", "ok": 1}\n{"id": "b", "v": [1, -Infinity]}\n', 2, "v", "-Infinity"),
    ("bigint.jsonl", '{"id": "a", "n": 99999999999999999999}\n', 1, "n", "64-bit"),
    ("deep.jsonl", '{"id": "a", "payload": ' + "[" * 32 + "]" * 32 + "}\n", 1, "payload", "nested"),
    ("deep-fields.jsonl", '{"id": "a", "x": ' + "[" * 31 + "]" * 31 + "}\n", 1, "payload", "nested"),
    ("deep.csv", 'id,payload\na,"' + "[" * 32 + "]" * 32 + '"\n', 2, "payload", "nested"),
    ("nan.csv", 'id,payload\na,"{""x"": 1}"\nb,"{""x"": NaN}"\n', 3, "payload", "NaN"),
    # Past a 64-bit float's range: Python reads it as inf, which would be stored as Infinity.
    ("huge.jsonl", '{"id": "a", "payload": {"x": 1e400}}\n', 1, "payload", "too large for a 64-bit float"),
    ("huge-field.jsonl", '{"id": "a", "y": 1, "x": -1e999}\n', 1, "x", "too large for a 64-bit float"),
    ("huge.csv", 'id,payload\na,"[1.5, 2e308]"\n', 2, "payload", "too large for a 64-bit float"),
]


@pytest.mark.parametrize(("name", "content", "line", "field", "what"), BAD_VALUES, ids=[c[0] for c in BAD_VALUES])
def test_values_mysql_cannot_store_are_refused_at_load(url, list_name, tmp_path,
                                                        name, content, line, field, what):
    path = tmp_path / name
    path.write_text(content)
    out = cli(url, "load", list_name, str(path))
    assert out.exit_code == 1, out.output
    assert f"{name}, line {line}, field '{field}'" in out.output and what in out.output
    assert_no_list(url, list_name)


def test_json_as_deep_as_the_sync_target_takes_loads_and_one_level_more_does_not(jl, list_name, tmp_path):
    """31 levels of arrays or objects: what MariaDB's JSON_VALID (the sync target's
    CHECK) takes; 32 it refuses, so the load does, naming the line."""
    deepest: object = 1
    for _ in range(31):
        deepest = [deepest]
    path = tmp_path / "deep.jsonl"
    path.write_text(json.dumps({"id": "a", "payload": deepest}) + "\n" + json.dumps({"id": "b", **{"k": [[1]]}}) + "\n")
    assert jl.load(list_name, list(read_file(path, max_payload=100_000))).loaded == 2
    assert jl.find_job(list_name, "a")["payload"] == deepest
    with pytest.raises(LoadError, match=r"line 1, field 'payload'.*nested more than 31 deep"):
        jl.load(f"{list_name}-2", [("c", [deepest])])
    assert f"{list_name}-2" not in jl.names()


def test_a_payload_the_server_stores_loads_on_every_backend(jl, list_name):
    """600 KB of JSON (a list of 300,000 small numbers) is within the payload limit:
    the embedded store once refused it, sizing it by Python's encoding (5 bytes an int)."""
    payload = [0] * 300_000
    assert jl.load(list_name, [("big", payload)]).loaded == 1
    assert jl.find_job(list_name, "big")["payload"] == payload


def test_a_jobspec_run_at_is_checked_before_anything_is_written(jl, list_name):
    """Plain items are checked whole before the first write: a JobSpec's run_at too,
    or a NaN one found at its range would leave the earlier ranges loaded."""
    jobs = [("a", {}), *(JobSpec(f"j{i}", {}) for i in range(1, 5)), JobSpec("bad", {}, run_at=float("nan"))]
    with pytest.raises(LoadError, match=r"line 6, field 'run_at'.*out of range"):
        jl.load(list_name, jobs, chunk_size=2)
    assert list_name not in jl.names(), "nothing written, not even the list"


def test_a_load_that_asks_no_mode_takes_the_mode_of_a_list_made_meanwhile(jl, list_name, monkeypatch):
    """`create` reads the list's mode, then creates it: a loader that asked for ids
    mode may create it in between. A load that asked for none loads into it."""
    backend = jl.backend
    real_get = backend.get
    raced: list[bool] = []

    def get_then_race(set_name, name, *args, **kw):
        rec = real_get(set_name, name, *args, **kw)
        if set_name == keys.LIST_SET and name == list_name and not raced:
            raced.append(True)
            JobLists(backend).create(list_name, mode="ids")  # the other loader, `--mode ids`
        return rec

    monkeypatch.setattr(backend, "get", get_then_race)
    assert jl.load(list_name, [JobSpec("a", {})]).loaded == 1
    assert raced and jl.header(list_name)["mode"] == "ids"
    with pytest.raises(ListModeMismatch):
        jl.create(list_name, mode="tokens")  # one that asked for another mode is still refused


def test_python_api_refuses_nan_and_huge_ints(jl, list_name):
    with pytest.raises(LoadError, match=r"line 2, field 'payload'.*nan"):
        jl.load(list_name, [("a", 1), ("b", {"x": float("nan")})])
    with pytest.raises(LoadError, match="64-bit"):
        jl.load(list_name, [("a", 2**64)])
    assert list_name not in jl.names()


# -- extra columns -------------------------------------------------------------------------


def test_extra_fields_are_kept_in_the_payload_or_refused_with_strict(url, list_name, tmp_path):
    jsonl = tmp_path / "extra.jsonl"
    jsonl.write_text('{"id": "a", "payload": {"n": 1}, "customer": "acme"}\n{"id": "b", "payload": {"n": 2}}\n')
    out = cli(url, "load", list_name, str(jsonl))
    assert out.exit_code == 0, out.output
    assert jobs_of(url, list_name) == {"a": {"n": 1, "customer": "acme"}, "b": {"n": 2}}

    strict = cli(url, "load", f"{list_name}-s", str(jsonl), "--strict")
    assert strict.exit_code == 1
    assert "extra.jsonl, line 1, field 'customer'" in strict.output and "--strict" in strict.output
    assert_no_list(url, f"{list_name}-s")

    csv_path = tmp_path / "extra.csv"
    csv_path.write_text('id,payload,region\nc1,"{""n"": 1}",eu\nc2,,us\n')
    out = cli(url, "load", f"{list_name}-c", str(csv_path))
    assert out.exit_code == 0, out.output
    assert jobs_of(url, f"{list_name}-c") == {"c1": {"n": 1, "region": "eu"}, "c2": {"region": "us"}}
    strict = cli(url, "load", f"{list_name}-cs", str(csv_path), "--strict")
    assert strict.exit_code == 1 and "extra.csv, line 1, field 'region'" in strict.output


def test_an_extra_field_beside_a_payload_that_is_not_an_object(tmp_path):
    path = tmp_path / "x.jsonl"
    path.write_text('{"id": "a", "payload": [1, 2], "tag": "t"}\n')
    with pytest.raises(LoadError, match=r"line 1, field 'tag'.*not an object"):
        validate(lambda: read_file(path, max_payload=10_000), str(path))
    path.write_text('{"id": "a", "payload": {"tag": 1}, "tag": "t"}\n')
    with pytest.raises(LoadError, match=r"line 1, field 'tag'.*also a field of the payload"):
        validate(lambda: read_file(path, max_payload=10_000), str(path))


# -- empty input, repeated sealed loads ---------------------------------------------------------


@pytest.mark.parametrize(("name", "content"), [("empty.csv", ""), ("header.csv", "id,x\n"), ("blank.jsonl", "\n\n")])
def test_empty_input_is_an_error_and_creates_nothing(url, list_name, tmp_path, name, content):
    path = tmp_path / name
    path.write_text(content)
    out = cli(url, "load", list_name, str(path))
    assert out.exit_code == 1 and "no jobs" in out.output
    assert_no_list(url, list_name)


def test_python_api_empty_load_creates_nothing(jl, list_name):
    with pytest.raises(LoadError, match="no jobs"):
        jl.load(list_name, [])
    assert list_name not in jl.names()


def test_repeated_sealed_load_is_a_noop_that_says_so(url, list_name, tmp_path):
    path = tmp_path / "jobs.csv"
    path.write_text("id,v\n" + "".join(f"s{i},{i}\n" for i in range(40)))
    first = cli(url, "load", list_name, str(path), "--seal", "--chunk-size", "7")
    assert first.exit_code == 0, first.output
    again = cli(url, "load", list_name, str(path), "--seal", "--json")
    assert again.exit_code == 0, again.output
    summary = json.loads(again.stdout)
    assert (summary["loaded"], summary["skipped"], summary["already_sealed"]) == (0, 40, True)
    text = cli(url, "load", list_name, str(path), "--seal")
    assert text.exit_code == 0 and "nothing to do" in text.output
    path.write_text(path.read_text() + "s999,new\n")
    refused = cli(url, "load", list_name, str(path), "--seal")
    assert refused.exit_code == 1 and "1 of these 41 jobs" in refused.output
    backend = open_backend(url)
    assert JobLists(backend).status(list_name).total == 40
    backend.close()


@pytest.mark.parametrize("fmt", ["jsonl", "csv"])
def test_a_line_too_long_for_any_payload_is_refused_without_reading_it_whole(tmp_path, fmt):
    """A file whose line 2 runs for 20 MB (no newline in a binary file, a runaway
    export): read whole it took that memory several times over before the payload
    check refused it; a multi-gigabyte one could take the machine's. Refused once past
    the longest line a payload within the limit can take, naming its line. (A CSV file
    was still read a line whole until the csv module's field limit refused it.)"""
    import tracemalloc

    head, start, end = {
        "jsonl": ('{"id": "a", "payload": {}}\n', '{"id": "b", "payload": "', '"}\n'),
        "csv": ("id,note\na,x\n", "b,", "\n"),
    }[fmt]
    path = tmp_path / f"jobs.{fmt}"
    with path.open("w") as f:
        f.write(head + start)
        f.write("x" * (20 << 20))
        f.write(end)
    line = 2 if fmt == "jsonl" else 3
    tracemalloc.start()
    try:
        with pytest.raises(LoadError) as e:
            validate(lambda: read_file(path, max_payload=10_000), str(path))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert f"line {line}: too long (over 125,536 characters: a line may take six a byte" in str(e.value), str(e.value)
    assert peak < 4 << 20, f"{peak:,} bytes at the peak for a 20 MB line"
    # A line just within it is read, and judged by its payload as before.
    path.write_text(head + start + "x" * 9_000 + end)
    assert validate(lambda: read_file(path, max_payload=10_000), str(path)) == 2


# -- duplicate ids in bounded memory ----------------------------------------------------------------


def _ids_file(tmp_path: Path, n: int, dup_at: int | None = None) -> Path:
    path = tmp_path / "ids.csv"
    rows = [f"id{i},{i}" for i in range(n)]
    if dup_at is not None:
        rows.insert(dup_at, "id10,again")
    path.write_text("id,v\n" + "\n".join(rows) + "\n")
    return path


@pytest.mark.parametrize("in_memory", [1 << 19, 64], ids=["in-memory", "spilled-to-disk"])
def test_duplicates_are_found_with_their_first_line(tmp_path, monkeypatch, in_memory):
    monkeypatch.setattr(IdDigests.__init__, "__kwdefaults__", {"in_memory": in_memory, "buckets": 16, "flush": 32})
    path = _ids_file(tmp_path, 5000)
    assert validate(lambda: read_file(path, max_payload=10_000), str(path)) == 5000
    path = _ids_file(tmp_path, 5000, dup_at=4000)
    with pytest.raises(LoadError) as e:
        validate(lambda: read_file(path, max_payload=10_000), str(path))
    assert "line 4002, field 'id': duplicate job id 'id10' (first at line 12)" in str(e.value)


def test_digest_collisions_are_confirmed_against_the_ids(tmp_path, monkeypatch):
    """Every id given the same digest: no false duplicate, and a real one still found."""
    monkeypatch.setattr(IdDigests, "digest", staticmethod(lambda jid: len(jid)))
    path = _ids_file(tmp_path, 300)
    assert validate(lambda: read_file(path, max_payload=10_000), str(path)) == 300
    path = _ids_file(tmp_path, 300, dup_at=200)
    with pytest.raises(LoadError, match=r"line 202, field 'id': duplicate job id 'id10'"):
        validate(lambda: read_file(path, max_payload=10_000), str(path))


def test_the_spilled_digests_stay_small():
    ids = IdDigests(in_memory=1000, buckets=8, flush=64)
    for i in range(20_000):
        ids.add(f"job-{i}")
    assert ids._seen is None, "past the threshold the set is gone"
    assert sum(len(b) for b in ids._bufs) <= 8 * 64, "only the write buffers stay in memory"
    assert ids.finish() == set()


@pytest.mark.parametrize("name", ["missing.txt", "missing.csv"])
def test_a_missing_file_is_said_missing_whatever_its_extension(tmp_path, name):
    """A missing ok.txt was refused for its extension, as if it existed."""
    out = cli(f"embedded://{tmp_path / 's.db'}", "load", "L", str(tmp_path / name))
    assert out.exit_code != 0
    assert f"{tmp_path / name}: cannot read the file: No such file or directory" in out.output, out.output
    assert "extension" not in out.output, out.output
