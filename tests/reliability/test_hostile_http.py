"""Hostile clients: a 1 GB body declared, a chunked body past the limit, and a slowloris
holding many connections open a byte at a time; each is refused early, or merely waited
on, and the server goes on serving everyone else."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator

import httpx
import pytest

from instantml.server.process import ServerProcess


@pytest.fixture
def server(start_server: Callable[..., ServerProcess]) -> Iterator[ServerProcess]:
    yield start_server(env={"INSTANTML_MAX_BODY_BYTES": str(1024 * 1024)})


def _connect(server: ServerProcess) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=30)
    return sock


def _served(server: ServerProcess) -> bool:
    headers = {"Authorization": f"Bearer {server.admin_key}"}
    return httpx.get(f"{server.url}/api/runs", headers=headers, timeout=30).status_code == 200


def _status(sock: socket.socket) -> int:
    head = b""
    while b"\r\n" not in head:
        chunk = sock.recv(4096)
        if not chunk:
            break
        head += chunk
    return int(head.split(b" ", 2)[1])


def test_a_1gb_body_is_refused_before_it_is_read(server: ServerProcess) -> None:
    sock = _connect(server)
    sock.sendall(
        b"POST /api/ingest HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Authorization: Bearer {server.admin_key}\r\n".encode()
        + b"Content-Length: 1073741824\r\n\r\n"
        + b"{" * 65536
    )
    assert _status(sock) == 413  # answered with 64 KiB of the gigabyte sent
    sock.close()
    assert _served(server)


def test_a_chunked_body_past_the_limit_is_refused(server: ServerProcess) -> None:
    sock = _connect(server)
    sock.sendall(
        b"POST /api/ingest HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Authorization: Bearer {server.admin_key}\r\n".encode()
        + b"Transfer-Encoding: chunked\r\n\r\n"
    )
    chunk = b"x" * 65536
    status = None
    try:
        for _ in range(64):  # 4 MiB against a 1 MiB limit
            sock.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
    except OSError:  # the server answered and closed: nothing more is read
        pass
    status = _status(sock)
    assert status == 413
    sock.close()
    assert _served(server)


def test_a_slowloris_does_not_starve_others(server: ServerProcess) -> None:
    slow = [_connect(server) for _ in range(200)]
    stop = threading.Event()

    def drip() -> None:  # a header byte per connection every 0.2 s, never finishing
        for sock in slow:
            sock.sendall(b"POST /api/ingest HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        while not stop.wait(0.2):
            for sock in slow:
                try:
                    sock.sendall(b"a")
                except OSError:
                    pass

    dripper = threading.Thread(target=drip, daemon=True)
    dripper.start()
    try:
        for _ in range(20):  # the others are served all along
            assert _served(server)
            time.sleep(0.1)
    finally:
        stop.set()
        dripper.join()
        for sock in slow:
            sock.close()
    assert _served(server)
