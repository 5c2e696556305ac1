"""The validation rules shared by the SDK and the server.

Both sides call these functions, so a value the SDK accepts is a value the server stores,
and every error names its field. Wrong types raise ``TypeError``, wrong values
``ValueError``; the server turns either into a 4xx answer with the message.

These run on every ``log_*`` call and every ingested event: keep them to plain loops and
``type(...) is`` checks on the common path.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

MAX_KEY_BYTES = 512
MAX_WORLD_SIZE = 512
MAX_STEP = 2**63 - 1
RUN_STATUSES = ("running", "finished", "failed", "crashed")


def _is_number(value: Any) -> bool:
    # bool is an int subclass; the contract refuses it. numpy scalars register as Real.
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _unwrap(value: Any) -> Any:
    """A 0-dim array (numpy, or anything array-like with ``.item()``) as the scalar it holds;
    anything else unchanged."""
    if getattr(value, "shape", None) == () and callable(getattr(value, "item", None)):
        return value.item()
    return value


# How a non-finite value travels: beside ``metrics``, in the body's ``nonfinite`` map.
NONFINITE_MARKS = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


def mark_of(number: float) -> str:
    """The mark of a non-finite float: ``"nan"``, ``"inf"`` or ``"-inf"``."""
    if number != number:
        return "nan"
    return "inf" if number > 0 else "-inf"


def _metric_name(key: Any, field: str) -> str:
    if type(key) is not str:
        raise TypeError(f"{field}: metric names must be strings, got {type(key).__name__}")
    # A str of n code points holds at most 4n UTF-8 bytes, so most keys skip encoding.
    if not key or (len(key) > MAX_KEY_BYTES // 4 and len(key.encode()) > MAX_KEY_BYTES):
        if not key:
            raise ValueError(f"{field}: metric names must not be empty")
        raise ValueError(f"{field}: metric name longer than {MAX_KEY_BYTES} UTF-8 bytes")
    if "\x00" in key:
        raise ValueError(f"{field}: metric names must not contain NUL characters")
    return key


MAX_NODE = 255


def node(value: Any, field: str = "node") -> str | None:
    """The host a rank runs on: a string of at most ``MAX_NODE`` characters (no NUL), or
    None (not said)."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise TypeError(
            f"{field} must be a string (the rank's host name), got {type(value).__name__}"
        )
    if len(value) > MAX_NODE:
        raise ValueError(f"{field} must be at most {MAX_NODE} characters, got {len(value)}")
    return text(value, field)


def text(value: str, field: str) -> str:
    """A name to store (project, run name, tag, org): no NUL characters (no database that
    keeps text takes them, and no name needs one)."""
    if "\x00" in value:
        raise ValueError(f"{field} must not contain NUL characters")
    return value


def metric_values(
    data: Any, field: str = "metrics", allow_empty: bool = False
) -> tuple[dict[str, float], dict[str, str] | None]:
    """A dict of non-empty string keys (<= 512 UTF-8 bytes) to numbers, as
    ``(finite values, non-finite marks or None)``: NaN and +-inf are data (a diverged rank
    is what the summary must show), returned apart as ``"nan"``, ``"inf"`` or ``"-inf"``.
    Empty is refused unless ``allow_empty``; 0-dim arrays count as the number they hold."""
    if not isinstance(data, dict):
        raise TypeError(f"{field} must be an object mapping metric names to numbers")
    if not data and not allow_empty:
        raise ValueError(f"{field} must contain at least one metric")
    out: dict[str, float] = {}
    marks: dict[str, str] | None = None  # allocated only for a non-finite value: rare
    for key, value in data.items():
        # The name checks of _metric_name, inline: this loop runs on every log_* call.
        if type(key) is not str or not key or len(key) > MAX_KEY_BYTES // 4 or "\x00" in key:
            _metric_name(key, field)
        if type(value) is float:
            number = value
        else:
            if type(value) is not int and not _is_number(value):
                value = _unwrap(value)
                if not _is_number(value):
                    raise TypeError(
                        f"{field}[{key!r}] must be a number, got {type(value).__name__}"
                    )
            try:
                number = float(value)
            except (OverflowError, TypeError, ValueError):
                raise ValueError(f"{field}[{key!r}] must be a finite number") from None
        if number - number == 0.0:  # finite (NaN and +-inf give NaN: one subtraction)
            out[key] = number
        else:
            if marks is None:
                marks = {}
            marks[key] = mark_of(number)
    return out, marks


def nonfinite_marks(data: Any, field: str = "nonfinite") -> dict[str, str]:
    """A non-empty dict of metric names to ``"nan"``, ``"inf"`` or ``"-inf"``."""
    if not isinstance(data, dict):
        raise TypeError(f"{field} must be an object mapping metric names to 'nan', 'inf' or '-inf'")
    if not data:
        raise ValueError(f"{field} must contain at least one metric")
    for key, mark in data.items():
        _metric_name(key, field)
        if type(mark) is not str or mark not in NONFINITE_MARKS:
            raise ValueError(f"{field}[{key!r}] must be 'nan', 'inf' or '-inf', got {mark!r}")
    return data


def step(value: Any, field: str = "step") -> int:
    """A finite step >= 0; an integral float (``100.0``) is that integer, ``1.5`` is refused."""
    if type(value) is int:
        number = value
    elif type(value) is float or _is_number(value) or _is_number(value := _unwrap(value)):
        as_float = float(value)
        if not math.isfinite(as_float):
            raise ValueError(f"{field} must be finite")
        if not as_float.is_integer():
            raise ValueError(f"{field} must be an integer, got {value}")
        number = int(as_float)
    else:
        raise TypeError(f"{field} must be an integer, got {type(value).__name__}")
    if number < 0:
        raise ValueError(f"{field} must be >= 0, got {number}")
    if number > MAX_STEP:
        raise ValueError(f"{field} must be < 2**63")
    return number


EXACT_FLOAT_STEP = 2**53  # every integer below it is a float64 exactly


def scalar_step(value: Any, field: str = "step") -> int | float:
    """A scalar metric's step: any finite number >= 0 (docs/reference.md, "HTTP API"; the
    public SDK's upload health scalars are logged at step = unix time, ``1764547200.25``).
    An integral value is an int. Stored as a float64, so an integer step must be below
    2**53 to be kept exactly, and a larger one is refused rather than rounded."""
    if type(value) is not int and not _is_number(value):
        value = _unwrap(value)
        if not _is_number(value):
            raise TypeError(f"{field} must be a number, got {type(value).__name__}")
    as_float = float(value)
    if not math.isfinite(as_float):
        raise ValueError(f"{field} must be finite")
    if as_float < 0:
        raise ValueError(f"{field} must be >= 0, got {value}")
    if not as_float.is_integer():
        return as_float
    number = int(value) if type(value) is int else int(as_float)
    if number >= EXACT_FLOAT_STEP:
        raise ValueError(f"{field} of a scalar metric must be < 2**53 (kept exactly), got {number}")
    return number


def _int(value: Any, field: str) -> int:
    # JSON integers only: strings, bools and floats are refused (the contract says so).
    if type(value) is int:
        return value
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return int(value)
    raise TypeError(f"{field} must be an integer, got {type(value).__name__}")


def rank_context(rank: Any, world_size: Any, local_rank: Any) -> tuple[int, int, int | None]:
    """``1 <= world_size <= 512``, ``0 <= rank < world_size``, ``local_rank`` None or in range."""
    size = _int(world_size, "world_size")
    if not 1 <= size <= MAX_WORLD_SIZE:
        raise ValueError(f"world_size must be between 1 and {MAX_WORLD_SIZE}, got {size}")
    r = _int(rank, "rank")
    if not 0 <= r < size:
        raise ValueError(f"rank must satisfy 0 <= rank < world_size ({size}), got {r}")
    if local_rank is None:
        return r, size, None
    lr = _int(local_rank, "local_rank")
    if not 0 <= lr < size:
        raise ValueError(f"local_rank must satisfy 0 <= local_rank < world_size ({size}), got {lr}")
    return r, size, lr


def weight(value: Any, field: str = "weight") -> float:
    """A finite number > 0; ``None`` means 1.0."""
    if value is None:
        return 1.0
    if (
        type(value) is not float
        and not _is_number(value)
        and not _is_number(value := _unwrap(value))
    ):
        raise TypeError(f"{field} must be a number, got {type(value).__name__}")
    try:
        number = float(value)
    except OverflowError:
        raise ValueError(f"{field} must be finite") from None
    if not math.isfinite(number) or number <= 0:
        raise ValueError(f"{field} must be a finite number > 0, got {number}")
    return number


def run_status(value: Any, field: str = "status") -> str:
    if value not in RUN_STATUSES or type(value) is not str:
        raise ValueError(f"{field} must be one of {', '.join(RUN_STATUSES)}")
    return str(value)


def run_id(value: Any, field: str = "id") -> str:
    """Run ids travel in URL paths: 1-128 characters of letters, digits, ``.``, ``_``, ``-``."""
    if type(value) is not str:
        raise TypeError(f"{field} must be a string")
    if not 1 <= len(value) <= 128 or not _RUN_ID_CHARS.issuperset(value) or value[0] in "._-":
        raise ValueError(
            f"{field} must be 1-128 letters, digits, '.', '_' or '-', starting with a letter or digit"
        )
    return value


_RUN_ID_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")
