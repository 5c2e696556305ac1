"""The Distributed summary's answer: assembled (:mod:`.assemble`, :mod:`.coverage`) from
the rows a point store reads, and drawn in a terminal (:mod:`.terminal`). The math it is
made of lives in :mod:`instantml.rankmath`.
"""
