"""A sink that lives outside walstream: a module named by a `walstream.sinks` entry point of
its own distribution, written against the public SDK (`walstream.sinks`) as CONTRIBUTING.md's
"Adding a sink" shows, is found, configured, checked and delivers."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SINK = """
import os
from typing import Literal

from walstream.sinks import Message, MessageDestination, MessageSink, SinkError, register


class LogDestination(MessageDestination):
    type: Literal["log"]
    path: str


@register
class LogSink(MessageSink):
    settings_model = LogDestination
    config: LogDestination

    def deliver(self, messages: list[Message]) -> None:
        try:
            with open(self.config.path, "ab") as f:
                for m in messages:
                    f.write((m.value or b"") + b"\\n")
                f.flush()
                os.fsync(f.fileno())
        except OSError as exc:
            raise SinkError(f"cannot append to {self.config.path}: {exc}",
                            "check the path and its disk", retryable=True) from exc

    def test_connection(self) -> None:
        if not os.access(os.path.dirname(self.config.path) or ".", os.W_OK):
            raise SinkError(f"cannot write in {self.config.path}'s directory", "fix the path")
"""

RUN = """
import json, sys
from walstream.config import parse_config
from walstream.sinks import Kind, Message
from walstream.sinks.registry import capabilities, sink_for, sink_types

out = sys.argv[1]
cfg = parse_config({
    "sources": [{"name": "app", "dsn": "postgresql:///app"}],
    "sinks": [{"name": "mine", "source": "app",
               "destination": {"type": "log", "path": out, "retry_timeout": "5s"}}],
})
dest = cfg.sinks[0].destination
sink = sink_for(dest)
sink.test_connection()
sink.deliver([Message(1, 0, b'{"a":1}'), Message(1, 1, b'{"a":2}')])
print(json.dumps({"types": sorted(sink_types()), "kind": str(capabilities(dest).kind),
                  "retry": dest.retry_timeout, "class": type(sink).__name__}))
"""


def test_a_sink_of_another_distribution_is_found_through_its_entry_point(tmp_path: Path) -> None:
    (tmp_path / "my_log_sink.py").write_text(SINK)
    info = tmp_path / "my_log_sink-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: my-log-sink\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[walstream.sinks]\nlog = my_log_sink\n")
    out = tmp_path / "out.log"
    done = subprocess.run(
        [sys.executable, "-c", RUN, str(out)], capture_output=True, text=True, timeout=120,
        env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["class"] == "LogSink" and got["kind"] == "messages" and got["retry"] == 5.0
    assert {"log", "kafka", "delta", "iceberg"} <= set(got["types"])
    assert out.read_bytes() == b'{"a":1}\n{"a":2}\n'


def test_without_the_entry_point_the_type_is_unknown(tmp_path: Path) -> None:
    (tmp_path / "my_log_sink.py").write_text(SINK)
    done = subprocess.run(
        [sys.executable, "-c", RUN, str(tmp_path / "out.log")], capture_output=True, text=True,
        timeout=120, env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert done.returncode != 0
    assert "sinks[0].destination" in done.stderr and "'log'" in done.stderr


def test_the_lake_sinks_register_without_metadata_and_a_broken_entry_point_is_named(
    tmp_path: Path,
) -> None:
    """An executor may run the shipped zip with no walstream metadata (or another
    version's): walstream's own lake sinks are loaded by name, not through its entry
    points. A third-party entry point that cannot be imported says which it is."""
    no_metadata = (
        "import json\n"
        "import walstream.sinks.registry as r\n"
        "r.entry_points = lambda group: []\n"
        "print(json.dumps(sorted(r.sink_types())))\n"
    )
    done = subprocess.run([sys.executable, "-c", no_metadata], capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert {"delta", "iceberg", "kafka", "postgres"} <= set(json.loads(done.stdout))
    info = tmp_path / "broken_sink-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-sink\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[walstream.sinks]\nbroken = no_such_module_here\n")
    done = subprocess.run(
        [sys.executable, "-c", "from walstream.sinks.registry import sink_types; sink_types()"],
        capture_output=True, text=True, timeout=120,
        env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert done.returncode != 0
    assert "the sink module 'no_such_module_here' (entry point 'broken'" in done.stderr
