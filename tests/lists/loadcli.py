"""What the load tests share: the store URL with the modules registered, and the
CLI driven in-process (`load`, `export`, `status`)."""

from __future__ import annotations

import json

from click.testing import CliRunner, Result

from aeroqueue import udfs
from aeroqueue.backends import open_backend
from aeroqueue.cli import main

_REGISTERED: set[str] = set()


def registered(store_url: str) -> str:
    """`store_url`, with the modules registered once per run on a real server (the
    CLI registers them itself on an embedded store): registration costs seconds."""
    if not store_url.startswith("embedded") and store_url not in _REGISTERED:
        b = open_backend(store_url)
        udfs.register(b)
        b.close()
        _REGISTERED.add(store_url)
    return store_url


def cli(url: str, *args: str, input: str | bytes | None = None, env: dict[str, str] | None = None) -> Result:
    # --create: a fresh embedded path is a new store (a typo check refuses it otherwise).
    return CliRunner().invoke(main, ["--url", url, "--create", *args], input=input, env=env)


def jobs_of(url: str, name: str) -> dict[str, object]:
    """job id -> payload, from the store (export), for every job of a list."""
    out = cli(url, "export", name)
    assert out.exit_code == 0, out.output
    rows = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    return {r["jid"]: r["payload"] for r in rows}


def assert_no_list(url: str, name: str) -> None:
    st = cli(url, "status", name, "--json")
    assert st.exit_code == 1 and f"no job list named '{name}'" in st.output, "nothing may be created"
