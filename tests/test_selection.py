"""The worker's list choice (aeroqueue.selection), on a fake clock: weights, backoff, patterns, bad input."""

from __future__ import annotations

import random
import threading
from collections import Counter

import pytest

from aeroqueue.errors import ConfigError
from aeroqueue.selection import ListSelector, ListSpec, parse_list, parse_lists


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def selector(*args, names=None, **kw) -> tuple[ListSelector, Clock]:
    clock = Clock()
    kw.setdefault("backoff_s", 0.1)
    kw.setdefault("backoff_max_s", 1.0)
    return ListSelector(parse_lists(args), names, clock=clock, rng=random.Random(7), **kw), clock


@pytest.mark.parametrize(("arg", "spec"), [
    ("urgent", ListSpec("urgent", 1)),
    ("urgent=5", ListSpec("urgent", 5)),
    (" bulk = 2 ", ListSpec("bulk", 2)),
    (("bulk", 3), ListSpec("bulk", 3)),
    ("cust-*=2", ListSpec("cust-*", 2)),
    ("c[ab]?", ListSpec("c[ab]?", 1)),
    ("*-eu", ListSpec("*-eu", 1)),
    ("[a-c]*[!0-9]", ListSpec("[a-c]*[!0-9]", 1)),
    ("a" * 64 + "*", ListSpec("a" * 64 + "*", 1)),  # matches the 64-character name
    ("[ab]" * 20, ListSpec("[ab]" * 20, 1)),  # 80 characters, matching names of 20
])
def test_parse(arg, spec):
    assert parse_list(arg) == spec


@pytest.mark.parametrize(("arg", "says"), [
    ("a=0", "'a=0': the weight must be from 1 to 1000, not 0"),
    ("a=-1", "not -1"),
    ("a=x", "'a=x': the weight 'x' is not a whole number"),
    ("a=1.5", "the weight '1.5' is not a whole number"),
    ("a=", "the weight '' is not a whole number"),
    ("", "'': the list name is empty"),
    ("=3", "the list name is empty"),
    ("a b", "invalid list name 'a b'"),
    ("cust/*", "is not a list name pattern"),
    # Patterns no list name can match: an open class, a start no name has.
    ("cust_[", "is not a list name pattern"),
    ("cust_[ab*", "is not a list name pattern"),
    ("_x*", "is not a list name pattern"),
    ("a" * 256 + "*", "is not a list name pattern"),
    (("a", "2"), "the weight must be a whole number, not '2'"),
    (("a", True), "the weight must be a whole number"),
    (("a",), "give (name, weight)"),
    (3, "give 'name', 'name=weight' or (name, weight)"),
])
def test_bad_input_names_the_option_and_value(arg, says):
    with pytest.raises(ConfigError) as e:
        parse_list(arg)
    assert str(e.value).startswith("--list ")
    assert says in str(e.value)


def test_no_list_is_an_error():
    with pytest.raises(ConfigError, match="at least one list"):
        parse_lists([])


def test_picks_follow_the_weights_exactly_and_spread_out():
    sel, _ = selector("a=3", "b=1")
    picks = [sel.pick() for _ in range(400)]
    assert Counter(picks) == {"a": 300, "b": 100}
    # Smooth: b comes once in every 4 picks, never a burst of b.
    assert all(picks[i:i + 4].count("b") == 1 for i in range(0, 400, 4))
    sel, _ = selector("a=5", "b=2", "c=1")
    assert Counter(sel.pick() for _ in range(800)) == {"a": 500, "b": 200, "c": 100}


def test_an_empty_list_backs_off_exponentially_capped_and_resets_when_it_gives():
    sel, clock = selector("a")
    pauses = []
    for _ in range(8):
        assert sel.pick() == "a"
        pauses.append(sel.empty("a"))
        assert sel.pick() is None, "not polled again before its pause is over"
        assert sel.wait_s() == pytest.approx(pauses[-1])
        clock.t += pauses[-1]
    for n, p in enumerate(pauses, start=1):
        full = min(1.0, 0.1 * 2 ** (n - 1))
        assert full / 2 <= p <= full, (n, p)
    assert sel.pick() == "a"
    sel.got("a")
    assert [sel.pick() for _ in range(3)] == ["a", "a", "a"], "a list that gave jobs is polled at full rate"


def test_one_thread_probes_a_backing_off_list_at_a_time():
    sel, clock = selector("a")
    sel.pick()
    clock.t += sel.empty("a")
    assert sel.pick() == "a"
    assert sel.pick() is None, "another thread does not poll it while the probe is out"
    sel.got("a")
    assert sel.pick() == "a" and sel.pick() == "a"


def test_an_empty_list_leaves_its_share_to_the_others():
    sel, clock = selector("urgent=5", "bulk=1")
    sel.empty("urgent")  # paused or empty
    assert [sel.pick() for _ in range(5)] == ["bulk"] * 5
    clock.t += 1.0
    sel.got("urgent")
    assert Counter(sel.pick() for _ in range(600)) == {"urgent": 500, "bulk": 100}


def test_patterns_follow_lists_that_appear_and_go():
    store = ["cust-a", "other"]
    sel, clock = selector("cust-*=2", "vip=3", names=lambda: list(store), refresh_s=5.0)
    assert sel.followed() == ["vip"], "nothing is read from the store before the first pick"
    assert Counter(sel.pick() for _ in range(50)) == {"cust-a": 20, "vip": 30}
    store.append("cust-b")
    assert "cust-b" not in {sel.pick() for _ in range(50)}, "not before the refresh interval"
    clock.t += 5.0
    assert Counter(sel.pick() for _ in range(70)) == {"cust-a": 20, "cust-b": 20, "vip": 30}
    store.remove("cust-a")
    clock.t += 5.0
    sel.pick()
    assert sel.followed() == ["cust-b", "vip"]
    assert sel.pattern_matches() == {"cust-*": ["cust-b"]}


def test_an_older_read_of_the_lists_landing_last_does_not_hide_a_newer_find():
    """Two threads refresh at once (the worker's maintenance thread calls `refresh`
    while a picking thread's is under way): the read that started first and came
    back last saw the store before `cust-b` was loaded, and must not undo the later
    read that saw it."""
    store = ["cust-a"]
    first_reading, first_may_answer = threading.Event(), threading.Event()
    calls = 0

    def names() -> list[str]:
        nonlocal calls
        calls += 1
        seen = list(store)
        if calls == 1:  # the first read holds its (old) answer until the second landed
            first_reading.set()
            assert first_may_answer.wait(10)
        return seen

    sel, _ = selector("cust-*", names=names)
    slow = threading.Thread(target=sel.refresh)
    slow.start()
    assert first_reading.wait(10)
    store.append("cust-b")
    assert sel.refresh() == ["cust-a", "cust-b"]
    first_may_answer.set()
    slow.join(10)
    assert sel.followed() == ["cust-a", "cust-b"]
    assert sel.pattern_matches() == {"cust-*": ["cust-a", "cust-b"]}


def test_a_named_list_keeps_its_weight_over_a_pattern_match():
    sel, _ = selector("cust-*=1", "cust-vip=4", names=lambda: ["cust-a", "cust-vip"])
    assert Counter(sel.pick() for _ in range(50)) == {"cust-a": 10, "cust-vip": 40}


def test_a_pattern_matching_nothing_waits_for_the_next_refresh():
    sel, _ = selector("cust-*", names=lambda: [], refresh_s=0.5)
    assert sel.pick() is None
    assert sel.wait_s() == pytest.approx(0.5)


def test_patterns_need_a_lister():
    with pytest.raises(ConfigError, match="patterns"):
        ListSelector(parse_lists(["cust-*"]))


@pytest.mark.parametrize(("value", "says"), [
    ("a=0", "'a=0': the weight must be from 1 to 1000, not 0"),
    ("a=x", "'a=x': the weight 'x' is not a whole number"),
    ("", "'': the list name is empty"),
])
def test_worker_command_refuses_bad_lists_as_wrong_usage(value, says, tmp_path):
    from click.testing import CliRunner

    from aeroqueue.cli import main

    # Refused before the handler is imported or the store opened (neither exists here).
    out = CliRunner().invoke(main, ["--url", f"embedded://{tmp_path}/none.db", "worker", "--handler", "no.such:fn",
                                    "--list", "ok=2", "--list", value])
    assert out.exit_code == 2, out.output
    assert "'--list'" in out.output and says in out.output
