"""Server errors as the real client raises them, for the embedded store's interpreters."""

from __future__ import annotations

from aerospike import exception as _exc

__all__ = ["server_error"]

_NODE = "embedded:0"


def server_error(cls_name: str, code: int, text: str) -> Exception:
    """An `aerospike.exception.<cls_name>` shaped like the one the real client raises.

    The client builds its exceptions with positional args (code, msg, file,
    line, in_doubt) *and* sets the attributes; constructing one with args alone
    leaves `.msg` None, so both are done here. `msg` carries a node prefix as a
    real client's does, so callers that match messages match their end.
    """
    cls = getattr(_exc, cls_name)
    msg = f"{_NODE} {text}"
    err = cls(code, msg, None, None, False)
    err.code = code
    err.msg = msg
    err.file = None
    err.line = None
    err.in_doubt = False
    return err
