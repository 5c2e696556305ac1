"""A throwaway PostgreSQL cluster for the tests: Debian's postgresql package, initialised in
a temp dir and started on a free loopback port (as the ``postgres`` user when the tests run
as root, which PostgreSQL refuses to run as). ``scripts/test.sh`` installs the package."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
import uuid
from pathlib import Path

from instantml.server.process import free_port

PASSWORD = "instantml-test"


def _bin(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    versions = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    return versions[-1] if versions else None


class Cluster:
    def __init__(self) -> None:
        initdb, pg_ctl = _bin("initdb"), _bin("pg_ctl")
        if not initdb or not pg_ctl:
            raise FileNotFoundError("PostgreSQL is not installed (initdb, pg_ctl)")
        self._pg_ctl = pg_ctl
        self.root = Path(tempfile.mkdtemp(prefix="instantml-pg-"))
        self.data = self.root / "data"
        self.port = free_port()
        self._as = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        if self._as:
            shutil.chown(self.root, "postgres")
        # Password authentication, as a real deployment has (a wrong password is tested).
        password_file = self.root / "password"
        password_file.write_text(PASSWORD + "\n")
        if self._as:
            shutil.chown(password_file, "postgres")
        subprocess.run(
            [*self._as, initdb, "-D", str(self.data), "-A", "scram-sha-256", "-U", "postgres",
             f"--pwfile={password_file}", "--no-sync"],
            check=True, capture_output=True,
        )  # fmt: skip
        options = (
            f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off"
            " -c max_connections=300 -c shared_buffers=64MB"
        )
        subprocess.run(
            [*self._as, pg_ctl, "-D", str(self.data), "-o", options, "-w", "-l",
             str(self.root / "log"), "start"],
            check=True, capture_output=True,
        )  # fmt: skip

    def url(self, database: str = "postgres", password: str = PASSWORD) -> str:
        return f"postgresql://postgres:{password}@127.0.0.1:{self.port}/{database}"

    def new_database(self) -> str:
        """A fresh, empty database: its URL."""
        import psycopg

        name = f"t_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(self.url(), autocommit=True) as con:
            con.execute(f"CREATE DATABASE {name}")
        return self.url(name)

    def stop(self) -> None:
        subprocess.run(
            [*self._as, self._pg_ctl, "-D", str(self.data), "-m", "immediate", "stop"],
            capture_output=True,
        )
        shutil.rmtree(self.root, ignore_errors=True)
