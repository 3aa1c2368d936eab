"""The README's first command: the embedded demo makes and decodes its changes, run after run."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from walstream.demo import run_demo
from walstream.postgres.embedded import server_home


@pytest.fixture
def home():
    path = Path(tempfile.mkdtemp(prefix="walstream-demo-"))
    path.chmod(0o755)  # reachable by the unprivileged server user when we are root
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_demo_runs_twice_on_its_own_server(home, monkeypatch):
    monkeypatch.chdir(home)
    tmp_path = Path(".walstream")  # relative, as bin/demo passes it
    messages: list[str] = []
    last_lsn = -1
    for _ in range(2):
        result = run_demo(tmp_path, progress=messages.append)
        assert not [f for f in result.findings if f.level == "error"]
        assert [c.action for c in result.changes] == ["insert"] * 3 + [
            "update",
            "delete",
            "truncate",
        ]
        lines = [json.loads(line) for line in result.output.read_text().splitlines()]
        assert len(lines) == 6
        first_id = lines[0]["record"]["id"]
        assert [line["pk"] for line in lines[:5]] == [
            [str(first_id)], [str(first_id + 1)], [str(first_id + 2)], [str(first_id)], [str(first_id + 1)],
        ]  # fmt: skip
        assert lines[0]["annotations"] == {"username": "demo", "reason": "walstream demo"}
        assert lines[3]["old"]["status"] == "new" and lines[3]["record"]["status"] == "paid"
        assert lines[4]["record"]["customer"] == f"customer-{2}"
        # each run sees only its own changes: the slot advanced past the previous run
        assert min(c.lsn for c in result.changes) > last_lsn
        last_lsn = max(c.lsn for c in result.changes)
    assert any("starting embedded PostgreSQL" in m for m in messages)
    assert (tmp_path / "postgres" / "data" / "PG_VERSION").exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="the fallback exists for root only")
def test_server_home_falls_back_when_root_hands_the_server_to_a_user_who_cannot_enter(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o700)
    chosen = server_home(locked / "postgres")
    assert chosen.parent == Path("/var/tmp") and chosen.name.startswith("walstream-")
    assert server_home(locked / "postgres") == chosen  # stable across runs
    open_dir = Path(tempfile.mkdtemp())
    try:
        open_dir.chmod(0o755)
        assert server_home(open_dir / "postgres") == open_dir / "postgres"
    finally:
        open_dir.rmdir()
