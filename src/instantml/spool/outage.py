"""An uploader's outages: said once per change, waited out with backoff, bounded in time.

The server is unreachable or failing: :meth:`Outage.failing` says so when what it looks
like changes (not at every try; the waits are the SDK's one retry policy's), and gives up (``GaveUp``) once it has lasted
``retry_for`` seconds, unless ``keep_going()`` says the uploader is still needed (a writer
of the spool is still running). Waits end at once on a stop (``Interrupted``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class UploadStopped(Exception):
    """The server will not take more from this spool (bad key, monthly limit): stop, keep it."""


class GaveUp(UploadStopped):
    """The server stayed unreachable (or failing) for longer than ``retry_for``."""


class Interrupted(Exception):
    """A stop was asked for: end now; what was not answered stays in the spool."""


class Outage:
    def __init__(
        self,
        base_url: str,
        retry_for: float | None,
        notify: Callable[[str], None],
        stop: threading.Event,
        max_backoff: float = 5.0,
    ) -> None:
        self._url = base_url
        self._retry_for = retry_for
        self._notify = notify
        self._stop = stop
        self.max_backoff = max_backoff
        self._since: float | None = None  # monotonic time the current outage began
        self._what: str | None = None  # what it looks like (said when it changes)
        self.errors: list[str] = []  # the last few, for the record
        self.keep_going: Callable[[], bool] = lambda: False

    def failing(self, what: str, delay: float | None = None) -> None:
        now = time.monotonic()
        if self._since is None:
            self._since = now
        if what != self._what:
            self._what = what
            self.errors = [*self.errors[-19:], what]
            self._notify(what + (f"; retrying in {delay:.1f} s" if delay is not None else ""))
        if self._retry_for is None or now - self._since < self._retry_for:
            return
        if not self.keep_going():
            raise GaveUp(f"gave up after {self._retry_for:g} s: {what}")

    def recovered(self) -> None:
        if self._since is not None:
            lasted = time.monotonic() - self._since
            self._notify(f"server {self._url} answering again after {lasted:.0f} s; resuming")
            self._since = self._what = None

    def wait(self, seconds: float) -> None:
        """Wait before sending again; a stop ends the wait at once (``Interrupted``)."""
        if self._stop.wait(seconds):
            raise Interrupted
