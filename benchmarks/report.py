"""The report: one dictionary (written as JSON), rendered as console tables, Markdown and a PNG chart.

Everything is rendered from the report dictionary alone, so a JSON file from
an earlier run can be drawn or compared again without re-running anything.
"""

from __future__ import annotations

import os
import platform
import statistics
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .harness import QUIET_CPU

SCHEMA = "aeroqueue-peers/1"


def machine() -> dict[str, Any]:
    """What the figures depend on: cores, memory, CPU model, OS, Python."""
    cpu = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        cpu = platform.processor() or "?"
    mem_gib = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_gib = round(int(line.split()[1]) / 1024 / 1024, 1)
                break
    except OSError:
        pass
    distro = platform.system()
    try:
        for line in Path("/etc/os-release").read_text().splitlines():
            if line.startswith("PRETTY_NAME="):
                distro = line.split("=", 1)[1].strip('"')
    except OSError:
        pass
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count() or 0
    return {
        "nproc": usable,
        "memory_gib": mem_gib,
        "cpu": cpu,
        "os": distro,
        "kernel": platform.release(),
        "python": platform.python_version(),
    }


def aeroqueue_revision() -> str:
    """The aeroqueue measured: its version, and in a git checkout the commit and
    whether the code (package or Lua) had uncommitted changes."""
    import subprocess

    import aeroqueue

    version = f"aeroqueue {aeroqueue.__version__}"
    root = Path(aeroqueue.__file__).resolve().parents[1]
    if not (root / ".git").exists():
        return version
    try:
        head = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--", "aeroqueue", "lua_udfs"],
            capture_output=True, text=True, timeout=10, check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return version
    return f"{version} at {head}" + (" with uncommitted changes" if dirty else "")


def machine_line(m: dict[str, Any]) -> str:
    return (
        f"{m.get('nproc')} cores (nproc), {m.get('memory_gib')} GiB memory, {m.get('cpu')}; "
        f"{m.get('os')}, Linux {m.get('kernel')}, Python {m.get('python')}"
    )


# -- tables as rows of strings ---------------------------------------------------------


def _ms(v: float) -> str:
    return f"{v:.3f}" if v < 10 else f"{v:.1f}"


def _ratio(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}x"


def _check(row: dict[str, Any]) -> str:
    if row["status"] in ("skipped", "n/a"):
        return "-"
    if row["exactly_once"]:
        return f"yes {row['acked']:,}/{row['expected']:,}"
    bits = []
    if row["duplicates"]:
        bits.append(f"{row['duplicates']} twice")
    if row["missing"]:
        bits.append(f"{row['missing']} missing")
    if row["server_check"]:
        bits.append(f"server: {row['server_check']}")
    return "NO: " + ("; ".join(bits) or row["status"])


def _note(row: dict[str, Any]) -> str:
    bits = []
    if row["status"] != "ok":
        bits.append(f"{row['status']}: {row['reason']}")
    if row.get("cleanup_error"):
        bits.append(f"cleanup failed: {row['cleanup_error']}")
    busy = row.get("background_cpu")
    if busy is not None and busy > QUIET_CPU:
        bits.append(f"machine busy: others used {busy:.0%} of the CPUs before the start")
    if row.get("retries"):
        what = "busy-key retries (absorbed)" if str(row.get("peer", "")).startswith("aeroqueue") else "deadlock retries"
        bits.append(f"{row['retries']} {what}")
    if row.get("lost"):
        bits.append(f"{row['lost']} acks refused")
    return "; ".join(bits)


def _measured(row: dict[str, Any]) -> bool:
    return row["status"] in ("ok", "timeout") and row["acked"] > 0


def _trips(row: dict[str, Any]) -> str:
    v = row.get("round_trips_per_job")
    return "-" if v is None or not _measured(row) else f"{v:.2f}"


def _cpu(row: dict[str, Any], key: str) -> str:
    v = row.get(key)
    return "-" if v is None or not _measured(row) else f"{v:,.0f}"


MAIN_COLUMNS = [
    "peer", "mode", "clients", "jobs/s", "reserve p50 ms", "reserve p99 ms",
    "jobs/s vs aq", "p50 vs aq", "trips/job", "client CPU us/job", "machine CPU us/job", "acked once", "notes",
]


def main_rows(rows: Iterable[dict[str, Any]]) -> list[list[str]]:
    out = []
    for r in rows:
        if _measured(r):
            out.append([
                r["peer"], r["mode"], str(r["clients"]), f"{r['jobs_per_s']:,.0f}", _ms(r["reserve_p50_ms"]),
                _ms(r["reserve_p99_ms"]), _ratio(r["vs_aeroqueue_jobs_per_s"]), _ratio(r["vs_aeroqueue_p50"]),
                _trips(r), _cpu(r, "client_cpu_us_per_job"), _cpu(r, "machine_cpu_us_per_job"), _check(r), _note(r),
            ])
        else:  # skipped rows of the scaling tables stand for every client count
            clients = str(r["clients"]) if r["clients"] else "-"
            out.append([r["peer"], r["mode"], clients, "-", "-", "-", "-", "-", "-", "-", "-", _check(r), _note(r)])
    return out


SIZE_COLUMNS = [
    "peer", "jobs in list", "load s", "loaded jobs/s", "reserve p50 ms", "reserve p99 ms",
    "p50 vs smallest", "trips/job", "acked once", "notes",
]


def size_rows(rows: Iterable[dict[str, Any]]) -> list[list[str]]:
    out = []
    for r in rows:
        if _measured(r):
            out.append([
                r["peer"], f"{r['jobs']:,}", f"{r['load_s']:.1f}", f"{r['jobs'] / r['load_s']:,.0f}" if r["load_s"] else "-",
                _ms(r["reserve_p50_ms"]), _ms(r["reserve_p99_ms"]), _ratio(r.get("vs_smallest_p50")), _trips(r),
                _check(r), _note(r),
            ])
        else:
            jobs = f"{r['jobs']:,}" if r["jobs"] else "-"  # a skipped peer's row stands for every size
            out.append([r["peer"], jobs, "-", "-", "-", "-", "-", "-", _check(r), _note(r)])
    return out


PEER_COLUMNS = ["peer", "version", "where", "claim and ack", "durability as configured"]


def peer_rows(peers: Iterable[dict[str, Any]]) -> list[list[str]]:
    out = []
    for p in peers:
        if p["status"] == "ok":
            out.append([p["name"], p["version"], p["target"], p["recipe"], p["durability"]])
        else:
            out.append([p["name"], "-", "-", f"skipped: {p['reason']}", "-"])
    return out


def jobs_text(params: dict[str, Any]) -> str:
    """How many jobs a run loaded: one count, or one for each mode (`--batch-jobs`)."""
    batch_jobs = params.get("batch_jobs", params["jobs"])  # reports from before --batch-jobs have one
    if batch_jobs == params["jobs"]:
        return f"{params['jobs']:,} jobs"
    return f"{params['jobs']:,} jobs one at a time, {batch_jobs:,} in batches"


def titles(report: dict[str, Any]) -> dict[str, str]:
    p = report["params"]
    backend = report["aeroqueue_backend"]
    jobs = jobs_text(p)
    return {
        "main": (
            f"Reserve one job + ack, then batches of {p['batch']}: {jobs}, {p['clients']} client processes. "
            f"aeroqueue backend: {backend}"
        ),
        "sizes": (
            f"Reserve cost by list size: 1 client, single path, first {p['sample']:,} jobs of each list"
            + (f", all lists loaded first, then sampled in {p['rounds']} interleaved turns" if p.get("rounds", 1) > 1 else "")
            + f". aeroqueue backend: {backend}"
        ),
        "clients": f"Throughput by client processes: {jobs}. aeroqueue backend: {backend}",
        "peers": "What each queue promises (claim, ack, durability) as it ran here",
    }


MEDIAN_COLUMNS = [
    "peer", "mode", "clients", "rounds", "jobs/s median", "jobs/s range", "reserve p50 ms median",
    "reserve p50 ms range", "jobs/s vs aq median", "p50 vs aq median", "machine CPU us/job median", "acked once",
]


def median_rows(rows: Iterable[dict[str, Any]]) -> list[list[str]]:
    """Per peer, mode and client count: the median and range of each figure over the
    rounds it was measured in, and its ratios to aeroqueue's (each round's own) at the
    median. 'acked once' holds only if it held in every round."""
    groups: dict[tuple[str, str, int], list[dict[str, Any]]] = {}
    for r in rows:
        if _measured(r):
            groups.setdefault((r["peer"], r["mode"], r["clients"]), []).append(r)

    def mid(values: list[float | None]) -> float | None:
        known = [v for v in values if v is not None]
        return statistics.median(known) if known else None

    out = []
    for (peer, mode, clients), rs in groups.items():
        rate = [r["jobs_per_s"] for r in rs]
        p50 = [r["reserve_p50_ms"] for r in rs]
        machine = mid([r.get("machine_cpu_us_per_job") for r in rs])
        once = all(r["exactly_once"] for r in rs)
        out.append([
            peer, mode, str(clients), str(len(rs)), f"{statistics.median(rate):,.0f}",
            f"{min(rate):,.0f} to {max(rate):,.0f}", _ms(statistics.median(p50)), f"{_ms(min(p50))} to {_ms(max(p50))}",
            _ratio(mid([r["vs_aeroqueue_jobs_per_s"] for r in rs])), _ratio(mid([r["vs_aeroqueue_p50"] for r in rs])),
            "-" if machine is None else f"{machine:,.0f}",
            f"yes, all {len(rs)} rounds" if once else "NO: see the rounds",
        ])
    return out


def tables(report: dict[str, Any]) -> list[tuple[str, list[str], list[list[str]]]]:
    """(title, columns, rows) for every table of the report, in print order."""
    t = titles(report)
    rounds = report["params"].get("rounds", 1)
    if rounds == 1:
        out = [(t["main"], MAIN_COLUMNS, main_rows(report["rows"]))]
    else:
        out = [
            (f"{t['main']} (round {k} of {rounds})", MAIN_COLUMNS, main_rows(r for r in report["rows"] if r.get("round", 1) == k))
            for k in range(1, rounds + 1)
        ]
        out.append((f"Medians over the {rounds} rounds, interleaved", MEDIAN_COLUMNS, median_rows(report["rows"])))
    scaling = report.get("scaling")
    if scaling:
        out.append((t["sizes"], SIZE_COLUMNS, size_rows(scaling["list_size"])))
        out.append((t["clients"], MAIN_COLUMNS, main_rows(scaling["clients"])))
    out.append((t["peers"], PEER_COLUMNS, peer_rows(report["peers"])))
    return out


FOOTNOTES = [
    "jobs/s: jobs acknowledged per second of wall-clock time, from the start signal to the last client's last ack.",
    "reserve p50/p99: latency of one reserve call as the client measured it (in batch mode, one call for up to the batch size).",
    "vs aq: the peer's jobs/s over aeroqueue's (above 1: the peer is faster) and its reserve p50 over "
    "aeroqueue's (below 1: the peer answers sooner), same mode and client count.",
    "trips/job: aeroqueue's round trips are counted at its backend boundary (backend.round_trips, session "
    "heartbeats included); the peers' are the calls their adapter issued (a pipeline counts once).",
    "client CPU us/job: CPU time of the client processes (every thread) while they looped, over the jobs acked; "
    "machine CPU us/job: every CPU's busy time from the start signal to the last client's report (clients, the "
    "queue's server, anything else running), over the jobs acked. On a machine whose cores clients and server "
    "share, the second sets the jobs/s.",
    "acked once: every job's ack was accepted exactly once across all clients, and the server agrees "
    "(nothing left queued, claimed or dead).",
    "p50 vs smallest: a list's reserve p50 over the same queue's on the smallest list; about 1 all the way "
    "up means the reserve cost does not grow with the list.",
]


# -- renderers ---------------------------------------------------------------------------------


def print_console(report: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    if not console.is_terminal:
        # Piped to a file, rich would assume 80 columns and fold every cell.
        console = Console(width=220)
    console.print(f"[bold]{report['date']}[/bold]  {machine_line(report['machine'])}", highlight=False)
    console.print(f"{report.get('aeroqueue_revision', '')}; backend: {report['aeroqueue_backend']}", highlight=False)
    for title, columns, rows in tables(report):
        if columns is PEER_COLUMNS:
            # Long prose cells: a table would wrap them into a column of single words.
            console.print(f"\n[italic]{title}[/italic]")
            for name, version, where, recipe, durability in rows:
                if version == "-":
                    console.print(f"[bold]{name}[/bold]: {recipe}", highlight=False)
                    continue
                console.print(f"[bold]{name}[/bold]: {version}; {where}", highlight=False)
                console.print(f"  claim and ack: {recipe}", highlight=False)
                console.print(f"  durability: {durability}", highlight=False)
            continue
        table = Table(title=title, title_justify="left", show_lines=False)
        for c in columns:
            numeric = c not in ("peer", "mode", "notes", "version", "where", "claim and ack", "durability as configured", "each job acked once")
            table.add_column(c, justify="right" if numeric else "left", overflow="fold")
        for row in rows:
            table.add_row(*row)
        console.print(table)
    for note in FOOTNOTES:
        console.print(f"- {note}", highlight=False)


def markdown(report: dict[str, Any]) -> str:
    lines = [
        f"Measured on {report['date']} on {machine_line(report['machine'])}.",
        "",
        f"aeroqueue backend: **{report['aeroqueue_backend']}**; code: {report.get('aeroqueue_revision', '?')}.",
        "",
    ]
    for title, columns, rows in tables(report):
        lines += [f"**{title}**", "", _md_row(columns), _md_row(["---"] * len(columns))]
        lines += [_md_row(r) for r in rows]
        lines.append("")
    lines += [f"- {n}" for n in FOOTNOTES]
    lines.append("")
    lines.append(f"Command: `{report['command']}`")
    return "\n".join(lines) + "\n"


def _md_row(cells: list[str]) -> str:
    return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"


def representative(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per peer, mode and client count, for a chart: the only one, or over
    several rounds the round whose jobs/s is the median (the lower middle of an even
    count): a figure that was measured, not an average of runs."""
    groups: dict[tuple[str, str, int], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["peer"], r["mode"], r["clients"]), []).append(r)
    return [sorted(g, key=lambda r: r["jobs_per_s"])[(len(g) - 1) // 2] for g in groups.values()]


def draw_png(report: dict[str, Any], path: Path) -> None:
    """Bar and line charts of the report (needs matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")  # no display on a server
        import matplotlib.pyplot as plt
    except ImportError:
        raise RuntimeError("drawing a PNG needs matplotlib (pip install matplotlib)") from None

    scaling = report.get("scaling")
    if scaling:
        fig, grid = plt.subplots(2, 2, figsize=(13, 10))
        axes = list(grid.flat)
    else:
        fig, grid = plt.subplots(1, 2, figsize=(13, 5))
        axes = list(grid)
    rows = representative([r for r in report["rows"] if _measured(r)])
    peers = list(dict.fromkeys(r["peer"] for r in report["rows"]))
    modes = list(dict.fromkeys(r["mode"] for r in report["rows"]))
    # One colour per queue in every panel, so a line and a bar of one peer match.
    palette = plt.get_cmap("tab10")
    colour = {p: palette(i) for i, p in enumerate(peers)}

    ax = axes[0]
    width = 0.8 / max(1, len(modes))
    for k, mode in enumerate(modes):
        values = [next((r["jobs_per_s"] for r in rows if r["peer"] == p and r["mode"] == mode), 0) for p in peers]
        ax.bar(
            [i + k * width for i in range(len(peers))], values, width, label=mode,
            color=[colour[p] for p in peers], alpha=1.0 if k == 0 else 0.55, hatch=None if k == 0 else "//",
        )
    ax.set_xticks([i + width * (len(modes) - 1) / 2 for i in range(len(peers))], peers)
    ax.set_yscale("log")
    ax.set_ylabel("jobs/s (log)")
    rounds = report["params"].get("rounds", 1)
    each = f", the median of {rounds} rounds" if rounds > 1 else ""
    ax.set_title(f"{jobs_text(report['params'])}, {report['params']['clients']} clients{each}")
    ax.legend()

    ax = axes[1]
    single = [r for r in rows if r["mode"] == "single"]
    xs = range(len(single))
    ax.bar([x - 0.2 for x in xs], [r["reserve_p50_ms"] for r in single], 0.4, label="p50",
           color=[colour[r["peer"]] for r in single])
    ax.bar([x + 0.2 for x in xs], [r["reserve_p99_ms"] for r in single], 0.4, label="p99",
           color=[colour[r["peer"]] for r in single], alpha=0.55, hatch="//")
    ax.set_xticks(list(xs), [r["peer"] for r in single])
    ax.set_yscale("log")
    ax.set_ylabel("reserve latency, ms (log)")
    ax.set_title("reserve one job")
    ax.legend()

    if scaling:
        ax = axes[2]
        for p in peers:
            pts = sorted((r["jobs"], r["reserve_p50_ms"]) for r in scaling["list_size"] if r["peer"] == p and _measured(r))
            if pts:
                ax.plot([x for x, _ in pts], [y for _, y in pts], marker="o", label=p, color=colour[p])
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("jobs in list (log)")
        ax.set_ylabel("reserve p50, ms (log)")
        ax.set_title("reserve cost by list size")
        ax.legend()

        ax = axes[3]
        for p in peers:
            for mode, style in zip(modes, ("-", "--"), strict=False):
                pts = sorted(
                    (r["clients"], r["jobs_per_s"])
                    for r in scaling["clients"]
                    if r["peer"] == p and r["mode"] == mode and _measured(r)
                )
                if pts:
                    ax.plot([x for x, _ in pts], [y for _, y in pts], style, marker="o", label=f"{p} {mode}", color=colour[p])
        counts = sorted({r["clients"] for r in scaling["clients"] if r["clients"]})
        ax.set_xscale("log", base=2)
        ax.set_xticks(counts, [str(c) for c in counts])
        ax.set_yscale("log")
        ax.set_xlabel("client processes")
        ax.set_ylabel("jobs/s (log)")
        ax.set_title("throughput by client processes (solid: single, dashed: batch)")
        # Below the panel: ten lines leave no free corner inside it.
        ax.legend(fontsize="x-small", ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.12))

    fig.suptitle(f"aeroqueue ({report['aeroqueue_backend']}) vs peers, {report['date']}", fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
