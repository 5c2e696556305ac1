"""What a training process imports: ``init`` and the ``Run`` it returns."""

from .errors import InstantMLError
from .run import Run, init

__all__ = ["InstantMLError", "Run", "init"]
