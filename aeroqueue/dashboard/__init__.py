"""The web dashboard: `aeroqueue dashboard`, or `create_app()` under any WSGI server.

Needs the ``dashboard`` extra (Flask, Flask-WTF and Flask-Compress): ``pip install 'aeroqueue[dashboard]'``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from flask import Flask

    from ..backends import Backend


def create_app(store: Backend | str | None = None, **kw: Any) -> Flask:
    """See `aeroqueue.dashboard.app.create_app`."""
    from .app import create_app as make

    return make(store, **kw)


__all__ = ["create_app"]
