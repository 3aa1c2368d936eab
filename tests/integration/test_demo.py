"""The README's first command: `walstream demo` streams a live workload to files, run after run."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest
import yaml

from walstream.cli.demo import run_demo
from walstream.postgres.embedded import server_home
from walstream.sinks.file import read_messages


@pytest.fixture
def home():
    path = Path(tempfile.mkdtemp(prefix="walstream-demo-"))
    path.chmod(0o755)  # reachable by the unprivileged server user when we are root
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.spark
def test_demo_streams_its_workload_to_files_exactly_once_run_after_run(home, monkeypatch, spark):
    monkeypatch.chdir(home)
    base = Path(".walstream")  # relative, as bin/demo passes it
    said: list[str] = []
    written = 0
    for _ in range(2):  # the second run continues from the first one's checkpoint and slot
        result = run_demo(base, seconds=6, rate=300, progress=said.append, spark=spark)
        assert result.written > 300
        assert result.delivered == result.written  # all of this run's changes, nothing more
        written += result.written
        assert result.total_files_messages == written  # nothing lost or repeated across runs
    messages = [json.loads(m) for m in read_messages(result.output)]
    keys = [m["metadata"]["idempotency_key"] for m in messages]
    assert len(set(keys)) == len(keys)
    assert {m["action"] for m in messages} == {"insert", "update", "delete"}
    per_order: dict[int, list[tuple[int, int]]] = {}
    for m in messages:  # files in batch order: each order's changes in WAL order
        cursor = (m["metadata"]["commit_lsn"], m["metadata"]["commit_idx"])
        per_order.setdefault(m["record"]["id"], []).append(cursor)
    assert all(c == sorted(c) for c in per_order.values())
    assert any(m["metadata"]["transaction_annotations"] for m in messages)
    # The config's comment says how to run it: a command that exists as typed.
    hint = result.config_path.read_text().splitlines()[1]
    program = hint.removeprefix("# Run it yourself with: ").split(" run -c ")[0].split()[0]
    assert shutil.which(program) or Path(program).exists(), hint
    config = yaml.safe_load(result.config_path.read_text())
    assert config["sinks"][0]["destination"] == {"type": "file", "path": str(result.output)}
    assert any("starting embedded PostgreSQL" in s for s in said)
    assert (base / "postgres" / "data" / "PG_VERSION").exists()


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


PLAIN_USER = "walstream-demo"


def _plain_user() -> str:
    """An unprivileged account to run the demo as (made once; root only)."""
    import pwd
    import subprocess

    try:
        pwd.getpwnam(PLAIN_USER)
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin",
                        PLAIN_USER], check=True, capture_output=True)  # fmt: skip
    return PLAIN_USER


@pytest.mark.spark
@pytest.mark.skipif(os.geteuid() != 0, reason="running as root and as another user needs root")
@pytest.mark.parametrize("as_user", ["root", "plain"])
def test_walstream_demo_runs_as_a_command_as_root_and_as_a_plain_user(home, as_user):
    """The README's first command as a newcomer types it: its own process, exit 0, every
    change delivered once; as root (the server runs as another user) and as a plain one."""
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "walstream.cli", "demo", "--seconds", "6", "--rate", "200"]
    env = {**os.environ, "HOME": str(home), "PYTHONDONTWRITEBYTECODE": "1"}
    if as_user == "plain":
        user = _plain_user()
        shutil.chown(home, user)
        cmd = ["runuser", "-u", user, "--", *cmd]
        probe = subprocess.run([*cmd[:4], sys.executable, "-c", "import walstream"],
                               capture_output=True, text=True)  # fmt: skip
        if probe.returncode != 0:  # e.g. a pyenv Python under /root (a Debian one is not)
            pytest.skip(f"{user} cannot run this Python: {probe.stderr.strip()[-200:]}")
    out = subprocess.run(cmd, cwd=home, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    ok = [line for line in out.stdout.splitlines() if line.startswith("ok: ")]
    assert ok, out.stdout[-3000:]
    import re

    found = re.match(r"ok: ([\d,]+) changes written, ([\d,]+) delivered this run", ok[0])
    assert found, ok[0]
    written, delivered = (int(g.replace(",", "")) for g in found.groups())
    assert written > 300 and delivered == written
    messages = [json.loads(m) for m in read_messages(home / ".walstream" / "demo" / "out")]
    keys = [m["metadata"]["idempotency_key"] for m in messages]
    assert len(keys) == written and len(set(keys)) == len(keys)  # each change once
