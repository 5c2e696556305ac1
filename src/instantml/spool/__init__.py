"""Spool mode: the training process appends events to local segment files; a separate
uploader (``instantml sync``) replays them to the server, each with its ``event_id`` as
Idempotency-Key, so a retry or a restart never double counts.

Layout of a spool dir::

    <dir>/segments/<created µs>-<host>-<pid>-<nonce>.jsonl   one per writer process
    <dir>/segments/<segment>.ack                          bytes the server acknowledged
    <dir>/dead-letter.jsonl                               events refused for bad input
    <dir>/uploader.lock                                   one uploader at a time
"""
