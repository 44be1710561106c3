"""Reading job lists from files (CSV, JSON Lines), standard input and Python iterables.

Each job is a customer job id and a payload. Input is checked whole before
anything is written, so a bad line leaves nothing from that load reservable;
every error names the source, the line and the field. A file is read twice
(checked, then written), never held whole in memory; standard input is first
spooled to a temporary file so that it can be read twice too.

- CSV (UTF-8, with or without a byte-order mark): a header row; the id column
  (``id`` unless told otherwise). Without a ``payload`` column the payload is
  the row's other columns, as an object of strings. With one, the cell holds
  the payload as JSON.
- JSON Lines: one object per line with the id field (``id``) and a
  ``payload`` field (any JSON value); without ``payload``, the payload is the
  object's other fields.
- Extra columns (fields) beside the id and a ``payload``: kept, merged into
  the payload object (which must then be an object, without a field of the
  same name), or refused with ``strict``.
- Payload values must be JSON that the sync's target (MySQL or MariaDB) and
  Aerospike can all store: no NaN or Infinity (nor numbers past a double's
  range), integers within 64 bits, nesting at most 31 deep, valid Unicode, and no
  object holding a key twice (JSON keeps the last value without a word).
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import errno
import json
import math
import os
import sys
import tempfile
from array import array
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import IO, Any

from .backends.sizes import bin_size
from .config import PLAIN_NUMBER, plain_number
from .errors import LoadError
from .keys import INT64

# What a job record holds besides its payload, at most: its bins (id, names,
# bookkeeping: about 1 KiB) and its failures (the last error and a history of 10,
# each within transitions.ERROR_BYTES: 45 KiB). The payload may use the rest of
# max-record-size: a job whose payload took it all could not record a failure. (A
# store configured with records under 256 KiB keeps a quarter of them instead.)
RECORD_OVERHEAD = 64 * 1024
MAX_ID_BYTES = 200
# The deepest JSON the sync's target stores: MariaDB's JSON functions (the CHECK
# (JSON_VALID) on payload and result) refuse 32 levels of arrays or objects and
# more; MySQL's limit is 100.
MAX_DEPTH = 31
_DEPTH_WHY = "MariaDB's JSON limit, where the sync copies it"
STDIN = "-"


@dataclass(frozen=True)
class JobSpec:
    """One job to load: the customer's id, its payload, and where it came from (for errors)."""

    jid: str
    payload: Any
    line: int | None = None
    run_at: float | None = None  # epoch seconds: not reservable before then (server clock)


class Checked:
    """Jobs a whole-input check has passed (`validate`, which the CLI runs over a file
    before it loads it): `JobLists.load` takes them as they come, lazily, unchecked,
    so that a file of a million jobs is read twice rather than held in memory. Any
    other input, JobSpecs included, is checked whole before anything is written."""

    __slots__ = ("_specs",)

    def __init__(self, specs: Iterable[JobSpec]) -> None:
        self._specs = specs

    def __iter__(self) -> Iterator[JobSpec]:
        return iter(self._specs)


RUN_AT = "run_at"  # the field (CSV column, JSON key) that delays one job
# What a JSON input must be, said when its first line is a whole document's start (a
# .json file, which the loader reads as JSON Lines).
_ONE_A_LINE = " (JSON Lines: one job's object on each line, not one JSON document or array)"


def _shown(value: Any, width: int = 40) -> str:
    """A value as an error quotes it: the start of a long one and its length, never a
    whole column of digits or a JSON array (the message is one line on stderr)."""
    text = repr(value)
    return text if len(text) <= width else f"{text[:width]}... ({len(text):,} characters)"


def _iso_seconds(text: str, source: str, line: int | None) -> float:
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise LoadError(f"run_at {_shown(text)} is neither ISO 8601 (2026-11-23T15:00:00+00:00) nor epoch seconds "
                        f"({PLAIN_NUMBER})", source=source, line=line, field=RUN_AT) from None
    if when.tzinfo is None:
        raise LoadError(f"run_at {_shown(text)} has no time zone (add Z or +hh:mm)", source=source, line=line,
                        field=RUN_AT)
    return when.timestamp()


def parse_run_at(value: Any, source: str, line: int | None) -> float | None:
    """A row's run_at: ISO 8601 with a time zone, or epoch seconds; empty: none."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if isinstance(value, bool):
        raise LoadError(f"run_at must be ISO 8601 with a zone or epoch seconds, not {_shown(value)}", source=source,
                        line=line, field=RUN_AT)
    if isinstance(value, (int, float)):
        seconds = float(value)
    else:
        text = str(value)
        if text.strip() != text:
            raise LoadError(f"run_at {_shown(text)} begins or ends with whitespace: remove it", source=source,
                            line=line, field=RUN_AT)
        # Not float(): it reads '1_800_000_000', Arabic-Indic digits, 'nan' and 'inf' too.
        plain = plain_number(text)
        seconds = _iso_seconds(text, source, line) if plain is None else plain
    if not 0 <= seconds < 1e11:  # NaN fails too
        raise LoadError(f"run_at {_shown(value)} is out of range", source=source, line=line, field=RUN_AT)
    return seconds


class _BadValue(ValueError):
    """A JSON value MySQL or Aerospike cannot store; the text says which."""


def payload_size(payload: Any, limit: int | None = None) -> int:
    """The payload's bytes: as JSON (what the sync writes to MySQL), or as its bin in
    the store where that is more (a float takes 9 bytes there, 3 as JSON). A job
    within `limit` as JSON and far from it is sized as JSON alone: a stored value is
    at most 3 times its JSON (a float), plus the bin's own few bytes."""
    text = len(json.dumps(payload, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode())
    if limit is not None and 3 * text + 8 <= limit:
        return text
    return max(text, bin_size(payload))


def _json_msg(e: json.JSONDecodeError) -> str:
    """The decoder's message without its own trailing "at" (it reads "Unterminated string
    starting at"): the place follows in ours."""
    return e.msg.removesuffix(" at")


def detect_format(path: Path, fmt: str | None) -> str:
    if fmt:
        return fmt
    if not path.exists():  # said so, rather than that its name's extension is unknown
        raise LoadError(f"cannot read the file: {os.strerror(errno.ENOENT)}", source=str(path))
    suffix = path.suffix.lower()
    if suffix == ".csv":
        return "csv"
    if suffix in (".jsonl", ".ndjson", ".json"):
        return "jsonl"
    raise LoadError(f"cannot tell the format from the extension {suffix!r}; pass --format csv or jsonl", source=str(path))


@contextlib.contextmanager
def spooled_stdin(stream: IO[bytes] | None = None) -> Iterator[Path]:
    """Standard input copied to a temporary file (removed afterwards): the load reads
    its input twice, to check it whole before writing, and a pipe reads once."""
    if stream is None and sys.stdin is None:  # file descriptor 0 closed (`<&-`)
        raise LoadError("standard input is closed: nothing to read", source="<stdin>")
    src = stream if stream is not None else sys.stdin.buffer
    # One read of the source a chunk (read1), and the first empty one ends the copy. A
    # terminal's Ctrl-D ends one read only: copyfileobj's read(n) read on to fill its n
    # bytes, and a user who typed the jobs had to press Ctrl-D two or three times.
    read = getattr(src, "read1", src.read)
    with tempfile.TemporaryDirectory(prefix="aeroqueue-load-") as tmp:
        path = Path(tmp) / "stdin"
        with path.open("wb") as out:
            while chunk := read(1 << 20):
                out.write(chunk)
        yield path


def sniff_format(path: Path) -> str:
    """For input without a name (stdin): JSON Lines if the first non-blank character is '{'."""
    with path.open("rb") as f:
        head = f.read(4096).lstrip(b"\xef\xbb\xbf \t\r\n")
    return "jsonl" if head.startswith(b"{") else "csv"


def read_file(
    path: Path, *, fmt: str | None = None, id_field: str = "id", max_payload: int, strict: bool = False,
    source: str | None = None,
) -> Iterator[JobSpec]:
    """Parse a file lazily, checking each line (`validate` adds the whole-file checks)."""
    kind = detect_format(path, fmt)
    name = source or str(path)
    try:
        # utf-8-sig: a byte-order mark (Excel's "CSV UTF-8") is dropped, not taken for
        # part of the first column's name.
        handle = path.open(newline="", encoding="utf-8-sig")
    except OSError as e:
        raise LoadError(f"cannot read the file: {e.strerror or e}", source=name) from None
    with handle:
        try:
            if kind == "csv":
                yield from _read_csv(handle, name, id_field, max_payload, strict)
            elif kind == "jsonl":
                yield from _read_jsonl(handle, name, id_field, max_payload, strict)
            else:
                raise LoadError(f"unknown format {kind!r}: use csv or jsonl", source=name)
        except UnicodeDecodeError as e:
            # e.start counts from the decoder's buffer, not the file: find the place.
            line, at, reason = _first_bad_utf8(path) or (None, e.start, e.reason)
            raise LoadError(f"not UTF-8 text ({reason} at byte {at:,} of the file)", source=name, line=line) from None


def _line_breaks(data: bytes) -> int:
    return data.count(b"\n") + data.count(b"\r") - data.count(b"\r\n")


def _first_bad_utf8(path: Path) -> tuple[int, int, str] | None:
    """(line, byte offset in the file, why) of the first bytes that are not UTF-8."""
    offset = 0
    with path.open("rb") as f:
        # Lines end as the readers see them: at \n, \r\n or a lone \r. A chunk of
        # the file ends at \n, so no \r\n is ever cut in two (and a newline byte is
        # never inside a UTF-8 sequence). Chunks, not the file (but a file of lone
        # \r endings is one chunk).
        line = 1
        for raw in f:
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError as e:
                return line + _line_breaks(raw[:e.start]), offset + e.start, e.reason
            line += _line_breaks(raw)
            offset += len(raw)
    return None


def _field_limit(max_payload: int) -> None:
    # The csv module refuses fields over 128 KiB by default; the real limit is the
    # record's. A field over it can never fit in a payload, so that is where we stop.
    # (field_size_limit is process-wide: only ever raise it.)
    csv.field_size_limit(max(csv.field_size_limit(), max_payload + 1))


def _lines(handle: Any, source: str, max_payload: int, kept: list[str] | None = None) -> Iterator[str]:
    """The file's lines, each refused once it is longer than any job's line can be: six
    characters a byte of the payload limit at most (\\u0001 in JSON; a CSV cell's
    doubled quotes take two), and room for the id and field names. Read whole, a line
    of gigabytes (no newline in a binary file, a runaway export, a CSV file of one line)
    took that much memory, several times over, before the payload check refused it.
    Each line is also appended to `kept`, if given (its reader clears it)."""
    longest = 6 * max_payload + 65_536
    line = 0
    keep = kept.append if kept is not None else None
    while text := handle.readline(longest + 1):
        line += 1
        if len(text) > longest:
            raise LoadError(f"too long (over {longest:,} characters: a line may take six a byte of the payload "
                            f"limit of {max_payload:,} bytes, and 64 KiB more)", source=source, line=line)
        if keep is not None:
            keep(text)
        yield text


def _column_over(text: str, limit: int) -> int | None:
    """The 0-based column of the first field of a CSV row's text (quotes and doubled
    quotes as the csv module's defaults read them) longer than `limit` characters; None
    if none is."""
    column, size, quoted, prev = 0, 0, False, ""
    for ch in text:
        if quoted:
            if ch == '"':
                quoted = False
            else:
                size += 1
        elif ch == '"':
            quoted = True
            if prev == '"':  # a doubled quote: one quote in the field
                size += 1
        elif ch == ",":
            column, size = column + 1, 0
        elif ch not in "\r\n":
            size += 1
        if size > limit:
            return column
        prev = ch
    return None


def _read_csv(handle: Any, source: str, id_field: str, max_payload: int, strict: bool) -> Iterator[JobSpec]:
    _field_limit(max_payload)
    # The text of the row being read: the csv module's "field larger than field limit"
    # names no field, so the error finds it there.
    row_text: list[str] = []
    reader = csv.reader(_lines(handle, source, max_payload, row_text), strict=True)
    try:
        header = next(reader)
    except StopIteration:
        return
    except csv.Error as e:
        raise LoadError(f"malformed CSV header: {e}", source=source, line=1) from None
    if not header:
        raise LoadError("the first line is empty: it must be the header, naming the columns", source=source, line=1)
    if id_field not in header:
        # At most 200 characters of it: a header of 100,000 columns made one error line of a megabyte.
        raise LoadError(f"no {id_field!r} column in the header {header!r:.200}", source=source, line=1, field=id_field)
    nul = next((h for h in header if "\x00" in h), None)
    if nul is not None:  # a payload key: the client cut it short, and two such columns became one
        raise LoadError(f"a column name: {NUL_WHY}", source=source, line=1, field=nul)
    blank = next((i for i, h in enumerate(header) if not h.strip()), None)
    if blank is not None:
        # Its cells went into the payload under the key "" (a header's trailing comma, say).
        raise LoadError(f"column {blank + 1} of the header has no name: name it, or remove it (a trailing comma?)",
                        source=source, line=1)
    if len(set(header)) != len(header):
        dup = next(h for h in header if header.count(h) > 1)
        raise LoadError("duplicate column in the header", source=source, line=1, field=dup)
    id_at = header.index(id_field)
    payload_at = header.index("payload") if "payload" in header and id_field != "payload" else None
    run_at_at = header.index(RUN_AT) if RUN_AT in header and id_field != RUN_AT else None
    extra = [(i, h) for i, h in enumerate(header) if i not in (id_at, payload_at, run_at_at)]
    if payload_at is not None and extra and strict:
        raise LoadError(f"column {extra[0][1]!r} is neither the id nor 'payload' (--strict)", source=source,
                        line=1, field=extra[0][1])
    width = len(header)
    # A row whose text is this short cannot reach the payload limit: skip measuring it.
    fast = max_payload // 6 - 8 * width - sum(len(h) for h in header)
    last = reader.line_num  # the physical line the previous row ended on
    while True:
        row_text.clear()
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error as e:
            msg = str(e)
            if "field larger than field limit" in msg:
                # A quote opened and never closed takes the lines after it into its
                # field, until the limit: say so, not only the size.
                spans = reader.line_num - last
                why = (f"; its row runs on over {spans:,} lines from here: a quote opened in it and never closed?"
                       if spans > 1 else "")
                column = _column_over("".join(row_text), max_payload + 1)  # as _field_limit set it
                field = header[column] if column is not None and column < width else None
                raise LoadError(f"a field is over the {max_payload}-byte payload limit (max-record-size less room "
                                f"for the job's own bins and failures){why}", source=source, line=last + 1,
                                field=field) from None
            # The error is in the row after the last good one (an unclosed quote runs
            # to the end of the file, where line_num points).
            raise LoadError(f"malformed CSV: {msg}", source=source, line=last + 1) from None
        line = last + 1
        last = reader.line_num
        if not row:  # a blank line
            continue
        if len(row) != width:
            raise LoadError(f"{len(row)} fields where the header has {width}", source=source, line=line)
        jid = row[id_at]
        if not jid.strip():
            raise LoadError("empty job id", source=source, line=line, field=id_field)
        run_at = parse_run_at(row[run_at_at], source, line) if run_at_at is not None else None
        if any("\x00" in cell for cell in row):
            name = header[next(i for i, cell in enumerate(row) if "\x00" in cell)]
            raise LoadError(NUL_WHY, source=source, line=line, field=name)
        if payload_at is None:
            payload: Any = dict(zip(header, row, strict=True))
            del payload[id_field]
            if run_at_at is not None:
                del payload[RUN_AT]
            measure = sum(map(len, row)) > fast
        else:
            payload = _json_cell(row[payload_at], source, line)
            if extra:
                payload = _merge_extra(payload, {h: row[i] for i, h in extra}, source, line)
            measure = True
        yield _checked(JobSpec(jid, payload, line, run_at), source, id_field, max_payload, measure)


def _json_cell(text: str, source: str, line: int) -> Any:
    if not text.strip():
        return None
    try:
        value = _loads(text)
    except json.JSONDecodeError as e:
        # A cell may span lines: its own offset, not a column of the file's line (nor a CSV column).
        raise LoadError(f"the payload column holds JSON: {_json_msg(e)} at character {e.pos + 1} of the cell", source=source,
                        line=line, field="payload") from None
    except _BadValue as e:
        raise LoadError(str(e), source=source, line=line, field="payload") from None
    return value


def _merge_extra(payload: Any, extra: dict[str, Any], source: str, line: int, *, cli: bool = True) -> Any:
    """Extra columns beside a payload go into it, never silently dropped. `cli`: the
    error names the CLI's --strict (a Python caller has no such option)."""
    if payload is None:
        payload = {}
    if not isinstance(payload, dict):
        name = next(iter(extra))
        how = "use --strict to refuse extra fields, or move it into the payload" if cli else "move it into the payload"
        raise LoadError(f"extra field {name!r} beside a payload that is not an object ({how})", source=source,
                        line=line, field=name)
    clash = next((k for k in extra if k in payload), None)
    if clash is not None:
        raise LoadError(f"extra field {clash!r} is also a field of the payload", source=source, line=line, field=clash)
    return {**payload, **extra}


def _refuse_constant(name: str) -> Any:
    raise _BadValue(f"{name} is not a number MySQL's JSON (nor the sync) can store")


# Digits of the longest integer within 64 bits (2^63 has 19). A longer one is refused
# before int() reads it: past 4,300 digits int() raises a plain ValueError (CPython's
# limit on text conversions), which no caller takes for a refused value.
INT64_DIGITS = 19


def _checked_int(text: str) -> int:
    if len(text) - text.startswith("-") > INT64_DIGITS:  # JSON has no leading zeros
        more = f"... ({len(text):,} digits)" if len(text) > 30 else ""
        raise _BadValue(f"integer {text[:30]}{more} is outside the 64-bit range Aerospike and MySQL store")
    value = int(text)
    if not INT64[0] <= value <= INT64[1]:
        raise _BadValue(f"integer {text[:30]} is outside the 64-bit range Aerospike and MySQL store")
    return value


def _checked_float(text: str) -> float:
    value = float(text)
    if value in (math.inf, -math.inf):
        raise _BadValue(f"number {text[:30]} is too large for a 64-bit float (it would be stored as Infinity)")
    return value


class _DuplicateKey(_BadValue):
    """An object that holds a key twice: JSON keeps the last value, without a word."""

    def __init__(self, key: str) -> None:
        super().__init__(f"key {_shown(key)} is given twice in one object (which value is meant?)")
        self.key = key


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        raise _DuplicateKey(_repeated([k for k, _ in pairs]))
    return obj


def _repeated(keys: list[str]) -> str:
    """The first key of `keys` given again (there is one)."""
    seen: set[str] = set()
    for k in keys:
        if k in seen:
            return k
        seen.add(k)
    raise ValueError("no key is repeated")


# One decoder for every line: json.loads with hooks builds a new one each call, which
# cost more (about 2 us a line, measured) than the duplicate-key hook costs.
_DECODER = json.JSONDecoder(parse_constant=_refuse_constant, parse_int=_checked_int, parse_float=_checked_float,
                            object_pairs_hook=_unique_keys)


def _loads(text: str, max_depth: int = MAX_DEPTH) -> Any:
    # The float hook costs about 0.2 us a number (measured: a regex to skip it cost more).
    try:
        value = _DECODER.decode(text)
    except RecursionError:  # about 1,000 levels: Python's decoder gives up (not a ValueError)
        raise _BadValue(f"JSON nested more than {MAX_DEPTH} deep ({_DEPTH_WHY})") from None
    if too_deep(value, text, max_depth):
        raise _BadValue(f"JSON nested more than {MAX_DEPTH} deep ({_DEPTH_WHY})")
    if "\\u0000" in text and holds_nul(value):  # JSON has no other way to spell one
        raise _BadValue(NUL_WHY)
    return value


# The Aerospike client cuts a string (a bin value, a map key, a record key) at its
# first NUL: 'a\x00b' is stored as 'a', and the record of job id 'a\x00b' is job 'a''s.
NUL_WHY = "a string holds a NUL character (\\u0000), where the Aerospike client would cut it short"


def holds_nul(value: Any) -> bool:
    """Whether a string in `value` (a value or a map key, at any depth) holds a NUL."""
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            if "\x00" in v:
                return True
        elif isinstance(v, dict):
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, (list, tuple)):
            stack.extend(v)
    return False


def too_deep(value: Any, text: str, max_depth: int = MAX_DEPTH) -> bool:
    """`value` (whose JSON is `text`) is nested more than `max_depth` deep (counting
    brackets first: a walk of the value only when there are enough of them)."""
    return text.count("[") + text.count("{") > max_depth and _depth(value) > max_depth


def _depth(value: Any) -> int:
    deepest, stack = 0, [(value, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, dict):
            v = list(v.values())
        if isinstance(v, list):
            deepest = max(deepest, d)
            stack.extend((x, d + 1) for x in v)
    return deepest


def _malformed(e: json.JSONDecodeError, text: str, source: str, line: int) -> LoadError:
    # The decoder counts the line's own newline as a line 2: a line cut short was "at column 1".
    column = min(e.pos, len(text.rstrip("\r\n"))) + 1
    # A first line of "{" or "[" alone: a JSON document (a .json file), pretty-printed.
    whole = _ONE_A_LINE if line == 1 and text.strip() in ("{", "[") else ""
    return LoadError(f"malformed JSON: {_json_msg(e)} at column {column}{whole}", source=source, line=line)


def _read_jsonl(handle: Any, source: str, id_field: str, max_payload: int, strict: bool) -> Iterator[JobSpec]:
    # Lines this short cannot reach the payload limit, however their numbers re-encode.
    fast = max_payload // 20
    for line, text in enumerate(_lines(handle, source, max_payload), 1):
        if not text.strip():
            continue
        try:
            # One level more for the line's own object: its payload field may take them all.
            obj = _loads(text, MAX_DEPTH + 1)
        except json.JSONDecodeError as e:
            raise _malformed(e, text, source, line) from None
        except _DuplicateKey:
            # The decoder stopped at the repeat: the rest of the line is read first here.
            try:
                obj, where = _duplicate_in(text)
            except json.JSONDecodeError as e:
                raise _malformed(e, text, source, line) from None
            except RecursionError:  # nested past Python's decoder
                raise LoadError(f"JSON nested more than {MAX_DEPTH} deep ({_DEPTH_WHY})", source=source, line=line,
                                field=_deep_field(text)) from None
            if where is not None:
                field, key = where
                if key is None:  # a field of the line's own object
                    raise LoadError(f"field {_shown(field)} is given twice (which one is meant?)", source=source,
                                    line=line, field=field) from None
                raise LoadError(f"key {_shown(key)} is given twice in one of its objects (which value is meant?)",
                                source=source, line=line, field=field) from None
            # Not an object (an array of objects, one of which repeats a key): said below.
        except _BadValue as e:
            raise LoadError(str(e), source=source, line=line, field=_bad_field(text)) from None
        if not isinstance(obj, dict):
            raise LoadError(f"expected a JSON object, got {type(obj).__name__}"
                            + (_ONE_A_LINE if line == 1 and isinstance(obj, list) else ""), source=source, line=line)
        if id_field not in obj:
            raise LoadError("missing job id", source=source, line=line, field=id_field)
        jid = obj.pop(id_field)
        run_at = parse_run_at(obj.pop(RUN_AT, None), source, line)
        jid = _checked_id(jid, source, line, id_field)
        if "payload" in obj and id_field != "payload":
            payload = obj.pop("payload")
            if obj:
                if strict:
                    name = next(iter(obj))
                    raise LoadError(f"field {name!r} is neither the id nor 'payload' (--strict)", source=source,
                                    line=line, field=name)
                payload = _merge_extra(payload, obj, source, line)
        else:
            payload = obj
        if too_deep(payload, text):
            raise LoadError(f"payload nested more than {MAX_DEPTH} deep ({_DEPTH_WHY})", source=source, line=line,
                            field="payload")
        # A \u escape may hide a lone surrogate, which is not valid Unicode: measure those.
        measure = len(text) > fast or "\\u" in text
        yield _checked(JobSpec(jid, payload, line, run_at), source, id_field, max_payload, measure)


class _Pairs(list[tuple[str, Any]]):
    """A JSON object as its key-value pairs, every one kept (`_duplicate_in`)."""


def _duplicate_in(text: str) -> tuple[Any, tuple[str, str | None] | None]:
    """A line whose objects hold a key twice (only called once one does), parsed again to
    say where: with ("the field", None) when it is one of the line's own fields, or
    ("the top-level field whose value holds it", "the key"); with None when the line
    is not an object."""
    top = json.loads(text, object_pairs_hook=_Pairs, parse_int=_lenient_int)
    if not isinstance(top, _Pairs):
        return top, None
    keys = [k for k, _ in top]
    if len(set(keys)) != len(keys):
        return top, (_repeated(keys), None)
    for field, value in top:
        stack = [value]
        while stack:
            v = stack.pop()
            if isinstance(v, _Pairs):
                inner = [k for k, _ in v]
                if len(set(inner)) != len(inner):
                    return top, (field, _repeated(inner))
                stack.extend(x for _, x in v)
            elif isinstance(v, list):
                stack.extend(v)
    raise ValueError("no key is given twice")


def _lenient_int(text: str) -> float:
    """An integer, or Infinity for one too long for int(): refused below all the same."""
    return math.inf if len(text) > INT64_DIGITS + 1 else int(text)


def _deep_field(text: str) -> str:
    """The top-level field of a line too deep for Python's decoder: the key last
    opened at the line's first level of nesting before the depth ran past MAX_DEPTH."""
    depth, key, in_string, escaped, start = 0, "payload", False, False, 0
    for i, c in enumerate(text):
        if in_string:
            if escaped:
                escaped = False
            elif c == "\\":
                escaped = True
            elif c == '"':
                in_string = False
                if depth == 1:
                    with contextlib.suppress(ValueError):
                        last = json.loads(text[start:i + 1])
                        if text[i + 1:].lstrip().startswith(":"):
                            key = str(last)
        elif c == '"':
            in_string, start = True, i
        elif c in "[{":
            depth += 1
            if depth > MAX_DEPTH + 1:
                return key
        elif c in "]}":
            depth -= 1
    return key


def _bad_field(text: str) -> str:
    """The top-level field that holds a refused value (for the error message)."""
    try:
        obj = json.loads(text, parse_int=_lenient_int)
    except (ValueError, RecursionError):
        return _deep_field(text)
    if not isinstance(obj, dict):
        return "payload"
    for k, v in obj.items():
        try:
            _loads(json.dumps(v))
        except (_BadValue, ValueError):
            return str(k)
    return "payload"


def _checked(spec: JobSpec, source: str, id_field: str, max_payload: int, measure: bool = True) -> JobSpec:
    try:
        too_long = len(spec.jid.encode()) > MAX_ID_BYTES
    except UnicodeEncodeError as e:
        raise LoadError(f"job id is not valid Unicode ({e.reason} at position {e.start})", source=source,
                        line=spec.line, field=id_field) from None
    if too_long:
        raise LoadError(f"job id longer than {MAX_ID_BYTES} bytes", source=source, line=spec.line, field=id_field)
    if spec.jid.strip() != spec.jid:
        # Ids are matched exactly (`job show`, the sync's jid): a CSV file's ' a' was
        # stripped to 'a' and a JSON Lines file's kept, two jobs for one id. Refused
        # from every source rather than guessed at.
        raise LoadError(f"job id {_shown(spec.jid)} begins or ends with whitespace: remove it (an id is taken "
                        "exactly as written, so ' a' would be a job other than 'a')", source=source, line=spec.line,
                        field=id_field)
    if "\x00" in spec.jid:
        raise LoadError(f"job id holds a NUL character (\\u0000): the Aerospike client cuts a key there, so it "
                        f"would be the id {spec.jid.partition(chr(0))[0]!r}", source=source, line=spec.line, field=id_field)
    if not measure:
        return spec
    try:
        size = payload_size(spec.payload, max_payload)
    except UnicodeEncodeError as e:
        raise LoadError(f"payload is not valid Unicode ({e.reason} at position {e.start})", source=source,
                        line=spec.line, field="payload") from None
    except ValueError as e:  # NaN or Infinity from Python
        raise LoadError(f"payload holds a value MySQL's JSON cannot store ({e})", source=source,
                        line=spec.line, field="payload") from None
    if size > max_payload:
        raise LoadError(
            f"payload of {size} bytes is over the {max_payload}-byte limit (max-record-size less room for the job's own bins and failures)",
            source=source,
            line=spec.line,
            field="payload",
        )
    return spec


# -- whole-input checks ---------------------------------------------------------


class IdDigests:
    """Which job ids were seen, in bounded memory: 8 bytes per id, mostly on disk.

    Each id is reduced to the interpreter's 64-bit string hash (SipHash, salted
    per process: fine, everything happens in this process). Up to `in_memory`
    digests live in a set, which finds a repeat at once. Past that the set is
    spilled to `buckets` temporary files by digest (8 bytes per id on disk,
    small write buffers in memory) and each bucket is checked on its own at the
    end, so memory stays bounded whatever the file's size. A repeated digest is
    only a suspect (two ids can share a hash): the caller confirms it against
    the ids themselves on another read.

    Why not a sorted array or a SQLite table: sorting needs the whole array in
    memory (or an external merge) and a Python list of ints costs 36 bytes per
    id; SQLite with a primary key costs about 1 µs per id in inserts alone.
    Hash buckets cost one append per id and a set per bucket at the end.
    """

    def __init__(self, *, in_memory: int = 1 << 19, buckets: int = 256, flush: int = 4096) -> None:
        self._seen: set[int] | None = set()
        self._limit = in_memory
        self._nbuckets = buckets
        self._flush = flush
        self._bufs: list[array] = []
        self._dir: tempfile.TemporaryDirectory[str] | None = None
        self.suspects: set[int] = set()
        self.count = 0

    @staticmethod
    def digest(jid: str) -> int:
        return hash(jid)

    def add(self, jid: str) -> bool:
        """Record an id; True when its digest was seen before in memory (check it now)."""
        h = self.digest(jid)
        self.count += 1
        seen = self._seen
        if seen is not None:
            if h in seen:
                self.suspects.add(h)
                return True
            seen.add(h)
            if len(seen) >= self._limit:
                self._spill()
            return False
        buf = self._bufs[h % self._nbuckets]
        buf.append(h)
        if len(buf) >= self._flush:
            self._write(h % self._nbuckets)
        return False

    def _spill(self) -> None:
        assert self._seen is not None
        self._dir = tempfile.TemporaryDirectory(prefix="aeroqueue-ids-")
        self._bufs = [array("q") for _ in range(self._nbuckets)]
        seen, self._seen = self._seen, None
        for h in seen:
            self._bufs[h % self._nbuckets].append(h)
        for b in range(self._nbuckets):
            self._write(b)

    def _write(self, b: int) -> None:
        assert self._dir is not None
        with open(os.path.join(self._dir.name, str(b)), "ab") as f:
            self._bufs[b].tofile(f)
        self._bufs[b] = array("q")

    def finish(self) -> set[int]:
        """Digests seen more than once (suspects); frees the disk."""
        if self._dir is not None:
            for b in range(self._nbuckets):
                self._write(b)
                digests = array("q")
                path = os.path.join(self._dir.name, str(b))
                with open(path, "rb") as f:
                    digests.frombytes(f.read())
                os.unlink(path)
                unique = set(digests)
                if len(unique) != len(digests):
                    seen: set[int] = set()
                    for h in digests:
                        if h in seen:
                            self.suspects.add(h)
                        seen.add(h)
            self._dir.cleanup()
            self._dir = None
        return self.suspects

    def close(self) -> None:
        if self._dir is not None:
            self._dir.cleanup()
            self._dir = None


def validate(
    specs: Iterable[JobSpec] | Callable[[], Iterable[JobSpec]],
    source: str,
    id_field: str = "id",
    progress: Callable[[int], None] | None = None,
) -> int:
    """Check a whole input (duplicate ids) without writing anything; returns the job count.

    Pass a callable that reads the input afresh (as `read_file` does) for
    bounded memory: a repeated id digest is then confirmed by reading again.
    A plain iterable is checked with its ids held in memory."""
    if not callable(specs):
        return _validate_in_memory(specs, source, id_field, progress)
    ids = IdDigests()
    try:
        n = 0
        for spec in specs():
            n += 1
            if ids.add(spec.jid):
                _confirm(specs, {ids.digest(spec.jid)}, ids.digest, source, id_field, upto=spec.line)
            if progress is not None and n % 4096 == 0:
                progress(n)
        suspects = ids.finish()
        if suspects:
            _confirm(specs, suspects, ids.digest, source, id_field)
    finally:
        ids.close()
    if progress is not None:
        progress(n)
    return n


def _confirm(
    specs: Callable[[], Iterable[JobSpec]], suspects: set[int], digest: Callable[[str], int], source: str,
    id_field: str, upto: int | None = None,
) -> None:
    """Read again: raise for the first id that really repeats among the suspect digests."""
    first: dict[str, int | None] = {}
    for spec in specs():
        if digest(spec.jid) not in suspects:
            continue
        if spec.jid in first:
            where = f" (first at line {first[spec.jid]})" if first[spec.jid] is not None else ""
            raise LoadError(f"duplicate job id {spec.jid!r}{where}", source=source, line=spec.line, field=id_field)
        first[spec.jid] = spec.line
        if upto is not None and spec.line is not None and spec.line >= upto:
            return


def _validate_in_memory(
    specs: Iterable[JobSpec], source: str, id_field: str, progress: Callable[[int], None] | None
) -> int:
    seen: dict[str, int | None] = {}
    n = 0
    for spec in specs:
        first = seen.get(spec.jid, -1)
        if first != -1:
            where = f" (first at line {first})" if first is not None else ""
            raise LoadError(f"duplicate job id {spec.jid!r}{where}", source=source, line=spec.line, field=id_field)
        seen[spec.jid] = spec.line
        n += 1
        if progress is not None and n % 4096 == 0:
            progress(n)
    if progress is not None:
        progress(n)
    return n


def from_iterable(items: Iterable[Any], *, max_payload: int, source: str = "<python>") -> list[JobSpec]:
    """Jobs from Python: JobSpec, (jid, payload) pairs or {'id': ..., 'payload': ...} dicts."""
    out = []
    for i, item in enumerate(items, start=1):
        if isinstance(item, JobSpec):
            # A JobSpec's run_at is checked as a file's is: a bad one found after
            # the first ranges were written would leave the load half done.
            line = item.line or i
            spec = JobSpec(_checked_id(item.jid, source, line), item.payload, line, parse_run_at(item.run_at, source, line))
        elif isinstance(item, tuple) and len(item) == 2:
            spec = JobSpec(_checked_id(item[0], source, i), item[1], i)
        elif isinstance(item, dict) and "id" in item:
            # Its other fields as a JSON Lines line's (they were dropped without a word):
            # the payload without one, else merged into it.
            extra = {k: v for k, v in item.items() if k not in ("id", "payload", RUN_AT)}
            payload = item.get("payload")
            if extra:
                payload = _merge_extra(payload, extra, source, i, cli=False) if "payload" in item else extra
            spec = JobSpec(_checked_id(item["id"], source, i), payload, i, parse_run_at(item.get(RUN_AT), source, i))
        else:
            raise LoadError(f"expected (id, payload), a JobSpec or a dict with 'id', got {item!r:.80}", source=source, line=i)
        try:
            if _check_python_value(spec.payload):
                spec = dataclasses.replace(spec, payload=_tuples_as_lists(spec.payload))
        except _BadValue as e:
            raise LoadError(str(e), source=source, line=spec.line, field="payload") from None
        out.append(_checked(spec, source, "id", max_payload))
    validate(out, source)
    return out


def _checked_id(jid: Any, source: str, line: int, field: str = "id") -> str:
    """A job id from JSON or Python as text: a non-empty string or an integer (None,
    True or 1.5 would otherwise load as the job "None", "True", "1.5")."""
    if isinstance(jid, bool) or not isinstance(jid, (str, int)) or not str(jid).strip():
        raise LoadError(f"job id must be a non-empty string or integer, got {jid!r:.80}", source=source, line=line,
                        field=field)
    return str(jid)


def _check_python_value(value: Any) -> bool:
    """What `_loads` refuses in JSON text, refused in Python values too, and what the
    Aerospike client cannot store as it is: map keys other than strings and integers
    (it drops a float or bool key, with a warning), values JSON has no form for
    (bytes, sets, objects). Returns whether a tuple is in it (the client serializes
    no tuple: `_tuples_as_lists`)."""
    tuples = False
    stack = [(value, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, str):
            if "\x00" in v:
                raise _BadValue(NUL_WHY)
            continue
        if isinstance(v, bool) or v is None:
            continue
        if isinstance(v, int):
            if not INT64[0] <= v <= INT64[1]:
                raise _BadValue(f"integer {v} is outside the 64-bit range Aerospike and MySQL store")
        elif isinstance(v, float):
            if v != v or v in (float("inf"), float("-inf")):
                raise _BadValue(f"{v} is not a number MySQL's JSON (nor the sync) can store")
        elif isinstance(v, (list, tuple, dict)):
            if d > MAX_DEPTH:
                raise _BadValue(f"payload nested more than {MAX_DEPTH} deep ({_DEPTH_WHY})")
            tuples = tuples or isinstance(v, tuple)
            if isinstance(v, dict):
                for k in v:
                    if isinstance(k, str):
                        if "\x00" in k:
                            raise _BadValue(NUL_WHY)
                    elif isinstance(k, bool) or not isinstance(k, int):
                        raise _BadValue(f"map key {k!r:.40} is a {type(k).__name__}: a payload's keys are strings "
                                        "or integers (the Aerospike client drops a float or bool key)")
            stack.extend((x, d + 1) for x in (v.values() if isinstance(v, dict) else v))
        else:
            raise _BadValue(f"a {type(v).__name__} is not a JSON value (the payload is stored, and synced, as JSON)")
    return tuples


def _tuples_as_lists(value: Any) -> Any:
    """`value` with its tuples as lists, as JSON has them."""
    if isinstance(value, (list, tuple)):
        return [_tuples_as_lists(v) for v in value]
    if isinstance(value, dict):
        return {k: _tuples_as_lists(v) for k, v in value.items()}
    return value
