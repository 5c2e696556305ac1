"""The server gives the C heap's free pages back (server/memory.py)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from instantml.server.memory import HeapTrimmer, _malloc_trim

# In a process of its own: 2,000 buffers of 100 KB (under glibc's mmap threshold, so from
# the heap), all freed but the last (which keeps free() from trimming the heap's top).
PROGRAM = textwrap.dedent(
    """
    import time
    import numpy as np
    from instantml.server.memory import HeapTrimmer

    def rss():
        for line in open("/proc/self/status"):
            if line.startswith("VmRSS"):
                return int(line.split()[1]) // 1024

    buffers = [np.ones(100_000 // 8) for _ in range(2_000)]
    last = buffers[-1]
    del buffers
    held = rss()
    trimmer = HeapTrimmer(seconds=0.05)
    while trimmer.trims < 1:
        time.sleep(0.01)
    trimmer.close()
    print(held, rss(), last.sum() > 0)
    """
)


def test_freed_heap_memory_is_given_back() -> None:
    if _malloc_trim() is None:
        pytest.skip("this libc has no malloc_trim")
    out = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    held, after, _ = out.stdout.split()
    assert int(held) - int(after) >= 100, out.stdout  # ~190 MB were free in the heap


def test_the_trimmer_stops_when_closed() -> None:
    trimmer = HeapTrimmer(seconds=0.01)
    trimmer.close()
    assert trimmer._thread is None or not trimmer._thread.is_alive()
