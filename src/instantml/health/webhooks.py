"""Delivering alerts to webhooks from the persistent outbox (``deliveries``): a thread that
claims due deliveries and posts each (a few at once, so that one slow receiver does not
hold up the others), signed with the webhook's secret.

A 2xx marks a delivery done; anything else (an error status, a refused connection, a
timeout) is retried with backoff (``HealthStore.failed``). A server killed mid-delivery
leaves its claim to run out (``LEASE``) and the next server posts it. Ingest never waits
on any of this."""

from __future__ import annotations

import hashlib
import hmac
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

from ..storage.protocols import HealthStore
from ..storage.records import Delivery

log = logging.getLogger(__name__)

SIGNATURE_HEADER = "X-InstantML-Signature"
DELIVERY_HEADER = "X-InstantML-Delivery"  # the delivery's id: a receiver may dedupe on it
LEASE = 20.0  # seconds a claimed delivery is ours: longer than a post may take
TIMEOUT = 5.0


def signature(secret: str, body: bytes) -> str:
    """``sha256=<hex HMAC-SHA256 of the body, keyed with the webhook's secret>``."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


class Deliverer:
    def __init__(self, health: HealthStore, poll: float = 1.0, senders: int = 4) -> None:
        self._health = health
        self._poll = poll
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._pool = ThreadPoolExecutor(senders, thread_name_prefix="instantml-webhook")
        self._senders = senders
        self._client = httpx.Client(timeout=TIMEOUT, follow_redirects=False)
        self._thread = threading.Thread(target=self._run, name="instantml-outbox", daemon=True)
        self._thread.start()

    def wake(self) -> None:
        self._wake.set()

    def close(self) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join()
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._client.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                due = self._health.due(time.time(), 4 * self._senders, LEASE)
            except Exception:  # the store away for now: look again later
                log.exception("reading the webhook outbox")
                due = []
            if due:
                for _ in self._pool.map(self._send, due):
                    pass
                continue  # more may be due
            self._wake.wait(self._poll)
            self._wake.clear()

    def _send(self, delivery: Delivery) -> None:
        body = delivery.body.encode()
        headers = {
            "Content-Type": "application/json",
            SIGNATURE_HEADER: signature(delivery.secret, body),
            DELIVERY_HEADER: delivery.delivery_id,
            "User-Agent": "instantml-webhooks",
        }
        try:
            response = self._client.post(delivery.url, content=body, headers=headers)
            error = None if response.is_success else f"HTTP {response.status_code}"
        except httpx.HTTPError as exc:
            error = f"{type(exc).__name__}: {exc}".rstrip(": ")
        try:
            if error is None:
                self._health.delivered(delivery.delivery_id, time.time())
            else:
                self._health.failed(delivery, time.time(), error)
        except Exception:  # the store away: the lease runs out and it is sent again
            log.exception("recording the outcome of webhook delivery %s", delivery.delivery_id)
