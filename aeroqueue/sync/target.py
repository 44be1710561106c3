"""Where a sync copies to: a MySQL database (or a SQLite file), and the mark that names it.

A job record carries one mark per target it was copied to: a bin named after
a hash of the target's place (dialect, host, port, database, table: never the
user or password) and of the id the sync keeps in the target (table
``sync_target``), holding the ``done_at`` of the version copied. So a job
copied to one database is still unsynced for another, and for a database
made anew at the same place (a new id); a job kicked and processed again (a
new ``done_at``) is unsynced everywhere without anyone clearing a mark.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from urllib.parse import quote, urlsplit

from ..config import (
    CREDENTIALS_ENCODING,
    MEMORY,
    StoreURL,
    decoded_credential,
    mask_passwords,
    mask_url,
    unencoded_in_credentials,
)
from ..errors import SyncError

ENV_PASSWORD = "AEROQUEUE_MYSQL_PASSWORD"
ENV_MYSQL_PWD = "MYSQL_PWD"  # what the mysql command-line tools read
DEFAULT_PORT = 3306
JOBS_TABLE = "aq_jobs"
# Mark bins: "sync_" and 10 hex digits of the target's hash, 15 bytes (Aerospike's limit).
MARK_PREFIX = "sync_"
_DB_NAME = re.compile(r"^[A-Za-z0-9_$]{1,64}$")


@dataclass(frozen=True)
class Target:
    """Where the copy goes: a MySQL database, or a SQLite file. ``str()`` never shows the password."""

    dialect: str  # "mysql" or "sqlite"
    host: str = ""
    port: int = DEFAULT_PORT
    user: str = ""
    password: str | None = field(default=None, repr=False)
    database: str = ""
    path: str = ""  # sqlite
    # The copy's id, read from the target once its schema is migrated (`schema.target_id`);
    # empty for a target made before ids, whose marks name its place alone.
    target_id: str = ""

    def __str__(self) -> str:
        if self.dialect == "sqlite":
            return f"sqlite://{self.path}"
        who = f"{self.user}:***@" if self.password else (f"{self.user}@" if self.user else "")
        return f"mysql://{who}{self.host}:{self.port}/{self.database}"

    @property
    def place(self) -> str:
        """The table's address, without credentials: what the mark names."""
        if self.dialect == "sqlite":
            return f"sqlite://{os.path.abspath(self.path)}/{JOBS_TABLE}"
        return f"mysql://{self.host.lower()}:{self.port}/{self.database}/{JOBS_TABLE}"

    @property
    def mark_bin(self) -> str:
        """The job bin that says which version of the job this target holds: named
        after the place and the copy's id, so a database dropped and made again at
        the place, which has another id, holds nothing the marks of the old one say.
        The place stays in it: a copy of the database elsewhere (a backup restored
        into another database) carries the id, and is not the target that holds the
        jobs marked."""
        named = f"{self.place}#{self.target_id}" if self.target_id else self.place
        return MARK_PREFIX + hashlib.sha1(named.encode()).hexdigest()[:10]

    @property
    def lease_name(self) -> str:
        """One sync at a time per target (two targets may sync at once): by the place,
        known before the target is connected to."""
        return "sync:" + hashlib.sha1(self.place.encode()).hexdigest()[:10]

    def redact(self, text: str) -> str:
        """`text` with this target's password masked, wherever it appears."""
        return redact(text, self.password)


def redact(text: str, *secrets: str | None) -> str:
    """Mask secrets in text meant for people: the password as given and
    percent-encoded (as it would appear in a URL), and any user:password@ in URLs."""
    text = mask_passwords(text)
    for secret in secrets:
        if secret:
            for form in {secret, quote(secret, safe="")}:
                text = text.replace(form, "***")
    return text


def parse_target(text: str) -> Target:
    """``mysql://user[:password]@host[:port]/db`` or ``sqlite:///abs/path.db``."""
    shown = redact(mask_url(text))  # the URL as errors show it
    scheme, sep, _ = text.partition("://")
    if not sep:
        raise SyncError(f"target URL {shown!r}: expected mysql://user@host:3306/db or sqlite:///path/sync.db")
    if scheme == "sqlite":
        path = text[len("sqlite://"):]
        if not path.startswith("/") or path.endswith("/"):
            raise SyncError(f"target URL {shown!r}: a SQLite target needs an absolute file path (sqlite:///abs/path.db)")
        return Target(dialect="sqlite", path=path)
    if scheme != "mysql":
        raise SyncError(f"target URL {shown!r}: unknown scheme {scheme!r}; expected 'mysql' or 'sqlite'")
    if unencoded_in_credentials(text):
        raise SyncError(f"target URL {shown!r}: {CREDENTIALS_ENCODING}")
    try:
        parts = urlsplit(text)
        port = parts.port or DEFAULT_PORT
    except ValueError:
        raise SyncError(f"target URL {shown!r}: the port is not a number from 1 to 65535") from None
    if parts.query or parts.fragment:
        raise SyncError(f"target URL {shown!r}: options after '?' or '#' are not supported")
    if not parts.hostname:
        raise SyncError(f"target URL {shown!r}: no host; expected mysql://user@host:3306/db")
    if not parts.username:
        raise SyncError(f"target URL {shown!r}: no user; expected mysql://user@host:3306/db")
    database = parts.path.lstrip("/")
    if not _DB_NAME.fullmatch(database):
        raise SyncError(
            f"target URL {shown!r}: database name {database!r} must be 1 to 64 letters, digits, '_' or '$'"
        )
    try:
        user = decoded_credential(parts.username, "user name")
        password = decoded_credential(parts.password, "password") if parts.password is not None else None
    except ValueError as e:
        raise SyncError(f"target URL {shown!r}: {e}") from None
    if password is None:
        password = os.environ.get(ENV_PASSWORD) or os.environ.get(ENV_MYSQL_PWD)
    return Target(
        dialect="mysql", host=parts.hostname, port=port, user=user, password=password, database=database,
    )


# -- the demo store: the one store whose target is known without --mysql ----------------


def demo_marker(store: StoreURL) -> Path | None:
    """The file beside an embedded store that `make demo` writes: store.db -> store.demo.json."""
    if not store.is_embedded or store.path in (None, MEMORY):
        return None
    path = Path(str(store.path))
    return path.with_name(path.stem + ".demo.json")


def remember_demo_target(store: StoreURL, target_url: str) -> None:
    """The demo says where it synced, so a later `aeroqueue sync` on its store goes there too."""
    marker = demo_marker(store)
    if marker is None:
        raise SyncError(f"{store} is not an embedded store with a file")
    # Without the password: a later run reads it from the environment, as always.
    marker.write_text(json.dumps({"target": str(replace(parse_target(target_url), password=None))}) + "\n")


def demo_target(store: StoreURL) -> Target | None:
    """The target the demo used for this store, or None if it is not the demo's store."""
    marker = demo_marker(store)
    if marker is None or not marker.is_file():
        return None
    try:
        url = json.loads(marker.read_text())["target"]
    except (ValueError, KeyError, TypeError):
        raise SyncError(f"{marker}: not a demo marker (expected {{\"target\": URL}}); give --mysql") from None
    return parse_target(str(url))
