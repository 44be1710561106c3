"""A handler module whose new version on disk no longer imports: a handler process
started after its marker file exists dies as it starts (AQ_TEST_BROKEN_MARK)."""

from __future__ import annotations

import os

from aeroqueue.queue import Job

MARK = os.environ.get("AQ_TEST_BROKEN_MARK", "")
if MARK and os.path.exists(MARK):
    raise RuntimeError("a broken deploy: this module no longer imports")


def crash_then_break(job: Job) -> None:
    """The broken code lands on disk, and this handler process dies."""
    open(MARK, "w").close()
    os._exit(7)
