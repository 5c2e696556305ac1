"""What a training process imports: ``init`` and the ``Run`` it returns; and ``Api``, to
read runs back from a notebook."""

from .api import Api
from .errors import InstantMLError
from .run import Run, init

__all__ = ["Api", "InstantMLError", "Run", "init"]
