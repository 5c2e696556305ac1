"""A pass's cursor over one segment: batches as large as asked, whatever the reads."""

from __future__ import annotations

from pathlib import Path

from instantml.spool.cursor import Cursor


def _segment(path: Path, count: int) -> list[bytes]:
    lines = [b'{"event_id": "w-%d", "n": "%s"}' % (i + 1, b"x" * (i % 7)) for i in range(count)]
    path.write_bytes(b"".join(line + b"\n" for line in lines))
    return lines


def test_a_take_reads_on_past_the_end_of_a_read(tmp_path: Path) -> None:
    """Lines are read a few hundred bytes at a time here; every take still gets the count
    it asks for (a batch cut at each read's end would be sent as a small batch of its
    own), in order, each with the offset just past it, until the segment ends."""
    path = tmp_path / "seg.jsonl"
    lines = _segment(path, 1000)
    cursor = Cursor(path)
    got: list[bytes] = []
    sizes = []
    while not cursor.exhausted:
        taken = cursor.take(64, 512)
        sizes.append(len(taken))
        for owner, line, end in taken:
            assert owner is cursor
            got.append(line)
            assert path.read_bytes()[:end].endswith(line + b"\n")
    assert got == lines
    assert sizes == [64] * 15 + [40]
    cursor.ack()
    assert Cursor(path).offset == path.stat().st_size


def test_a_line_longer_than_a_read_is_read_whole(tmp_path: Path) -> None:
    path = tmp_path / "seg.jsonl"
    long = b'{"event_id": "w-1", "pad": "' + b"y" * 5000 + b'"}'
    path.write_bytes(long + b"\n" + b'{"event_id": "w-2"}\n')
    cursor = Cursor(path)
    assert [line for _, line, _ in cursor.take(10, 256)] == [long, b'{"event_id": "w-2"}']
    assert cursor.take(10, 256) == [] and cursor.exhausted
