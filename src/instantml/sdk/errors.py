from __future__ import annotations


class InstantMLError(Exception):
    """A request the server refused or could not be reached for (sync mode, ``init``)."""
