"""The write path: how a write request becomes stored points and an answer.

The wire's writes are typed once (``wire.py``) and routed by one table (``table.py``): a
single route's body, or one event of a ``POST /api/ingest`` batch (``events.py`` decodes a
batch once), is validated into a command (``validate.py``, ``commands.py``; plain rank
events straight into columns by ``rank_batch.py``, a large batch's in a decoding process,
``decode_pool.py``). ``apply.py`` claims each Idempotency-Key and hands the commands to
the group committer (``committer.py``), one thread that applies groups of them in one unit
of work through ``service.py`` (each group decided by ``group.py``: replays, runs, usage
limits from ``guardrail.py``, points as ``rank_columns.py`` columns) and answers each in
HTTP terms (``answers.py``).
``idempotency.py`` reduces keys and fingerprints requests; ``upload_order.py`` applies an
uploader's pipelined batches in the order it sent them.
"""
