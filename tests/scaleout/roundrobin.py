"""A round-robin HTTP proxy for the tests: each request goes to the next server process in
turn (not each connection: a client's keep-alive connection must not pin it to one), as
a load balancer in front of stateless processes may do."""

from __future__ import annotations

import itertools
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx

# Hop-by-hop headers (RFC 9110, 7.6.1) and the ones httpx sets itself.
_SKIP = {"connection", "keep-alive", "transfer-encoding", "host", "content-length"}


@dataclass
class Proxy:
    url: str
    sent: Counter[str] = field(default_factory=Counter)  # requests per upstream


@contextmanager
def round_robin(upstreams: list[str]) -> Iterator[Proxy]:
    """Serve a proxy over ``upstreams`` on a free loopback port."""
    turns = itertools.cycle(upstreams)
    lock = threading.Lock()
    client = httpx.Client(timeout=120)
    proxy = Proxy("")

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _forward(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            with lock:
                upstream = next(turns)
                proxy.sent[upstream] += 1
            headers = {k: v for k, v in self.headers.items() if k.lower() not in _SKIP}
            try:
                answer = client.request(
                    self.command, upstream + self.path, content=body, headers=headers
                )
                status, content = answer.status_code, answer.content
                out = [(k, v) for k, v in answer.headers.items() if k.lower() not in _SKIP]
                out = [(k, v) for k, v in out if k.lower() != "content-encoding"]
            except httpx.HTTPError as exc:
                status, content, out = 502, f"proxy: {exc}".encode(), []
            self.send_response(status)
            for name, value in out:
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(content)))
            self.end_headers()
            self.wfile.write(content)

        do_GET = do_POST = do_DELETE = do_PATCH = do_PUT = _forward

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        proxy.url = f"http://127.0.0.1:{server.server_address[1]}"
        yield proxy
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
        client.close()
