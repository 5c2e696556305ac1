"""The math of the Distributed summary, written once, below storage: the query parameters
and the bucket rule (:mod:`.params`), step statistics and scores (:mod:`.step_stats`),
straggler scores (:mod:`.stragglers`), block rows, covers, heatmap cells and the rollup
(:mod:`.covers`), and the rows a summary is made of (:mod:`.rows`). The definitions are
the project's (docs/reference.md, "The Distributed summary"); this package imports nothing
else of instantml, and every point store computes through it.
"""
