"""The Distributed summary: what every rank's values say about a step range of one key.

The definitions are DESIGN.md's ("The Distributed summary"). The SQL that computes them
lives with each storage backend; this package holds what is backend-neutral: the query
parameters, the bucketing rule and the assembly of coverage and heatmap.
"""

from .params import SummaryParams, bucket_size

__all__ = ["SummaryParams", "bucket_size"]
