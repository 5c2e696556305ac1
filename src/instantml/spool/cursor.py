"""Where an upload pass stands in each segment: lines read ahead, and the byte offset the
server has answered up to (the ``.ack`` file), which only ever moves past lines that have
their final answer."""

from __future__ import annotations

from itertools import repeat
from pathlib import Path

from . import segments


class Cursor:
    """Where a pass stands in one segment: complete lines read ahead, and how far the
    server has answered (acknowledged only once every line before it has an answer)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.active = segments.writer_active(path)  # before reading: if done, it is complete
        self.offset = segments.read_acked(path)  # acknowledged
        self._read = self.offset  # read ahead up to here
        self._lines: list[bytes] = []
        self._ends: list[int] = []
        self._pos = 0
        self._taken_end = self.offset
        self.exhausted = False
        self.missing = False

    def take(self, count: int, read_bytes: int) -> list[Item]:
        """Up to ``count`` further complete lines, read on past the end of a read (a batch
        cut at every read's end would be a small batch, a whole unit on the server, for
        each read of each segment); marks the cursor exhausted at the end."""
        taken: list[Item] = []
        while len(taken) < count:
            if self._pos == len(self._lines) and not self._read_more(read_bytes):
                break
            start = self._pos
            self._pos = min(start + count - len(taken), len(self._lines))
            if self._pos > start:
                self._taken_end = self._ends[self._pos - 1]
                taken += zip(
                    repeat(self), self._lines[start : self._pos], self._ends[start : self._pos]
                )
        return taken

    def _read_more(self, read_bytes: int) -> bool:
        """Read the next complete lines; False (exhausted) when there are none."""
        while True:
            try:
                chunk = segments.read_lines(self.path, self._read, read_bytes)
            except FileNotFoundError:
                self.exhausted = self.missing = True
                return False
            if chunk.end == self._read:
                if self.path.stat().st_size - self._read < read_bytes:
                    self.exhausted = True  # nothing more, or only a line being written
                    return False
                read_bytes *= 2  # one line longer than a read: read more
                continue
            self._lines, self._ends, self._pos = chunk.lines, chunk.ends, 0
            self._read = chunk.end
            if not chunk.lines:
                self._taken_end = chunk.end  # only blank lines: acknowledged with the rest
            return True

    def ack(self, offset: int | None = None) -> None:
        """Every line before ``offset`` (default: every line taken) has its final answer."""
        offset = self._taken_end if offset is None else offset
        if offset > self.offset:
            segments.write_acked(self.path, offset)
            self.offset = offset


Item = tuple[Cursor, bytes, int]  # a line, its segment, and the offset just past it


def ack_items(items: list[Item]) -> None:
    """Acknowledge, per segment, everything up to the last of ``items`` (all answered)."""
    last: dict[int, tuple[Cursor, int]] = {}
    for cursor, _, end in items:
        last[id(cursor)] = (cursor, end)
    for cursor, end in last.values():
        cursor.ack(end)


def ack_runs(items: list[Item], runs: list[int], answered: int) -> None:
    """:func:`ack_items` for the first ``answered`` items of a batch whose segments' runs of
    lines end at the indexes ``runs``: per segment, not per line."""
    start = 0
    for stop in runs:
        if answered <= start:
            return
        cursor, _, end = items[min(stop, answered) - 1]
        cursor.ack(end)
        start = stop
