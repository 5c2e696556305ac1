"""Ranks grouped by the node (host) they run on: the summary's ``nodes``, each rank's
``node``, the heatmap ordered by node, and a node's straggler score (its slowest rank's).

At scale a straggler is usually a node (a hot GPU, a bad NIC), not a rank: eight ranks of
one slow host read as one slow node here. A rank whose events never said a node (the
public SDK) is in no node; when no rank said one, ``nodes`` is empty.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np


def _groups(ranks: list[int], nodes: Mapping[int, str]) -> dict[str | None, list[int]]:
    groups: dict[str | None, list[int]] = {}
    for rank in sorted(ranks):
        groups.setdefault(nodes.get(rank), []).append(rank)
    return groups


def add_nodes(answer: dict[str, Any], nodes: Mapping[int, str]) -> None:
    """Each rank of the rollup gets its ``node``; ``answer["nodes"]``: per node, its ranks,
    those missing, the mean of its ranks' ``mean_delta`` and ``mean_abs_z``, and the sum of
    their ``outlier_steps``, nodes by name (ranks said no node last, as node null)."""
    for row in answer["ranks"]:
        row["node"] = nodes.get(row["rank"])
    if not nodes:
        answer["nodes"] = []
        return
    missing = {m["rank"] for m in answer["coverage"]["missing"]}
    rows = {row["rank"]: row for row in answer["ranks"]}
    listed = []
    for node, members in _groups(list(rows), nodes).items():
        mine = [rows[rank] for rank in members]
        listed.append(
            {
                "node": node,
                "ranks": members,
                "missing_ranks": [rank for rank in members if rank in missing],
                "mean_delta": float(np.mean([r["mean_delta"] for r in mine])),
                "mean_abs_z": float(np.mean([r["mean_abs_z"] for r in mine])),
                "outlier_steps": int(sum(r["outlier_steps"] for r in mine)),
            }
        )
    listed.sort(key=lambda n: (n["node"] is None, n["node"] or ""))
    answer["nodes"] = listed


def order_heatmap_by_node(heatmap: dict[str, Any], nodes: Mapping[int, str]) -> None:
    """The heatmap's rows grouped by node (nodes by name, ranks in order within one; ranks
    said no node last), with each row's node in ``heatmap["nodes"]``."""
    ranks: list[int] = heatmap["ranks"]
    order = sorted(range(len(ranks)), key=lambda i: (nodes.get(ranks[i]) is None,
                                                      nodes.get(ranks[i]) or "", ranks[i]))  # fmt: skip
    where = {old: new for new, old in enumerate(order)}
    heatmap["ranks"] = [ranks[i] for i in order]
    values = heatmap["values"]
    heatmap["values"] = (
        values[order] if isinstance(values, np.ndarray) else [values[i] for i in order]
    )
    heatmap["nonfinite"] = sorted([where[row], col] for row, col in heatmap["nonfinite"])
    heatmap["nodes"] = [nodes.get(rank) for rank in heatmap["ranks"]]


def node_scores(answer: dict[str, Any], nodes: Mapping[int, str]) -> None:
    """A stragglers answer's ``nodes``: per node, its slowest rank's score (the lowest), that
    rank, and whether any of its ranks is a straggler; slowest node first. Each rank's row
    gets its ``node``."""
    for row in answer["ranks"]:
        row["node"] = nodes.get(row["rank"])
    if not nodes:
        answer["nodes"] = []
        return
    rows = {row["rank"]: row for row in answer["ranks"]}
    listed = []
    for node, members in _groups(list(rows), nodes).items():
        slowest = min((rows[rank] for rank in members), key=lambda r: (r["score"], r["rank"]))
        listed.append(
            {
                "node": node,
                "ranks": members,
                "score": slowest["score"],
                "slowest_rank": slowest["rank"],
                "straggler": any(rows[rank]["straggler"] for rank in members),
            }
        )
    listed.sort(key=lambda n: (n["score"], n["node"] is None, n["node"] or ""))
    answer["nodes"] = listed
