"""A test-only ClickHouse HTTP endpoint, served from ClickHouse's engine in this process
(chdb), so that several ``instantml server`` processes can share one ClickHouse database
in tests: chdb opens a data directory in one process only, and no ClickHouse server
package recent enough is installable here.

It answers the part of ClickHouse's HTTP interface that clickhouse-connect uses:
``GET /ping``; a query in the ``query`` URL parameter, in the body, or begun in the one and
ended in the other; ``param_<name>`` query parameters; ``INSERT ... FORMAT <fmt>`` with the
data in the (possibly compressed, possibly chunked) body; a result in the query's
``FORMAT`` (TabSeparated when it names none); errors as ClickHouse sends them (status 500,
``X-ClickHouse-Exception-Code``, the message as the body). Every statement runs on the
real engine: the SQL, the table engines, FINAL, the merges.

What it does not cover (docs/deploy.md says so too): the server's own HTTP layer
(sessions, users and quotas, settings in the URL, which it ignores, compressed
responses, progress headers), queries of several clients running truly at once (one
statement at a time here), and replication or a cluster.

Run as ``python -m tests.clickhouse_http --path DIR --port N``; it prints ``ready`` when it
serves, and stops on SIGTERM.
"""

from __future__ import annotations

import argparse
import email
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import uuid
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import chdb
import lz4.frame

_INSERT_DATA = re.compile(rb"^(\s*INSERT\s.*?)\bFORMAT\s+(\w+)[ \t]*(?:\r?\n|$)", re.I | re.S)
_TRAILING_FORMAT = re.compile(rb"\bFORMAT\s+(\w+)\s*;?\s*$", re.I)
_ERROR_CODE = re.compile(r"Code: (\d+)")


class Engine:
    """One chdb connection; one statement at a time."""

    def __init__(self, path: str) -> None:
        self.conn = chdb.connect(path)
        self.lock = threading.Lock()

    def run(self, sql: bytes, fmt: str, params: dict[str, str]) -> bytes:
        with self.lock:
            return bytes(self.conn.query(sql.decode(), fmt, params=params).bytes() or b"")

    def insert(self, statement: bytes, fmt: str, data: bytes) -> None:
        with tempfile.NamedTemporaryFile(suffix=f".{fmt.lower()}", delete=False) as handle:
            handle.write(data)
        try:
            path = handle.name.replace("'", "\\'")
            sql = statement.rstrip() + f" FROM INFILE '{path}' FORMAT {fmt}".encode()
            with self.lock:
                self.conn.query(sql.decode(), "TabSeparated")
        finally:
            os.unlink(handle.name)


class Handler(BaseHTTPRequestHandler):
    engine: Engine
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def do_GET(self) -> None:
        if urlsplit(self.path).path == "/ping":
            self._answer(200, b"Ok.\n", {})
        else:
            self._query()

    def do_POST(self) -> None:
        self._query()

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    break
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
            body = b"".join(chunks)
        else:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        encoding = self.headers.get("Content-Encoding")
        if encoding == "lz4":
            return bytes(lz4.frame.decompress(body))
        if encoding in ("gzip", "deflate"):
            return zlib.decompress(body, 31 if encoding == "gzip" else 15)
        if encoding:  # the client is told which to use: lz4 (see ChEngine)
            raise ValueError(f"Content-Encoding {encoding!r} is not served here")
        return body

    def _query(self) -> None:
        url = urlsplit(self.path)
        args = dict(parse_qsl(url.query, keep_blank_values=True))
        params = {k.removeprefix("param_"): v for k, v in args.items() if k.startswith("param_")}
        try:
            body = self._body()
            query = args.get("query", "").encode()
            if self.headers.get("Content-Type", "").startswith("multipart/form-data"):
                # Long parameters travel as form fields (the query one of them).
                fields = _form_fields(self.headers["Content-Type"], body)
                params.update(
                    {
                        k.removeprefix("param_"): v
                        for k, v in fields.items()
                        if k.startswith("param_")
                    }
                )
                query, body = fields.get("query", "").encode(), b""
            text = query + b"\n" + body if query and body else query or body
            insert = _INSERT_DATA.match(text)
            if insert is not None:
                self.engine.insert(insert.group(1), insert.group(2).decode(), text[insert.end() :])
                result, fmt = b"", None
            else:
                found = _TRAILING_FORMAT.search(text)
                fmt = found.group(1).decode() if found else "TabSeparated"
                result = self.engine.run(text, fmt, params)
        except Exception as exc:  # the engine's message, as ClickHouse sends it
            message = str(exc)
            start = message.find("Code: ")
            message = message[start:] if start > 0 else message
            code = _ERROR_CODE.search(message)
            self._answer(
                500,
                message.encode() + b"\n",
                {"X-ClickHouse-Exception-Code": code.group(1) if code else "1000"},
            )
            return
        headers = {"X-ClickHouse-Summary": json.dumps({"read_rows": "0"})}
        if fmt is not None and result:
            headers["X-ClickHouse-Format"] = fmt
        self._answer(200, result, headers)

    def _answer(self, status: int, body: bytes, headers: dict[str, str]) -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("X-ClickHouse-Query-Id", str(uuid.uuid4()))
        self.send_header("X-ClickHouse-Timezone", "UTC")
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)


def serve(path: str, port: int, host: str = "127.0.0.1") -> None:
    Handler.engine = Engine(path)
    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    print("ready", flush=True)
    try:
        server.serve_forever(poll_interval=0.1)
    finally:
        server.server_close()
        Handler.engine.conn.close()


def _form_fields(content_type: str, body: bytes) -> dict[str, str]:
    """The fields of a multipart/form-data body, by name."""
    message = email.message_from_bytes(f"Content-Type: {content_type}\r\n\r\n".encode() + body)
    fields = {}
    for part in message.get_payload():  # type: ignore[union-attr]
        name = part.get_param("name", header="content-disposition")
        payload = part.get_payload(decode=True)
        if name and payload is not None:
            fields[str(name)] = payload.decode()
    return fields


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--path", required=True)
    parser.add_argument("--port", type=int, required=True)
    options = parser.parse_args()
    serve(options.path, options.port)


class Endpoint:
    """The endpoint above in a child process on a free loopback port (a test fixture)."""

    def __init__(self, path: Path, port: int | None = None) -> None:
        from instantml.server.process import free_port

        self.path = Path(path)
        self.port = port or free_port()
        self.log = Path(path).with_suffix(".log")
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tests.clickhouse_http", "--path", str(path), "--port",
                 str(self.port)],
                stdout=subprocess.PIPE, stderr=log,
                cwd=Path(__file__).resolve().parent.parent,
            )  # fmt: skip
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().decode().strip()
        if line != "ready":
            self.proc.kill()
            raise RuntimeError(
                f"the ClickHouse HTTP endpoint did not start: {self.log.read_text()[-2000:]}"
            )

    def url(self, database: str | None = None) -> str:
        """``clickhouse://`` URL of a database (a fresh one's, unless named)."""
        return f"clickhouse://127.0.0.1:{self.port}/{database or 'd_' + uuid.uuid4().hex[:12]}"

    def restart(self) -> Endpoint:
        """The same engine directory on the same port again (after ``stop``)."""
        return Endpoint(self.path, self.port)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
