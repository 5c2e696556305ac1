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


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return True
    return False


class StartFailed(RuntimeError):
    """The server did not start; ``reason`` is one line saying why."""

    def __init__(self, reason: str, log: str = "") -> None:
        super().__init__(f"{reason}\n{log}" if log else reason)
        self.reason = reason


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
        """Start the server and wait until it answers its health check. Raises StartFailed
        at once when the port is taken, or when the child exits first; a health check
        answered by any other process (another server on the port) does not count."""
        if port_in_use(self.port):
            raise StartFailed(
                f"port {self.port} on 127.0.0.1 is already in use (another server?);"
                " choose another with --port"
            )
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
                raise StartFailed(self._last_error(), self.log())
            try:
                health = httpx.get(f"{self.url}/healthz", timeout=1.0)
                if health.status_code == 200 and health.json().get("pid") == self.proc.pid:
                    return self
            except (httpx.HTTPError, ValueError, AttributeError):
                pass
            time.sleep(0.05)
        self.stop()
        raise StartFailed(
            f"server not ready after {timeout:g} s (log: {self._log_path})", self.log()
        )

    def _last_error(self) -> str:
        lines = [line for line in self.log().splitlines() if line.strip()]
        last = lines[-1] if lines else "no output"
        return f"the server exited with status {self.proc.returncode if self.proc else '?'}: {last}"

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
