"""The command line: UDF registration, help texts, errors, and a job list end to end."""

from __future__ import annotations

import json
import os
import re
import shlex
import sys

import click
import pytest
from click.testing import CliRunner

from aeroqueue import udfs
from aeroqueue.backends import Backend, open_backend
from aeroqueue.cli import main
from aeroqueue.errors import UDFModulesError
from aeroqueue.sessions import Session


def run(*args: str, url: str | None = None) -> click.testing.Result:
    argv = (["--url", url] if url else []) + list(args)
    return CliRunner().invoke(main, argv)


def test_udf_status_register_and_refusal(store_url):
    backend = open_backend(store_url)
    if backend.is_embedded:  # a fresh store has nothing registered
        out = run("udf", "status", "--json", url=store_url)
        assert out.exit_code == 1
        assert {m["state"] for m in json.loads(out.output)} == {"missing"}
        # The advice names the store: typed without it, it registered on the default one.
        out = run("udf", "status", url=store_url)
        assert f"run `aeroqueue udf register --url {backend.url}`" in out.stderr, out.output
        with pytest.raises(UDFModulesError) as e:
            udfs.verify(backend)
        assert "aeroqueue udf register" in str(e.value)
    out = run("udf", "register", url=store_url)
    assert out.exit_code == 0, out.output
    if backend.is_embedded:
        assert "aq_job_v1" in out.output and "aq_list_v1" in out.output
    # Up to date now: a second register says so, and sends nothing that blocks.
    out = run("udf", "register", url=store_url)
    assert out.exit_code == 0, out.output
    assert "nothing changed" in out.output
    spy = SpyClient(backend.client)
    assert udfs.register(Backend(spy, backend.url)).changed is False
    assert spy.blocking == []
    out = run("udf", "status", "--json", url=store_url)
    assert out.exit_code == 0
    rows = json.loads(out.output)
    assert {m["module"] for m in rows} == set(udfs.packaged())
    assert all(m["state"] == "ok" and m["registered"] == m["packaged"] for m in rows)
    udfs.verify(backend)  # no complaint


def test_the_register_advice_is_one_command_a_shell_takes_whole():
    """The advice printed the URL as it is: a URL's '&' between options split the
    pasted command in two (the rest ran in the background), and a login's *** was
    not said to stand for the password (a second read)."""
    from types import SimpleNamespace

    from aeroqueue.config import parse_url

    url = "aerospike://app:s3cret@127.0.0.1:3000/test?connect_timeout=500&total_timeout=2000"
    advice = udfs.register_advice(SimpleNamespace(url=parse_url(url)))  # type: ignore[arg-type]
    assert advice == ("run `aeroqueue udf register --url "
                      "'aerospike://app:***@127.0.0.1:3000/test?connect_timeout=500&total_timeout=2000'` "
                      "(with the password in place of ***)"), advice
    assert "s3cret" not in advice
    plain = udfs.register_advice(SimpleNamespace(url=parse_url("aerospike://127.0.0.1:3000/test")))  # type: ignore[arg-type]
    assert plain == "run `aeroqueue udf register --url aerospike://127.0.0.1:3000/test`", plain


class SpyClient:
    """Passes every call to the real client, noting the ones that block for seconds."""

    BLOCKING = ("udf_put", "index_single_value_create", "index_string_create", "index_integer_create")

    def __init__(self, client):
        self.client = client
        self.blocking: list[str] = []

    def __getattr__(self, name):
        if name in self.BLOCKING:
            self.blocking.append(name)
        return getattr(self.client, name)


def test_stale_module_is_refused(tmp_path):
    backend = open_backend(f"embedded://{tmp_path / 's.db'}")
    udfs.register(backend)
    stale = tmp_path / "aq_job_v1.lua"
    stale.write_text("-- an older copy\nfunction claim(rec) return 'x' end\n")
    backend.client.udf_put(str(stale))
    states = {s.name: s.state for s in udfs.status(backend)}
    assert states["aq_job_v1"] == "stale" and states["aq_list_v1"] == "ok"
    with pytest.raises(UDFModulesError) as e:
        udfs.verify(backend)
    assert "aq_job_v1 (stale)" in str(e.value) and "aeroqueue udf register" in str(e.value)
    # The command the message names runs as it is written, and mends the store.
    hinted = re.search(r"`aeroqueue (udf register [^`]*)`", str(e.value))
    assert hinted is not None, str(e.value)
    out = CliRunner().invoke(main, shlex.split(hinted.group(1)))
    assert out.exit_code == 0, out.output
    udfs.verify(backend)


def test_store_options_work_after_the_command_too(tmp_path, monkeypatch):
    """`--url` and `--create` after the subcommand, as before it; given there, --url
    wins over AEROQUEUE_URL and the group's --url."""
    monkeypatch.setenv("AEROQUEUE_URL", f"embedded://{tmp_path / 'env.db'}")
    store = tmp_path / "after.db"
    out = CliRunner().invoke(main, ["--url", f"embedded://{tmp_path / 'before.db'}", "udf", "register",
                                    "--url", f"embedded://{store}", "--create"])
    assert out.exit_code == 0, out.output
    assert store.is_file() and not (tmp_path / "before.db").exists() and not (tmp_path / "env.db").exists()
    out = CliRunner().invoke(main, ["config", "--json", "--url", f"embedded://{store}"])
    assert out.exit_code == 0, out.output
    shown = json.loads(out.output)
    assert shown["path"] == str(store) and shown["source"] == "--url" and shown["options"] == {}
    out = CliRunner().invoke(main, ["config", "--json", "--url",
                                    "aerospike://u:secret@h1:3000/ns?total_timeout=50&tls_name=n1"])
    shown = json.loads(out.output)
    assert shown["options"] == {"total_timeout": "50", "tls_name": "n1"} and "secret" not in out.output, out.output
    # An IPv6 address keeps its brackets, as in the URL: "::1:3000" names no port.
    out = CliRunner().invoke(main, ["config", "--json", "--url", "aerospike://[::1]:3000,h2:3001/ns"])
    assert json.loads(out.output)["hosts"] == ["[::1]:3000", "h2:3001"], out.output
    out = CliRunner().invoke(main, ["config", "--json"])
    assert json.loads(out.output)["source"] == "AEROQUEUE_URL"


def _commands(group: click.Group, prefix: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], click.Command]]:
    out = []
    for name, cmd in group.commands.items():
        out.append(((*prefix, name), cmd))
        if isinstance(cmd, click.Group):
            out += _commands(cmd, (*prefix, name))
    return out


@pytest.mark.parametrize(("path", "cmd"), _commands(main), ids=lambda v: " ".join(v) if isinstance(v, tuple) else "")
def test_every_option_names_its_environment_variable(path, cmd):
    out = run(*path, "--help")
    assert out.exit_code == 0
    for param in cmd.params:
        if isinstance(param, click.Option) and not param.hidden and param.name != "help":
            assert param.envvar and str(param.envvar).startswith("AEROQUEUE_"), f"{path} --{param.name}"
            assert str(param.envvar) in " ".join(out.output.split()), f"{path} --{param.name} help"


# A value each option takes, as typed (on the command line, or in its variable).
_SAMPLE_BY_NAME = {
    "target_url": "sqlite:///sync.db", "handler": "examples.handlers:send_email", "since": "2026-11-01",
    "sizes": "1000", "result": '{"sent": true}', "master": "local[1]",
    "host": "0.0.0.0", "metrics_host": "0.0.0.0",
}


def _sample(param: click.Option, tmp_path) -> list[str]:
    """Values for `param` as words: one, or two for a repeatable option."""
    t = param.type
    if param.multiple:
        return ["a", "b"]
    if param.name in _SAMPLE_BY_NAME:
        return [_SAMPLE_BY_NAME[param.name]]
    # Numbers and choices other than the default: an option that dropped its variable's
    # value for the default would otherwise pass.
    if isinstance(t, click.Choice):
        return [next(str(c) for c in reversed(t.choices) if c != param.default)]
    if isinstance(t, click.IntRange):
        return [str(max(t.min or 0, 1) + 1)]
    if isinstance(t, click.FloatRange):
        return ["7.5"]
    if isinstance(t, click.File):
        return ["-"]
    if isinstance(t, click.Path):
        return [str(tmp_path / "out.json")]
    if type(t).__name__ == "Duration":
        return ["5m"]
    return ["x1"]


def _comparable(value: object) -> object:
    return getattr(value, "name", value) if hasattr(value, "write") else value


def _parse(cmd: click.Command, path: tuple[str, ...], args: list[str]) -> click.Context:
    from aeroqueue.cli import Context

    root = click.Context(main, info_name="aeroqueue", obj=Context(url=None, verbose=False))
    return cmd.make_context(" ".join(path), args, parent=root)


@pytest.mark.parametrize(("path", "cmd"), [(p, c) for p, c in _commands(main) if not isinstance(c, click.Group)],
                         ids=lambda v: " ".join(v) if isinstance(v, tuple) else "")
def test_every_option_reads_its_environment_variable(path, cmd, tmp_path, monkeypatch):
    """What --help promises ("Every option can also come from an environment variable"):
    the variable gives the option the value the option itself would, a repeatable one
    split at blanks, a flag pair set either way. --url, --create and --verbose after the
    command are the group's, read from the variable there (the group test below)."""
    for var in [v for v in os.environ if v.startswith("AEROQUEUE_")]:
        monkeypatch.delenv(var)
    job_file = tmp_path / "jobs.csv"
    job_file.write_text("id\nj1\n")
    positional = {"list_name": "L", "job_id": "j1", "token": "1", "file": str(job_file)}
    args = [positional[p.name] for p in cmd.params if isinstance(p, click.Argument)]
    required = {p.name: p for p in cmd.params if isinstance(p, click.Option) and p.required}
    tested = 0
    for param in cmd.params:
        if not isinstance(param, click.Option) or not param.expose_value or param.name == "help":
            continue
        others = [w for name, p in required.items() if name != param.name
                  for w in (p.opts[0], *_sample(p, tmp_path)[:1])]
        if param.is_flag and param.secondary_opts:  # --lease/--no-lease: the non-default side
            typed, env = [param.secondary_opts[0] if param.default else param.opts[0]], "0" if param.default else "1"
        elif param.is_flag:
            typed, env = [param.opts[0]], "1"
        else:
            words = _sample(param, tmp_path)
            typed, env = [w for v in words for w in (param.opts[0], v)], " ".join(words)
        want = _parse(cmd, path, [*args, *others, *typed]).params[param.name]
        assert want != param.default, (path, param.name, "a sample the default cannot pass for")
        monkeypatch.setenv(str(param.envvar), env)
        ctx = _parse(cmd, path, [*args, *others])
        monkeypatch.delenv(str(param.envvar))
        assert ctx.get_parameter_source(param.name) == click.core.ParameterSource.ENVIRONMENT, (path, param.name)
        assert _comparable(ctx.params[param.name]) == _comparable(want), (path, param.name, env)
        tested += 1
    assert tested or all(not p.expose_value for p in cmd.params if isinstance(p, click.Option) and p.name != "help")


def test_the_group_options_read_their_environment_variables(tmp_path, monkeypatch):
    """--url, --create and --verbose, on every command, come from AEROQUEUE_URL,
    AEROQUEUE_CREATE and AEROQUEUE_VERBOSE (read by the group, before or after the command)."""
    store = tmp_path / "made.db"
    monkeypatch.setenv("AEROQUEUE_URL", f"embedded://{store}")
    monkeypatch.setenv("AEROQUEUE_CREATE", "1")
    out = run("status", "nolist")
    assert out.exit_code == 1 and store.is_file(), out.output  # AEROQUEUE_CREATE made the store AEROQUEUE_URL names
    assert "Traceback" not in out.output
    monkeypatch.setenv("AEROQUEUE_VERBOSE", "1")
    assert "Traceback" in run("status", "nolist").output


def test_an_environment_variable_means_one_setting():
    """Options of several commands may share a variable (AEROQUEUE_URL, AEROQUEUE_JSON,
    AEROQUEUE_SWEEP_GRACE) only where it is the same setting: same type and default. The
    worker's metrics port once shared AEROQUEUE_METRICS_PORT with `aeroqueue metrics
    --port`, so setting it for one made the other bind the same port."""
    seen: dict[str, set[tuple[str, str]]] = {}
    for _, cmd in _commands(main):
        for param in cmd.params:
            if isinstance(param, click.Option) and param.envvar:
                default = None if param.required else param.default  # required: no default at all
                seen.setdefault(str(param.envvar), set()).add((repr(default), str(param.type)))
    assert {var: kinds for var, kinds in seen.items() if len(kinds) > 1} == {}


def test_top_level_help_and_url_envvar():
    out = run("--help")
    assert out.exit_code == 0 and "AEROQUEUE_URL" in out.output and "embedded:///" in out.output


def test_malformed_url_is_one_line_with_what_to_do(tmp_path):
    out = run("status", "x", url="aerospike://h:notaport/test")
    assert out.exit_code == 1
    first = out.output.splitlines()[0]
    assert first.startswith("error: ") and "port 'notaport'" in first
    assert len(out.output.splitlines()) == 1 and "Traceback" not in out.output
    verbose = CliRunner().invoke(main, ["--verbose", "--url", "aerospike://h:notaport/test", "status", "x"])
    assert "Traceback" in verbose.output


def test_load_reserve_complete_status_end_to_end(tmp_path):
    url = f"embedded://{tmp_path / 's.db'}"
    data = tmp_path / "jobs.csv"
    data.write_text("id,email\n" + "".join(f"c{i},u{i}@example.com\n" for i in range(12)))
    assert run("init", url=url).exit_code == 0
    out = run("load", "customers", str(data), "--seal", url=url)
    assert out.exit_code == 0, out.output
    assert "12 loaded" in out.output
    again = run("load", "customers", str(data), "--seal", url=url)
    assert again.exit_code == 0 and "nothing to do" in again.output, "a repeated sealed load is a no-op"
    data.write_text(data.read_text() + "c99,new@example.com\n")
    more = run("load", "customers", str(data), url=url)
    assert more.exit_code == 1 and "sealed" in more.output, "a sealed list refuses a new job"
    holder = Session.open(open_backend(url))  # a program's session, kept alive by its heartbeat
    out = run("reserve", "customers", "--count", "3", "--session", holder.id, url=url)
    assert out.exit_code == 0, out.output
    jobs = [json.loads(line) for line in out.stdout.splitlines()]
    assert [j["id"] for j in jobs] == ["c0", "c1", "c2"]
    assert jobs[0]["payload"] == {"email": "u0@example.com"}
    for j in jobs:
        done = run("complete", "customers", str(j["token"]), "--session", j["session"], "--result", '{"sent": true}', url=url)
        assert done.exit_code == 0, done.output
    holder.close()
    lost = run("complete", "customers", str(jobs[0]["token"]), "--session", "someone-else", url=url)
    assert lost.exit_code == 1 and "already done" in lost.output
    st = json.loads(run("status", "customers", "--json", url=url).output)
    assert st == {"name": "customers", "mode": "tokens", "total": 12, "queued": 9, "reservable": 9, "delayed": 0,
                  "in_flight": 0,
                  "retry_pending": 0, "done": 3, "dead": 0, "sealed": True, "paused": False, "complete": False,
                  "timeout_s": 300, "backoff_s": 1, "backoff_max_s": 3600, "max_attempts": 5, "dropping": False,
                  "loads_in_progress": 0, "loads_stalled": 0}
    table = run("status", "customers", url=url).output
    assert re.search(r"fresh \(never reserved\)[\s│]+9 ", table) and re.search(r"queued \(reservable now\)[\s│]+9 ", table), table
    listed = json.loads(run("lists", "--json", url=url).output)
    assert [row["name"] for row in listed] == ["customers"]
    exported = run("export", "customers", "--state", "done", url=url)
    assert exported.exit_code == 0
    assert sorted(json.loads(line)["jid"] for line in exported.output.splitlines() if line.startswith("{")) == ["c0", "c1", "c2"]


def test_the_worker_table_shows_list_patterns_as_given():
    """A --list pattern's "[ab]" is a glob, not rich markup to swallow."""
    from types import SimpleNamespace

    from rich.console import Console

    from aeroqueue.cli.worker_cmd import _counters_table

    counts = dict.fromkeys(("reserved", "done", "retried", "dead", "lost", "unacked", "released", "reaped"), 0)
    w = SimpleNamespace(session=None, lists=["orders_[ab]*", "eu"], in_flight=0,
                        counters=SimpleNamespace(snapshot=lambda: counts))
    console = Console(record=True, width=200)
    console.print(_counters_table(w))
    assert "on orders_[ab]*, eu" in console.export_text()


def test_text_log_lines_keep_the_traceback_and_quote_values_with_blanks():
    """--log-format text (and every command's default) dropped a logged exception's
    traceback, and `error=invalid list name 'a b'` could not be read back as key=value."""
    import logging

    from aeroqueue.logs import TextLines

    try:
        raise ZeroDivisionError("division by zero")
    except ZeroDivisionError:
        record = logging.getLogger("aeroqueue.t").makeRecord(
            "aeroqueue.t", logging.ERROR, __file__, 1, "callback failed", (), sys.exc_info(),
            extra={"event": "ack_callback_failed", "error": "invalid list name 'a b'", "jid": "j1"})
    text = TextLines().format(record)
    first, *rest = text.splitlines()
    assert " error callback failed event=" in first, first
    fields = dict(kv.split("=", 1) for kv in shlex.split(first.split("callback failed ", 1)[1]))
    assert fields == {"event": "ack_callback_failed", "error": "invalid list name 'a b'", "jid": "j1"}
    assert rest[0].startswith("Traceback") and rest[-1] == "ZeroDivisionError: division by zero"
    bare = TextLines(stamp=False).format(record).splitlines()[0]
    assert bare.startswith("callback failed event=ack_callback_failed")
