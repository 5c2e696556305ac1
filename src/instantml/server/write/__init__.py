"""The write path: how a write request becomes stored points and an answer.

A single route's body or one event of ``POST /api/ingest`` is validated into a command
(``validate.py``, ``commands.py``; a batch of plain rank events straight into columns by
``rank_batch.py``, large ones in a decoding process, ``decode_pool.py``); ``apply.py``
claims each Idempotency-Key and hands the commands to the group committer
(``committer.py``), one thread that applies groups of them in one unit of work through
``service.py`` (runs, usage limits from ``guardrail.py``, points as ``rank_columns.py``
columns), and answers each in HTTP terms (``answers.py``). ``idempotency.py`` reduces keys
and fingerprints requests; ``upload_order.py`` applies an uploader's pipelined batches in
the order it sent them.
"""
