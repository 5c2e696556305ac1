"""Running ``instantml server`` as a child process (the demo and the tests use it)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class ServerProcess:
    """``instantml server`` on loopback, started in a child process and stopped by SIGTERM."""

    def __init__(
        self,
        data_dir: Path,
        port: int | None = None,
        env: dict[str, str] | None = None,
        log_path: Path | None = None,
    ) -> None:
        self.data_dir = Path(data_dir)
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._env = {**os.environ, **(env or {})}
        self._log_path = log_path or self.data_dir.parent / f"server-{self.port}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def admin_key(self) -> str:
        return (self.data_dir / "admin-key").read_text().strip()

    def start(self, timeout: float = 30.0) -> ServerProcess:
        self._log_path.parent.mkdir(parents=True, exist_ok=True)
        log = self._log_path.open("ab")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "instantml",
                "server",
                "--data-dir",
                str(self.data_dir),
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=self._env,
        )
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}: {self.log()}")
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1.0).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"server not ready after {timeout}s: {self.log()}")

    def log(self) -> str:
        try:
            return self._log_path.read_text(errors="replace")[-4000:]
        except OSError:
            return ""

    def stop(self, timeout: float = 20.0) -> int | None:
        """SIGTERM, then wait; SIGKILL if it does not stop in time. Returns the exit code."""
        if self.proc is None or self.proc.poll() is not None:
            return None if self.proc is None else self.proc.returncode
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            return -9

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
