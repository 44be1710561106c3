"""Reading job lists from files (CSV, JSON Lines) and Python iterables.

Each job is a customer job id and a payload. Input is validated whole before
anything is written, so a bad line leaves nothing from that load reservable;
every error names the source, the line and the field.

- CSV: a header row; the id column (``id`` unless told otherwise); the
  payload is the row's other columns, as an object of strings.
- JSON Lines: one object per line with the id field (``id``) and a
  ``payload`` field (any JSON value); without ``payload``, the payload is the
  object's other fields.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import LoadError

# What a job record holds besides its payload (bins, names, bookkeeping): the
# payload may use the rest of max-record-size.
RECORD_OVERHEAD = 4096


@dataclass(frozen=True)
class JobSpec:
    """One job to load: the customer's id, its payload, and where it came from (for errors)."""

    jid: str
    payload: Any
    line: int | None = None


def payload_size(payload: Any) -> int:
    return len(json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode())


def detect_format(path: Path, fmt: str | None) -> str:
    if fmt:
        return fmt
    suffix = path.suffix.lower()
    if suffix == ".csv":
        return "csv"
    if suffix in (".jsonl", ".ndjson", ".json"):
        return "jsonl"
    raise LoadError(f"cannot tell the format from the extension {suffix!r}; pass --format csv or jsonl", source=str(path))


def read_file(path: Path, *, fmt: str | None = None, id_field: str = "id", max_payload: int) -> Iterator[JobSpec]:
    """Parse a file lazily (call `validate` first for whole-file checks)."""
    kind = detect_format(path, fmt)
    try:
        handle = path.open(newline="", encoding="utf-8")
    except OSError as e:
        raise LoadError(f"cannot read the file: {e.strerror or e}", source=str(path)) from None
    with handle:
        try:
            if kind == "csv":
                yield from _read_csv(handle, str(path), id_field, max_payload)
            elif kind == "jsonl":
                yield from _read_jsonl(handle, str(path), id_field, max_payload)
            else:
                raise LoadError(f"unknown format {kind!r}: use csv or jsonl", source=str(path))
        except UnicodeDecodeError as e:
            raise LoadError(f"not UTF-8 text ({e.reason} at byte {e.start})", source=str(path)) from None


def _read_csv(handle: Any, source: str, id_field: str, max_payload: int) -> Iterator[JobSpec]:
    reader = csv.reader(handle, strict=True)
    try:
        header = next(reader)
    except StopIteration:
        return
    except csv.Error as e:
        raise LoadError(f"malformed CSV header: {e}", source=source, line=1) from None
    if id_field not in header:
        raise LoadError(f"no {id_field!r} column in the header {header!r}", source=source, line=1, field=id_field)
    if len(set(header)) != len(header):
        dup = next(h for h in header if header.count(h) > 1)
        raise LoadError("duplicate column in the header", source=source, line=1, field=dup)
    id_at = header.index(id_field)
    line = reader.line_num  # the last line read so far: a record starts on the next one
    while True:
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error as e:
            raise LoadError(f"malformed CSV: {e}", source=source, line=line + 1) from None
        line = reader.line_num
        if not row:  # a blank line
            continue
        if len(row) != len(header):
            raise LoadError(
                f"{len(row)} fields where the header has {len(header)}", source=source, line=line
            )
        jid = row[id_at].strip()
        if not jid:
            raise LoadError("empty job id", source=source, line=line, field=id_field)
        payload = {h: v for i, (h, v) in enumerate(zip(header, row, strict=True)) if i != id_at}
        yield _checked(JobSpec(jid, payload, line), source, id_field, max_payload)


def _read_jsonl(handle: Any, source: str, id_field: str, max_payload: int) -> Iterator[JobSpec]:
    for line, text in enumerate(handle, start=1):
        if not text.strip():
            continue
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as e:
            raise LoadError(f"malformed JSON: {e.msg} at column {e.colno}", source=source, line=line) from None
        if not isinstance(obj, dict):
            raise LoadError(f"expected a JSON object, got {type(obj).__name__}", source=source, line=line)
        if id_field not in obj:
            raise LoadError("missing job id", source=source, line=line, field=id_field)
        jid = obj[id_field]
        if isinstance(jid, bool) or not isinstance(jid, (str, int)) or str(jid).strip() == "":
            raise LoadError(f"job id must be a non-empty string or integer, got {jid!r}", source=source, line=line, field=id_field)
        payload = obj["payload"] if "payload" in obj else {k: v for k, v in obj.items() if k != id_field}
        yield _checked(JobSpec(str(jid), payload, line), source, id_field, max_payload)


def _checked(spec: JobSpec, source: str, id_field: str, max_payload: int) -> JobSpec:
    if len(spec.jid.encode()) > 200:
        raise LoadError("job id longer than 200 bytes", source=source, line=spec.line, field=id_field)
    try:
        size = payload_size(spec.payload)
    except UnicodeEncodeError as e:
        raise LoadError(f"payload is not valid Unicode ({e.reason} at position {e.start})", source=source,
                        line=spec.line, field="payload") from None
    if size > max_payload:
        raise LoadError(
            f"payload of {size} bytes is over the {max_payload}-byte limit (max-record-size less the job's own bins)",
            source=source,
            line=spec.line,
            field="payload",
        )
    return spec


def validate(specs: Iterable[JobSpec], source: str, id_field: str = "id") -> int:
    """Check a whole input (duplicate ids) without writing anything; returns the job count."""
    seen: dict[str, int | None] = {}
    n = 0
    for spec in specs:
        first = seen.get(spec.jid, -1)
        if first != -1:
            where = f" (first at line {first})" if first is not None else ""
            raise LoadError(f"duplicate job id {spec.jid!r}{where}", source=source, line=spec.line, field=id_field)
        seen[spec.jid] = spec.line
        n += 1
    return n


def from_iterable(items: Iterable[Any], *, max_payload: int, source: str = "<python>") -> list[JobSpec]:
    """Jobs from Python: JobSpec, (jid, payload) pairs or {'id': ..., 'payload': ...} dicts."""
    out = []
    for i, item in enumerate(items, start=1):
        if isinstance(item, JobSpec):
            spec = JobSpec(item.jid, item.payload, item.line or i)
        elif isinstance(item, tuple) and len(item) == 2:
            spec = JobSpec(str(item[0]), item[1], i)
        elif isinstance(item, dict) and "id" in item:
            spec = JobSpec(str(item["id"]), item.get("payload"), i)
        else:
            raise LoadError(f"expected (id, payload), a JobSpec or a dict with 'id', got {item!r:.80}", source=source, line=i)
        if not spec.jid.strip():
            raise LoadError("empty job id", source=source, line=i, field="id")
        out.append(_checked(spec, source, "id", max_payload))
    validate(out, source)
    return out
