"""A store that did not answer at the start, connected later.

The metrics exporter and the dashboard start with the servers they watch (a deploy
brings them all up at once), or while a server is down. Exiting then would read
as the watcher down, for a reason on another host; they serve what they can say
without the store (``aeroqueue_store_up`` 0, a 503 page naming the error) and
connect as soon as the store answers. `Later` connects in a thread of its own, so
that no scrape or page ever waits on a connect.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

from ..errors import AeroqueueError, StoreUnreachable

T = TypeVar("T")


class Later(Generic[T]):
    """`make(failures)` called every `retry_s` by a thread of its own until it answers
    (`failures`: the attempts that failed so far, the one that led here included).
    `value` is None until then; `error` the last attempt's error. `meanwhile` says,
    in the log, what is served until then; each reason is logged once (warning),
    not every retry."""

    def __init__(
        self, make: Callable[[int], T], error: Exception, *, retry_s: float, log: logging.Logger, meanwhile: str,
    ) -> None:
        self._make = make
        self.retry_s = retry_s
        self._log = log
        self._meanwhile = meanwhile
        self.value: T | None = None
        self.error: Exception = error
        self.failures = 1  # `error`'s attempt; written by the thread only
        self._said = ""
        self._failed(error)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._keep_trying, name="store-connect", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop trying (a connect under way ends first)."""
        self._stop.set()
        self._thread.join()

    def _keep_trying(self) -> None:
        while not self._stop.wait(self.retry_s):
            try:
                value = self._make(self.failures)
            except Exception as e:  # any: the client's own errors too (a UDF check's timeout)
                self.failures += 1
                self.error = e
                self._failed(e)
                continue
            self.value = value
            self._log.info("store reachable", extra={"event": "store_reachable"})
            return

    def _failed(self, e: Exception) -> None:
        said = str(e) if isinstance(e, AeroqueueError) else f"{type(e).__name__}: {e}"
        # Not reachable, or reachable but refused (its modules not registered yet, a login).
        what = "reachable" if isinstance(e, StoreUnreachable) else "usable"
        (self._log.warning if said != self._said else self._log.debug)(
            f"store not {what}: {self._meanwhile} until it answers",
            extra={"event": f"store_un{what}", "error": said, "hint": getattr(e, "hint", None)})
        self._said = said
