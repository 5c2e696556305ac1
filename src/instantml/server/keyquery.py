"""The ``key`` query parameter of every route that reads one metric key: ``key=`` (the
name everywhere), ``metric=`` an alias of it."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Query

from .errors import ApiError

_NAME = {"min_length": 1, "max_length": 2048}


def _key_name(
    key: Annotated[str | None, Query(description="the metric key", **_NAME)] = None,
    metric: Annotated[str | None, Query(description="an alias of key", **_NAME)] = None,
) -> str | None:
    return key if key is not None else metric


KeyName = Annotated[str | None, Depends(_key_name)]


def required(name: str | None) -> str:
    """The key asked for, or a 422 naming the field."""
    if name is None:
        raise ApiError(422, "key: Field required (the metric key; metric= is an alias)")
    return name
