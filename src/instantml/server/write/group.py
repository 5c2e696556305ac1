"""One group of writes decided in one unit of work: the contract of every write, in one
place.

In order: replay what an Idempotency-Key already answered (422 when the request differs),
resolve runs, charge the monthly guardrail (a write of n points refused whole when it
would cross the limit), write, and keep each 2xx answer for the key's replays. Stores only
keep and return data (``storage.protocols``); answers in HTTP terms come from
``answers.py``.

An ingest batch's plain rank events (every run known, every key new and distinct, the
limit out of reach) are decided at once; anything else is decided event by event. Either
way a batch's points reach the point store as columns.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ...storage.protocols import Stores
from ...storage.records import (
    SCALAR,
    Keys,
    RunConflict,
    RunRef,
    RunSpec,
    ScalarPoint,
    Slot,
    StoredAnswer,
)
from . import answers
from .answers import Answer
from .commands import (
    Envelope,
    PatchRun,
    RankEvents,
    Write,
    WriteAttributes,
    WriteRankPoints,
    WriteScalars,
)
from .guardrail import UsagePolicy, month_of
from .rank_columns import RankColumns

HEALTH_PREFIX = "system/instantml/"  # the public SDK's own series (upload lag, queue, failures)


class Group:
    """One group of writes being applied: what it has decided so far."""

    def __init__(self, stores: Stores, policy: UsagePolicy, envelopes: list[Envelope]) -> None:
        self.stores = stores
        self.policy = policy
        self.envelopes = envelopes
        self.now = self.policy.clock()
        self.month = month_of(self.now)
        self.points = RankColumns()
        self.scalars: list[ScalarPoint] = []
        self.limits: dict[int, int | None] = {}
        # Answers given to keys in this group: single writes' by slot, batches' as columns
        # (indexed only if a later write of the group needs to look one up).
        self.seen: dict[Slot, StoredAnswer] = {}
        self.chunks: list[_Chunk] = []
        self._chunk_index: list[dict[Slot, int]] = []
        self.known = self.stores.ledger.lookup(_keys(envelopes))
        self.recorded: list[tuple[Slot, StoredAnswer, tuple[int, int]]] = []  # with its form
        self.touched: set[tuple[int, str]] = set()  # runs given rank points

    def apply(self) -> list[Answer]:
        out = []
        for envelope in self.envelopes:
            if isinstance(envelope.write, RankEvents):
                out.append(Answer(200, {}, each=self._rank_events(envelope.write)))
            else:
                out.append(self._one(envelope))
        self._write()
        return out

    # ---- one write ----

    def _one(self, envelope: Envelope) -> Answer:
        write, idem = envelope.write, envelope.idempotency
        slot: Slot | None = None
        if idem is not None:
            slot = (write.org_id, idem.key_hi, idem.key_lo)
            stored = self._stored(slot)
            if stored is not None:
                return answers.replay(stored, idem.fingerprint)
        answer = self._decide(write)
        if slot is not None and idem is not None and 200 <= answer.status < 300:
            stored = StoredAnswer(idem.fingerprint, answer.status, answer.text())
            self.seen[slot] = stored
            self.recorded.append((slot, stored, (idem.seq, idem.n)))
        return answer

    def _decide(self, write: Write) -> Answer:
        runs = self.stores.runs
        if isinstance(write, RunSpec):
            try:
                record, created = runs.create(write)
            except RunConflict as conflict:
                return answers.run_conflict(conflict)
            return answers.run(record, created)
        if isinstance(write, RankEvents):
            raise TypeError("a RankEvents write is decided by _rank_events")
        run = runs.resolve(write.org_id, [write.run_id])[write.run_id]
        if run is None:
            return answers.unknown_run(write.run_id)
        if isinstance(write, PatchRun):
            if write.rank is not None and write.status != "running":
                runs.finish_rank(run, write.rank, self.now)
                self.touched.add((write.org_id, write.run_id))  # others may be left behind
            return answers.run(runs.set_status(run, write.status))
        if isinstance(write, WriteAttributes):
            runs.add_attributes(run, write.attributes, write.timestamp)
            return answers.accepted(len(write.attributes))
        # Metric points: every accepted value counts, a rewrite too (a replay, above, not).
        count = len(write.metrics)
        refused = self._charge(write.org_id, count)
        if refused is not None:
            return refused
        if isinstance(write, WriteRankPoints):
            self.points.add(write, run, runs.series_ids)
            self.touched.add((write.org_id, write.run_id))
        elif isinstance(write, WriteScalars):
            keys = list(write.metrics)
            self.points.count(run, count)
            for sid, value in zip(runs.series_ids(run, SCALAR, keys), write.metrics.values()):
                self.scalars.append(
                    ScalarPoint(sid, write.step, value, write.timestamp, write.preview)
                )
            # A run's last step follows its training steps: not a fractional step, nor the
            # SDK's own upload-health series (system/instantml/*, at step = unix time).
            if type(write.step) is int and not all(k.startswith(HEALTH_PREFIX) for k in keys):
                self.points.extend(run, 0, write.step)
        else:
            raise TypeError(f"unknown write {type(write).__name__}")
        return answers.accepted(count)

    def _charge(self, org: int, points: int) -> Answer | None:
        """Charge the guardrail; the refusal when it would cross the month's limit."""
        limit = self._limit(org)
        if self.stores.ledger.charge(org, self.month, points, limit):
            return None
        assert limit is not None
        used = self.stores.ledger.used(org, self.month)
        return answers.over_limit(limit, used, points, self.now)

    def _limit(self, org: int) -> int | None:
        if org not in self.limits:
            own = self.stores.tenancy.monthly_limit(org)
            self.limits[org] = own if own is not None else self.policy.default_limit
        return self.limits[org]

    # ---- a batch's rank events ----

    def _rank_events(self, write: RankEvents) -> list[Answer]:
        """Decide a whole batch at once when nothing needs deciding event by event: every
        run exists, every key is new and distinct, and the limit is out of reach. Otherwise
        each event is decided on its own, in order (its points still go as columns)."""
        org = write.org_id
        names = write.names()  # each event's metric names, in order
        uniform = len(names) == 1
        counts = (
            np.full(len(write), len(next(iter(names))), dtype=np.int64)
            if uniform
            else np.fromiter(map(len, write.metrics), dtype=np.int64, count=len(write))
        )
        runs = self.stores.runs.resolve(org, set(write.run_ids))
        keys = write.keys()
        plain = (
            None not in runs.values()
            and _distinct(keys)
            and self._all_new(keys)
            and self.stores.ledger.charge(org, self.month, int(counts.sum()), self._limit(org))
        )
        if not plain:
            return self._each(write, runs, counts)
        self.points.add_events(write, runs, names, self.stores.runs.series_ids)
        self.touched.update((org, run_id) for run_id in runs)
        self.chunks.append(_Chunk(keys, write.fingerprints, counts))
        if uniform:  # one shared answer (nothing changes an Answer once given)
            return [answers.accepted(int(counts[0]))] * len(write)
        return [answers.accepted(c) for c in counts.tolist()]

    def _each(
        self, write: RankEvents, runs: dict[str, RunRef | None], counts: np.ndarray
    ) -> list[Answer]:
        """Each event decided on its own, in order, as a single request would be (a key
        answered before is a replay; an unknown run; the month's limit), and the accepted
        events' points written as columns."""
        org = write.org_id
        out: list[Answer] = []
        accepted: list[int] = []
        events = zip(
            write.key_hi.tolist(), write.key_lo.tolist(), write.fingerprints.tolist(),
            write.key_seq.tolist(), write.key_n.tolist(), write.run_ids, counts.tolist(),
        )  # fmt: skip
        for i, (hi, lo, fingerprint, seq, n, run_id, count) in enumerate(events):
            slot = (org, hi, lo)
            stored = self._stored(slot)
            if stored is not None:
                out.append(answers.replay(stored, fingerprint))
                continue
            if runs[run_id] is None:
                out.append(answers.unknown_run(run_id))
                continue
            refused = self._charge(org, count)
            if refused is not None:
                out.append(refused)
                continue
            answer = answers.accepted(count)
            stored = StoredAnswer(fingerprint, answer.status, answer.text())
            self.seen[slot] = stored
            self.recorded.append((slot, stored, (seq, n)))
            accepted.append(i)
            out.append(answer)
        if accepted:
            taken = write.take(accepted)
            known = {run_id: runs[run_id] for run_id in set(taken.run_ids)}
            self.points.add_events(taken, known, taken.names(), self.stores.runs.series_ids)
            self.touched.update((org, run_id) for run_id in known)
        return out

    def _all_new(self, keys: Keys) -> bool:
        if not self.known and not self.seen and not self.chunks:
            return True  # the usual case: nothing to compare with
        wanted = set(keys.slots())
        return (
            wanted.isdisjoint(self.known)
            and wanted.isdisjoint(self.seen)
            and all(wanted.isdisjoint(self._index(i)) for i in range(len(self.chunks)))
        )

    def _index(self, number: int) -> dict[Slot, int]:
        while len(self._chunk_index) <= number:
            slots = self.chunks[len(self._chunk_index)].keys.slots()
            self._chunk_index.append(dict(zip(slots, range(len(slots)))))
        return self._chunk_index[number]

    def _stored(self, slot: Slot) -> StoredAnswer | None:
        """The answer this key already has: given earlier in this group, or stored."""
        stored = self.seen.get(slot)
        if stored is not None:
            return stored
        for number, chunk in enumerate(self.chunks):
            i = self._index(number).get(slot)
            if i is not None:
                body = answers.accepted_text(int(chunk.counts[i]))
                return StoredAnswer(int(chunk.fingerprints[i]), 200, body)
        return self.known.get(slot)

    # ---- the writes, once decided ----

    def _write(self) -> None:
        stores = self.stores
        for sid, chunks in self.points.take().items():
            for columns in chunks:
                stores.points.write_rank(sid, columns)
        if self.scalars:
            stores.points.write_scalars(self.scalars)
        if self.points.extents:
            stores.runs.extend(self.points.extents)
        if self.points.points:
            stores.runs.count_points(self.points.points)
        if self.points.ranks:
            stores.runs.saw_ranks(self.points.ranks, self.now, self.points.nodes)
        self._record()

    def _record(self) -> None:
        """Keep the group's 2xx answers for their keys' replays, as columns."""
        keys = [chunk.keys for chunk in self.chunks]
        prints = [chunk.fingerprints for chunk in self.chunks]
        statuses = [np.full(len(chunk.keys), 200, dtype=np.int16) for chunk in self.chunks]
        bodies: list[str] = []
        for chunk in self.chunks:
            counts = chunk.counts
            if (counts == counts[0]).all():
                bodies += [answers.accepted_text(int(counts[0]))] * len(counts)
            else:
                bodies += map(answers.accepted_text, counts.tolist())
        if self.recorded:
            slots, stored, forms = zip(*self.recorded, strict=True)
            keys.append(Keys.of(slots, forms))
            prints.append(np.array([s.fingerprint for s in stored], dtype=np.int64))
            statuses.append(np.array([s.status for s in stored], dtype=np.int16))
            bodies += [s.body for s in stored]
        if not bodies:
            return
        every = Keys.concat(keys)
        self.stores.ledger.record(
            every,
            np.concatenate(prints),
            np.concatenate(statuses),
            bodies,
            self.now,
        )


@dataclass(slots=True)
class _Chunk:
    """A batch's rank events decided at once: their keys, fingerprints and point counts
    (each answered ``{"accepted": count}``)."""

    keys: Keys
    fingerprints: np.ndarray
    counts: np.ndarray


def _distinct(keys: Keys) -> bool:
    """No key twice (a batch that repeats one is decided event by event)."""
    hi = np.sort(keys.hi)
    if not (hi[1:] == hi[:-1]).any():  # distinct halves: distinct keys (nearly always)
        return True
    return len(set(zip(keys.hi.tolist(), keys.lo.tolist()))) == len(keys)


def _keys(envelopes: Sequence[Envelope]) -> Keys:
    """Every Idempotency-Key the envelopes carry."""
    parts: list[Keys] = []
    slots: list[Slot] = []
    forms: list[tuple[int, int]] = []
    for envelope in envelopes:
        write, idem = envelope.write, envelope.idempotency
        if isinstance(write, RankEvents):
            parts.append(write.keys())
        elif idem is not None:
            slots.append((write.org_id, idem.key_hi, idem.key_lo))
            forms.append((idem.seq, idem.n))
    if slots:
        parts.append(Keys.of(slots, forms))
    return Keys.concat(parts)
