"""The services the project's tests rely on: skipped locally when missing, a failure in CI."""

from __future__ import annotations

import subprocess

import mysql.connector


def test_mysql_answers(mysql_available):
    conn = mysql.connector.connect(host="127.0.0.1", port=3306, user="root", password="", database="test")
    try:
        cur = conn.cursor()
        cur.execute("SELECT %s + 1", (41,))
        assert cur.fetchone()[0] == 42
    finally:
        conn.close()


def test_java_runs_for_spark(java):
    out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0
    assert "version" in out.stderr + out.stdout
