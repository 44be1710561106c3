"""Which list a worker polls next: weights, empty-list backoff, glob patterns.

A worker given several lists (``--list urgent=5 --list bulk=1 --list 'cust-*'``)
asks a `ListSelector` for the next list before each reservation, and tells it
what came back:

- **Weights.** Smooth weighted round robin (nginx's): each pick adds every
  ready list's weight to its credit, takes the list with the most credit and
  charges it the sum of the ready weights. Picks follow the weights exactly
  (``a=3, b=1``: a a b a, a a b a, ...), spread out rather than in bursts, and
  with no randomness, so a test can count them. Each pick reserves up to the
  worker's batch, so jobs taken follow the weights while every list has jobs.
- **Empty and paused lists** (a paused list answers like an empty one) back
  off: after n empty polls in a row a list is not polled again for between
  half and all of ``backoff_s * 2**(n-1)``, capped at ``backoff_max_s``; a
  poll that gives a job resets it. While a list is backing off, only one
  thread at a time probes it, so the polls an idle worker makes do not grow
  with its concurrency. Weights are shared among the lists that are ready: a
  paused ``urgent`` leaves the whole worker to ``bulk``.
- **Patterns.** A spec with ``*``, ``?`` or ``[`` is a glob over list names
  (`fnmatch`, case-sensitive), re-read from the store every ``refresh_s``, so
  lists loaded after the worker started are followed (and dropped ones
  forgotten). Its weight applies to each list it matches. A list named by
  several patterns takes the weight of the first; a list named outright
  takes its own weight whatever pattern also matches it.
"""

from __future__ import annotations

import fnmatch
import random
import re
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from . import keys
from .errors import ConfigError

DEFAULT_WEIGHT = 1
MAX_WEIGHT = 1000
DEFAULT_REFRESH_S = 5.0
DEFAULT_BACKOFF_MAX_S = 2.0
_GLOB = frozenset("*?[")
# What a pattern may hold: a list name's characters and fnmatch's, so that it can
# match a name: it starts as a name does (or with a glob), and every '[' closes a
# class of name characters ('[' left open would match only a literal '[').
MAX_PATTERN = 256  # a pattern's classes ('[ab]') make it longer than the 64-character names it matches
_PATTERN = re.compile(r"^(?=[A-Za-z0-9*?\[])(?:[A-Za-z0-9_.:*?-]|\[!?[A-Za-z0-9_.:-]+\])+$")

ListArg = str | tuple[str, int]


@dataclass(frozen=True)
class ListSpec:
    """One ``--list``: a list name or a glob pattern, and its weight."""

    name: str
    weight: int = DEFAULT_WEIGHT

    @property
    def is_pattern(self) -> bool:
        return any(c in _GLOB for c in self.name)

    def __str__(self) -> str:
        return self.name if self.weight == DEFAULT_WEIGHT else f"{self.name}={self.weight}"


def parse_list(arg: ListArg, option: str = "--list") -> ListSpec:
    """``"name"``, ``"name=weight"`` or ``(name, weight)`` -> a `ListSpec`; a
    `ConfigError` naming the option and the value when it is not one."""
    if isinstance(arg, tuple):
        if len(arg) != 2:
            raise ConfigError(f"{option} {arg!r}: give (name, weight)")
        name, weight_v = arg
        if not isinstance(weight_v, int) or isinstance(weight_v, bool):
            raise ConfigError(f"{option} {arg!r}: the weight must be a whole number, not {weight_v!r}")
        weight = weight_v
    elif isinstance(arg, str):
        # rpartition: a weight is always last, and names cannot hold '='.
        name, sep, text = arg.rpartition("=") if "=" in arg else (arg, "", "")
        weight = DEFAULT_WEIGHT
        if sep:
            try:
                weight = int(text.strip())
            except ValueError:
                raise ConfigError(f"{option} {arg!r}: the weight {text!r} is not a whole number") from None
    else:
        raise ConfigError(f"{option} {arg!r}: give 'name', 'name=weight' or (name, weight)")
    if not isinstance(name, str) or not name.strip():
        raise ConfigError(f"{option} {arg!r}: the list name is empty")
    name = name.strip()
    if not 1 <= weight <= MAX_WEIGHT:
        raise ConfigError(f"{option} {arg!r}: the weight must be from 1 to {MAX_WEIGHT}, not {weight}")
    if any(c in _GLOB for c in name):
        # A pattern must be able to match a valid name: the same characters, plus the glob ones.
        if len(name) > MAX_PATTERN or not _PATTERN.fullmatch(name):
            raise ConfigError(f"{option} {arg!r}: {name!r} is not a list name pattern "
                              "(letters, digits, '_', '.', ':', '-' and the globs '*', '?', '[...]', "
                              f"starting with a letter, a digit or a glob; up to {MAX_PATTERN})")
    else:
        try:
            keys.check_list_name(name)
        except keys.InvalidName as e:
            raise ConfigError(f"{option} {arg!r}: {e}") from None
    return ListSpec(name, weight)


def parse_lists(args: Iterable[ListArg], option: str = "--list") -> list[ListSpec]:
    specs = [parse_list(a, option) for a in args]
    if not specs:
        raise ConfigError(f"a worker needs at least one list ({option})")
    return specs


@dataclass
class _State:
    weight: int
    credit: int = 0
    empties: int = 0  # empty polls in a row
    ready_at: float = 0.0  # monotonic seconds: not polled before
    probing: bool = False  # backing off, and one thread is polling it now


class ListSelector:
    """Thread-safe choice of the next list to poll (see the module's docstring)."""

    def __init__(
        self,
        specs: Sequence[ListSpec],
        names: Callable[[], Iterable[str]] | None = None,
        *,
        backoff_s: float = 0.2,
        backoff_max_s: float = DEFAULT_BACKOFF_MAX_S,
        refresh_s: float = DEFAULT_REFRESH_S,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
        on_change: Callable[[list[str]], None] | None = None,
    ) -> None:
        if not specs:
            raise ConfigError("a worker needs at least one list (--list)")
        if any(s.is_pattern for s in specs) and names is None:
            raise ConfigError("list patterns need a way to list the store's lists")
        self.specs = list(specs)
        self._names = names
        self.backoff_s = backoff_s
        self.backoff_max_s = max(backoff_max_s, backoff_s)
        self.refresh_s = refresh_s
        self._clock = clock
        self._rng = rng or random.Random()
        self._lock = threading.Lock()
        self._states: dict[str, _State] = {}
        self._matched: set[str] = set()  # pattern matches at the last refresh
        self._next_refresh = 0.0  # the first pick reads the store's lists
        self._refreshing = False
        # Reads of the store's lists, numbered as they start: a read that lands after
        # a later-started one has, is stale (the maintenance thread's `refresh` and a
        # picking thread's may overlap) and must not hide a list the later one found.
        self._reads_started = 0
        self._read_landed = 0
        # Told the followed lists whenever they change (with the lock held: it must be quick).
        self._on_change = on_change
        self._resolve(set())

    @property
    def has_patterns(self) -> bool:
        return any(s.is_pattern for s in self.specs)

    def _weight_of(self, name: str) -> int | None:
        for s in self.specs:
            if s.name == name if not s.is_pattern else fnmatch.fnmatchcase(name, s.name):
                return s.weight
        return None

    def _resolve(self, store_names: set[str]) -> None:
        """The followed lists: every named one, and the pattern matches among `store_names`."""
        wanted: dict[str, int] = {}
        for s in self.specs:
            if not s.is_pattern:
                wanted.setdefault(s.name, s.weight)
        for name in sorted(store_names):
            if name not in wanted:
                w = self._weight_of(name)
                if w is not None:
                    wanted[name] = w
        self._matched = {n for n in wanted if any(s.is_pattern and fnmatch.fnmatchcase(n, s.name) for s in self.specs)}
        # Before the removals: a list dropped, and none new, is a change too.
        changed = set(wanted) != set(self._states)
        for name in list(self._states):
            if name not in wanted:
                del self._states[name]
        for name, w in wanted.items():
            st = self._states.get(name)
            if st is None:
                self._states[name] = _State(weight=w)
            else:
                st.weight = w
        if changed and self._on_change is not None:
            self._on_change(sorted(self._states))

    def refresh(self) -> list[str]:
        """Read the store's lists now (patterns only); returns the followed lists."""
        if self.has_patterns:
            assert self._names is not None
            with self._lock:
                self._reads_started += 1
                read = self._reads_started
            found = set(self._names())
            with self._lock:
                if read > self._read_landed:
                    self._read_landed = read
                    self._resolve(found)
                    self._next_refresh = self._clock() + self.refresh_s
        return self.followed()

    def _maybe_refresh(self) -> None:
        if not self.has_patterns:
            return
        with self._lock:
            if self._refreshing or self._clock() < self._next_refresh:
                return
            self._refreshing = True  # one thread reads the store; the others go on with what they have
        try:
            self.refresh()
        except Exception:
            with self._lock:  # try again at the next interval; the caller logs nothing here
                self._next_refresh = self._clock() + self.refresh_s
            raise
        finally:
            with self._lock:
                self._refreshing = False

    def followed(self) -> list[str]:
        """The lists followed now: the named ones and the current pattern matches."""
        with self._lock:
            return sorted(self._states)

    def pattern_matches(self) -> dict[str, list[str]]:
        """Each pattern -> the lists it matched at the last refresh."""
        with self._lock:
            return {s.name: sorted(n for n in self._matched if fnmatch.fnmatchcase(n, s.name))
                    for s in self.specs if s.is_pattern}

    # -- choosing ----------------------------------------------------------------

    def pick(self) -> str | None:
        """The next list to poll, or None when every list is backing off (or none
        is followed yet): wait `wait_s()` then."""
        self._maybe_refresh()
        now = self._clock()
        with self._lock:
            ready = [(n, st) for n, st in self._states.items() if st.ready_at <= now and not st.probing]
            if not ready:
                return None
            total = sum(st.weight for _, st in ready)
            for _, st in ready:
                st.credit += st.weight
            # Ties go to the first in name order: deterministic for a test.
            name, best = min(ready, key=lambda item: (-item[1].credit, item[0]))
            best.credit -= total
            if best.empties:
                best.probing = True
            return name

    def wait_s(self) -> float:
        """Seconds until some list may be polled again (at most `backoff_max_s`)."""
        now = self._clock()
        with self._lock:
            waits = [st.ready_at - now for st in self._states.values() if not st.probing]
            if self.has_patterns:
                waits.append(self._next_refresh - now)
        # A list being probed answers within a round trip: look again soon.
        return min(max(0.0, min(waits, default=self.backoff_s)), self.backoff_max_s) or self.backoff_s / 4

    def got(self, name: str) -> None:
        """The list gave jobs: poll it at full rate again."""
        with self._lock:
            st = self._states.get(name)
            if st is not None:
                st.empties, st.ready_at, st.probing = 0, 0.0, False

    def empty(self, name: str) -> float:
        """The list gave nothing (empty, paused, missing, or the poll failed): back off.
        Returns the pause, in seconds."""
        with self._lock:
            st = self._states.get(name)
            if st is None:
                return 0.0
            st.empties += 1
            st.probing = False
            full = min(self.backoff_max_s, self.backoff_s * 2 ** min(st.empties - 1, 30))
            pause = full * self._rng.uniform(0.5, 1.0)  # jitter: workers do not poll in step
            st.ready_at = self._clock() + pause
            # A list that comes back has no saved-up credit to burst with.
            st.credit = 0
            return pause

