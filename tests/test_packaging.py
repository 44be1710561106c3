"""The wheel carries the Lua UDFs, and the package finds them with importlib.resources."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from aeroqueue import udfs

ROOT = Path(__file__).resolve().parents[1]


def test_packaged_modules_are_the_repo_lua_files():
    on_disk = {p.stem: p.read_text() for p in (ROOT / "lua_udfs").glob("*.lua")}
    assert on_disk and udfs.packaged() == on_disk


def test_every_lua_module_opens_with_a_documented_header():
    for name, source in udfs.packaged().items():
        lines = source.splitlines()
        assert lines[0].startswith(f"-- {name}:"), f"{name}.lua must open with its header"
        header = "\n".join(line for line in lines[: next(i for i, x in enumerate(lines) if not x.startswith("--"))])
        assert "Keyspace" in header, f"{name}.lua header documents its keyspace"
        # Each UDF entry point is documented in a comment right above it.
        for i, line in enumerate(lines):
            if line.startswith("function "):
                assert lines[i - 1].startswith("--"), f"{name}.lua: {line!r} has no documenting comment"


@pytest.mark.slow
def test_wheel_contains_the_lua_files(tmp_path):
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp_path), str(ROOT)],
        check=True, capture_output=True, timeout=300,
    )
    [wheel] = tmp_path.glob("aeroqueue-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for module in udfs.packaged():
        assert f"aeroqueue/lua_udfs/{module}.lua" in names
    assert "aeroqueue/backends/embedded/prelude.lua" in names
    assert "aeroqueue/sync_schema/schema.sql" in names, "aeroqueue sync migrates from the wheel's copy"
    # The dashboard serves its pages and assets from the package (no CDN).
    dashboard = ROOT / "aeroqueue" / "dashboard"
    for path in [*dashboard.glob("templates/*.html"), *dashboard.glob("static/*")]:
        assert f"aeroqueue/dashboard/{path.relative_to(dashboard)}" in names, path.name
