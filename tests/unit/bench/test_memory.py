"""bench's process-tree memory counts each address space once."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from bench.backlog import one_per_address_space


@pytest.mark.skipif(os.uname().machine not in ("x86_64", "aarch64"), reason="kcmp's number")
def test_a_process_listed_twice_counts_once_and_another_process_counts_too() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                             stdin=subprocess.PIPE)  # fmt: skip
    try:
        me = os.getpid()
        assert one_per_address_space([me, me]) == [me]  # one address space, as a vfork child
        assert one_per_address_space([me, child.pid, me]) == [me, child.pid]
    finally:
        child.communicate(b"")
