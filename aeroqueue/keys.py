"""The keyspace: set names, record names and module names, in one place (design.md, Records)."""

from __future__ import annotations

import re
from typing import Any

from .errors import AeroqueueError, InvalidText

LIST_SET = "aq_list"  # "<list>": token store and list header
JOB_SET = "aq_job"  # "<list>/<token>": one job
IDS_SET = "aq_ids"  # "<list>/<chunk>": ID store chunks
SESS_SET = "aq_sess"  # "<session id>": heartbeat session
DONE_SET = "aq_done"  # "<list>/<chunk>": completion bitmaps (bins done, dead; void: tokens that hold no job; c: the list's stamp)
BLOCK_SET = "aq_blk"  # "<list>/<block>": fresh jobs' ids and payloads, a hundred a record (aeroqueue/blocks.py)
JIDX_SET = "aq_jidx"  # "<list>/<jid>": job id -> token, the commit point of a load
LOCK_SET = "aq_lock"  # "<name>": a lease (owner, host, pid, ttl_ms); a sync's is "sync:<target>"; SWEEP_GATE, LOST_TAKE_MARK
SYNC_SET = "aq_sync"  # "<run>/<partition>": a running sync task's progress (lists: copied per list); "clock/<id>"
# The time to live of every aq_sync record (none in a namespace that refuses TTLs:
# nsup-period 0, `sync.mark.put_sync_record`): each is removed by the process that
# wrote it (the clock at once, progress at the run's end), and one killed in
# between would otherwise leave it for ever. A task's progress is rewritten
# after each batch, so a running task's never expires.
SYNC_TTL_S = 86_400

LIST_MOD = "aq_list_v1"
JOB_MOD = "aq_job_v1"
IDS_MOD = "aq_ids_v1"
SESS_MOD = "aq_sess_v1"

# The workers' sweep gate, in LOCK_SET: its last update is when the last regular sweep of
# the store began, by the server's clock (`sessions.claim_sweep`); bins: the winner's
# sess, host and pid, for an operator. Versioned as the modules are: a release that
# changes what it means names another, so that during an upgrade the workers of each
# release keep their own (two sweeps an interval at worst), never misreading the other's.
SWEEP_GATE = "sweep_v1"

# In LOCK_SET: its last update is when a take or an ID-store pop last lost its answer
# (`sessions.mark_lost_take`): a worker sweeps soon after, through the gate above.
LOST_TAKE_MARK = "lost_take_v1"

SESS_INDEX = "aq_job_sess"  # secondary index on aq_job.sess: a session's claims
# Numeric secondary index on aq_job.dl, the claim's deadline, which a job holds only
# while claimed: every session's claims in one query (the dashboard's sessions).
CLAIMS_INDEX = "aq_job_dl"
# Set indexes on the small sets every worker and every view scans (sessions: twice a
# reaper's pass; lists: pattern discovery, the dashboard, a scrape): without one a scan
# of a set walks the whole namespace's primary index on each node.
SESS_SET_INDEX = "aq_sess_set"
LIST_SET_INDEX = "aq_list_set"

BITS_PER_CHUNK = 1 << 16  # 8 KiB of bits per bitmap record

INT64 = (-(1 << 63), (1 << 63) - 1)  # the integers a record holds (and MySQL's JSON integers)

_LIST_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}$")


class InvalidName(AeroqueueError):
    """A list name must be 1 to 64 letters, digits, '_', '.', ':' or '-', starting with a letter or digit."""


def check_list_name(name: str) -> str:
    if not isinstance(name, str) or not _LIST_NAME.fullmatch(name):  # match's $ passes a trailing newline
        raise InvalidName(f"invalid list name {name!r}: use 1 to 64 letters, digits, '_', '.', ':' or '-'")
    return name


def check_text(value: str, what: str) -> str:
    """`value`, refused (`InvalidText`) unless it encodes as UTF-8. Bytes of another
    encoding (a job id typed in a Latin-1 terminal) reach Python as lone surrogates
    (surrogateescape): as a record's name they crash the aerospike client's C code
    (a segfault, in `calc_digest`), and as a bin value the server refuses them with a
    message that names neither the value nor where it came from."""
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as e:
            raise InvalidText(
                f"{what} {value!r} is not valid UTF-8 text (character {e.start + 1}): typed in another encoding?"
            ) from None
    return value


def job_name(list_name: str, token: int) -> str:
    return f"{list_name}/{token}"


def job_names(list_name: str, tokens: list[int]) -> list[str]:
    """`job_name` of many tokens of one list (the batch path: one call, not one per token)."""
    return [f"{list_name}/{t}" for t in tokens]


def jidx_name(list_name: str, jid: str) -> str:
    return f"{list_name}/{jid}"


# A job-id index entry: its job's token, and the `created` stamp of the list that
# indexed it; also the list's name (bin "l"), by which a drop finds the entries of
# jobs the sync's retention deleted (it finds the others through the job records).
# Entries a dropped list left behind (written before the "l" bin) carry another stamp.
INDEX_BINS = ["tok", "c"]


def indexed_here(index_bins: dict[str, Any], created: int) -> bool:
    """Whether an index entry is this list's (stamped `created`). Entries written
    before the stamp existed have none: taken as this list's, as they always were."""
    return index_bins.get("c", created) == created


def bitmap_of(rec: Any, created: int | None) -> Any:
    """A completion bitmap record if it is the list's made at `created` (its stamp
    `c`), else None, as if no bit of it were set: one of a list of the same name
    dropped since (brought back by a node that missed the drop, or written by a
    process paused past it) counts nothing. Chunks written before the stamp existed
    have none: taken as this list's, as they always were. `created` None: any."""
    if rec is None or created is None:
        return rec
    return rec if indexed_here(rec.bins, created) else None


def chunk_name(list_name: str, chunk: int) -> str:
    return f"{list_name}/{chunk}"


def bit_position(token: int) -> tuple[int, int]:
    """(bitmap chunk, bit offset in it) of a token."""
    return divmod(token, BITS_PER_CHUNK)


def bit_is_set(bitmap: bytes, bit: int) -> bool:
    """Whether a bit of a chunk's bitmap is set (most significant bit first, as the
    server's bit operations number them); bits past its end are clear."""
    return bit >> 3 < len(bitmap) and bool(bitmap[bit >> 3] & (0x80 >> (bit & 7)))
