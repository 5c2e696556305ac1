"""Idempotency-Keys are remembered at least 7 days, then forgotten (the write service on
every backend, an injected clock)."""

from __future__ import annotations

from instantml.server.write.commands import CreateRun, Envelope, Idempotency, WriteScalars
from instantml.server.write.guardrail import UsagePolicy
from instantml.server.write.service import WriteService
from instantml.storage.protocols import Stores

DAY = 86400.0


def test_keys_kept_seven_days_then_pruned(stores: Stores) -> None:
    now = [1_800_000_000.0]
    service = WriteService(stores, UsagePolicy(clock=lambda: now[0]))
    org, _ = stores.tenancy.ensure_org("o")
    service.apply([Envelope(CreateRun(org, "r", "p", None, {}, [], {}))])

    def write(key: int, step: int) -> tuple[int, bool]:
        envelope = Envelope(WriteScalars(org, "r", step, {"a": 1.0}, 0.0), Idempotency(key, key, 1))
        answer = service.apply([envelope])[0]
        return answer.status, answer.replayed

    assert write(1, 0) == (200, False)
    now[0] += 7 * DAY
    assert write(1, 0) == (200, True)  # a week later: still a replay
    now[0] += 2 * DAY
    assert write(2, 1) == (200, False)  # any write may prune, at most hourly
    assert write(1, 0) == (200, False)  # nine days on: forgotten, applied afresh
    assert write(1, 0) == (200, True)  # and remembered again
