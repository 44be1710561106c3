"""aeroqueue against the queues users would otherwise pick, side by side, in one run.

    python -m benchmarks.peers [--url URL] [--jobs N] [--batch-jobs M] [--clients C] [--batch 100]
                               [--peers beanstalkd,mysql,postgres,redis]
                               [--json out.json] [--png out.png] [--markdown out.md] [--scaling]

Every queue runs the same workload (see `benchmarks.harness`): N jobs
preloaded, C client processes each looping "reserve one job, ack it" until
the queue is empty; then the same with batches (M jobs, N unless given) where
the queue has a batch form. aeroqueue always runs, as the baseline of the ratios; a peer whose
service or client library is missing is reported as skipped, with the reason.

``--scaling`` adds two runs: the cost of one reserve on lists of 1,000,
100,000 and 1,000,000 jobs (aeroqueue's O(1) claim, beside the peers'), and
throughput with 1, 4 and 16 client processes.
"""

from __future__ import annotations

import contextlib
import json
import re
import shlex
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click

from aeroqueue.config import mask_url

from . import report as rpt
from .harness import Peer, PeerUnavailable, RunRow, mode_name, run, run_sizes
from .peer_aeroqueue import AeroqueuePeer
from .peer_beanstalkd import BeanstalkdPeer
from .peer_mysql import DEFAULT_URL as MYSQL_URL
from .peer_mysql import MySQLPeer
from .peer_postgres import DEFAULT_DSN as POSTGRES_DSN
from .peer_postgres import PostgresPeer
from .peer_redis import DEFAULT_URL as REDIS_URL
from .peer_redis import RedisPeer

PEER_NAMES = ("aeroqueue-api", "aeroqueue-api-lease", "bare-udf", "beanstalkd", "mysql", "postgres", "redis")
# Run only when named: a design's floor, not a queue (peer_aeroqueue.LeaseFloorWorker).
EXTRA_PEERS = ("lease-floor", "block-floor", "api-lease-records")
KNOWN_PEERS = PEER_NAMES + EXTRA_PEERS
DEFAULT_JOBS = 20_000
DEFAULT_SIZES = (1_000, 100_000, 1_000_000)
DEFAULT_CLIENT_COUNTS = (1, 4, 16)


@dataclass
class Options:
    """One benchmark run's settings (the CLI's options, for callers that skip the CLI)."""

    url: str | None = None  # aeroqueue's store; None: a scratch embedded store per run
    jobs: int = DEFAULT_JOBS
    batch_jobs: int | None = None  # jobs of each batch run; None: `jobs`
    clients: int = 4
    batch: int = 100
    peers: tuple[str, ...] = PEER_NAMES
    timeout_s: float = 300.0  # per run
    settle_s: float = 30.0  # longest wait for a quiet machine before each run
    rounds: int = 1  # every peer measured this many times, interleaved
    scaling: bool = False
    sizes: tuple[int, ...] = DEFAULT_SIZES
    client_counts: tuple[int, ...] = DEFAULT_CLIENT_COUNTS
    sample: int = 2000  # jobs reserved from each list of the list-size run
    postgres_dsn: str = POSTGRES_DSN
    mysql_url: str = MYSQL_URL
    redis_url: str = REDIS_URL
    beanstalkd_bin: str = "beanstalkd"
    beanstalkd_binlog: bool = True
    command: str = field(default_factory=lambda: masked(["python", "-m", "benchmarks.peers", *sys.argv[1:]]))

    def jobs_for(self, batch: int) -> int:
        """Jobs a run of this batch size loads: `batch_jobs` for the batch runs, if given."""
        return self.jobs if batch == 1 else self.batch_jobs or self.jobs


_DSN_PASSWORD = re.compile(r"(?i)(\bpassword\s*=\s*)('[^']*'|\S+)")  # PostgreSQL's key=value DSNs


def masked(argv: list[str]) -> str:
    """A command line for the report (printed and saved), every password in it masked.
    Argument by argument, as `aeroqueue.config.mask_url` masks one URL given whole: a
    password holding a blank, or a URL typed wrongly (mysql//...), is masked whole too,
    which a pattern run over the joined line missed."""
    return shlex.join(_DSN_PASSWORD.sub(r"\1***", mask_url(arg)) for arg in argv)


def make_peers(options: Options) -> list[Peer]:
    """aeroqueue first (the baseline), then the chosen peers in a fixed order."""
    unknown = set(options.peers) - set(KNOWN_PEERS)
    if unknown:
        raise ValueError(f"unknown peer(s) {sorted(unknown)}: choose from {', '.join(KNOWN_PEERS)}")
    factories: dict[str, Callable[[], Peer]] = {
        "aeroqueue-api": lambda: AeroqueuePeer(options.url, "aeroqueue-api"),
        "bare-udf": lambda: AeroqueuePeer(options.url, "bare-udf"),
        "lease-floor": lambda: AeroqueuePeer(options.url, "lease-floor"),
        "block-floor": lambda: AeroqueuePeer(options.url, "block-floor"),
        "aeroqueue-api-lease": lambda: AeroqueuePeer(options.url, "aeroqueue-api-lease"),
        "api-lease-records": lambda: AeroqueuePeer(options.url, "api-lease-records"),
        "beanstalkd": lambda: BeanstalkdPeer(options.beanstalkd_bin, binlog=options.beanstalkd_binlog),
        "mysql": lambda: MySQLPeer(options.mysql_url),
        "postgres": lambda: PostgresPeer(options.postgres_dsn),
        "redis": lambda: RedisPeer(options.redis_url),
    }
    return [AeroqueuePeer(options.url), *(factories[name]() for name in KNOWN_PEERS if name in options.peers)]


def run_benchmark(options: Options, log: Callable[[str], None] = lambda _: None) -> dict[str, Any]:
    """Run everything the options ask for; returns the report (see `benchmarks.report`)."""
    peers = make_peers(options)
    baseline = peers[0]
    assert isinstance(baseline, AeroqueuePeer)
    started: list[Peer] = []
    infos: list[dict[str, Any]] = []
    skipped: dict[str, str] = {}
    t_start = time.monotonic()
    # Clients import aeroqueue when they spawn: a commit landing mid-run would be
    # measured from then on, so the revision is taken before and checked after.
    revision = rpt.aeroqueue_revision()
    started_at = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    try:
        for peer in peers:
            try:
                info = peer.start()
            except Exception as e:
                if peer is baseline:
                    raise
                why = str(e) if isinstance(e, PeerUnavailable) else f"could not start: {type(e).__name__}: {e}"
                skipped[peer.name] = why
                infos.append({"name": peer.name, "status": "skipped", "reason": why})
                log(f"{peer.name}: skipped: {why}")
                with contextlib.suppress(Exception):  # a half-started peer (a launched daemon) is still ours to stop
                    peer.stop()
                continue
            started.append(peer)
            infos.append({"status": "ok", "reason": None, **info.__dict__})

        def measure(peer: Peer, **kw: Any) -> RunRow:
            try:
                return run(peer, timeout_s=options.timeout_s, settle_s=options.settle_s, log=log, **kw)
            except Exception as e:  # one broken peer must not cost the other figures
                row = RunRow(
                    peer=peer.name, mode=mode_name(kw["batch"]), batch=kw["batch"], clients=kw["clients"],
                    jobs=kw["jobs"], expected=kw["jobs"], status="failed", reason=f"{type(e).__name__}: {e}"[:500],
                )
                log(f"{peer.name}: failed: {row.reason}")
                return row

        def skipped_rows(batch: int, clients: int, jobs: int) -> list[RunRow]:
            return [
                RunRow(peer=name, mode=mode_name(batch), batch=batch, clients=clients, jobs=jobs, expected=jobs,
                       status="skipped", reason=why)
                for name, why in skipped.items()
            ]

        rows: list[RunRow] = []
        # Rounds interleave the peers (all of them, then all again) rather than repeat
        # each in a row: a machine whose speed drifts over minutes then bills every
        # peer alike, and the medians over rounds say more than any one run.
        for round_no in range(1, options.rounds + 1):
            for batch in (1, options.batch):
                jobs = options.jobs_for(batch)
                these = [measure(peer, jobs=jobs, clients=options.clients, batch=batch) for peer in started]
                these += skipped_rows(batch, options.clients, jobs)
                for row in these:
                    row.round = round_no
                rows += these
        add_ratios(rows)

        scaling = None
        if options.scaling:
            # Client counts first: the list-size run loads a million jobs per
            # peer, and what the servers do after that must not bill these runs.
            by_clients: list[RunRow] = []
            for clients in options.client_counts:
                for batch in (1, options.batch):
                    if clients == options.clients:  # measured above, same workload
                        by_clients += [r for r in rows if r.batch == batch and r.status != "skipped" and r.round == 1]
                        continue
                    for peer in started:
                        by_clients.append(measure(peer, jobs=options.jobs_for(batch), clients=clients, batch=batch))
            by_clients += skipped_rows(1, 0, options.jobs)
            add_ratios(by_clients)
            by_size: list[RunRow] = []
            for peer in started:
                try:
                    by_size += run_sizes(
                        peer, sizes=list(options.sizes), sample=options.sample, turns=options.rounds,
                        timeout_s=options.timeout_s, settle_s=options.settle_s, log=log,
                    )
                except Exception as e:  # one broken peer must not cost the other figures
                    log(f"{peer.name}: list sizes failed: {type(e).__name__}: {e}")
                    by_size += [
                        RunRow(peer=peer.name, mode="single", batch=1, clients=1, jobs=size, expected=size,
                               status="failed", reason=f"{type(e).__name__}: {e}"[:500])
                        for size in options.sizes
                    ]
            by_size += skipped_rows(1, 1, 0)
            scaling = {"list_size": [_size_dict(r, by_size) for r in by_size], "clients": [r.as_dict() for r in by_clients]}
    finally:
        for peer in started:
            try:
                peer.stop()
            except Exception as e:  # keep stopping the others (a launched beanstalkd above all)
                log(f"{peer.name}: stop failed: {e}")
    return {
        "schema": rpt.SCHEMA,
        "date": started_at,
        "machine": rpt.machine(),
        "aeroqueue_backend": baseline.label(),
        "aeroqueue_revision": _revision_span(revision, rpt.aeroqueue_revision()),
        "params": {
            "jobs": options.jobs,
            "batch_jobs": options.jobs_for(options.batch),
            "clients": options.clients,
            "batch": options.batch,
            "peers": list(options.peers),
            "timeout_s": options.timeout_s,
            "settle_s": options.settle_s,
            "rounds": options.rounds,
            "scaling": options.scaling,
            "sizes": list(options.sizes),
            "client_counts": list(options.client_counts),
            "sample": options.sample,
        },
        "peers": infos,
        "rows": [r.as_dict() for r in rows],
        "scaling": scaling,
        "duration_s": round(time.monotonic() - t_start, 1),
        "command": options.command,
    }


def _revision_span(before: str, after: str) -> str:
    return before if before == after else f"{before}, changed during the run to {after}: figures mix both"


def add_ratios(rows: list[RunRow]) -> None:
    """Each row's jobs/s and reserve p50 over aeroqueue's for the same mode, client count and round."""
    base = {(r.mode, r.clients, r.round): r for r in rows if r.peer == "aeroqueue" and r.status == "ok" and r.acked}
    for r in rows:
        b = base.get((r.mode, r.clients, r.round))
        if b is None or r.status != "ok" or not r.acked:
            continue
        r.vs_aeroqueue_jobs_per_s = r.jobs_per_s / b.jobs_per_s if b.jobs_per_s else None
        r.vs_aeroqueue_p50 = r.reserve_p50_ms / b.reserve_p50_ms if b.reserve_p50_ms else None


def _size_dict(row: RunRow, rows: list[RunRow]) -> dict[str, Any]:
    """A list-size row, with its reserve p50 over the same peer's on the smallest list:
    about 1.0 all the way up means the reserve cost does not grow with the list."""
    out = row.as_dict()
    ok = sorted((r for r in rows if r.peer == row.peer and r.status == "ok" and r.acked), key=lambda r: r.jobs)
    smallest = ok[0] if ok else None
    good = row.status == "ok" and row.acked
    out["vs_smallest_p50"] = (
        row.reserve_p50_ms / smallest.reserve_p50_ms if good and smallest and smallest.reserve_p50_ms else None
    )
    return out


def write_outputs(report: dict[str, Any], json_out: Path | None, png_out: Path | None, md_out: Path | None) -> None:
    if json_out:
        json_out.write_text(json.dumps(report, indent=1) + "\n")
    if md_out:
        md_out.write_text(rpt.markdown(report))
    if png_out:
        rpt.draw_png(report, png_out)


# -- command line ---------------------------------------------------------------------------


def _ints(text: str, what: str) -> tuple[int, ...]:
    try:
        values = tuple(int(x.replace("_", "")) for x in text.split(",") if x.strip())
    except ValueError:
        raise click.BadParameter(f"not a comma-separated list of integers: {text!r}", param_hint=what) from None
    if not values or min(values) < 1:
        raise click.BadParameter(f"give positive integers: {text!r}", param_hint=what)
    return values


def _names(text: str) -> tuple[str, ...]:
    names = tuple(dict.fromkeys(x.strip().lower() for x in text.split(",") if x.strip() and x.strip().lower() != "none"))
    unknown = [n for n in names if n not in KNOWN_PEERS]
    if unknown:
        raise click.BadParameter(f"unknown peer(s) {', '.join(unknown)}: choose from {', '.join(KNOWN_PEERS)}", param_hint="--peers")
    return names


_PATH = click.Path(dir_okay=False, writable=True, path_type=Path)


@click.command("peers", context_settings={"help_option_names": ["-h", "--help"], "show_default": True})
@click.option(
    "--url",
    envvar="AEROQUEUE_URL",
    show_envvar=True,
    metavar="URL",
    help="aeroqueue's store: aerospike://host:3000/namespace for a real server (UDFs registered). "
    "Default: a scratch embedded store per run, deleted afterwards.",
)
@click.option("--jobs", "-n", type=click.IntRange(1), default=DEFAULT_JOBS, help="Jobs preloaded for each run.")
@click.option("--batch-jobs", type=click.IntRange(1), default=None, help="Jobs preloaded for each batch run (default: --jobs). Batches drain 20,000 jobs in a fraction of a second, where one descheduled client moves the figure by a tenth: give them more.")
@click.option("--clients", "-c", type=click.IntRange(1, 256), default=4, help="Client processes.")
@click.option("--batch", type=click.IntRange(2, 1000), default=100, help="Batch size of the batch runs.")
@click.option("--peers", "peer_list", default=",".join(PEER_NAMES), help="Peers to run beside aeroqueue, comma-separated ('none': aeroqueue only). Also, only when named: lease-floor (the lease design's floor: jobs read at the reserve, not written), block-floor (the same, each 100 jobs read from one block record) and api-lease-records (aeroqueue-api-lease with its block records left unread).")
@click.option("--json", "json_out", type=_PATH, default=None, help="Write the report as JSON here.")
@click.option("--png", "png_out", type=_PATH, default=None, help="Draw the report as a PNG chart here (needs matplotlib).")
@click.option("--markdown", "md_out", type=_PATH, default=None, help="Write the tables as Markdown here.")
@click.option("--scaling", is_flag=True, help="Also measure reserve cost by list size and throughput by client count.")
@click.option("--scaling-sizes", default=",".join(map(str, DEFAULT_SIZES)), help="List sizes of the list-size run.")
@click.option("--scaling-clients", default=",".join(map(str, DEFAULT_CLIENT_COUNTS)), help="Client counts of the throughput run.")
@click.option("--sample", type=click.IntRange(1), default=2000, help="Jobs reserved from each list in the list-size run.")
@click.option("--timeout", "timeout_s", type=click.FloatRange(1), default=300.0, help="Seconds a single run may take before its clients stop.")
@click.option("--rounds", type=click.IntRange(1, 50), default=1, help="Measure every peer this many times, interleaved (all peers, then all again), and add a table of medians over the rounds: on a machine whose speed drifts, one run per peer can be off by a third. The list-size run samples its lists in as many interleaved turns.")
@click.option("--settle", "settle_s", type=click.FloatRange(0), default=30.0, help="Seconds to wait at most, before each run, for other processes to leave the CPUs quiet.")
@click.option("--postgres-dsn", envvar="AQ_BENCH_POSTGRES", show_envvar=True, default=POSTGRES_DSN, help="PostgreSQL to use.")
@click.option("--mysql-url", envvar="AQ_BENCH_MYSQL", show_envvar=True, default=MYSQL_URL, help="MariaDB/MySQL to use.")
@click.option("--redis-url", envvar="AQ_BENCH_REDIS", show_envvar=True, default=REDIS_URL, help="Redis to use.")
@click.option("--beanstalkd-bin", default="beanstalkd", help="The beanstalkd binary the harness launches.")
@click.option("--beanstalkd-binlog/--no-beanstalkd-binlog", default=True, help="Run beanstalkd with a binlog (persistent) or in memory.")
@click.option("--quiet", "-q", is_flag=True, help="No progress lines on stderr.")
@click.pass_context
def peers_command(
    ctx: click.Context,
    url: str | None,
    jobs: int,
    batch_jobs: int | None,
    clients: int,
    batch: int,
    peer_list: str,
    json_out: Path | None,
    png_out: Path | None,
    md_out: Path | None,
    scaling: bool,
    scaling_sizes: str,
    scaling_clients: str,
    sample: int,
    timeout_s: float,
    rounds: int,
    settle_s: float,
    postgres_dsn: str,
    mysql_url: str,
    redis_url: str,
    beanstalkd_bin: str,
    beanstalkd_binlog: bool,
    quiet: bool,
) -> None:
    """Run one workload on aeroqueue and on beanstalkd, MariaDB/MySQL, PostgreSQL and Redis; print one table."""
    # Mounted under `aeroqueue`, the group's --url has already been consumed.
    url = url or getattr(ctx.find_root().obj, "url", None)
    # What the user typed, for the report: `python -m benchmarks.peers ...`, or the
    # host CLI's own command line when it runs this one (`aeroqueue bench --peers`).
    program = ["python", "-m", "benchmarks.peers"] if ctx.parent is None else [Path(sys.argv[0]).name]
    command = masked([*program, *sys.argv[1:]])
    options = Options(
        url=url,
        jobs=jobs,
        batch_jobs=batch_jobs,
        clients=clients,
        batch=batch,
        peers=_names(peer_list),
        timeout_s=timeout_s,
        settle_s=settle_s,
        rounds=rounds,
        scaling=scaling,
        sizes=_ints(scaling_sizes, "--scaling-sizes"),
        client_counts=_ints(scaling_clients, "--scaling-clients"),
        sample=sample,
        postgres_dsn=postgres_dsn,
        mysql_url=mysql_url,
        redis_url=redis_url,
        beanstalkd_bin=beanstalkd_bin,
        beanstalkd_binlog=beanstalkd_binlog,
        command=command,
    )
    if png_out:  # fail before minutes of measuring, not after
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise click.UsageError("--png needs matplotlib (pip install matplotlib)") from None
    try:
        report = run_benchmark(options, log=(lambda _: None) if quiet else (lambda line: click.echo(line, err=True)))
    except PeerUnavailable as e:
        raise click.ClickException(f"aeroqueue cannot run: {e}") from None
    rpt.print_console(report)
    write_outputs(report, json_out, png_out, md_out)
    problems = [
        f"{r['peer']} {r['mode']} x{r['clients']}: "
        + (f"{r['status']} ({r['reason']})" if r["status"] != "ok" else "NOT acked exactly once")
        for r in _all_rows(report)
        if r["status"] in ("failed", "timeout") or (r["status"] == "ok" and not r["exactly_once"])
    ]
    if problems:
        raise click.ClickException("some runs went wrong: " + "; ".join(problems))


def _all_rows(report: dict[str, Any]) -> list[dict[str, Any]]:
    scaling = report.get("scaling") or {}
    return [*report["rows"], *scaling.get("list_size", []), *scaling.get("clients", [])]


if __name__ == "__main__":
    peers_command()
