"""The webhook receiver every health test posts to."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.health.test_run_health import Receiver


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    found = Receiver()
    yield found
    found.close()
