"""A throw-away PostgreSQL server for the tests: the system's binaries, else the ``pgserver`` wheel's.

The server lives in a temporary folder, listens on a free TCP port of 127.0.0.1 only, trusts local
connections, and is stopped and removed at the end of the session. PostgreSQL refuses to run as root,
so under root (containers, CI) it runs as ``nobody``, from a private copy of the binaries where the
wheel's own folder is not reachable by that user (a site-packages under /root).
"""
from __future__ import annotations

import glob
import importlib.util
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

#: Where PostgreSQL's programs are looked for, in order: $PATH, Debian's layout, the pip wheel.
SYSTEM_GLOBS = ("/usr/lib/postgresql/*/bin", "/usr/pgsql-*/bin", "/opt/homebrew/opt/postgresql*/bin")
RUN_AS_WHEN_ROOT = "nobody"
PROGRAMS = ("initdb", "pg_ctl", "postgres")


def find_bin_dir() -> tuple[Path | None, str]:
    """A folder holding initdb, pg_ctl and postgres, or None and why not."""
    candidates: list[Path] = []
    on_path = shutil.which("pg_ctl")
    if on_path:
        candidates.append(Path(os.path.realpath(on_path)).parent)
    for pattern in SYSTEM_GLOBS:
        candidates += [Path(p) for p in sorted(glob.glob(pattern), reverse=True)]
    wheel = importlib.util.find_spec("pgserver")  # found, not imported: importing it sets up state we do not use
    if wheel is not None and wheel.origin:
        candidates.append(Path(wheel.origin).parent / "pginstall" / "bin")
    for folder in candidates:
        if all((folder / name).is_file() for name in PROGRAMS):
            return folder, ""
    return None, ("no PostgreSQL server: neither initdb/pg_ctl/postgres on PATH or in /usr/lib/postgresql/*/bin "
                  "nor the pgserver wheel (pip install -e .[test])")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PgServer:
    """One PostgreSQL cluster in a temporary folder; ``url`` is its SQLAlchemy URL."""

    def __init__(self, bin_dir: Path) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="fusetune-pg-"))
        try:
            self._create(bin_dir)
        except BaseException:
            shutil.rmtree(self.root, ignore_errors=True)
            raise

    def _create(self, bin_dir: Path) -> None:
        self.user = None
        if os.geteuid() == 0:
            entry = pwd.getpwnam(RUN_AS_WHEN_ROOT)
            self.user = entry.pw_uid
            os.chown(self.root, entry.pw_uid, entry.pw_gid)
            if not self._runs(bin_dir):  # the wheel under /root: copy its install where nobody can read it
                bin_dir = self._copy_install(bin_dir)
        self.bin_dir = bin_dir
        self.data = self.root / "data"
        self.port = free_port()
        self.url = f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "-A", "trust", "-E", "UTF8",
                  "--no-sync", "--locale=C")
        with open(self.data / "postgresql.conf", "a") as conf:
            conf.write(f"\nport = {self.port}\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = ''\n"
                       "fsync = off\nsynchronous_commit = off\nfull_page_writes = off\nmax_connections = 200\n")
        self.start()

    def _copy_install(self, bin_dir: Path) -> Path:
        """Copy the wheel's server (``<site>/pgserver/pginstall``) and the libraries its programs find
        through their RPATH (``$ORIGIN/../../../pgserver.libs``) into the server's folder."""
        install = bin_dir.parent
        site, copy = install.parent.parent, self.root / "install"
        target = copy / install.parent.name / install.name
        for part in ("bin", "lib", "share"):
            shutil.copytree(install / part, target / part, symlinks=True)
        for libs in site.glob(f"{install.parent.name}.libs"):
            shutil.copytree(libs, copy / libs.name, symlinks=True)
        subprocess.run(["chmod", "-R", "a+rX", str(copy)], check=True)
        return target / "bin"

    def _runs(self, bin_dir: Path) -> bool:
        try:
            return subprocess.run([str(bin_dir / "postgres"), "--version"], user=self.user,
                                  capture_output=True, timeout=30).returncode == 0
        except (OSError, subprocess.SubprocessError):
            return False

    def _run(self, program: str, *args: str) -> None:
        done = subprocess.run([str(self.bin_dir / program), *args], user=self.user, capture_output=True,
                              text=True, timeout=120, cwd=self.root)
        if done.returncode != 0:
            raise RuntimeError(f"{program} {' '.join(args)} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"
                               f"\n{self.log_tail()}")

    def log_tail(self) -> str:
        log = self.root / "server.log"
        return log.read_text(errors="replace")[-3000:] if log.exists() else ""

    def start(self) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.root / "server.log"), "-w", "-t", "60", "start")

    def stop(self) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")

    def restart(self) -> None:
        """Drop every connection, as a crash or failover would, and come back on the same port."""
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.root / "server.log"), "-m", "fast", "-w",
                  "-t", "60", "restart")

    def fresh_database(self, name: str) -> str:
        """A new, empty database; its URL."""
        import sqlalchemy

        engine = sqlalchemy.create_engine(self.url, isolation_level="AUTOCOMMIT")
        with engine.connect() as conn:
            conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
        engine.dispose()
        return self.url.rsplit("/", 1)[0] + f"/{name}"

    def close(self) -> None:
        try:
            self.stop()
        except (RuntimeError, OSError, subprocess.SubprocessError):
            pass
        shutil.rmtree(self.root, ignore_errors=True)
