"""The committed gRPC stubs are what puller.proto generates (no hand edits, no drift)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
PROTO = Path("walstream/server/puller/puller.proto")
#: What the generator stamps with its own version (a newer grpcio-tools on PyPI changes it,
#: not the stubs): compared without the version.
STAMPS = re.compile(r"(GRPC_GENERATED_VERSION = |# Protobuf Python Version: )\S+")
RUNTIME = re.compile(r"(Domain\.PUBLIC,)\s*\d+,\s*\d+,\s*\d+,")


def _unstamped(text: str) -> str:
    return RUNTIME.sub(r"\1 <version>,", STAMPS.sub(r"\1<version>", text))


def test_the_committed_stubs_are_generated_from_the_proto(tmp_path: Path) -> None:
    from grpc_tools import protoc

    (tmp_path / PROTO.parent).mkdir(parents=True)
    shutil.copy(ROOT / PROTO, tmp_path / PROTO)
    args = ["protoc", f"-I{tmp_path}", f"--python_out={tmp_path}", f"--pyi_out={tmp_path}",
            f"--grpc_python_out={tmp_path}", str(tmp_path / PROTO)]  # fmt: skip
    assert protoc.main(args) == 0
    for name in ("puller_pb2.py", "puller_pb2.pyi", "puller_pb2_grpc.py"):
        generated = _unstamped((tmp_path / PROTO.parent / name).read_text())
        committed = _unstamped((ROOT / PROTO.parent / name).read_text())
        assert committed == generated, f"{name} is not what {PROTO} generates: regenerate it"
