"""What a point store written by an earlier version needs, once, when opened."""

from __future__ import annotations

from .engine import ChEngine


def upgrade_points(engine: ChEngine) -> None:
    _copy_int_scalars(engine)
    # Points written before blocks existed: every step stale once, so its blocks are
    # built by the refresh (a cheap check: count() of a MergeTree is metadata).
    # Points written before step blocks existed: the same, so those are built too.
    ((blocks_kept,),) = engine.rows(f"SELECT count() FROM {engine.table('rank_blocks')}")
    ((steps_kept,),) = engine.rows(f"SELECT count() FROM {engine.table('step_blocks')}")
    if not blocks_kept or not steps_kept:  # (their outlier rows come with the refresh)
        with engine.guarded() as client:
            client.command(
                f"INSERT INTO {engine.table('stale_steps')} SELECT DISTINCT series_id,"
                f" step, 1, {engine.version()} FROM {engine.table('rank_points')}"
            )


def _copy_int_scalars(engine: ChEngine) -> None:
    """Scalar points of an earlier version (Int64 steps, ``scalar_points``) into the
    Float64 table, once: when that table exists and this one is empty."""
    ((old,),) = engine.rows(
        "SELECT count() FROM system.tables WHERE database = {db:String} AND name = 'scalar_points'",
        {"db": engine.database},
    )
    if not old or engine.rows(f"SELECT count() FROM {engine.table('scalars')}")[0][0]:
        return
    with engine.guarded() as client:
        client.command(
            f"INSERT INTO {engine.table('scalars')} SELECT series_id, toFloat64(step), value, ts,"
            f" preview, version FROM {engine.table('scalar_points')}"
        )
