"""InstantML: experiment tracking with per-rank metrics for distributed training.

import instantml as im
run = im.init(project="distributed-job")
run.log_rank_metrics({"train/loss": 0.12}, step=100, rank=0, world_size=8)
run.finish()

rows = im.Api().rank_points(run.run_id, "train/loss")  # a pandas DataFrame
"""

from ._version import __version__
from .sdk import Api, InstantMLError, Run, init

__all__ = ["Api", "InstantMLError", "Run", "__version__", "init"]
