"""The store itself: `aeroqueue init` makes it ready, `aeroqueue config` shows which one is in use."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click
from click.core import ParameterSource

from .. import udfs
from ..config import ENV_URL, MEMORY, resolve_url
from ..hosts import url_host
from .context import JSON_OPT, Context, url_given_after_command


@click.command()
@JSON_OPT
@click.pass_obj
def init(obj: Context, as_json: bool) -> None:
    """Make the store ready: create the embedded store file (its directory must
    exist), or on a server register the Lua modules and the index, like `udf register`.

    Safe to repeat: an existing store is left as it is, with its modules brought
    up to date. --json prints {"url", "backend", "created", "uploaded", "indexes"}.
    """
    url = resolve_url(obj.url)
    created = False
    if url.is_embedded and url.path != MEMORY:
        path = Path(url.path or "")
        created = not path.exists() or (path.is_file() and path.stat().st_size == 0)  # an empty file: made now
    backend = obj.backend(check_udfs=False, create=True)
    done = udfs.register(backend)
    if as_json:
        click.echo(json.dumps({"url": str(backend.url), "backend": url.scheme, "created": created,
                               "uploaded": done.uploaded, "indexes": done.indexes}))
        return
    what = f"created embedded store {url.path}" if created else f"store {backend.url} was there"
    changes = [f"uploaded {', '.join(done.uploaded)}"] if done.uploaded else []
    changes += [f"created index {', '.join(done.indexes)}"] if done.indexes else []
    click.echo(f"{what}; " + ("; ".join(changes) if changes else "its modules and index are up to date"))


@click.command("config")
@JSON_OPT
@click.pass_obj
def show_config(obj: Context, as_json: bool) -> None:
    """Show the store URL in use (credentials masked); --json adds where it came from
    (--url, AEROQUEUE_URL or the default), the file or hosts it names, and the URL's
    options (none of them a secret: credentials go before the host)."""
    url = resolve_url(obj.url)
    ctx = click.get_current_context()
    given = ctx.find_root().get_parameter_source("url")
    source = (
        "default" if obj.url is None
        else ENV_URL if given == ParameterSource.ENVIRONMENT and not url_given_after_command(ctx) else "--url"
    )
    if not as_json:
        click.echo(str(url))
        return
    out: dict[str, Any] = {"url": str(url), "backend": url.scheme, "namespace": url.namespace, "source": source}
    if url.is_embedded:
        out["path"] = url.path
        out["exists"] = url.path == MEMORY or Path(url.path or "").is_file()
    else:
        out["hosts"] = [f"{url_host(h)}:{p}" for h, p in url.hosts]  # "::1:3000" was ambiguous
    out["options"] = dict(url.options)
    click.echo(json.dumps(out))
