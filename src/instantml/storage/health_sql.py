"""Run-health alerts, webhooks and the webhook outbox, in SQL: one implementation over
DuckDB and PostgreSQL, which differ only in how a statement is run, how an open alert is
kept unique, and how deliveries are claimed.

Not a participant of the write path's units: the health monitor and the delivery thread
write these tables in transactions of their own, which touch no table a write touches, so
ingest never waits on them (nor they on ingest beyond a transaction's start).

An alert and its deliveries are written in one transaction: an alert that exists is
delivered (after any crash), and one delivery per (alert, webhook) is queued once."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any

import orjson

from .records import AlertRecord, Delivery, WebhookRecord
from .sql import Execute

ALERT_COLUMNS = (
    "alert_id, org_id, run_id, kind, rank, key, since_step, since_time, message,"
    " opened_at, resolved_at"
)
# Delivery attempts: after the nth failure, the next in min(2^n, 300) seconds; given up
# after MAX_ATTEMPTS (about a day of retries).
MAX_ATTEMPTS = 300


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:20]}"


def _alert(row: tuple[Any, ...]) -> AlertRecord:
    aid, org, run, kind, rank, key, step, stime, message, opened, resolved = row
    return AlertRecord(
        str(aid), int(org), str(run), str(kind), int(rank), key or None, int(step),
        float(stime), str(message), float(opened), None if resolved is None else float(resolved),
    )  # fmt: skip


def _webhook(row: tuple[Any, ...]) -> WebhookRecord:
    wid, org, url, kinds, secret, created = row
    return WebhookRecord(str(wid), int(org), str(url), orjson.loads(kinds), str(secret), created)


class SqlHealth:
    """Subclasses say how to run a statement (``read``: committed data, autocommit) and
    open a transaction (``transaction``, yielding an ``Execute``)."""

    # The insert of an alert that is not open already (same run, kind, rank, key); it
    # RETURNs the id when inserted.
    INSERT_ALERT: str
    # What locks the deliveries a claim selects, so that two processes never take the
    # same one at once ("" where one process owns the store).
    CLAIM: str

    def read(self, sql: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
        raise NotImplementedError

    def transaction(self) -> AbstractContextManager[Execute]:
        raise NotImplementedError

    # ---- alerts ----

    def alerts(self, org_id: int, run_id: str, open_only: bool = False) -> list[AlertRecord]:
        """The run's alerts, oldest first (only the open ones if ``open_only``)."""
        where = " AND resolved_at IS NULL" if open_only else ""
        rows = self.read(
            f"SELECT {ALERT_COLUMNS} FROM alerts WHERE org_id = %s AND run_id = %s{where}"
            " ORDER BY opened_at, alert_id",
            [org_id, run_id],
        )
        return [_alert(row) for row in rows]

    def open_kinds(self, org_id: int, run_ids: Sequence[str]) -> dict[str, list[str]]:
        """Per run (of these), the kinds of its open alerts."""
        if not run_ids:
            return {}
        marks = ", ".join(["%s"] * len(run_ids))
        rows = self.read(
            f"SELECT run_id, kind FROM alerts WHERE org_id = %s AND run_id IN ({marks})"
            " AND resolved_at IS NULL",
            [org_id, *run_ids],
        )
        out: dict[str, list[str]] = {}
        for run_id, kind in rows:
            out.setdefault(str(run_id), []).append(str(kind))
        return out

    def change(
        self,
        opened: Sequence[AlertRecord],
        resolved: Sequence[str],
        resolved_at: float,
        body: Callable[[AlertRecord], dict[str, Any]],
        moved: Sequence[AlertRecord] = (),
    ) -> list[AlertRecord]:
        """In one transaction: open these alerts (each unless one of its identity is open:
        the opened ones are returned), resolve these (by id), move open ones to the first
        step (and message) given in ``moved`` (by id; never posted again), and queue one
        delivery of each opened alert (``body(alert)``) to every webhook of its org that
        takes its kind."""
        done: list[AlertRecord] = []
        with self.transaction() as execute:
            for alert in opened:
                params = [
                    alert.alert_id, alert.org_id, alert.run_id, alert.kind, alert.rank,
                    alert.key or "", alert.since_step, alert.since_time, alert.message,
                    alert.opened_at,
                ]  # fmt: skip
                if not execute(  # a run deleted since the detectors looked gets none
                    "SELECT 1 FROM runs WHERE org_id = %s AND run_id = %s",
                    [alert.org_id, alert.run_id],
                ) or not execute(self.INSERT_ALERT, params):
                    continue
                done.append(alert)
                hooks = execute(
                    "SELECT webhook_id, kinds FROM webhooks WHERE org_id = %s", [alert.org_id]
                )
                text = orjson.dumps(body(alert)).decode()
                for webhook_id, kinds in hooks:
                    if alert.kind in orjson.loads(kinds):
                        execute(
                            "INSERT INTO deliveries (delivery_id, webhook_id, alert_id, body,"
                            " attempts, next_at) VALUES (%s, %s, %s, %s, 0, %s)",
                            [new_id("dlv"), webhook_id, alert.alert_id, text, alert.opened_at],
                        )
            for alert in moved:
                execute(
                    "UPDATE alerts SET since_step = %s, since_time = %s, message = %s"
                    " WHERE alert_id = %s AND resolved_at IS NULL",
                    [alert.since_step, alert.since_time, alert.message, alert.alert_id],
                )
            for alert_id in resolved:
                execute(
                    "UPDATE alerts SET resolved_at = %s WHERE alert_id = %s"
                    " AND resolved_at IS NULL",
                    [resolved_at, alert_id],
                )
        return done

    # ---- webhooks ----

    def add_webhook(self, hook: WebhookRecord) -> None:
        with self.transaction() as execute:
            execute(
                "INSERT INTO webhooks (webhook_id, org_id, url, kinds, secret, created_at)"
                " VALUES (%s, %s, %s, %s, %s, %s)",
                [hook.webhook_id, hook.org_id, hook.url, orjson.dumps(hook.kinds).decode(),
                 hook.secret, hook.created_at],
            )  # fmt: skip

    def webhooks(self, org_id: int) -> list[WebhookRecord]:
        rows = self.read(
            "SELECT webhook_id, org_id, url, kinds, secret, created_at FROM webhooks"
            " WHERE org_id = %s ORDER BY created_at, webhook_id",
            [org_id],
        )
        return [_webhook(row) for row in rows]

    def delete_webhook(self, org_id: int, webhook_id: str) -> bool:
        with self.transaction() as execute:
            found = execute(
                "SELECT 1 FROM webhooks WHERE org_id = %s AND webhook_id = %s",
                [org_id, webhook_id],
            )
            if found:
                execute("DELETE FROM deliveries WHERE webhook_id = %s AND delivered_at IS NULL",
                        [webhook_id])  # fmt: skip
                execute("DELETE FROM webhooks WHERE webhook_id = %s", [webhook_id])
        return bool(found)

    # ---- the outbox ----

    def due(self, now: float, limit: int, lease: float) -> list[Delivery]:
        """Deliveries due now, claimed for ``lease`` seconds (a process that dies holding
        one leaves it to be claimed again when the lease ends)."""
        with self.transaction() as execute:
            rows = execute(
                "SELECT d.delivery_id, w.url, w.secret, d.body, d.attempts FROM deliveries d"
                " JOIN webhooks w ON w.webhook_id = d.webhook_id WHERE d.delivered_at IS NULL"
                " AND d.failed_at IS NULL AND d.next_at <= %s ORDER BY d.next_at LIMIT %s"
                + self.CLAIM,
                [now, limit],
            )
            for row in rows:
                execute(
                    "UPDATE deliveries SET next_at = %s WHERE delivery_id = %s",
                    [now + lease, row[0]],
                )
        return [Delivery(str(d), str(u), str(s), str(b), int(a)) for d, u, s, b, a in rows]

    def delivered(self, delivery_id: str, at: float) -> None:
        with self.transaction() as execute:
            execute(
                "UPDATE deliveries SET delivered_at = %s, attempts = attempts + 1,"
                " last_error = NULL WHERE delivery_id = %s",
                [at, delivery_id],
            )

    def failed(self, delivery: Delivery, at: float, error: str) -> None:
        """One more failed attempt: retried with backoff, or given up after MAX_ATTEMPTS."""
        attempts = delivery.attempts + 1
        retry_at = at + min(2.0**attempts, 300.0)
        with self.transaction() as execute:
            execute(
                "UPDATE deliveries SET attempts = %s, next_at = %s, last_error = %s,"
                " failed_at = %s WHERE delivery_id = %s",
                [attempts, retry_at, error[:500], at if attempts >= MAX_ATTEMPTS else None,
                 delivery.delivery_id],
            )  # fmt: skip
