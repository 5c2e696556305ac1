"""Segment files: naming, the writer's lock, reading complete lines, acknowledged offsets.

A writer holds an exclusive ``flock`` on its segment for as long as it may append; the
kernel drops it when the process ends, however it ends (SIGKILL included). So an uploader
that can take the lock knows the segment is final: a last line without its newline is then
torn (the writer died mid-write) and is never uploaded. A segment is created under a name
the uploader does not list, locked, and only then renamed to its listed name
(:func:`open_segment`): an uploader never sees one that is not yet locked.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import time
import uuid
from dataclasses import dataclass
from itertools import accumulate
from pathlib import Path

SEGMENTS = "segments"
SUFFIX = ".jsonl"
ACK_SUFFIX = ".ack"


def segment_dir(spool_dir: Path) -> Path:
    return spool_dir / SEGMENTS


def new_segment_path(spool_dir: Path) -> Path:
    host = socket.gethostname().replace("-", "_")[:32] or "host"
    name = f"{time.time_ns() // 1000:020d}-{host}-{os.getpid()}-{uuid.uuid4().hex[:8]}{SUFFIX}"
    return segment_dir(spool_dir) / name


OPENING = ".opening"  # a segment being created: not listed until its writer holds the lock


def open_segment(spool_dir: Path) -> tuple[int, Path]:
    """Create a segment for appending, locked for as long as this process may write, and
    only then give it the name the uploader lists. (Created under that name directly, a
    pass that looked between the create and the lock would take it for a finished,
    empty segment and remove it; every event after that would go to an unlinked file.)"""
    segment_dir(spool_dir).mkdir(parents=True, exist_ok=True)
    path = new_segment_path(spool_dir)
    opening = path.with_name(path.name + OPENING)
    fd = os.open(opening, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # held until this process ends: "writer active"
        os.rename(opening, path)
    except OSError:
        os.close(fd)
        with contextlib.suppress(OSError):
            opening.unlink()
        raise
    return fd, path


def list_segments(spool_dir: Path) -> list[Path]:
    """Segments in creation order."""
    try:
        return sorted(segment_dir(spool_dir).glob(f"*{SUFFIX}"))
    except OSError:
        return []


def locked(path: Path) -> bool:
    """True while another process holds an ``flock`` on ``path`` (False if it is missing)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing drops the probe's lock
    return False


def writer_active(path: Path) -> bool:
    """True while a writer process still holds the segment open for appending."""
    return locked(path)


def read_acked(path: Path) -> int:
    try:
        return int((path.parent / (path.name + ACK_SUFFIX)).read_text() or 0)
    except (FileNotFoundError, ValueError):
        return 0


def write_acked(path: Path, offset: int) -> None:
    """Record that the server answered every event before ``offset`` (atomic replace)."""
    ack = path.parent / (path.name + ACK_SUFFIX)
    tmp = ack.with_suffix(".tmp")
    tmp.write_text(str(offset))
    os.replace(tmp, ack)


def remove(path: Path) -> None:
    for p in (path, path.parent / (path.name + ACK_SUFFIX)):
        try:
            p.unlink()
        except FileNotFoundError:
            pass


@dataclass(slots=True)
class Chunk:
    """Complete lines read from a segment: ``lines[i]`` ends at byte ``ends[i]``."""

    lines: list[bytes]
    ends: list[int]
    end: int  # offset just past the last complete line read
    torn: bytes  # bytes after the last newline (a line still being written, or torn)


def read_lines(path: Path, start: int, max_bytes: int = 32 * 1024 * 1024) -> Chunk:
    with path.open("rb") as handle:
        handle.seek(start)
        data = handle.read(max_bytes)
    cut = data.rfind(b"\n") + 1
    parts = data[:cut].split(b"\n")[:-1]  # split and accumulate run in C, not per line
    ends = [start + length + i for i, length in enumerate(accumulate(map(len, parts)), 1)]
    if b"" in parts:  # blank lines (after a short write's fragment): nothing to send
        kept = [(line, end) for line, end in zip(parts, ends, strict=True) if line]
        parts, ends = [line for line, _ in kept], [end for _, end in kept]
    torn = data[cut:] if len(data) < max_bytes else b""
    return Chunk(parts, ends, start + cut, torn)
