"""Runs Lua UDF modules the way an Aerospike 8.1 server does, on lupa's Lua 5.4.

Aerospike's Lua API (``record``, ``aerospike``, ``list``, ``map``, ``bytes``,
the log functions) is implemented in Lua, in ``prelude.lua``; this module
compiles UDF modules into sandboxes, converts values between Python and Lua
and turns what a call did into a :class:`UdfOutcome`.

Bins are converted to Lua only when the UDF reads them, and only the bins the
UDF writes are converted back: a UDF that reads three integers and writes one
crosses the Python/Lua boundary about five times.
"""

from __future__ import annotations

import threading
from importlib import resources
from typing import Any

from lupa import lua54

from .types import CITRUSLEAF_EPOCH_MS, RecordView, UdfFailure, UdfOutcome

__all__ = ["LuaRuntime"]

_LuaTable = type(lua54.LuaRuntime().table())
# Lists and maps cross to and from Lua in slices of this many elements.
_CHUNK = 4096
# Deeper nesting than this is taken for a cycle (a list that contains itself).
_MAX_DEPTH = 256
_NO_BINS: dict[str, Any] = {}
_STR = frozenset((str,))
_NUMERIC = frozenset((int, float, bool, type(None)))
_NUMERIC_OR_STR = _NUMERIC | _STR
_UNEXPECTED = "result value type unexpected"


def _deny_attributes(obj: Any, name: Any, is_setting: bool) -> Any:
    # Lua code never needs to reach into a Python object.
    raise AttributeError(name)


def _cstr(s: str) -> str:
    # The server hands strings to Lua as C strings: they end at the first NUL.
    if "\x00" in s:
        return s[: s.index("\x00")]
    return s


def _hashable(k: Any) -> Any:
    # Map keys must be hashable in Python; a blob key becomes bytes.
    if isinstance(k, bytearray):
        return bytes(k)
    if isinstance(k, list):
        return tuple(_hashable(x) for x in k)
    if isinstance(k, dict):
        return tuple((_hashable(a), _hashable(b)) for a, b in k.items())
    return k


class LuaRuntime:
    """Runs registered UDF modules with Aerospike's Lua API. Thread-safe (internal lock), one per process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lua = lua54.LuaRuntime(
            unpack_returned_tuples=True,
            register_eval=False,
            register_builtins=False,
            attribute_filter=_deny_attributes,
        )
        # The record of the call under way, read by the bin callbacks.
        self._bins: dict[str, Any] = _NO_BINS
        # An exception raised in a Python callback, re-raised after the call.
        self._callback_error: BaseException | None = None
        # module -> (source hash, sandbox or None, compile error or None)
        self._modules: dict[str, tuple[str, Any, str | None]] = {}

        source = resources.files(__package__).joinpath("prelude.lua").read_text(encoding="utf-8")
        loaded = self._lua.globals().load(source, "@prelude.lua", "t")
        if isinstance(loaded, tuple):
            raise RuntimeError(f"prelude.lua does not compile: {loaded[1]}")
        api = loaded(self._get_bin, self._bin_names)
        self._compile = api["compile"]
        self._invoke = api["invoke"]
        self._describe = api["describe"]
        self._list_items = api["list_items"]
        self._list_items_exported = api["list_items_exported"]
        self._map_items = api["map_items"]
        self._map_items_exported = api["map_items_exported"]
        self._new_list = api["new_list"]
        self._new_map = api["new_map"]
        self._new_bytes = api["new_bytes"]
        self._table_from = self._lua.table_from

    # -- public API ---------------------------------------------------------

    def call(
        self,
        module: str,
        source: str,
        source_hash: str,
        function: str,
        record: RecordView,
        args: list,
    ) -> UdfOutcome:
        """Run ``module.function(rec, *args)`` on ``record``.

        Raises :class:`UdfFailure` with the server's message when the UDF
        fails (nothing is written then).
        """
        with self._lock:
            env = self._sandbox(module, source, source_hash)
            exists = record.exists
            key = record.user_key
            if key is not None:
                key = self._to_lua(key)
            lut = record.last_update_ms - CITRUSLEAF_EPOCH_MS if exists and record.last_update_ms else 0
            lua_args = [self._to_lua(a) for a in args]
            self._bins = record.bins if exists else _NO_BINS
            self._callback_error = None
            try:
                ret = self._invoke(
                    env, function, exists, record.gen, record.ttl_seconds, max(lut, 0),
                    record.digest, record.set_name or None, key, record.now_ms, *lua_args,
                )
            finally:
                self._bins = _NO_BINS
            if self._callback_error is not None:
                error, self._callback_error = self._callback_error, None
                raise error
            return self._outcome(ret, record)

    def compile_error(self, module: str, source: str) -> str | None:
        """The error loading ``source`` as ``module`` (as Lua reports it), or None if it loads."""
        with self._lock:
            ok, result = self._compile(module, source)
            return None if ok else str(result)

    # -- modules ------------------------------------------------------------

    def _sandbox(self, module: str, source: str, source_hash: str) -> Any:
        cached = self._modules.get(module)
        if cached is None or cached[0] != source_hash:
            ok, result = self._compile(module, source)
            cached = (source_hash, result, None) if ok else (source_hash, None, str(result))
            self._modules[module] = cached
        if cached[2] is not None:
            raise UdfFailure(cached[2])
        return cached[1]

    # -- outcome ------------------------------------------------------------

    def _outcome(self, ret: Any, record: RecordView) -> UdfOutcome:
        if type(ret) is not tuple:
            ret = (ret,)
        status = ret[0]
        if status != 0:
            if status == 2:
                raise UdfFailure("function not found")
            message = ret[1] if len(ret) > 1 else None
            if message is None:
                raise UdfFailure(_UNEXPECTED)
            if status == 3:
                message = bytes.fromhex(message).decode("utf-8", "replace")
            raise UdfFailure(message)

        result = self._to_py(ret[1])
        ttl = ret[3]
        if ttl is not None and ttl >= 0x80000000:
            # the server keeps the ttl as uint32: -1 (never expire) and -2
            # (do not change) come back as the client spells them
            ttl -= 0x100000000
        if not ret[2]:
            return UdfOutcome(result=result, ttl=ttl)

        bins = dict(record.bins) if record.exists else {}
        changes = ret[4:]
        for i in range(0, len(changes), 2):
            name, value = changes[i], changes[i + 1]
            if value is None:
                bins.pop(name, None)
            else:
                bins[name] = self._to_py(value)
        # The server deletes a record left without bins.
        action = "write" if bins else "remove"
        return UdfOutcome(result=result, action=action, bins=bins if bins else None, ttl=ttl)

    # -- callbacks from Lua -------------------------------------------------

    def _get_bin(self, name: str) -> Any:
        # An exception must not reach Lua: UDF code could catch it with pcall
        # and hold a Python object. It is kept and re-raised after the call.
        try:
            v = self._bins.get(name)
            t = type(v)
            if t is int or t is float or t is bool or v is None:
                return v
            return self._to_lua(v)
        except BaseException as exc:
            self._callback_error = exc
            return None

    def _bin_names(self) -> tuple[str, ...]:
        try:
            return tuple(self._bins)
        except BaseException as exc:
            self._callback_error = exc
            return ()

    # -- conversions --------------------------------------------------------

    def _to_lua(self, v: Any) -> Any:
        t = type(v)
        if t is int or t is float or t is bool or v is None:
            return v
        if t is str:
            return _cstr(v)
        if t is bytes or t is bytearray or t is memoryview:
            return self._new_bytes(bytes(v))
        if t is list or t is tuple:
            return self._new_list(self._lua_items(v), len(v))
        if t is dict:
            keys = self._lua_items(list(v))
            values = self._lua_items(list(v.values()))
            return self._new_map(keys, values, len(v))
        raise TypeError(f"a {t.__name__} cannot be given to a Lua UDF")

    def _lua_items(self, items: list | tuple) -> Any:
        """A Lua array of the converted items (nil for None)."""
        types = set(map(type, items))
        # table_from converts numbers, booleans and strings in one C loop;
        # only strings holding a NUL (cut short in Lua) and containers need
        # converting one by one.
        if types <= _NUMERIC:
            return self._table_from(items)
        if types <= _NUMERIC_OR_STR:
            if types == _STR:
                clean = "\x00".join(items).count("\x00") == len(items) - 1
            else:
                clean = not any("\x00" in x for x in items if type(x) is str)
            if clean:
                return self._table_from(items)
        return self._table_from([self._to_lua(x) for x in items])

    def _to_py(self, v: Any, depth: int = 0) -> Any:
        if type(v) is not _LuaTable:
            return v
        if depth > _MAX_DEPTH:
            raise UdfFailure(_UNEXPECTED)
        kind, info = self._describe(v)
        if kind == "L":
            out: list[Any] = []
            for i in range(1, info + 1, _CHUNK):
                j = min(i + _CHUNK - 1, info)
                items = self._fetch(self._list_items, self._list_items_exported, v, i, j)
                if items[0]:
                    out.extend(items[1:])
                else:
                    out.extend(self._to_py(x, depth + 1) if type(x) is _LuaTable else x for x in items[1:])
            return out
        if kind == "M":
            d: dict[Any, Any] = {}
            for i in range(1, info + 1, _CHUNK):
                j = min(i + _CHUNK - 1, info)
                items = self._fetch(self._map_items, self._map_items_exported, v, i, j)
                if items[0]:
                    d.update(zip(items[1::2], items[2::2], strict=True))
                    continue
                for n in range(1, len(items), 2):
                    k, x = items[n], items[n + 1]
                    if type(k) is _LuaTable:
                        k = _hashable(self._to_py(k, depth + 1))
                    d[k] = self._to_py(x, depth + 1) if type(x) is _LuaTable else x
            return d
        if kind == "B":
            return bytearray(info.encode("utf-8"))
        if kind == "X":
            return bytearray.fromhex(info)
        if kind == "S":
            return bytes.fromhex(info).decode("utf-8", "replace")
        return None

    @staticmethod
    def _fetch(fast: Any, exported: Any, v: Any, i: int, j: int) -> tuple:
        """Items i..j of a list or map: ``(True, *plain values)`` when the fast
        form applies, else ``(False, *exported values)``."""
        try:
            items = fast(v, i, j)
        except UnicodeDecodeError:
            items = False
        if items is False:
            return (False, *exported(v, i, j)[1:])
        return items
