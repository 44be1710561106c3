"""The cluster script for people (`python -m tests.cluster`): every command the README
and its own docstring show parses, its options go before or after the command, and a
cluster of 3 nodes or more needs a majority to form. Nothing here starts a node."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from tests import cluster
from tests.cluster import default_min_cluster_size, main, parse_args

ROOT = Path(__file__).resolve().parents[1]


def documented_commands() -> list[list[str]]:
    text = (ROOT / "README.md").read_text() + "\n" + (cluster.__doc__ or "")
    found = []
    for line in text.splitlines():
        m = re.search(r"python -m tests\.cluster (.*)", line)
        if m:
            found.append(shlex.split(m.group(1).split("#")[0]))
    return found


def test_every_documented_command_parses() -> None:
    commands = documented_commands()
    assert len(commands) >= 8, commands
    for argv in commands:
        args = parse_args(argv)
        assert args.cmd == argv[0]
    assert parse_args(["up", "--nodes", "3"]).nodes == 3


@pytest.mark.parametrize("argv", [["--nodes", "3", "--name", "x", "up"], ["up", "--nodes", "3", "--name", "x"],
                                  ["--name", "x", "up", "--nodes", "3"]])
def test_options_go_before_or_after_the_command(argv: list[str]) -> None:
    args = parse_args(argv)
    assert (args.cmd, args.nodes, args.name) == ("up", 3, "x")


def test_exec_passes_its_command_through_untouched() -> None:
    args = parse_args(["--name", "x", "exec", "--", "aeroqueue", "status", "--nodes", "9"])
    assert (args.name, args.nodes, args.argv) == ("x", None, ["--", "aeroqueue", "status", "--nodes", "9"])


def test_a_majority_forms_a_cluster_from_three_nodes_up() -> None:
    assert [default_min_cluster_size(n) for n in (1, 2, 3, 4, 5)] == [1, 1, 2, 3, 3]


def test_a_min_cluster_size_above_the_nodes_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--name", "never-made", "--nodes", "2", "--min-cluster-size", "3", "url"]) == 1
    assert "min_cluster_size must be 1..2, not 3" in capsys.readouterr().err
