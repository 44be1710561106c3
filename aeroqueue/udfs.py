"""The project's Lua UDF modules: packaged, registered, checked.

The modules ship inside the package (``aeroqueue.lua_udfs``, from the repo's
``lua_udfs/``) and are registered under versioned names: a file
``aq_job_v1.lua`` is module ``aq_job_v1``. A change to a module's contract
gets a new version number, so old and new clients run side by side on one
cluster during a rolling upgrade; a change within a version must keep the
contract, and `verify` refuses a cluster whose copy differs from this
client's (same name, other content). Until the first release the `_v1` modules
change in place (README, "Records"): what they gained since takes trailing
arguments that an older caller leaves out (nil: the old behaviour).
"""

from __future__ import annotations

import functools
import hashlib
import shlex
import time
from dataclasses import dataclass
from importlib import resources
from importlib.resources.abc import Traversable

import aerospike

from . import keys
from .backends import Backend, retry_in_doubt, wrap
from .errors import UDFModulesError

PACKAGE = "aeroqueue.lua_udfs"


@dataclass(frozen=True)
class ModuleStatus:
    name: str  # module name, e.g. "aq_job_v1"
    packaged: str  # sha1 of the packaged source
    registered: str | None  # sha1 of the cluster's copy, None if missing

    @property
    def state(self) -> str:
        if self.registered is None:
            return "missing"
        return "ok" if self.registered == self.packaged else "stale"


def _files() -> dict[str, Traversable]:
    return {
        f.name[: -len(".lua")]: f
        for f in resources.files(PACKAGE).iterdir()
        if f.name.endswith(".lua")
    }


def sha1(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()


def packaged() -> dict[str, str]:
    """Module name -> source, for every Lua module shipped in the package."""
    return {name: f.read_text(encoding="utf-8") for name, f in sorted(_files().items())}


def status(backend: Backend) -> list[ModuleStatus]:
    """Each packaged module, with the hash of the cluster's copy (None when missing)."""
    backend.round_trips += 1
    registered = {entry["name"] for entry in backend.client.udf_list()}
    out = []
    for name, source in packaged().items():
        remote = None
        if name + ".lua" in registered:
            # Compare contents, not the server's hash field, so the check does not
            # depend on how a server version computes its hash.
            backend.round_trips += 1
            remote = sha1(backend.client.udf_get(name + ".lua"))
        out.append(ModuleStatus(name, sha1(source), remote))
    return out


# Indexes the client relies on: (set, bin, index name, type). A store without the
# claims index still works: the reaper and the dashboard then read each session's
# claims with a query of its own. The set indexes (type "set", no bin) only make the
# scans of small sets cheap: measured with 1M jobs in the namespace, a scan of the
# sessions cost the server 350 ms of CPU without one, 3 ms with it.
INDEXES = [
    (keys.JOB_SET, "sess", keys.SESS_INDEX, "string"),
    (keys.JOB_SET, "dl", keys.CLAIMS_INDEX, "numeric"),
    (keys.SESS_SET, "", keys.SESS_SET_INDEX, "set"),
    (keys.LIST_SET, "", keys.LIST_SET_INDEX, "set"),
]


@dataclass(frozen=True)
class Registration:
    """What `register` changed: modules uploaded and indexes created (both empty
    when the cluster was already up to date)."""

    uploaded: list[str]
    indexes: list[str]

    @property
    def changed(self) -> bool:
        return bool(self.uploaded or self.indexes)


def register(backend: Backend, *, wait_s: float = 10.0, force: bool = False) -> Registration:
    """Upload the packaged modules the cluster lacks or holds another version of, and
    create the missing secondary indexes; wait until the cluster serves them.

    Each upload and index creation blocks about 2 s on the real client (it polls the
    cluster until done), so nothing that is already in place is sent again. Both are
    idempotent, and on a cluster still settling (just formed, migrating) the client's
    wait for them can time out: they are repeated then."""
    present = backend.indexes()
    created = []
    for set_name, bin_name, index_name, kind in INDEXES:
        if present.get(index_name) != (set_name, bin_name, kind) and retry_in_doubt(
            functools.partial(backend.create_index, set_name, bin_name, index_name, kind), deadline_s=wait_s * 3
        ):
            created.append(index_name)
    stale = {s.name for s in status(backend) if force or s.state != "ok"}
    uploaded = []
    for name, f in sorted(_files().items()):
        if name not in stale:
            continue
        with resources.as_file(f) as path:
            retry_in_doubt(functools.partial(_udf_put, backend, str(path)), deadline_s=wait_s * 3)
        uploaded.append(name)
    if not uploaded:
        return Registration(uploaded, created)
    # A real cluster distributes modules asynchronously: poll until they all match.
    give_up = time.monotonic() + wait_s
    while True:
        bad = [s for s in status(backend) if s.state != "ok"]
        if not bad:
            return Registration(uploaded, created)
        if time.monotonic() > give_up:
            raise UDFModulesError(
                f"registered UDF modules did not appear on the cluster within {wait_s:.0f}s: "
                + ", ".join(s.name for s in bad)
            )
        time.sleep(0.2)


def _udf_put(backend: Backend, path: str) -> None:
    backend.round_trips += 1
    try:
        backend.client.udf_put(path)
    except aerospike.exception.AerospikeError as e:
        raise wrap(e, "udf_put", path) from e


def verify(backend: Backend) -> None:
    """Refuse to run against a cluster whose modules are missing or stale."""
    bad = [s for s in status(backend) if s.state != "ok"]
    if bad:
        detail = ", ".join(f"{s.name} ({s.state})" for s in bad)
        raise UDFModulesError(f"UDF modules on {backend.url} are not this client's: {detail}; "
                              f"{register_advice(backend)} to upload them")


def register_advice(backend: Backend) -> str:
    """"run `aeroqueue udf register --url URL`" for this store, ready to paste into a
    shell (quoted: a URL's options hold '&'), the password shown as *** (said so)."""
    advice = f"run `aeroqueue udf register --url {shlex.quote(str(backend.url))}`"
    if backend.url.password is not None:
        advice += " (with the password in place of ***)"
    return advice


def ensure(backend: Backend) -> None:
    """Before work: an embedded store registers the packaged modules itself (it is
    this client's own store); a real cluster must have had them registered by an
    operator, and is refused otherwise (`verify`)."""
    if backend.is_embedded:
        register(backend)
    else:
        verify(backend)
