"""Ordered uploads' completed batches, in memory: one process sees every batch of the
embedded store, as it sees every claim (docs/architecture.md, "State a server process keeps in memory")."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence


class _Marks:
    """One ordered upload's completed batches (the newest ``_KEPT_MARKS`` of them)."""

    __slots__ = ("floor", "marks", "used")

    def __init__(self) -> None:
        self.floor = 0  # every batch below it completed cleanly (its mark was let go)
        self.marks: dict[int, bool] = {}
        self.used = time.monotonic()


_KEPT_MARKS = 1024  # an uploader keeps 2 batches in flight: older marks are never asked for
_IDLE_SESSION = 3600.0  # an ordered upload unused this long is forgotten


class UploadMarks:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._uploads: dict[tuple[int, str], _Marks] = {}

    def mark(self, org_id: int, session: str, seq: int, clean: bool) -> None:
        """Batch ``seq`` of this upload completed (``clean``: every event of it landed)."""
        with self._lock:
            upload = self._uploads.get((org_id, session))
            if upload is None:
                now = time.monotonic()
                for idle in [k for k, v in self._uploads.items() if v.used < now - _IDLE_SESSION]:
                    del self._uploads[idle]
                upload = self._uploads[(org_id, session)] = _Marks()
            upload.used = time.monotonic()
            if seq < upload.floor or seq in upload.marks:
                return
            upload.marks[seq] = clean
            if len(upload.marks) > 2 * _KEPT_MARKS:
                newest = max(upload.marks)
                upload.floor = newest - _KEPT_MARKS
                upload.marks = {q: c for q, c in upload.marks.items() if q >= upload.floor}

    def marks(self, org_id: int, session: str, seqs: Sequence[int]) -> dict[int, bool]:
        """Of these batches of the upload, those completed, and whether cleanly."""
        with self._lock:
            upload = self._uploads.get((org_id, session))
            if upload is None:
                return {}
            upload.used = time.monotonic()
            return {
                q: True if q < upload.floor else upload.marks[q]
                for q in seqs
                if q < upload.floor or q in upload.marks
            }
