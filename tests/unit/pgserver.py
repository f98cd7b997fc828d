# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A real, throwaway PostgreSQL server for the throughput history tests.

Debian's ``postgresql`` package (scripts/bootstrap installs it): its ``initdb`` makes a cluster in a temporary directory
and its ``pg_ctl`` starts it on a free port of 127.0.0.1, with SCRAM password authentication over TCP (the way a
controller reaches the fleet's database), TLS with a self-signed certificate for ``localhost`` and 127.0.0.1
(``self.cert``: what a client gives as ``sslrootcert``; plain TCP is accepted too) and an ICU English collation where the server has ICU (so that a query that
sorts text in the database's collation instead of byte order shows up as a different report). PostgreSQL refuses to run
as root: as root the cluster belongs to ``nobody`` and every server command runs as that user (``setpriv``). Stopped
(immediate) and removed after the tests. About 2 s to start on the 2-core development machine.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

import pytest

from tests.unit.plugins.modules.uthelper import REQUIRE_TOOLS

SUPERUSER = "gpufleet_test"
PASSWORD = "s3cret-Pa55:with/odd@chars"  # a URL must quote it; messages must never show it


def bindir() -> str | None:
    """Debian's server programs (/usr/lib/postgresql/VERSION/bin, the newest), or initdb on PATH."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(p.split("/")[4]))
    if found:
        return os.path.dirname(found[-1])
    on_path = shutil.which("initdb")
    return os.path.dirname(on_path) if on_path else None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PgServer:
    """One cluster: ``start()``, ``url(database)``, ``create_database(name)``, ``stop()``."""

    def __init__(self, bin_dir: str):
        self.bin = bin_dir
        self.base = Path(tempfile.mkdtemp(prefix="gpufleet-pg-"))
        self.port = free_port()
        self.prefix: list[str] = []
        if os.geteuid() == 0:
            nobody = pwd.getpwnam("nobody")
            os.chown(self.base, nobody.pw_uid, nobody.pw_gid)
            self.prefix = ["setpriv", f"--reuid={nobody.pw_uid}", f"--regid={nobody.pw_gid}", "--clear-groups", "--"]
            self.owner = (nobody.pw_uid, nobody.pw_gid)
        else:
            self.owner = (os.getuid(), os.getgid())

    def _run(self, *argv: str) -> str:
        proc = subprocess.run(self.prefix + list(argv), capture_output=True, text=True, timeout=60,
                              env={"PATH": "/usr/bin:/bin", "LC_ALL": "C.UTF-8"}, check=False)
        if proc.returncode:
            log = self.base / "server.log"
            raise RuntimeError(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr or proc.stdout}"
                               + (f"\nserver log:\n{log.read_text()}" if log.exists() else ""))
        return proc.stdout

    def start(self) -> "PgServer":
        pwfile = self.base / "pw"
        pwfile.write_text(PASSWORD + "\n")
        os.chown(pwfile, *self.owner)
        icu = self._has_icu()
        self._run(f"{self.bin}/initdb", "-D", str(self.base / "data"), "-U", SUPERUSER, f"--pwfile={pwfile}",
                  "--auth-local=scram-sha-256", "--auth-host=scram-sha-256", "-E", "UTF8", "--no-sync",
                  *(["--locale-provider=icu", "--icu-locale=en-US", "--locale=C.UTF-8"] if icu else ["--locale=C.UTF-8"]))
        self.icu = icu
        self._certificate()
        opts = (f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.base} -c fsync=off -c synchronous_commit=off "
                "-c full_page_writes=off -c shared_buffers=16MB -c max_connections=40 "
                f"-c ssl=on -c ssl_cert_file={self.cert} -c ssl_key_file={self.base / 'server.key'}")
        self._run(f"{self.bin}/pg_ctl", "-D", str(self.base / "data"), "-l", str(self.base / "server.log"), "-w",
                  "-t", "60", "-o", opts, "start")
        return self

    def _certificate(self) -> None:
        """A self-signed certificate for localhost and 127.0.0.1 (openssl), the key readable by the server only."""
        self.cert = self.base / "server.crt"
        key = self.base / "server.key"
        subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                        "-days", "2", "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1",
                        "-keyout", str(key), "-out", str(self.cert)], capture_output=True, check=True, timeout=60)
        for path in (key, self.cert):
            os.chown(path, *self.owner)
        os.chmod(key, 0o600)

    def _has_icu(self) -> bool:
        out = subprocess.run([f"{self.bin}/initdb", "--help"], capture_output=True, text=True, check=False).stdout
        return "--locale-provider" in out

    def url(self, database: str = "postgres", password: bool = True) -> str:
        from urllib.parse import quote
        secret = f":{quote(PASSWORD, safe='')}" if password else ""
        return f"postgresql://{SUPERUSER}{secret}@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str) -> str:
        """A new, empty database; its URL (with the password)."""
        from ansible_collections.gpufleet.inference.plugins.module_utils.bench.history_db import open_database
        db = open_database(self.url())
        try:
            db.execute(f'CREATE DATABASE "{name}"')
        finally:
            db.close()
        return self.url(name)

    def stop(self) -> None:
        try:
            self._run(f"{self.bin}/pg_ctl", "-D", str(self.base / "data"), "-m", "immediate", "-w", "stop")
        finally:
            shutil.rmtree(self.base, ignore_errors=True)


@pytest.fixture(scope="module")
def pg_server():
    """A started throwaway server for the tests of one module; skipped where Debian's postgresql or pg8000 is missing,
    except under GPUFLEET_REQUIRE_TOOLS=1 (scripts/run-tests, CI), where that fails."""
    missing = []
    bin_dir = bindir()
    if not bin_dir:
        missing.append("PostgreSQL's initdb (Debian package postgresql)")
    try:
        import pg8000.native  # noqa: F401  pylint: disable=unused-import
    except ImportError:
        missing.append("the Python library pg8000")
    if missing:
        if REQUIRE_TOOLS:
            pytest.fail(f"{' and '.join(missing)} missing, and GPUFLEET_REQUIRE_TOOLS=1 allows no skip: run scripts/bootstrap",
                        pytrace=False)
        pytest.skip(f"{' and '.join(missing)} missing (scripts/bootstrap installs them)")
    server = PgServer(bin_dir).start()
    try:
        yield server
    finally:
        server.stop()
