"""Framework callbacks that log every rank, not rank 0 only: ``integrations.lightning`` and
``integrations.transformers``. Each imports its framework; ``import instantml`` imports
none of them."""
