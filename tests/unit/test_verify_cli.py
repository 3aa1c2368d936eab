"""`walstream verify`'s exit codes when no verdict is reached: a failure is 2 (never 1, which
says the sink differs), Ctrl-C is 130 and says the next verification resumes it."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from walstream.cli import app


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "walstream.yaml"
    path.write_text(yaml.safe_dump({
        "sources": [{"name": "app", "dsn": "postgresql://u@127.0.0.1:1/app", "slot": "s",
                     "publication": "p"}],
        "sinks": [{"name": "pg", "source": "app",
                   "destination": {"type": "postgres", "dsn": "postgresql://u@127.0.0.1:1/m"}}],
    }))  # fmt: skip
    return path


@pytest.mark.parametrize(
    ("raised", "code", "said"),
    [
        (RuntimeError("boom"), 2, "the comparison failed: RuntimeError: boom"),
        (KeyboardInterrupt(), 130, "interrupted: `walstream verify pg` resumes it"),
    ],
)
def test_no_verdict_is_no_difference(config, monkeypatch, raised, code, said):
    import walstream.verify.job

    def fails(*args, **kwargs):
        raise raised

    monkeypatch.setattr(walstream.verify.job, "verify_sink", fails)
    result = CliRunner().invoke(app, ["verify", "pg", "-c", str(config)])
    assert result.exit_code == code, result.output
    assert said in " ".join(result.output.split())
